"""DP calibration-in-the-large: shift the click logit so the mean prediction matches the click rate.

Why. DP-SGD clips every example's gradient to norm C. When clipping binds
for (almost) every example, each one pushes the logit with the same force C
whatever its error, so the net push on the intercept direction is set by
the class COUNTS, not by the errors: with 78% non-clicks the model keeps
lowering every logit until the non-clicks' gradients fall below C, i.e.
until it predicts far fewer clicks than there are (clipping bias; Chen, Wu &
Hong, NeurIPS 2020). The ranking (AUC) is barely affected; the intercept,
hence the log loss and the mean prediction, is. Smaller learning rates, no
momentum or larger batches do not remove it; a larger clip norm shrinks it
only at the cost of more noise. The measurements (the Kaggle sample, with
and without this calibration) are in `benchmarks/RESULTS.md`, "Criteo, real
rows: AUC vs ε" (`python -m benchmarks.criteo_realdata --diagnose`).

Fix (post-training, accounted). With the trained model f fixed (the output
of an earlier DP mechanism; adaptive composition):

  1. one pass over the training rows: h_b = #{i : clip(f(x_i), -L, L) in bin b}
     over `BINS` fixed, public bins of width w on [-L, L], and Y = sum_i y_i;
  2. add Laplace(2 / eps_c) noise to every h_b and to Y: one row changes one
     bin by 1 and Y by at most 1 (add/remove-one), L1 sensitivity 2, so the
     release is (eps_c, 0)-DP (`event`: `LaplaceDpEvent(1 / eps_c)`);
  3. post-processing: s solves sum_b h~_b sigmoid(c_b + s) = Y~ (bin centres
     c_b; bisection on [-S, S]) and the output bias becomes b + s.

The rest of the model, hence the AUC, is unchanged (a monotone shift). The
pipeline spends eps_c = `calibration_fraction` x epsilon on it: training
(and any DP selection) is calibrated for epsilon - eps_c (basic
composition), and every ledger holds the Laplace event, so the reported
epsilon composes it with the rest. Memory: the bins, independent of N.

Accuracy: the noise on sum_b h~_b sigmoid(c_b + s) has sd at most
sqrt(2 x BINS) x 2 / eps_c (plus sqrt(2) x 2 / eps_c on Y~); divided by the
slope sum_i p_i (1 - p_i) it bounds the sd of s, so the error of the shift
shrinks as 1 / (N eps_c).

References: Chen, Wu & Hong, "Understanding Gradient Clipping in Private SGD:
A Geometric Perspective", NeurIPS 2020 (clipping bias); Dwork et al. 2006
(Laplace mechanism); Cox 1958 / Van Calster et al. 2016 (calibration-in-the-large).
"""

from __future__ import annotations

import dataclasses
import math

import dp_accounting
import numpy as np

from pipelines.criteo import evaluation as criteo_eval
from tfdp_embed import tf

LOGIT_RANGE = 10.0
BIN_WIDTH = 0.5
BINS = int(2 * LOGIT_RANGE / BIN_WIDTH)
MAX_SHIFT = 20.0
L1_SENSITIVITY = 2.0
OUTPUT_LAYER = "click_logit"


MAX_CLICK_RATE_ERROR = 0.01
"""Largest noise (sd, on the click-rate scale) at which the calibration is run: one percentage point."""


def expected_click_rate_error(rows: int, epsilon: float) -> float:
    """Sd of the calibration's own noise on the click rate it matches, known before it runs.

        sd <= sqrt(2 (BINS + 1)) x (2 / eps_c) / N

    The bins' Laplace(2 / eps_c) noise, weighted by sigmoid <= 1, and the
    click count's add in quadrature (a Laplace(b) draw has sd sqrt(2) b);
    divided by N it is the error of the mean prediction the shift aims at.
    """
    if not epsilon > 0 or rows < 1:
        return math.inf
    return math.sqrt(2.0 * (BINS + 1)) * (L1_SENSITIVITY / float(epsilon)) / int(rows)


def skip_reason(rows: int, epsilon: float) -> str | None:
    """Why the calibration cannot help on N = `rows` at eps_c = `epsilon`, or None when it is worth running.

    Its noise is public (N, eps_c and the bins fix it). When it exceeds
    `MAX_CLICK_RATE_ERROR` it is comparable to the clipping bias it is meant
    to correct (on a Criteo-1TB-like click rate of 2-3%, a mean prediction
    of 0.2% needs a correction of about 2 points) and would move the mean
    prediction by noise, not signal: skipped, its epsilon is better spent
    on training.
    """
    error = expected_click_rate_error(rows, epsilon)
    if error <= MAX_CLICK_RATE_ERROR:
        return None
    return (
        f"its Laplace noise (scale {L1_SENSITIVITY / epsilon:.3g} on the click count and on each of {BINS} bins, at "
        f"eps_c {epsilon:.3g}) would move the mean prediction by about {error:.2g} (sd) on {rows:,} rows, more than "
        f"the {MAX_CLICK_RATE_ERROR:g} allowed; its epsilon went to training"
    )


@dataclasses.dataclass(frozen=True)
class OutputCalibration:
    """What the calibration released and did.

    Attributes:
      epsilon: eps_c (pure DP).
      shift: s, added to the output bias.
      noisy_clicks: Y~ (DP).
      noisy_rows: sum of the noisy bin counts (DP).
      bins, logit_range: the public histogram grid.
    """

    epsilon: float
    shift: float
    noisy_clicks: float
    noisy_rows: float
    bins: int = BINS
    logit_range: float = LOGIT_RANGE

    @property
    def event(self) -> dp_accounting.DpEvent:
        return calibration_event(self.epsilon)

    def report(self) -> dict:
        return dataclasses.asdict(self) | {"mechanism": "Laplace histogram of logits + click count, L1 sensitivity 2"}


def calibration_event(epsilon: float) -> dp_accounting.DpEvent:
    """The `dp_accounting` event of one calibration at eps_c: `LaplaceDpEvent(1 / eps_c)` (eps_c-DP)."""
    if not epsilon > 0:
        raise ValueError(f"The calibration epsilon must be > 0; received {epsilon!r}.")
    return dp_accounting.LaplaceDpEvent(1.0 / float(epsilon))


def logit_histogram(model, datasets) -> tuple[np.ndarray, float]:
    """(bin counts [BINS], clicks) of the model's clipped logits over batched `(features, labels)` datasets."""
    counts = np.zeros(BINS, np.int64)
    clicks = 0.0
    for dataset in datasets:
        labels, logits = criteo_eval.predict_logits(model, dataset)
        if not np.all(np.isfinite(logits)):
            raise ValueError("The model gives non-finite logits on training rows; calibration needs a finite model.")
        index = np.clip(((logits + LOGIT_RANGE) / BIN_WIDTH).astype(np.int64), 0, BINS - 1)
        counts += np.bincount(index, minlength=BINS)
        clicks += float(np.sum(labels))
    return counts, clicks


def noisy_release(counts: np.ndarray, clicks: float, *, epsilon: float, rng: np.random.Generator):
    """The DP release: Laplace(2 / eps_c) on every bin count and on the click count ((eps_c, 0)-DP).

    Returns:
      (noisy counts float64 [BINS], noisy clicks).
    """
    scale = L1_SENSITIVITY / float(epsilon)
    counts = np.asarray(counts, np.float64)
    return counts + rng.laplace(0.0, scale, size=counts.shape), float(clicks) + rng.laplace(0.0, scale)


def solve_shift(counts: np.ndarray, clicks: float) -> float:
    """s with sum_b counts_b sigmoid(c_b + s) = clicks (bisection; clamped to [-MAX_SHIFT, MAX_SHIFT])."""
    centres = -LOGIT_RANGE + BIN_WIDTH * (np.arange(BINS) + 0.5)
    counts = np.asarray(counts, np.float64)

    def excess(s):
        return float(np.sum(counts / (1.0 + np.exp(-(centres + s))))) - clicks

    lo, hi = -MAX_SHIFT, MAX_SHIFT
    if excess(lo) >= 0:
        return lo
    if excess(hi) <= 0:
        return hi
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if excess(mid) < 0:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def calibrate_output(model, datasets, *, epsilon: float, seed: int | None = None) -> OutputCalibration:
    """Runs the DP calibration on the training data and shifts the model's output bias in place.

    Args:
      model: the trained pCTR model (flushed: no owed noise), with a Dense
        layer `click_logit`.
      datasets: batched `(features, labels)` datasets covering every training row once.
      epsilon: eps_c > 0.
      seed: noise seed (None: OS entropy).

    Returns:
      The `OutputCalibration`.

    Raises:
      ValueError: eps_c <= 0, or non-finite logits.
    """
    calibration_event(epsilon)  # validates epsilon
    counts, clicks = logit_histogram(model, datasets)
    noisy_counts, noisy_clicks = noisy_release(counts, clicks, epsilon=epsilon, rng=np.random.default_rng(seed))
    shift = solve_shift(noisy_counts, noisy_clicks)
    bias = model.get_layer(OUTPUT_LAYER).bias
    bias.assign_add(tf.fill(tf.shape(bias), tf.cast(shift, bias.dtype)))
    return OutputCalibration(
        epsilon=float(epsilon),
        shift=float(shift),
        noisy_clicks=float(noisy_clicks),
        noisy_rows=float(noisy_counts.sum()),
    )


__all__ = [
    "BINS",
    "OutputCalibration",
    "calibrate_output",
    "MAX_CLICK_RATE_ERROR",
    "calibration_event",
    "expected_click_rate_error",
    "logit_histogram",
    "noisy_release",
    "skip_reason",
    "solve_shift",
]
