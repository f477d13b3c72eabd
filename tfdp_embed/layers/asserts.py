"""`string_assert`: a run-time check that adds one op to a traced step, not a `tf.cond`.

`tf.debugging.Assert` guards its op with a `tf.cond` (two branch graphs,
traced and optimised with the step) unless every data tensor is a string or
int32. The layers' range checks run in every lookup of every step, so their
numbers are shown as strings: one plain `Assert` op each.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf


def string_assert(condition, data: Sequence):
    """`tf.debugging.Assert(condition, data)` with `data`'s tensors shown as strings (one op, no cond).

    Run eagerly, it raises at once with the same text (a tensor shown as numpy
    prints it), and converts nothing while `condition` holds.

    Raises:
      tf.errors.InvalidArgumentError: `condition` is false (eagerly: here; traced: when the op runs).
    """
    if tf.executing_eagerly():
        if bool(condition):
            return condition
        raise tf.errors.InvalidArgumentError(None, None, " ".join(_shown_eagerly(item) for item in data))
    shown = [item if isinstance(item, str) else _as_string(item) for item in data]
    return tf.debugging.Assert(condition, shown, summarize=-1)  # every entry (default: 3 per tensor)


def _shown_eagerly(item) -> str:
    """`item` as the traced `Assert` prints it: text as is, a tensor's values in brackets."""
    if isinstance(item, str):
        return item
    value = tf.convert_to_tensor(item).numpy()
    return value.decode() if isinstance(value, bytes) else str(value)


def _as_string(tensor) -> tf.Tensor:
    tensor = tf.convert_to_tensor(tensor)
    return tensor if tensor.dtype == tf.string else tf.strings.as_string(tensor)


__all__ = ["string_assert"]
