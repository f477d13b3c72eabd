"""Membership in a sorted set of ids, by binary search (no hash table, no dense mask)."""

from __future__ import annotations

import tensorflow as tf


def is_member(values: tf.Tensor, sorted_set: tf.Tensor) -> tf.Tensor:
    """Boolean mask, shaped like `values`: which entries occur in `sorted_set`.

    A value occurs when its left and right insertion points differ, so the
    set may be empty and needs no sentinel; a trailing sentinel larger than
    every value is harmless. O(n log k) for n values and k set entries.

    Args:
      values: integer tensor of any shape.
      sorted_set: 1-D tensor of the same dtype, sorted ascending.

    Returns:
      bool tensor with the shape of `values`.
    """
    values = tf.convert_to_tensor(values)
    flat = tf.reshape(values, [-1])
    left = tf.searchsorted(sorted_set, flat, side="left")
    right = tf.searchsorted(sorted_set, flat, side="right")
    return tf.reshape(right > left, tf.shape(values))
