"""Requests no machine can serve, refused in one line before any calibration or training.

Three limits, shared by the three pipelines:

* steps: at most `MAX_STEPS` (10 million) training steps per run (per period for
  Criteo's streaming periods). `check_epochs` refuses an `--epochs` alone above
  it when the flags are parsed (an epoch is at least one step); `check_steps`
  refuses the steps the data implies (epochs x batches per epoch, from the
  DP-released size N~) before the noise is calibrated.
* memory: `check_memory` refuses what would not fit in this machine's
  physical memory (the estimate is a lower bound: the tables, or Sequential's
  per-step full-softmax logits), instead of failing at the first step.
* time: `check_time` refuses a run whose estimated training time exceeds
  `--max-hours` (default `DEFAULT_MAX_HOURS`; 0 disables it). The estimate is
  measured before the noise is calibrated: a throwaway copy of the model takes
  non-private forward and backward passes (compiled, no optimizer update) on one
  batch of the real shape, and the step time times the planned steps (times
  `DP_STEP_FACTOR`) is the run's time; calibration is not counted. It reads no
  training batch, draws no training randomness and releases nothing.

Example:
    >>> check_steps(4 * 1000, what="`--epochs` 4 x 1,000 batches per epoch", fix="lower --epochs")
    4000
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

MAX_STEPS = 10_000_000
"""At 1 ms a step (a small model on an accelerator) this is ~3 hours; above it a request is a typo."""


def check_epochs(parser: argparse.ArgumentParser, epochs: int | None, max_steps: int | None = None) -> None:
    """Exits (status 2, argparse) for `--epochs` or `--max-steps` above `MAX_STEPS`."""
    if max_steps is not None and max_steps > MAX_STEPS:
        parser.error(f"--max-steps must be at most {MAX_STEPS:,}; received {max_steps:,}.")
    if max_steps is None and epochs is not None and epochs > MAX_STEPS:
        parser.error(
            f"--epochs {epochs:,} means at least {epochs:,} training steps (one per epoch at the least); at most "
            f"{MAX_STEPS:,} are allowed: lower --epochs or give --max-steps."
        )


def check_steps(steps: int, *, what: str, fix: str) -> int:
    """`steps` if at most `MAX_STEPS`; else ValueError naming `what` asked for them and `fix`.

    Args:
      steps: the run's training steps (after any `--max-steps`).
      what: how they came about, e.g. "`--epochs` 5 x 3,125 batches per epoch (N~ / `--batch`)".
      fix: what to change, e.g. "lower --epochs, raise --batch or give --max-steps".
    """
    if steps > MAX_STEPS:
        raise ValueError(f"{what} = {steps:,} training steps; at most {MAX_STEPS:,} are allowed: {fix}.")
    return steps


DEFAULT_MAX_HOURS = 24.0
"""`--max-hours`' default: a run estimated to train longer is refused (0 disables the check)."""
DP_STEP_FACTOR = 1.0
"""DP step / non-private step used by the estimate. benchmarks/RESULTS.md measures 0.81-1.60x for the sparse
mechanisms (eana, lazy, fest, adafest) step by step, 1.14-1.24x for the Criteo pipeline end to end (every
mechanism, dense included), 1.52x for MovieLens retrieval (lazy); only dense DP-SGD on a large table is far
above (6.9-331x at 10^5-10^7 rows). 1.0, the low end: a refused run would overrun the limit even without DP."""
PROBE_UNITS = 8
"""Units (examples, users, rows) of the first, cheap pass: scaled to the batch it bounds the step from above."""
TIMED_STEPS = 2
"""Full-batch passes timed after one full-batch warm-up; their median is the step time."""


def add_max_hours_flag(parser: argparse.ArgumentParser) -> None:
    """`--max-hours H` (default `DEFAULT_MAX_HOURS`; 0 disables the check)."""
    parser.add_argument(
        "--max-hours",
        type=float,
        default=DEFAULT_MAX_HOURS,
        metavar="H",
        help="refuse, before the noise is calibrated, a run whose training is estimated (from a few timed "
        "non-private steps of the model on one batch of the data's shape) to take more than H hours; 0: no check",
    )


def check_max_hours(parser: argparse.ArgumentParser, max_hours: float) -> float | None:
    """`max_hours`, None for 0 (no check); exits (status 2, argparse) for a negative or non-finite value."""
    if not (math.isfinite(max_hours) and max_hours >= 0):
        parser.error(f"--max-hours must be a finite number >= 0 (0: no check); received {max_hours!r}.")
    return max_hours or None


def check_time(
    step: Callable[[int], object], *, batch: int, steps: int, max_hours: float | None, what: str, fix: str
) -> float | None:
    """The estimated training seconds (None: not checked); ValueError when above `max_hours`.

    A first pass on `PROBE_UNITS` units (building the weights included) scaled to the batch bounds the step
    from above; when that bound already fits, nothing more runs. Otherwise one full-batch warm-up pass and
    `TIMED_STEPS` timed ones follow; their median, times `steps` and `DP_STEP_FACTOR`, is the estimate.

    Args:
      step: runs one non-private forward and backward pass on the first `n` units of a batch of the real shape.
      batch: the units of one batch (the expected Poisson batch); steps: the run's planned steps.
      max_hours: the limit; None or 0: no check. what, fix: as in `check_steps`.
    """
    if not max_hours or steps < 1:
        return None
    limit, probe = max_hours * 3600, max(1, min(batch, PROBE_UNITS))
    bound = _timed(step, probe) * batch / probe * steps * DP_STEP_FACTOR
    if bound <= limit:
        return bound
    step(batch)  # warm-up: the compiled pass traced at the batch's shape
    seconds = statistics.median(_timed(step, batch) for _ in range(TIMED_STEPS))
    estimate = seconds * steps * DP_STEP_FACTOR
    if estimate > limit:
        raise ValueError(
            f"{what} = {steps:,} training steps, estimated {_hours(estimate)} h at {seconds * 1e3:,.3g} ms a step "
            f"(a non-private forward and backward pass of the model on one batch of {batch:,}, median of "
            f"{TIMED_STEPS} after 1 warm-up, x {DP_STEP_FACTOR:g} for DP; calibration not counted), above "
            f"--max-hours {max_hours:g}: {fix}, or raise --max-hours (0: no check)."
        )
    return estimate


def gradient_pass(model, loss: Callable[[Any], object]) -> Callable[[Any], None]:
    """A non-private forward and backward pass compiled like a training step (`tf.function`, no update).

    `run(batch)` computes the gradient of `sum(loss(batch))` for `model`'s trainable variables and waits
    for it; its first call runs `loss` once eagerly (a Keras model creates its weights on its first call).
    """
    from tfdp_embed import tf  # TensorFlow only where a pass runs: the flag checks import this module

    @tf.function(reduce_retracing=True)
    def compiled(batch):
        with tf.GradientTape() as tape:
            total = tf.reduce_sum(loss(batch))
        grads = tape.gradient(total, model.trainable_variables)
        values = [g.values if isinstance(g, tf.IndexedSlices) else g for g in grads if g is not None]
        return tf.add_n([tf.reduce_sum(v) for v in values]) if values else total

    built: list[bool] = []

    def run(batch) -> None:
        if not built:
            loss(batch)
            built.append(True)
        float(compiled(batch))

    return run


def _timed(step: Callable[[int], object], units: int) -> float:
    started = time.perf_counter()
    step(units)
    return time.perf_counter() - started


def _hours(seconds: float) -> str:
    hours = seconds / 3600
    return f"{hours:,.1f}" if hours < 1000 else f"{hours:,.0f}"


def machine_memory() -> int:
    """This machine's physical memory in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_memory(needed: int, *, what: str, fix: str) -> None:
    """ValueError when `needed` bytes (`what`) exceed `machine_memory()`; the message says how to `fix` it."""
    available = machine_memory()
    if needed > available:
        raise ValueError(
            f"{what} need about {_gb(needed)} GB, more than this machine's {_gb(available)} GB of memory: {fix}."
        )


def _gb(size: int) -> str:
    return f"{size / 1e9:,.3g}"


__all__ = [
    "DEFAULT_MAX_HOURS",
    "DP_STEP_FACTOR",
    "MAX_STEPS",
    "add_max_hours_flag",
    "check_epochs",
    "check_max_hours",
    "check_memory",
    "check_steps",
    "check_time",
    "gradient_pass",
    "machine_memory",
]
