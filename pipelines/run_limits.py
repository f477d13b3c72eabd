"""Requests no machine can serve, refused in one line before any calibration or training.

Two limits, shared by the three pipelines:

* steps: at most `MAX_STEPS` (10 million) training steps per run (per period for
  Criteo's streaming periods). `check_epochs` refuses an `--epochs` alone above
  it when the flags are parsed (an epoch is at least one step); `check_steps`
  refuses the steps the data implies (epochs x batches per epoch, from the
  DP-released size N~) before the noise is calibrated.
* memory: `check_memory` refuses what would not fit in this machine's
  physical memory (the estimate is a lower bound: the tables, or Sequential's
  per-step full-softmax logits), instead of failing at the first step.

Example:
    >>> check_steps(4 * 1000, what="`--epochs` 4 x 1,000 batches per epoch", fix="lower --epochs")
    4000
"""

from __future__ import annotations

import argparse
import os

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


__all__ = ["MAX_STEPS", "check_epochs", "check_memory", "check_steps", "machine_memory"]
