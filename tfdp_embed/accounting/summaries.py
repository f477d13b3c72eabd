"""Epsilon as a TensorBoard scalar, whatever the order of the callbacks.

Keras' `TensorBoard` callback writes the epoch logs it sees; a budget that
runs after it adds epsilon to logs already written. So the budget writes
epsilon itself, as `epoch_<key>` (next to TensorBoard's `epoch_loss`):

  * with `log_dir`, to `<log_dir>/train`, the run TensorBoard writes its
    training scalars to;
  * without, to the default summary writer if one is active (a
    `writer.as_default()` around `fit`, or TensorBoard's with `update_freq`
    in batches); otherwise nowhere.

When a TensorBoard callback follows the budget it also writes the same
value under the same tag and step from the epoch logs.
"""

from __future__ import annotations

import os
from typing import Any

import tensorflow as tf


class EpochScalars:
    """Writes epoch scalars to `<log_dir>/train` (or the default summary writer when `log_dir` is None)."""

    def __init__(self, log_dir: str | os.PathLike | None):
        self.log_dir = None if log_dir is None else os.fspath(log_dir)
        self._writer: Any = None

    def write(self, key: str, value: float, *, epoch: int) -> None:
        """Writes `epoch_<key>` = value at step `epoch`."""
        tag = f"epoch_{key}"
        if self.log_dir is None:
            if tf.summary.should_record_summaries():
                tf.summary.scalar(tag, value, step=int(epoch))
            return
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(os.path.join(self.log_dir, "train"))
        writer = self._writer
        with writer.as_default():
            tf.summary.scalar(tag, value, step=int(epoch))
        writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


__all__ = ["EpochScalars"]
