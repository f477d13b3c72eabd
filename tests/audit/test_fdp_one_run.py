"""Tests of the one-run f-DP audit (tfdp_embed/audit/fdp_one_run.py, Mahloujifar, Melis & Chaudhuri 2025).

The recursion is checked where it is exact by hand (every guess correct at mu = 0: the tail is
2^-k), the curves' inverse blow-ups against their closed forms, and the bounds on seeded simulations
of mechanisms whose privacy is known: each canary's score is N(mu * included, 1) (exactly mu-GDP per
canary) or randomized response at eps (exactly eps-DP).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tfdp_embed.audit.fdp_one_run import (
    METHODS,
    approx_dp_epsilon_for_counts,
    approx_dp_inverse_blow_up,
    audit_lower_bound,
    fdp_rejects,
    gaussian_inverse_blow_up,
    gdp_epsilon,
    mu_for_counts,
)
from tfdp_embed.audit.one_run import epsilon_for_counts

DELTA = 1e-5


def test_inverse_blow_ups_match_their_closed_forms():
    # mu = 0 and (eps, delta) = (0, 0): no privacy loss, f(1 - y) = y.
    assert gaussian_inverse_blow_up(0.0)(0.3) == pytest.approx(0.3)
    assert approx_dp_inverse_blow_up(0.0, 0.0)(0.3) == pytest.approx(0.3)
    # mu = 1, y = 1/2: Phi(0 - 1) = 0.158655
    assert gaussian_inverse_blow_up(1.0)(0.5) == pytest.approx(0.158655, abs=1e-6)
    # eps = 1, delta = 0.01: small y -> e^-1 (y - 0.01); y = 0.99 -> 1 - 0.01 - e (0.01) = 0.962817
    curve = approx_dp_inverse_blow_up(1.0, 0.01)
    assert curve(0.2) == pytest.approx(math.exp(-1) * 0.19)
    assert curve(0.99) == pytest.approx(1 - 0.01 - math.e * 0.01)
    assert curve(0.005) == 0.0


@pytest.mark.parametrize("k", [1, 2, 5, 8])
def test_all_correct_at_mu_zero_is_rejected_exactly_below_two_to_the_minus_k(k):
    """Random guessing (mu = 0): P[k of k correct] = 2^-k, and the recursion is exact there.

    Hand trace for k = 2, m = 4, tau = 0.5: right = 0.25, wrong = 0; i = 1: wrong = 0.25,
    right = 0.25 + 1/1 * 0.25 = 0.5; i = 0: wrong = 0.5, right = 0.5; 1.0 > 2/4: rejected.
    At tau = 0.2 the same steps give 0.2 + 0.2 = 0.4 <= 0.5: not rejected.
    """
    curve = gaussian_inverse_blow_up(0.0)
    counts = dict(num_canaries=10, guesses=k, correct=k)
    assert fdp_rejects(curve, significance=2.0**-k * 1.001, **counts)
    assert not fdp_rejects(curve, significance=2.0**-k * 0.999, **counts)


def test_bounds_grow_with_correct_guesses_and_vanish_at_half():
    counts = dict(num_canaries=1000, guesses=1000, significance=0.05)
    assert mu_for_counts(correct=500, **counts) == 0.0
    assert approx_dp_epsilon_for_counts(correct=500, delta=DELTA, **counts) == 0.0
    mus = [mu_for_counts(correct=v, **counts) for v in (600, 700, 800, 900)]
    assert mus[0] > 0 and mus == sorted(mus)


def test_gaussian_curve_is_tighter_than_steinke_on_the_same_counts_and_the_approx_dp_curve_is_close():
    """Same counts, significance 0.05, m = 1000, delta = 1e-5. Observed (eps: Steinke / (eps, delta) curve / Gaussian):

    r = 100, v = 80: 0.955 / 0.943 / 1.402;  r = 1000, v = 900: 2.021 / 2.013 / 3.779;
    r = 50, v = 50: 2.756 / 2.783 / 4.062. The (eps, delta) curve's recursion is within 2 % of the
    binomial bound (exact for pure DP) and ahead only when every guess is right; the Gaussian curve,
    a stronger hypothesis, is far ahead: `audit_lower_bound` takes the tightest.
    """
    for r, v in [(100, 80), (500, 400), (1000, 650), (1000, 900), (50, 50), (200, 190)]:
        counts = dict(num_canaries=1000, guesses=r, correct=v, significance=0.05)
        steinke = epsilon_for_counts(delta=DELTA, **counts)
        curve = approx_dp_epsilon_for_counts(delta=DELTA, **counts)
        assert gdp_epsilon(mu_for_counts(**counts), DELTA) > 1.3 * steinke, (r, v)
        assert curve == pytest.approx(steinke, rel=0.02), (r, v)


def _gaussian_scores(rng, mu: float, m: int) -> tuple[np.ndarray, np.ndarray]:
    included = rng.random(m) < 0.5
    return mu * included + rng.normal(size=m), included


def test_gaussian_mechanism_bound_is_tighter_than_steinke_and_stays_below_the_truth():
    """Scores N(mu * included, 1), mu = 2 (true eps = 10.0 at delta = 1e-5), m = 1000, 30 seeded trials.

    Observed: fdp-gaussian beats Steinke's bound in every trial, by 0.79 at least (median eps_lb 3.87
    against 2.59; mu_lb median 0.90, at most 1.07, of the true 2; eps_lb at most 4.72): no trial's
    mu_lb exceeds 2 nor its eps_lb 10.0 (at most 5 % allowed by the 95 % confidence).
    """
    rng = np.random.default_rng(0)
    mu, true_epsilon = 2.0, gdp_epsilon(2.0, DELTA)
    assert true_epsilon == pytest.approx(10.0, abs=0.05)
    audits = [audit_lower_bound(*_gaussian_scores(rng, mu, 1000), delta=DELTA) for _ in range(30)]
    for audit in audits:
        assert audit.by_method["fdp-gaussian"] >= audit.by_method["steinke"], audit.as_dict()
        assert audit.method == "fdp-gaussian" and audit.num_tests == 14 * 3
    assert np.mean([a.mu_lb > mu for a in audits]) <= 0.05
    assert np.mean([a.epsilon_lb > true_epsilon for a in audits]) <= 0.05
    assert np.median([a.epsilon_lb for a in audits]) > 0.3 * true_epsilon  # the audit is not blind


def test_randomized_response_is_rarely_caught_above_its_epsilon():
    """Exactly eps-DP (each canary's output is its bit, kept with probability e^eps / (1 + e^eps)), eps = 2.

    m = 500, 40 seeded trials, delta = 0: the (eps, delta)-curve bound exceeds 2 in none (at most 5 %
    allowed); observed median 1.59, largest 1.76.
    """
    rng = np.random.default_rng(1)
    bounds = []
    for _ in range(40):
        included = rng.random(500) < 0.5
        output = np.where(rng.random(500) < math.exp(2) / (1 + math.exp(2)), included, ~included)
        audit = audit_lower_bound(output + 0.5 * rng.random(500), included, delta=0.0, methods=("fdp-approx-dp",))
        bounds.append(audit.epsilon_lb)
    assert np.mean(np.array(bounds) > 2.0) <= 0.05
    assert np.median(bounds) > 1.0


def test_random_guesses_give_zero():
    rng = np.random.default_rng(2)
    audit = audit_lower_bound(*_gaussian_scores(rng, 0.0, 2000), delta=DELTA)
    assert audit.epsilon_lb == 0.0 and audit.mu_lb == 0.0
    assert audit.by_method == dict.fromkeys(METHODS, 0.0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(methods=("steinke", "magic")), "methods"),
        (dict(methods=()), "methods"),
        (dict(methods=("steinke", "steinke")), "methods"),
        (dict(confidence=1.0), "confidence"),
        (dict(delta=-1.0), "delta"),
    ],
)
def test_bad_input_is_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        audit_lower_bound(np.arange(100.0), np.arange(100) % 2 == 0, **{"delta": 0.0, **kwargs})


def test_impossible_counts_are_refused():
    with pytest.raises(ValueError, match="correct <= guesses"):
        fdp_rejects(gaussian_inverse_blow_up(1.0), num_canaries=10, guesses=5, correct=6, significance=0.05)
