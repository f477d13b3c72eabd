"""An epsilon lower bound from one training run: Steinke, Nasr & Jagielski's one-run audit.

m canaries are each included in the training data independently with
probability 1/2. After training, the auditor scores every canary from what
was released (higher = "looks included"), guesses "in" for the k+ highest
scores and "out" for the k- lowest, and abstains on the rest. With r = k+ + k-
guesses of which v are correct:

    epsilon-DP:          P[v correct] is dominated by Binomial(r, e^eps / (1 + e^eps))   (Theorem 3.1)
    (epsilon, delta)-DP: p(eps) = P[Binomial(r, q) >= v] + 2 m delta max_{1<=i<=v} P[v - i <= Binomial(r, q) < v] / i
                         with q = e^eps / (1 + e^eps)                       (Corollary 5.4, Appendix D)

An observed v with p(eps) <= 1 - confidence rejects the hypothesis "the
training run is (eps, delta)-DP"; it then rejects every eps' <= eps too (an
(eps', delta)-DP run is (eps, delta)-DP). The reported lower bound is the
largest such eps, found by bisection and rounded down.

Choosing (k+, k-) after seeing the scores costs a union bound: the best of G
candidate pairs is reported with each pair tested at (1 - confidence) / G, so
the bound holds with probability >= confidence over the canaries' coin flips
and the training randomness together. Ties between scores are broken by
canary index, which does not depend on the coin flips.

Example:
    >>> bound = epsilon_lower_bound(scores, included, delta=1e-5, confidence=0.95)
    >>> bound.epsilon_lb, bound.correct, bound.k_plus, bound.k_minus

References: Steinke, Nasr & Jagielski, "Privacy Auditing with One (1) Training
Run", NeurIPS 2023: §3 (Algorithm 1, Theorem 3.1), §5 (Corollary 5.4, the
delta term), Appendix D (the p-value and the bisection for epsilon).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from scipy import special, stats

#: Shares of the m canaries the default grid guesses on; each share is tried
#: one-sided (all "in") and two-sided (half "in", half "out").
DEFAULT_GUESS_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)

_BISECTION_STEPS = 60
_EPSILON_TOLERANCE = 1e-7


class GuessTotals:
    """`guesses` (r = k+ + k-) and `as_dict` for a bound dataclass with `k_plus` and `k_minus`."""

    k_plus: int
    k_minus: int

    @property
    def guesses(self) -> int:
        """r = k+ + k-."""
        return self.k_plus + self.k_minus

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "guesses": self.guesses}  # type: ignore[call-overload]


@dataclasses.dataclass(frozen=True)
class OneRunBound(GuessTotals):
    """The one-run audit's epsilon lower bound and the guesses it came from.

    Attributes:
      epsilon_lb: with probability >= `confidence`, the run is not (eps, delta)-DP
        for any eps < epsilon_lb (0.0: nothing could be rejected).
      k_plus: "in" guesses of the best (k+, k-) pair.
      k_minus: "out" guesses of that pair.
      correct: correct guesses of that pair (out of k_plus + k_minus).
      confidence: the stated confidence, over all pairs of the grid together.
      delta: the delta of the rejected hypotheses.
      num_canaries: m.
      num_guess_pairs: G, the grid size the union bound divided by.
    """

    epsilon_lb: float
    k_plus: int
    k_minus: int
    correct: int
    confidence: float
    delta: float
    num_canaries: int
    num_guess_pairs: int


def one_run_p_value(*, num_canaries: int, guesses: int, correct: int, epsilon: float, delta: float) -> float:
    """p(eps): probability of >= `correct` correct guesses out of `guesses` under (epsilon, delta)-DP.

    p = P[Binomial(r, q) >= v] + 2 m delta max_{1<=i<=v} P[v - i <= Binomial(r, q) < v] / i,
    q = e^eps / (1 + e^eps); the delta term is absent when delta = 0.

    Args:
      num_canaries: m (each included independently with probability 1/2).
      guesses: r <= m, the guesses made (abstentions excluded).
      correct: v <= r.
      epsilon: eps >= 0 of the null hypothesis.
      delta: delta in [0, 1) of the null hypothesis.

    Returns:
      The p-value, at most 1.

    References: Steinke, Nasr & Jagielski 2023, Theorem 3.1, Corollary 5.4, Appendix D.
    """
    m, r, v = int(num_canaries), int(guesses), int(correct)
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= correct <= guesses <= num_canaries; received {v}, {r}, {m}.")
    if not epsilon >= 0:
        raise ValueError(f"`epsilon` must be >= 0; received {epsilon!r}.")
    q = float(special.expit(epsilon))
    tail = float(stats.binom.sf(v - 1, r, q))  # P[Binomial(r, q) >= v]
    if delta == 0 or v == 0:
        return min(tail, 1.0)
    # P[v - i <= B < v] for i = 1..v: cumulative sums of pmf(v - 1), pmf(v - 2), ..., pmf(0).
    below = np.cumsum(stats.binom.pmf(np.arange(v - 1, -1, -1), r, q))
    worst = float(np.max(below / np.arange(1, v + 1)))
    return min(tail + 2.0 * m * delta * worst, 1.0)


def epsilon_for_counts(*, num_canaries: int, guesses: int, correct: int, delta: float, significance: float) -> float:
    """The largest eps whose (eps, delta)-DP hypothesis `correct` of `guesses` rejects at `significance`.

    Bisection on p(eps) <= significance (Appendix D), rounded down; 0.0 when
    even eps = 0 is not rejected.

    References: Steinke, Nasr & Jagielski 2023, Appendix D.
    """

    def rejected(eps: float) -> bool:
        p = one_run_p_value(num_canaries=num_canaries, guesses=guesses, correct=correct, epsilon=eps, delta=delta)
        return p <= significance

    if correct == 0 or not rejected(0.0):
        return 0.0
    low, high = 0.0, 1.0
    while rejected(high):  # terminates: q -> 1 makes P[B >= v] -> 1 > significance
        low, high = high, 2.0 * high
    for _ in range(_BISECTION_STEPS):
        if high - low <= _EPSILON_TOLERANCE:
            break
        middle = 0.5 * (low + high)
        low, high = (middle, high) if rejected(middle) else (low, middle)
    return low


def default_guess_pairs(num_canaries: int) -> tuple[tuple[int, int], ...]:
    """(k+, k-) pairs: r = max(1, round(f m)) for f in `DEFAULT_GUESS_FRACTIONS`, as (r, 0) and (ceil(r/2), r//2)."""
    pairs: list[tuple[int, int]] = []
    for fraction in DEFAULT_GUESS_FRACTIONS:
        r = max(1, round(fraction * num_canaries))
        for pair in ((r, 0), ((r + 1) // 2, r // 2)):
            if pair not in pairs:
                pairs.append(pair)
    return tuple(pairs)


def count_correct(scores: np.ndarray, included: np.ndarray, k_plus: int, k_minus: int) -> int:
    """Correct guesses when the k+ highest scores are guessed "in" and the k- lowest "out" (ties: lower index first)."""
    order = np.argsort(-scores, kind="stable")
    guessed_in = order[:k_plus]
    guessed_out = order[scores.size - k_minus :] if k_minus else order[:0]
    return int(included[guessed_in].sum() + (~included[guessed_out]).sum())


def _check_inputs(scores, included, delta, confidence) -> tuple[np.ndarray, np.ndarray, float, float]:
    values = np.asarray(scores, dtype=np.float64)
    flags = np.asarray(included)
    if values.ndim != 1 or flags.ndim != 1:
        raise ValueError(f"`scores` and `included` must be 1-D; received shapes {values.shape} and {flags.shape}.")
    if values.size != flags.size:
        raise ValueError(
            f"`scores` ({values.size}) and `included` ({flags.size}) must have one entry per canary (lengths differ)."
        )
    if not np.isfinite(values).all():
        raise ValueError(f"`scores` must be finite; {int((~np.isfinite(values)).sum())} are NaN or infinite.")
    if flags.dtype != np.bool_ and not np.isin(flags, (0, 1)).all():
        raise ValueError("`included` must be booleans (or 0/1): whether each canary was put into the training data.")
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0 < confidence < 1:
        raise ValueError(f"`confidence` must be a number in the open interval (0, 1); received {confidence!r}.")
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 <= delta < 1:
        raise ValueError(f"`delta` must be a number in [0, 1); received {delta!r}.")
    return values, flags.astype(bool), float(delta), float(confidence)


def _check_pairs(guesses, m: int) -> tuple[tuple[int, int], ...]:
    pairs = default_guess_pairs(m) if guesses is None else tuple(tuple(pair) for pair in guesses)
    if not pairs:
        raise ValueError("`guesses` must hold at least one (k_plus, k_minus) pair.")
    for pair in pairs:
        ok = len(pair) == 2 and all(isinstance(k, (int, np.integer)) and not isinstance(k, bool) for k in pair)
        if not ok or min(pair) < 0 or not 1 <= pair[0] + pair[1] <= m:
            raise ValueError(
                f"each `guesses` entry must be a pair of ints (k_plus, k_minus) >= 0 with 1 <= k_plus + k_minus "
                f"<= m = {m}; received {pair!r}."
            )
    return tuple((int(a), int(b)) for a, b in pairs)


def epsilon_lower_bound(
    scores,
    included,
    *,
    delta: float,
    confidence: float = 0.95,
    guesses: Sequence[tuple[int, int]] | None = None,
) -> OneRunBound:
    """The one-run audit: the largest eps rejected by the best (k+, k-) guess pair, union-bounded over the pairs.

    Args:
      scores: [m] canary scores from the released model, higher = "looks included".
      included: [m] booleans, whether each canary was in the training data (drawn with probability 1/2).
      delta: delta of the hypotheses (eps, delta)-DP tested, in [0, 1) (keyword-only).
      confidence: in (0, 1); the bound holds with at least this probability.
      guesses: (k+, k-) pairs to try; default `default_guess_pairs(m)`. Each is
        tested at (1 - confidence) / len(guesses).

    Returns:
      A `OneRunBound` (the pair with the largest bound; the first such pair on ties).

    Raises:
      ValueError: lengths differ, non-finite scores, confidence outside (0, 1),
        delta outside [0, 1), a pair outside 1 <= k+ + k- <= m, or m so small
        that m correct guesses out of m could not reject even eps = 0.

    References: Steinke, Nasr & Jagielski 2023, Algorithm 1, Theorem 3.1, Corollary 5.4.
    """
    values, flags, delta, confidence = _check_inputs(scores, included, delta, confidence)
    m = int(values.size)
    pairs = _check_pairs(guesses, max(m, 1))
    significance = (1.0 - confidence) / len(pairs)
    if m == 0 or m * math.log(2.0) < -math.log(significance):
        needed = math.ceil(-math.log2(significance))
        raise ValueError(
            f"{m} canaries are too few: even {m} correct guesses out of {m} (probability 2^-{m} at eps = 0) "
            f"cannot reach the significance (1 - confidence) / {len(pairs)} pairs = {significance:.3g}; "
            f"use at least {needed} canaries (hundreds for a useful bound)."
        )
    best = (-1.0, 0, 0, 0)
    for k_plus, k_minus in pairs:
        correct = count_correct(values, flags, k_plus, k_minus)
        eps = epsilon_for_counts(
            num_canaries=m, guesses=k_plus + k_minus, correct=correct, delta=delta, significance=significance
        )
        if eps > best[0]:  # the first pair wins ties
            best = (eps, k_plus, k_minus, correct)
    eps, k_plus, k_minus, correct = best
    return OneRunBound(eps, k_plus, k_minus, correct, confidence, delta, m, len(pairs))


__all__ = [
    "DEFAULT_GUESS_FRACTIONS",
    "OneRunBound",
    "count_correct",
    "default_guess_pairs",
    "epsilon_for_counts",
    "epsilon_lower_bound",
    "one_run_p_value",
]
