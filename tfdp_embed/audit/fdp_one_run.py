"""An epsilon (or mu) lower bound from one run under an f-DP trade-off curve: Mahloujifar, Melis & Chaudhuri.

The one-run game of `tfdp_embed.audit.one_run` (m canaries, each in with
probability 1/2; r guesses, v of them correct), analysed with the whole
trade-off curve f of the hypothesised mechanism instead of its (eps, delta)
pair alone. Under f-DP, flipping one canary's bit turns an event of
probability y into one of probability at least f^-1-blow-up(y) = f(1 - y):
the mass of wrong guesses is tied to the mass of right ones, canary by canary.
Assuming P[>= v correct] >= tau and walking the counts down from v,

    right_v = tau v / m,  wrong_v = tau (r - v) / m
    wrong_(i-1) = max(wrong_i, f(1 - right_i))
    right_(i-1) = min(right_i + (i - 1) / (r - i + 1) (wrong_(i-1) - wrong_i), 1)

gives lower bounds on the expected shares of right (right_0) and wrong
(wrong_0) guesses per canary; right_0 + wrong_0 > r / m (more than the r
guesses made) is a contradiction,
so P[>= v correct] < tau: the hypothesis "the run is f-DP" is rejected at
significance tau. The rejection is monotone in the curve's parameter, so the
largest rejected mu (or eps) is found by bisection, rounded down.

Two curve families:

    mu-GDP (Gaussian):  f(1 - y) = Phi(Phi^-1(y) - mu);  reported as mu, and as the eps at delta of mu-GDP
                        (the Gaussian mechanism with sensitivity 1 and std 1 / mu)
    (eps, delta)-DP:    f(1 - y) = max(0, e^-eps (y - delta), 1 - delta - e^eps (1 - y))

`audit_lower_bound` reports the tightest of Steinke et al.'s bound and these
two, each (guess pair, method) tested at (1 - confidence) / (pairs x methods),
and names the method. A Gaussian-curve bound rejects "the run is at least as
private as the Gaussian mechanism with this (eps, delta)": for DP-SGD, whose
curve is close to Gaussian, the tightest and the usual claim (JAX Privacy's
`epsilon_one_run_fdp`); the (eps, delta) curve assumes nothing beyond the
claimed pair.

Example:
    >>> audit = audit_lower_bound(scores, included, delta=1e-5, confidence=0.95)
    >>> audit.epsilon_lb, audit.method, audit.mu_lb

References: Mahloujifar, Melis & Chaudhuri, "Auditing f-Differential Privacy
in One Run", ICML 2025 (arXiv:2410.22235), §4 (the recursion on the shares,
Algorithm 3 with the cap on the guesses); Dong, Roth & Su, "Gaussian
Differential Privacy", JRSS-B 2022, §2 (f-DP, G_mu, Corollary 2.13: eps of
mu-GDP at delta); Steinke, Nasr & Jagielski, NeurIPS 2023 (the game).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import dp_accounting
from scipy import special

from tfdp_embed.audit.one_run import (
    GuessTotals,
    _check_inputs,
    _check_pairs,
    count_correct,
    default_guess_pairs,
    epsilon_for_counts,
)

#: The methods `audit_lower_bound` tries: Steinke et al.'s binomial bound and the two f-DP curves.
METHODS = ("steinke", "fdp-gaussian", "fdp-approx-dp")

_BISECTION_STEPS = 60
_TOLERANCE = 1e-7


def gaussian_inverse_blow_up(mu: float):
    """y -> Phi(Phi^-1(y) - mu) = f_mu(1 - y): the least probability of the event's flip under mu-GDP."""
    return lambda y: float(special.ndtr(special.ndtri(min(y, 1.0)) - mu))


def approx_dp_inverse_blow_up(epsilon: float, delta: float):
    """y -> max(0, e^-eps (y - delta), 1 - delta - e^eps (1 - y)) = f_(eps, delta)(1 - y)."""
    low, high = math.exp(-epsilon), math.exp(epsilon)
    return lambda y: max(0.0, low * (y - delta), 1.0 - delta - high * (1.0 - y))


def _check_counts(num_canaries: int, guesses: int, correct: int) -> tuple[int, int, int]:
    m, r, v = int(num_canaries), int(guesses), int(correct)
    if not 0 <= v <= r <= m or m == 0:
        raise ValueError(f"need 0 <= correct <= guesses <= num_canaries, m >= 1; received {v}, {r}, {m}.")
    return m, r, v


def fdp_rejects(inverse_blow_up, *, num_canaries: int, guesses: int, correct: int, significance: float) -> bool:
    """True when `correct` of `guesses` is impossible with probability >= `significance` under the curve.

    Args:
      inverse_blow_up: y -> f(1 - y) of the hypothesised trade-off curve f
        (`gaussian_inverse_blow_up`, `approx_dp_inverse_blow_up`).
      num_canaries: m.
      guesses: r <= m (abstentions excluded).
      correct: v <= r.
      significance: tau in (0, 1).

    Returns:
      Whether right_0 + wrong_0 > r / m (the hypothesis is rejected at `significance`).

    References: Mahloujifar, Melis & Chaudhuri 2025, §4 (Algorithm 3, with the cap on the guesses).
    """
    m, r, v = _check_counts(num_canaries, guesses, correct)
    right, wrong = significance * v / m, significance * (r - v) / m
    for i in range(v - 1, -1, -1):
        wrong_next = max(wrong, inverse_blow_up(right))
        if wrong_next == wrong:
            break  # neither share changes again
        right = min(right + i / (r - i) * (wrong_next - wrong), 1.0)
        wrong = wrong_next
    return bool(right + wrong > r / m)


def _largest_rejected(rejected) -> float:
    """The largest x >= 0 with rejected(x), given rejected is monotone (True below a point); 0.0 if not even x = 0."""
    if not rejected(0.0):
        return 0.0
    low, high = 0.0, 1.0
    while rejected(high):
        low, high = high, 2.0 * high
        if high > 1e6:
            return math.inf  # every finite parameter is rejected (only when the shares are degenerate)
    for _ in range(_BISECTION_STEPS):
        if high - low <= _TOLERANCE:
            break
        middle = 0.5 * (low + high)
        low, high = (middle, high) if rejected(middle) else (low, middle)
    return low


def mu_for_counts(*, num_canaries: int, guesses: int, correct: int, significance: float) -> float:
    """The largest mu whose mu-GDP hypothesis `correct` of `guesses` rejects at `significance` (0.0: none)."""

    def rejected(mu: float) -> bool:
        curve = gaussian_inverse_blow_up(mu)
        return fdp_rejects(
            curve, num_canaries=num_canaries, guesses=guesses, correct=correct, significance=significance
        )

    return _largest_rejected(rejected)


def gdp_epsilon(mu: float, delta: float) -> float:
    """eps of mu-GDP at delta: the Gaussian mechanism with sensitivity 1 and std 1 / mu (0.0 at mu = 0).

    References: Dong, Roth & Su 2022, Corollary 2.13.
    """
    if mu <= 0.0:
        return 0.0
    if math.isinf(mu) or delta <= 0.0:
        return math.inf
    return float(dp_accounting.get_epsilon_gaussian(1.0 / mu, delta))


def approx_dp_epsilon_for_counts(
    *, num_canaries: int, guesses: int, correct: int, delta: float, significance: float
) -> float:
    """The largest eps whose (eps, delta) trade-off curve `correct` of `guesses` rejects at `significance`."""

    def rejected(eps: float) -> bool:
        curve = approx_dp_inverse_blow_up(eps, delta)
        return fdp_rejects(
            curve, num_canaries=num_canaries, guesses=guesses, correct=correct, significance=significance
        )

    return _largest_rejected(rejected)


@dataclasses.dataclass(frozen=True)
class AuditBound(GuessTotals):
    """The tightest one-run bound over the methods, and where it came from.

    Attributes:
      epsilon_lb: the largest eps lower bound of any method (0.0: nothing rejected).
      method: the method that gave it (one of `METHODS`; the first listed on ties).
      mu_lb: the largest mu-GDP rejected (None when "fdp-gaussian" was not tried).
      by_method: method -> its best eps over the pairs.
      k_plus, k_minus, correct: the guess pair behind `epsilon_lb` and its correct guesses.
      confidence, delta, num_canaries: as given; m.
      num_tests: pairs x methods, the union bound's divisor.
    """

    epsilon_lb: float
    method: str
    mu_lb: float | None
    by_method: dict
    k_plus: int
    k_minus: int
    correct: int
    confidence: float
    delta: float
    num_canaries: int
    num_tests: int


def _method_epsilon(method: str, m: int, r: int, v: int, delta: float, significance: float) -> tuple:
    """(eps, mu or None) of one method for v correct of r."""
    if method == "steinke":
        return epsilon_for_counts(num_canaries=m, guesses=r, correct=v, delta=delta, significance=significance), None
    if method == "fdp-approx-dp":
        eps = approx_dp_epsilon_for_counts(num_canaries=m, guesses=r, correct=v, delta=delta, significance=significance)
        return eps, None
    mu = mu_for_counts(num_canaries=m, guesses=r, correct=v, significance=significance)
    return gdp_epsilon(mu, delta), mu


def _check_methods(methods) -> tuple[str, ...]:
    chosen = tuple(methods)
    unknown = [method for method in chosen if method not in METHODS]
    if not chosen or unknown or len(set(chosen)) != len(chosen):
        raise ValueError(f"`methods` must be distinct names from {METHODS}; received {methods!r}.")
    return chosen


def audit_lower_bound(
    scores,
    included,
    *,
    delta: float,
    confidence: float = 0.95,
    guesses: Sequence[tuple[int, int]] | None = None,
    methods: Sequence[str] = METHODS,
) -> AuditBound:
    """The tightest one-run eps lower bound of Steinke et al.'s and the f-DP analyses, union-bounded over all tests.

    Args:
      scores: [m] canary scores, higher = "looks included".
      included: [m] booleans, whether each canary was trained on (probability 1/2 each).
      delta: delta of the hypotheses, in [0, 1) (keyword-only).
      confidence: in (0, 1); every reported bound holds with at least this probability.
      guesses: (k+, k-) pairs; default `default_guess_pairs(m)`.
      methods: a subset of `METHODS`; each (pair, method) is tested at (1 - confidence) / (pairs x methods).

    Returns:
      An `AuditBound`.

    Raises:
      ValueError: what `epsilon_lower_bound` refuses, or unknown `methods`.

    References: Mahloujifar, Melis & Chaudhuri 2025, §4; Steinke, Nasr & Jagielski 2023, §3, §5.
    """
    values, flags, delta, confidence = _check_inputs(scores, included, delta, confidence)
    chosen = _check_methods(methods)
    m = int(values.size)
    pairs = _check_pairs(guesses if guesses is not None else default_guess_pairs(max(m, 1)), max(m, 1))
    significance = (1.0 - confidence) / (len(pairs) * len(chosen))
    if m == 0 or m * math.log(2.0) < -math.log(significance):
        raise ValueError(
            f"{m} canaries are too few to reach the significance {significance:.3g} of {len(pairs) * len(chosen)} "
            f"tests; use at least {math.ceil(-math.log2(significance))} canaries (hundreds for a useful bound)."
        )
    by_method = dict.fromkeys(chosen, 0.0)
    best, mu_lb = (-1.0, chosen[0], 0, 0, 0), (0.0 if "fdp-gaussian" in chosen else None)
    for k_plus, k_minus in pairs:
        correct = count_correct(values, flags, k_plus, k_minus)
        for method in chosen:
            eps, mu = _method_epsilon(method, m, k_plus + k_minus, correct, delta, significance)
            by_method[method] = max(by_method[method], eps)
            mu_lb = mu_lb if mu is None else max(mu_lb or 0.0, mu)
            if eps > best[0]:
                best = (eps, method, k_plus, k_minus, correct)
    eps, method, k_plus, k_minus, correct = best
    return AuditBound(
        eps, method, mu_lb, by_method, k_plus, k_minus, correct, confidence, delta, m, len(pairs) * len(chosen)
    )


__all__ = [
    "METHODS",
    "AuditBound",
    "approx_dp_epsilon_for_counts",
    "approx_dp_inverse_blow_up",
    "audit_lower_bound",
    "fdp_rejects",
    "gaussian_inverse_blow_up",
    "gdp_epsilon",
    "mu_for_counts",
]
