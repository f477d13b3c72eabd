"""Stopping a Criteo run that diverged, before anything is exported.

A click model that diverged still exports: its log loss may be 400 and its
mean prediction 0, yet the SavedModel serves logits of -16,000. The run stops
instead, with `TrainingDivergedError` (exit status 1 from the CLI), when

* a training batch's loss is non-finite (DPModel's step refuses to clip a
  NaN/Inf loss; the non-private step reports it in its logs);
* (non-private runs only, `--mechanism none`) the training loss explodes:
  the mean loss of the last `WINDOW` batches exceeds `EXPLODE_FACTOR` x
  max(first batch's loss, log 2) (log 2 is the loss of predicting 1/2,
  which an untrained model is near). A DP run does not attach
  `DivergenceMonitor`: stopping on the un-noised training loss would make
  whether a model is released depend on single training rows, outside the
  guarantee (the library refuses `TerminateOnNaN` and `EarlyStopping` on
  training statistics for the same reason). A DP run is judged on the
  held-out evaluation rows (next item) instead;
* the released model, on the evaluation rows: non-finite log loss, log loss
  above `EXPLODE_FACTOR` x max(base-rate log loss, log 2), or a collapsed
  mean prediction (below `COLLAPSE_RATIO` x the click rate, or its
  complement below `COLLAPSE_RATIO` x the non-click rate).

The checks read the training loss and the evaluation predictions, which the
operator sees anyway (they are not released); a stopped run releases
nothing: no SavedModel, no report.

References: Goodfellow et al., Deep Learning (2016) §8.2.4 (exploding
gradients); Ponomareva et al., "How to DP-fy ML", JAIR 2023, §5 (monitoring
DP training).
"""

from __future__ import annotations

import math

from tfdp_embed import keras

EXPLODE_FACTOR = 4.0
WINDOW = 8
COLLAPSE_RATIO = 0.01
NON_FINITE_LOSS = "The per-example loss is NaN or Inf"
"""What DPModel's train step says when it refuses a non-finite loss."""


class TrainingDivergedError(ValueError):
    """Training diverged; nothing was exported. The message says what was seen and which flags to change."""


def advice(*, learning_rate: float, momentum: float, chosen: tuple = ()) -> str:
    """The flags to change after a divergence."""
    given = [f for f in ("learning_rate", "batch", "hidden_units") if f not in chosen]
    unset = (
        " or leave " + ", ".join("--" + f.replace("_", "-") for f in given) + " unset (defaults scaled to the data)"
        if given
        else ""
    )
    return (
        f"Nothing was exported. Lower --learning-rate (now {learning_rate:.4g}) or --momentum "
        f'(now {momentum:g}){unset}; see docs/pipelines.md, "Criteo pipeline: defaults scaled to the data".'
    )


class DivergenceMonitor(keras.callbacks.Callback):
    """Stops `fit` at the first non-finite or exploding training loss; `problem` says what was seen.

    Keras logs the epoch's running mean loss after each batch; the batch's
    own loss is recovered from two running means (equal batch weights).
    """

    def __init__(self, *, factor: float = EXPLODE_FACTOR, window: int = WINDOW):
        super().__init__()
        self.factor, self.window = float(factor), int(window)
        self.first: float | None = None
        self.recent: list[float] = []
        self.steps = 0
        self.problem: str | None = None
        self._running, self._seen = 0.0, 0

    def on_epoch_begin(self, epoch, logs=None):
        self._running, self._seen = 0.0, 0

    def on_train_batch_end(self, batch, logs=None):
        if logs is None or "loss" not in logs:
            return
        running = float(logs["loss"])
        seen = int(batch) + 1
        loss = running * seen - self._running * self._seen if seen > self._seen else running
        self._running, self._seen = running, seen
        self.steps += 1
        if not math.isfinite(running):
            return self._stop(f"the training loss became non-finite ({running}) at step {self.steps}")
        if self.first is None:
            self.first = loss
        self.recent = (self.recent + [loss])[-self.window :]
        mean = sum(self.recent) / len(self.recent)
        limit = self.factor * max(self.first, math.log(2.0))
        if len(self.recent) == self.window and mean > limit:
            self._stop(
                f"the training loss exploded: mean {mean:.4g} over the last {self.window} batches at step "
                f"{self.steps}, above {self.factor:g} x the starting loss ({limit:.4g})"
            )

    def _stop(self, problem: str) -> None:
        self.problem = problem
        self.model.stop_training = True


def released_model_problem(metrics: dict) -> str | None:
    """What is wrong with the released model's evaluation `metrics` (`evaluation.evaluate`), or None."""
    logloss, click_rate, mean = metrics.get("logloss"), metrics.get("click_rate"), metrics.get("mean_prediction")
    if not metrics.get("examples"):
        return None
    if logloss is None or not math.isfinite(logloss) or mean is None or not math.isfinite(mean):
        return f"the released model gives non-finite predictions (log loss {logloss}) on the evaluation rows"
    base = metrics.get("base_rate_logloss") or 0.0
    limit = EXPLODE_FACTOR * max(base, math.log(2.0))
    if logloss > limit:
        return (
            f"the released model's log loss {logloss:.4g} is above {EXPLODE_FACTOR:g} x max(base-rate log loss "
            f"{base:.4g}, log 2) = {limit:.4g} on the evaluation rows"
        )
    if mean < COLLAPSE_RATIO * click_rate or 1.0 - mean < COLLAPSE_RATIO * (1.0 - click_rate):
        return (
            f"the released model's mean prediction collapsed: {mean:.3g} for a click rate of {click_rate:.3g} "
            "on the evaluation rows"
        )
    return None


__all__ = [
    "COLLAPSE_RATIO",
    "EXPLODE_FACTOR",
    "NON_FINITE_LOSS",
    "DivergenceMonitor",
    "TrainingDivergedError",
    "advice",
    "released_model_problem",
]
