"""Argument checks shared across the library (the mechanisms and the accounting do not import each other for them)."""

from __future__ import annotations

import numbers


def check_positive(name: str, value, *, allow_zero: bool = False) -> float:
    """Validates a privacy hyperparameter; the error names the argument.

    Returns:
      `value` as a float.

    Raises:
      TypeError: not a number. ValueError: not finite, or not > 0 (>= 0 with `allow_zero`).
    """
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"`{name}` must be a number; received {value!r}.") from None
    bad = value < 0 if allow_zero else value <= 0
    if bad or value != value or value == float("inf"):
        allowed = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"`{name}` must be finite and {allowed}; received {value!r}.")
    return value


def check_int(name: str, value, *, minimum: int = 1) -> int:
    """Validates a size or count; the error names the argument.

    Returns:
      `value` as a Python int.

    Raises:
      ValueError: not an integer (a bool is not one) or below `minimum`.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"`{name}` must be an int >= {minimum}; received {value!r}.")
    return int(value)
