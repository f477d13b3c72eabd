"""Selecting examples from a batch: every batched tensor of a nested structure, sliced alike.

The per-example checks compare a batch with the same batch less some
examples. A leaf of `(features, labels, sample_weight)` is batched when its
leading dimension is the batch size: dense tensors and arrays, ragged
tensors (rows) and sparse tensors (first index). Other leaves (scalars,
Python values, tensors of another leading size) are passed as they are.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def batch_size_of(structure) -> int | None:
    """The leading size of the first batched leaf of `structure` (None if it has none)."""
    for leaf in tf.nest.flatten(structure):
        size = _leading_size(leaf)
        if size is not None:
            return size
    return None


def select_examples(structure, keep, batch_size: int):
    """`structure` with only examples `keep` (sorted int positions) in every batched leaf.

    Args:
      structure: nested features / labels / sample weights of one batch.
      keep: sorted positions in `[0, batch_size)` of the examples to keep.
      batch_size: the batch's size; leaves of another leading size are not sliced.
    """
    keep = np.asarray(keep, np.int64)
    return tf.nest.map_structure(lambda leaf: _select(leaf, keep, batch_size), structure)


def _leading_size(leaf) -> int | None:
    if isinstance(leaf, tf.RaggedTensor):
        return int(leaf.nrows())
    if isinstance(leaf, tf.SparseTensor):
        return int(leaf.dense_shape[0])
    if isinstance(leaf, (tf.Tensor, np.ndarray)) and len(leaf.shape) >= 1:
        return int(leaf.shape[0])
    return None


def _select(leaf, keep: np.ndarray, batch_size: int):
    if _leading_size(leaf) != batch_size:
        return leaf
    if isinstance(leaf, tf.SparseTensor):
        position = np.full([batch_size], -1, np.int64)
        position[keep] = np.arange(len(keep))
        rows = tf.gather(position, leaf.indices[:, 0])
        kept = tf.sparse.retain(leaf, rows >= 0)
        indices = tf.concat([tf.gather(position, kept.indices[:, :1]), kept.indices[:, 1:]], 1)
        shape = tf.concat([[len(keep)], leaf.dense_shape[1:]], 0)
        return tf.SparseTensor(indices, kept.values, shape)
    if isinstance(leaf, np.ndarray):
        return leaf[keep]
    return tf.gather(leaf, keep)


__all__ = ["batch_size_of", "select_examples"]
