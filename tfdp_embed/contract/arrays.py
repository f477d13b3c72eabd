"""`fit`'s arrays as a one-batch dataset, so `DPModel` checks the contract on them as on a dataset (both front ends).

Keras-free: the front end passes its Keras's `Model.fit`, whose signature
says which of `fit`'s arguments are `y`, `sample_weight` and `batch_size`
(tf-keras and Keras 3 order them alike).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import numpy as np
import tensorflow as tf

DEFAULT_BATCH_SIZE = 32  # what `fit` batches arrays by when given no `batch_size` (both Kerases)


def one_batch_of_arrays(fit: Callable, x, args: tuple, kwargs: dict) -> tf.data.Dataset | None:
    """`fit(x, *args, **kwargs)`'s arrays (`x`, `y`, `sample_weight`, `batch_size`) as a dataset of their first batch.

    `fit`: the front end's `keras.Model.fit` (unbound). Returns None for
    anything but NumPy arrays and tensors (generators, Sequences, DatasetCreators).
    """
    try:
        bound = inspect.signature(fit).bind(None, x, *args, **kwargs).arguments
    except TypeError:
        return None
    y, sample_weight = bound.get("y"), bound.get("sample_weight")
    leaves = tf.nest.flatten((x, y, sample_weight))
    if x is None or not all(isinstance(a, (np.ndarray, tf.Tensor)) or a is None for a in leaves):
        return None
    data = _packed(x, y, sample_weight)
    try:
        return tf.data.Dataset.from_tensor_slices(data).batch(bound.get("batch_size") or DEFAULT_BATCH_SIZE).take(1)
    except (TypeError, ValueError):
        return None


def _packed(x, y, sample_weight):
    """As Keras's `pack_x_y_sample_weight`: `x` alone (a 1-tuple when nested), `(x, y)` or `(x, y, sample_weight)`."""
    if y is None:
        return (x,) if tf.nest.is_nested(x) else x
    return (x, y) if sample_weight is None else (x, y, sample_weight)


__all__ = ["DEFAULT_BATCH_SIZE", "one_batch_of_arrays"]
