"""argparse value types shared by the pipeline command lines (errors name the bad value)."""

from __future__ import annotations

import argparse
import math


def positive(kind, *, allow_inf: bool = False):
    """An argparse type: `kind(text)` that must be > 0 (and finite unless `allow_inf`)."""

    def convert(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}; received {text!r}") from None
        if not value > 0 or (not allow_inf and not math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"must be a finite number > 0; received {text!r}")
        return value

    convert.__name__ = f"positive {kind.__name__}"
    return convert


def non_negative_float(text):
    """An argparse type: a finite float >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number; received {text!r}") from None
    if not value >= 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0; received {text!r}")
    return value
