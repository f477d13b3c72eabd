"""Checkpoint and resume of a Keras 3 `DPModel`: the core's `tfdp_embed.checkpointing` with a Keras 3 callback.

    from tfdp_embed.keras3.checkpointing import DPCheckpoint, TrainingCheckpoint, rest_of_epoch

One `tf.train.Checkpoint` of the wrapped model, the optimizer, the mechanism
(RNG, LazyDP's histories, DP-FEST's selection, counters), the privacy ledger
and the position in the batch stream; restored all or nothing, and resumed
without accounting a step twice (the ledger comes back with the weights).
"""

from tfdp_embed.checkpointing import (
    CheckpointCallback,
    CheckpointCorruptedError,
    CheckpointError,
    CheckpointMismatchError,
    DataPosition,
    ResumeInfo,
    TrainingCheckpoint,
    rest_of_epoch,
)
from tfdp_embed.keras3._keras import keras


class DPCheckpoint(CheckpointCallback, keras.callbacks.Callback):
    __doc__ = CheckpointCallback.__doc__


__all__ = [
    "CheckpointCorruptedError",
    "CheckpointError",
    "CheckpointMismatchError",
    "DPCheckpoint",
    "DataPosition",
    "ResumeInfo",
    "TrainingCheckpoint",
    "rest_of_epoch",
]
