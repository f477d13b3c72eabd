"""`DPCheckpoint`: a Keras callback that checkpoints DP training every n steps, and resumes it (both front ends).

The logic is `CheckpointCallback`; each front end's `DPCheckpoint` is it on that
Keras's `keras.callbacks.Callback` (`tfdp_embed.keras2.checkpointing`,
`tfdp_embed.keras3.checkpointing`).

    ckpt = DPCheckpoint(directory, dp_model=dp, budget=budget, every_n_steps=100,
                        batches_per_epoch=info.batches_per_epoch, sampler_seed=7)
    dp.prepare(build_batches)       # build from fixed batches, not from the seeded sampler
    resumed = ckpt.restore_or_initialize()               # None on a fresh start
    if resumed is None:
        dp.fit(batches, epochs=E, callbacks=[budget, ckpt])
    else:
        rest = rest_of_epoch(batches, resumed.position)  # the interrupted epoch's remaining batches
        if rest is not None:
            dp.fit(rest, epochs=resumed.position.epoch + 1,
                   initial_epoch=resumed.position.epoch, callbacks=[budget, ckpt])
        dp.fit(batches, epochs=E, initial_epoch=resumed.position.next_full_epoch,
               callbacks=[budget, ckpt])

A save that is due after batch t is written when the NEXT callback hook
runs (the next batch's begin, the epoch's end or the train end): by then
every callback's `on_train_batch_end` has run, whatever their order, so the
ledger (recorded by `PrivacyBudget`) and the weights describe the same step.
Saving refuses when they do not (see `TrainingCheckpoint.save`).

References: `tf.keras.callbacks.BackupAndRestore` (the idea); LazyDP
(ASPLOS 2024) §3 (what may be released).
"""

from __future__ import annotations

import logging

from tfdp_embed.checkpointing.position import DataPosition, normalized_position
from tfdp_embed.checkpointing.training_state import ResumeInfo, TrainingCheckpoint

_LOG = logging.getLogger(__name__)


class CheckpointCallback:
    """Checkpoints model, optimizer, mechanism, ledger and data position during `fit`.

    Args:
      directory: checkpoint directory (created).
      dp_model: the compiled `DPModel` (keyword-only, as all that follow).
      every_n_steps: save every n training steps (None: only at epoch/train end).
      save_at_epoch_end: also save at the end of every epoch.
      save_at_train_end: save when `fit` ends (including a budget stop).
      budget: the `PrivacyBudget` in the same `fit` (its ledger is saved and restored).
      ledger: a `PrivacyLedger` to save instead when there is no budget.
      max_to_keep: complete checkpoints kept.
      batches_per_epoch: B of the batch stream; default: Keras' steps per
        epoch of the first full `fit`.
      sampler_seed: the batch sampler's seed (recorded and checked).

    Attributes:
      checkpoint: the `TrainingCheckpoint` doing the work.
      last_saved: prefix of the last checkpoint written (None before).

    Raises:
      ValueError, TypeError: bad arguments.
    """

    def __init__(
        self,
        directory: str,
        *,
        dp_model,
        every_n_steps: int | None = None,
        save_at_epoch_end: bool = False,
        save_at_train_end: bool = True,
        budget=None,
        ledger=None,
        max_to_keep: int = 3,
        batches_per_epoch: int | None = None,
        sampler_seed: int | None = None,
    ):
        super().__init__()
        if every_n_steps is not None and (
            isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) or every_n_steps < 1
        ):
            raise ValueError(f"`every_n_steps` must be an int >= 1 or None; received {every_n_steps!r}.")
        self.checkpoint = TrainingCheckpoint(
            directory,
            dp_model=dp_model,
            budget=budget,
            ledger=ledger,
            max_to_keep=max_to_keep,
            batches_per_epoch=batches_per_epoch,
            sampler_seed=sampler_seed,
        )
        self.every_n_steps = every_n_steps
        self.save_at_epoch_end = bool(save_at_epoch_end)
        self.save_at_train_end = bool(save_at_train_end)
        self.last_saved: str | None = None
        self._consumed = 0  # batches trained on since the start of training (all runs)
        self._epoch = 0
        self._in_epoch = 0
        self._resume_offset: tuple[int, int] | None = None  # (epoch, batches already done in it)
        self._batch_begin = 0
        self._since_save = 0
        self._due = False
        self._dirty = False

    # -- resuming -------------------------------------------------------------------
    def restore_or_initialize(self, data=None) -> ResumeInfo | None:
        """Restores the newest complete checkpoint (all or nothing); None when there is none.

        See `TrainingCheckpoint.restore` for what is checked and raised.
        """
        info = self.checkpoint.restore_or_initialize(data)
        if info is not None:
            self._adopt(info)
        return info

    def restore(self, prefix: str | None = None, *, data=None) -> ResumeInfo:
        """Restores checkpoint `prefix` (default: the newest complete one)."""
        info = self.checkpoint.restore(prefix, data=data)
        self._adopt(info)
        return info

    def _adopt(self, info: ResumeInfo) -> None:
        position = info.position
        self._consumed = position.batches_consumed
        self._epoch, self._in_epoch = position.epoch, position.batch_in_epoch
        self._resume_offset = (position.epoch, position.batch_in_epoch) if position.batch_in_epoch else None
        if self.checkpoint.batches_per_epoch is None:
            self.checkpoint.batches_per_epoch = position.batches_per_epoch
        self.last_saved = info.path

    def position(self) -> DataPosition:
        """The current position in the batch stream."""
        return normalized_position(
            batches_consumed=self._consumed,
            epoch=self._epoch,
            batch_in_epoch=self._in_epoch,
            batches_per_epoch=self.checkpoint.batches_per_epoch,
        )

    def save(self) -> str:
        """Writes a checkpoint now; returns its prefix."""
        self.last_saved = self.checkpoint.save(position=self.position())
        self._due = self._dirty = False
        self._since_save = 0
        _LOG.info("DPCheckpoint: wrote %s (%d batches).", self.last_saved, self._consumed)
        return self.last_saved

    # -- Keras hooks ----------------------------------------------------------------
    def on_train_begin(self, logs=None):
        steps = (self.params or {}).get("steps")
        if self.checkpoint.batches_per_epoch is None and self._resume_offset is None and steps:
            self.checkpoint.batches_per_epoch = int(steps)

    def on_epoch_begin(self, epoch, logs=None):
        self._save_if_due()
        self._epoch = int(epoch)
        self._in_epoch = 0
        if self._resume_offset is not None and self._resume_offset[0] == epoch:
            self._in_epoch = self._resume_offset[1]
        self._resume_offset = None

    def on_train_batch_begin(self, batch, logs=None):
        self._save_if_due()
        self._batch_begin = int(batch)

    def on_train_batch_end(self, batch, logs=None):
        taken = max(1, int(batch) - self._batch_begin + 1)  # steps_per_execution > 1
        self._consumed += taken
        self._in_epoch += taken
        self._since_save += taken
        self._dirty = True
        if self.every_n_steps is not None and self._since_save >= self.every_n_steps:
            self._due = True

    def on_epoch_end(self, epoch, logs=None):
        if self.save_at_epoch_end and self._dirty:
            self._due = True
        self._save_if_due()

    def on_train_end(self, logs=None):
        if self.save_at_train_end and self._dirty:
            self._due = True
        self._save_if_due()

    def _save_if_due(self) -> None:
        if self._due:
            self.save()


__all__ = ["CheckpointCallback"]
