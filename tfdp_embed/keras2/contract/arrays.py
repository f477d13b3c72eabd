"""`fit`'s arrays as a one-batch dataset, for the contract check of a tf-keras `DPModel` (`tfdp_embed.contract.arrays`)."""

from __future__ import annotations

from tfdp_embed.contract import arrays
from tfdp_embed.keras2._keras import keras, tf


def one_batch_of_arrays(x, args: tuple, kwargs: dict) -> tf.data.Dataset | None:
    """`fit`'s arrays (`x`, `y`, `sample_weight`, `batch_size`) as a dataset of their first batch.

    Returns None for anything else (generators, Sequences, DatasetCreators).
    """
    return arrays.one_batch_of_arrays(keras.Model.fit, x, args, kwargs)


__all__ = ["one_batch_of_arrays"]
