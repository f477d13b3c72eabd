"""Checkpoint and resume of DP training: model, optimizer, mechanism, ledger, data position (both front ends).

    from tfdp_embed.keras2.checkpointing import DPCheckpoint, rest_of_epoch   # tf-keras
    from tfdp_embed.keras3.checkpointing import DPCheckpoint, rest_of_epoch   # Keras 3

* `DPCheckpoint` (Keras callback) saves every n steps with
  `tf.train.CheckpointManager` and restores with `restore_or_initialize`.
* `TrainingCheckpoint` does the work: one `tf.train.Checkpoint` of the
  wrapped model, the optimizer, the mechanism (RNG, LazyDP histories,
  DP-FEST selections, counters), the `PrivacyLedger` and the position in the
  batch stream; a manifest with the training setup and file checksums; an
  all-or-nothing restore that refuses mismatched or corrupted checkpoints
  before loading anything (`CheckpointMismatchError`,
  `CheckpointCorruptedError`).
* `rest_of_epoch` continues the interrupted epoch's Poisson batch stream.

A checkpoint is training state, never a release: a LazyDP checkpoint keeps
the un-flushed table with its noise history; export (which flushes) is the
only way out. See `tfdp_embed.checkpointing.training_state`.

Under `MirroredStrategy`, build the model, mechanism and optimizer of the
resumed run inside the same strategy's scope as the run that saved; the
restore fills every replica's copy (tested on 2 logical CPUs with EANA,
dense DP-SGD and DP-FEST: tests/distributed/test_checkpoint_distributed.py).
"""

from tfdp_embed.checkpointing.callback import CheckpointCallback
from tfdp_embed.checkpointing.errors import (
    CheckpointCorruptedError,
    CheckpointError,
    CheckpointMismatchError,
)
from tfdp_embed.checkpointing.position import DataPosition, rest_of_epoch
from tfdp_embed.checkpointing.training_state import ResumeInfo, TrainingCheckpoint

__all__ = [
    "CheckpointCorruptedError",
    "CheckpointError",
    "CheckpointMismatchError",
    "CheckpointCallback",
    "DataPosition",
    "ResumeInfo",
    "TrainingCheckpoint",
    "rest_of_epoch",
]
