"""`fit`'s arrays as a one-batch dataset, for the contract check of a tf-keras `DPModel`."""

from __future__ import annotations

import inspect

import numpy as np

from tfdp_embed.keras2._keras import keras, tf


def one_batch_of_arrays(x, args: tuple, kwargs: dict) -> tf.data.Dataset | None:
    """`fit`'s arrays (`x`, `y`, `sample_weight`, `batch_size`) as a dataset of their first batch.

    Returns None for anything else (generators, Sequences, DatasetCreators).
    """
    try:
        bound = inspect.signature(keras.Model.fit).bind(None, x, *args, **kwargs).arguments
    except TypeError:
        return None
    y, sample_weight = bound.get("y"), bound.get("sample_weight")
    leaves = tf.nest.flatten((x, y, sample_weight))
    if x is None or not all(isinstance(a, (np.ndarray, tf.Tensor)) or a is None for a in leaves):
        return None
    data = keras.utils.pack_x_y_sample_weight(x, y, sample_weight)
    try:
        return tf.data.Dataset.from_tensor_slices(data).batch(bound.get("batch_size") or 32).take(1)
    except (TypeError, ValueError):
        return None


__all__ = ["one_batch_of_arrays"]
