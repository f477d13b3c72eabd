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

  0. the subset: every training row is kept independently with probability
     p = M / N (a coin per row, drawn in row order from the run's seeded
     RNG, never looking at the row), expected size M = `subset_rows(N, eps_c)`;
  1. one pass over the kept rows: h_b = #{i : clip(f(x_i), -L, L) in bin b}
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

Subset and privacy. The sensitivity stays 2, and the subset can only lower
the privacy loss: for D' = D plus a row x, x is kept with probability p
independently of the other coins, so the output on D' is the mixture
(1 - p) A(S) + p A(S + x) with S the subset of D; both parts are within
e^eps_c of A(S), hence the mixture is (eps_c, 0)-DP (in fact
log(1 + p (e^eps_c - 1)) <= eps_c, Poisson subsampling). The ledger keeps
the unamplified `LaplaceDpEvent(1 / eps_c)`, an upper bound. p uses N, which
the pipeline treats as public (as q = B / N for training). Why per-row
coins and not a fixed-size subset (the first M rows of a seeded shuffle):
with a fixed size, adding a row can push another one out, a substitution
that moves one bin down, another up and Y by 1 (L1 up to 3 > 2), so the
Laplace(2 / eps_c) release would no longer be eps_c-DP for add/remove-one.
The coins also need no shuffle: one pass in row order (in memory: each
batch of rows is a view, and only the kept rows are gathered; streaming:
the files are read once and only the kept rows go through the model).

Accuracy and the choice of M. The noise on sum_b h~_b sigmoid(c_b + s) has
sd at most sqrt(2 x BINS) x 2 / eps_c (plus sqrt(2) x 2 / eps_c on Y~);
divided by the M rows it is the noise on the click rate the shift matches,
sqrt(2 (BINS + 1)) x (2 / eps_c) / M. The subset adds its sampling error:
the mean of y - f over M of the N rows differs from the mean over all of
them by sd sigma x sqrt(1 / M - 1 / N), with sigma <= `LABEL_SD` = 1/2
(the sd of a 0/1 label; the predictions, on the same rows and positively
correlated with the labels, only reduce it). M is the smallest expected
size at which the two together (in quadrature) are `SUBSET_TARGET_ERROR`,
half the skip limit `MAX_CLICK_RATE_ERROR`, and at most N: the calibration
stays well inside the accuracy that makes it worth running, while its
forward pass reads a number of rows set by eps_c (tens of thousands at the
pipeline's default eps_c), not by N. Both parts are public (N, eps_c and
the bins fix them), so `expected_click_rate_error` is known before the run.

References: Chen, Wu & Hong, "Understanding Gradient Clipping in Private SGD:
A Geometric Perspective", NeurIPS 2020 (clipping bias); Dwork et al. 2006
(Laplace mechanism); Cox 1958 / Van Calster et al. 2016 (calibration-in-the-large).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable, Iterator, Sequence

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


LABEL_SD = 0.5
"""Bound on the sd of y - f(x) per row used for the subset's sampling error: the sd of a 0/1 label."""

SUBSET_TARGET_ERROR = MAX_CLICK_RATE_ERROR / 2
"""The subset is the smallest whose expected click-rate error (noise and sampling) is this, at most N rows."""


def _noise_term(epsilon: float) -> float:
    """A with noise sd on the click rate = A / M: sqrt(2 (BINS + 1)) x 2 / eps_c."""
    return math.sqrt(2.0 * (BINS + 1)) * (L1_SENSITIVITY / float(epsilon))


def subset_rows(rows: int, epsilon: float) -> int:
    """M: the expected number of training rows the calibration reads, for N = `rows` at eps_c = `epsilon`.

    The smallest M whose expected error (`expected_click_rate_error`) is
    `SUBSET_TARGET_ERROR`, capped at N: with a = A^2, s = `LABEL_SD`,
    u = 1 / M solves a u^2 + s^2 u = T^2 + s^2 / N, so

        M = min(N, ceil(2 a / (sqrt(s^4 + 4 a (T^2 + s^2 / N)) - s^2)))

    Returns N for N < 1 or eps_c <= 0 (nothing to subsample).
    """
    rows = int(rows)
    if rows < 1 or not epsilon > 0:
        return max(rows, 0)
    a, s2, t2 = _noise_term(epsilon) ** 2, LABEL_SD**2, SUBSET_TARGET_ERROR**2
    root = math.sqrt(s2 * s2 + 4.0 * a * (t2 + s2 / rows))
    return min(rows, math.ceil(2.0 * a / (root - s2)))


def expected_click_rate_error(rows: int, epsilon: float) -> float:
    """Sd of the calibration's error on the click rate it matches, known before it runs (N = `rows`).

        sd = sqrt((A / M)^2 + s^2 (1 / M - 1 / N)),  A = sqrt(2 (BINS + 1)) x 2 / eps_c,  M = subset_rows(N, eps_c)

    The bins' Laplace(2 / eps_c) noise, weighted by sigmoid <= 1, and the
    click count's add in quadrature (a Laplace(b) draw has sd sqrt(2) b);
    divided by M it is the noise on the subset's mean prediction. The
    second term is the subset's sampling error (s = `LABEL_SD`; 0 when M = N).
    """
    if not epsilon > 0 or rows < 1:
        return math.inf
    subset = subset_rows(rows, epsilon)
    sampling = LABEL_SD**2 * max(0.0, 1.0 / subset - 1.0 / int(rows))
    return math.sqrt((_noise_term(epsilon) / subset) ** 2 + sampling)


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
        f"eps_c {epsilon:.3g}) would move the mean prediction by about {error:.2g} (sd) on "
        f"{subset_rows(rows, epsilon):,} of {rows:,} rows, more than the {MAX_CLICK_RATE_ERROR:g} allowed; its "
        "epsilon went to training"
    )


@dataclasses.dataclass(frozen=True)
class OutputCalibration:
    """What the calibration released and did.

    Attributes:
      epsilon: eps_c (pure DP).
      shift: s, added to the output bias.
      noisy_clicks: Y~ (DP).
      noisy_rows: sum of the noisy bin counts (DP).
      rows: N, the training rows the subset was drawn from (None: every row was read, no subset).
      subset_rows: M, the subset's expected size (`subset_rows`).
      sampling_probability: p = M / N, each row's chance to be read.
      rows_read: the subset's actual size (a function of N and the coins only).
      bins, logit_range: the public histogram grid.
    """

    epsilon: float
    shift: float
    noisy_clicks: float
    noisy_rows: float
    rows: int | None = None
    subset_rows: int | None = None
    sampling_probability: float = 1.0
    rows_read: int | None = None
    bins: int = BINS
    logit_range: float = LOGIT_RANGE

    @property
    def event(self) -> dp_accounting.DpEvent:
        return calibration_event(self.epsilon)

    def report(self) -> dict:
        return dataclasses.asdict(self) | {
            "mechanism": "Laplace histogram of logits + click count, L1 sensitivity 2, on a Bernoulli(p) row subset"
        }


def calibration_event(epsilon: float) -> dp_accounting.DpEvent:
    """The `dp_accounting` event of one calibration at eps_c: `LaplaceDpEvent(1 / eps_c)` (eps_c-DP)."""
    if not epsilon > 0:
        raise ValueError(f"The calibration epsilon must be > 0; received {epsilon!r}.")
    return dp_accounting.LaplaceDpEvent(1.0 / float(epsilon))


def row_subset(batches: Iterable, *, probability: float, rng: np.random.Generator) -> Iterator[tuple]:
    """The rows of `(features, labels)` batches each kept with `probability`, by a coin per row drawn in row order.

    The coins come from `rng` alone (never from the rows), one
    `rng.random()` per row, so the subset depends only on the seed and the
    row positions, however the rows are cut into batches. Only the kept
    rows are gathered (`np.take`); a batch with none kept is skipped.
    `probability` >= 1 yields every batch as it is and draws nothing.

    Raises:
      ValueError: `probability` not in (0, 1].
    """
    if not 0.0 < probability <= 1.0:
        raise ValueError(f"`probability` must lie in (0, 1]; received {probability!r}.")
    for features, labels in batches:
        if probability >= 1.0:
            yield features, labels
            continue
        labels = np.asarray(labels)
        kept = np.flatnonzero(rng.random(labels.shape[0]) < probability)
        if kept.size:
            yield {name: np.take(np.asarray(value), kept, axis=0) for name, value in features.items()}, labels[kept]


def logit_histogram(model, batches: Iterable) -> tuple[np.ndarray, float, int]:
    """(bin counts [BINS], clicks, rows) of the model's clipped logits over batched `(features, labels)`.

    Every row lands in exactly one bin and adds at most 1 to the clicks,
    whatever its values, so the release's L1 sensitivity stays 2: logits
    are clipped to [-L, L] (+-inf to the end bins, NaN to the middle bin,
    logit 0) and labels to [0, 1] (NaN counts as 0). A non-finite value is
    clipped like any other, never an error: an error would depend on one
    row (whether the calibration, hence the release, happens at all).
    """
    labels, logits = criteo_eval.predict_logits(model, batches)
    logits = np.clip(np.nan_to_num(np.asarray(logits, np.float64).reshape(-1), nan=0.0), -LOGIT_RANGE, LOGIT_RANGE)
    clicks = np.clip(np.nan_to_num(np.asarray(labels, np.float64).reshape(-1), nan=0.0), 0.0, 1.0)
    index = np.clip(np.floor((logits + LOGIT_RANGE) / BIN_WIDTH).astype(np.int64), 0, BINS - 1)
    return np.bincount(index, minlength=BINS).astype(np.int64), float(np.sum(clicks)), int(clicks.size)


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


def calibrate_output(
    model, datasets: Sequence[Iterable], *, epsilon: float, rows: int | None = None, seed: int | None = None
) -> OutputCalibration:
    """Runs the DP calibration on a Bernoulli subset of the training rows and shifts the output bias in place.

    Args:
      model: the trained pCTR model (flushed: no owed noise), with a Dense
        layer `click_logit`.
      datasets: batched `(features, labels)` iterables (tf.data datasets or
        numpy batches, e.g. `data.row_batches`) covering every training row once.
      epsilon: eps_c > 0.
      rows: N, the number of rows in `datasets`: each is read with
        probability `subset_rows(N, eps_c)` / N. None reads every row.
      seed: seed of the subset's coins and of the noise (None: OS entropy).

    Returns:
      The `OutputCalibration`.

    Raises:
      ValueError: eps_c <= 0 or `rows` < 1 (never the data: non-finite logits or labels are clipped,
        see `logit_histogram`).
    """
    calibration_event(epsilon)  # validates epsilon
    if rows is not None and rows < 1:
        raise ValueError(f"`rows` must be >= 1 (the training rows N) or None; received {rows!r}.")
    subset = None if rows is None else subset_rows(rows, epsilon)
    probability = 1.0 if rows is None or subset is None else subset / rows  # subset: None iff rows is
    seeds = np.random.SeedSequence(seed)
    noise_rng, coins = np.random.default_rng(seeds), np.random.default_rng(seeds.spawn(1)[0])
    kept = row_subset(itertools.chain.from_iterable(datasets), probability=probability, rng=coins)
    counts, clicks, read = logit_histogram(model, kept)
    noisy_counts, noisy_clicks = noisy_release(counts, clicks, epsilon=epsilon, rng=noise_rng)
    shift = solve_shift(noisy_counts, noisy_clicks)
    bias = model.get_layer(OUTPUT_LAYER).bias
    bias.assign_add(tf.fill(tf.shape(bias), tf.cast(shift, bias.dtype)))
    return OutputCalibration(
        epsilon=float(epsilon),
        shift=float(shift),
        noisy_clicks=float(noisy_clicks),
        noisy_rows=float(noisy_counts.sum()),
        rows=rows,
        subset_rows=subset,
        sampling_probability=probability,
        rows_read=read,
    )


__all__ = [
    "BINS",
    "LABEL_SD",
    "SUBSET_TARGET_ERROR",
    "OutputCalibration",
    "calibrate_output",
    "MAX_CLICK_RATE_ERROR",
    "calibration_event",
    "expected_click_rate_error",
    "logit_histogram",
    "noisy_release",
    "row_subset",
    "skip_reason",
    "solve_shift",
    "subset_rows",
]
