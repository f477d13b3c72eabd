"""Checkpoint and resume of a tf-keras `DPModel` (the core's `tfdp_embed.checkpointing` with a tf-keras callback).

    from tfdp_embed.keras2.checkpointing import DPCheckpoint, rest_of_epoch

Under `MirroredStrategy`, build the model, mechanism and optimizer of the
resumed run inside the same strategy's scope as the run that saved; the
restore fills every replica's copy (tests/distributed/test_checkpoint_distributed.py).
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
from tfdp_embed.keras2._keras import keras


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
