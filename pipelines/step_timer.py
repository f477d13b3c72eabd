"""Wall time per training step, shared by the pipelines' reports (`median_step_s`) and their run-time estimate.

Given the run's planned steps (more than `WARMUP_STEPS + ESTIMATE_STEPS`),
`StepTimer` prints one line to stderr once that many steps have run (the
first ones trace the train function and are left out): "estimated N min for
S steps", from the median of the measured steps, so a run that will take
hours says so early.
"""

from __future__ import annotations

import statistics
import sys
import time

from tfdp_embed import keras

WARMUP_STEPS = 3  # first steps trace the train function; excluded from the median
ESTIMATE_STEPS = 3  # steps measured after the warm-up before the run-time estimate is printed


class StepTimer(keras.callbacks.Callback):
    """Wall time of every training step (data, forward, clip, noise, apply).

    Args:
      total_steps: the run's planned steps; given, the run-time estimate is printed once (see the module).
      program: the prefix of the estimate's line (e.g. "python -m pipelines.criteo").
    """

    def __init__(self, total_steps: int | None = None, *, program: str = "training"):
        super().__init__()
        self.durations: list[float] = []
        self._start = None
        self.total_steps, self.program = total_steps, program
        self.estimate: str | None = None  # the line printed, once

    def on_train_batch_begin(self, batch, logs=None):
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.durations.append(time.perf_counter() - self._start)
        measured = WARMUP_STEPS + ESTIMATE_STEPS
        if (
            self.total_steps
            and self.total_steps > measured
            and self.estimate is None
            and len(self.durations) == measured
        ):
            self.estimate = estimate_line(self.median(), self.total_steps, measured=ESTIMATE_STEPS)
            print(f"{self.program}: {self.estimate}", file=sys.stderr, flush=True)

    def median(self, skip: int = WARMUP_STEPS) -> float | None:
        """Median step time in seconds, without the first `skip` steps (tracing) when possible."""
        values = self.durations[skip:] if len(self.durations) > skip else self.durations
        return statistics.median(values) if values else None


def estimate_line(step_seconds: float, steps: int, *, measured: int) -> str:
    """ "estimated N min for S steps (x ms a step, median of `measured` steps after the warm-up)"."""
    minutes = step_seconds * steps / 60
    shown = f"{minutes:.1f}" if minutes < 100 else f"{minutes:,.0f}"
    return (
        f"estimated {shown} min for {steps:,} steps ({step_seconds * 1e3:.3g} ms a step, median of {measured} "
        f"steps after {WARMUP_STEPS} warm-up steps)"
    )


__all__ = ["ESTIMATE_STEPS", "WARMUP_STEPS", "StepTimer", "estimate_line"]
