"""Wall time per training step, shared by the pipelines' reports (`median_step_s`)."""

from __future__ import annotations

import statistics
import time

from tfdp_embed import keras

WARMUP_STEPS = 3  # first steps trace the train function; excluded from the median


class StepTimer(keras.callbacks.Callback):
    """Wall time of every training step (data, forward, clip, noise, apply)."""

    def __init__(self):
        super().__init__()
        self.durations: list[float] = []
        self._start = None

    def on_train_batch_begin(self, batch, logs=None):
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.durations.append(time.perf_counter() - self._start)

    def median(self, skip: int = WARMUP_STEPS) -> float | None:
        """Median step time in seconds, without the first `skip` steps (tracing) when possible."""
        values = self.durations[skip:] if len(self.durations) > skip else self.durations
        return statistics.median(values) if values else None


__all__ = ["WARMUP_STEPS", "StepTimer"]
