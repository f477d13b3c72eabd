"""Tests of the one-run epsilon lower bound (tfdp_embed/audit/one_run.py).

The bound's values are checked against hand computations (binomial sums written out with
math.comb). The audit runs of a model (rare-id canaries, both front ends) are in test_rare_id.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tfdp_embed.audit import (
    count_correct,
    default_guess_pairs,
    epsilon_for_counts,
    epsilon_lower_bound,
    one_run_p_value,
)


def _binom_pmf(k: int, n: int, p: float) -> float:
    return math.comb(n, k) * p**k * (1 - p) ** (n - k)


def _perfect(m: int) -> tuple[np.ndarray, np.ndarray]:
    """m canaries, the first half included, scores that rank every included canary first."""
    included = np.arange(m) < m // 2
    return np.where(included, 1.0, 0.0) + np.linspace(0, 0.1, m), included


# -- the bound against hand computations ---------------------------------------------------------


def test_p_value_matches_the_written_out_binomial_sums():
    # m = 10, r = 4, v = 3, eps = 1, delta = 0.01; q = e / (1 + e) = 0.7310586
    q = math.e / (1 + math.e)
    tail = 4 * q**3 * (1 - q) + q**4  # P[B >= 3] = 0.6147...
    pmf = [_binom_pmf(k, 4, q) for k in (2, 1, 0)]  # P[B = 2], P[B = 1], P[B = 0]
    worst = max(pmf[0], (pmf[0] + pmf[1]) / 2, sum(pmf) / 3)  # max_i P[3 - i <= B < 3] / i
    expected = tail + 2 * 10 * 0.01 * worst
    got = one_run_p_value(num_canaries=10, guesses=4, correct=3, epsilon=1.0, delta=0.01)
    assert got == pytest.approx(expected, rel=1e-12)
    assert one_run_p_value(num_canaries=10, guesses=4, correct=3, epsilon=1.0, delta=0.0) == pytest.approx(tail)


def test_all_guesses_correct_gives_the_closed_form_epsilon():
    # v = r = k, delta = 0: p(eps) = q^k <= a  <=>  q <= a^(1/k)  =>  eps = logit(a^(1/k)).
    # k = 100, a = 0.05: q = exp(ln(0.05) / 100) = 0.9704870, eps = ln(q / (1 - q)) = 3.4930
    eps = epsilon_for_counts(num_canaries=100, guesses=100, correct=100, delta=0.0, significance=0.05)
    q = 0.05 ** (1 / 100)
    assert eps == pytest.approx(math.log(q / (1 - q)), abs=1e-6)
    assert eps == pytest.approx(3.4930, abs=1e-3)
    assert eps <= math.log(q / (1 - q))  # rounded down: the reported eps is itself rejected


def test_half_correct_gives_zero_and_more_correct_gives_more():
    # r = 100, v = 50: p(0) = P[Binomial(100, 1/2) >= 50] = 0.54 > 0.05, nothing is rejected.
    assert epsilon_for_counts(num_canaries=100, guesses=100, correct=50, delta=0.0, significance=0.05) == 0.0
    bounds = [
        epsilon_for_counts(num_canaries=100, guesses=100, correct=v, delta=0.0, significance=0.05)
        for v in (60, 70, 80, 90, 100)
    ]
    assert bounds[0] > 0 and bounds == sorted(bounds)


def test_delta_and_the_union_bound_only_lower_the_bound():
    scores, included = _perfect(200)
    pure = epsilon_lower_bound(scores, included, delta=0.0, guesses=[(100, 0)])
    approx = epsilon_lower_bound(scores, included, delta=1e-3, guesses=[(100, 0)])
    assert pure.correct == 100 and pure.num_guess_pairs == 1
    # one pair at significance 0.05: eps = logit(0.05^(1/100)) = 3.4930 (as above)
    assert pure.epsilon_lb == pytest.approx(3.4930, abs=1e-3)
    assert 0 < approx.epsilon_lb < pure.epsilon_lb
    grid = epsilon_lower_bound(scores, included, delta=0.0, guesses=[(100, 0), (50, 50), (20, 0), (10, 10)])
    # four pairs, each at 0.05 / 4: the same 100-of-100 pair gives logit(0.0125^(1/100)):
    # q = exp(ln(0.0125) / 100) = 0.957126, eps = ln(0.957126 / 0.042874) = 3.1057
    assert grid.num_guess_pairs == 4 and (grid.k_plus, grid.k_minus) == (100, 0)
    assert grid.epsilon_lb == pytest.approx(3.1057, abs=1e-3)


def test_guesses_take_the_top_and_bottom_scores_and_break_ties_by_index():
    scores = np.array([5.0, 1.0, 1.0, 1.0, -2.0, 0.0])
    included = np.array([True, False, True, True, False, False])
    # top 2: index 0 (in), then the tie at 1.0 -> index 1 (out): 1 correct;
    # bottom 2: indices 5 (0.0) and 4 (-2.0), both out: 2 correct.
    assert count_correct(scores, included, 2, 2) == 3
    assert count_correct(scores, included, 1, 0) == 1
    assert count_correct(scores, included, 0, 6) == 3


def test_default_grid_is_small_and_within_m():
    pairs = default_guess_pairs(400)
    # r = 4, 8, 20, 40, 80, 200, 400 each as (r, 0) and (r/2, r/2): 14 pairs
    assert len(pairs) == 14 and (400, 0) in pairs and (100, 100) in pairs
    assert all(1 <= a + b <= 400 for a, b in pairs)


def test_random_scores_give_no_bound():
    rng = np.random.default_rng(0)
    included = rng.random(1000) < 0.5
    bound = epsilon_lower_bound(rng.normal(size=1000), included, delta=1e-5)
    assert bound.epsilon_lb < 0.3 and bound.num_canaries == 1000


def test_randomized_response_at_eps_is_rarely_caught_above_eps():
    """An exactly eps-DP mechanism: each canary's output is its bit, flipped with probability 1 / (1 + e^eps).

    eps = 2, m = 500, the default 14 pairs, 200 seeded trials. Observed: the bound exceeds 2 in 1.0 %
    of trials (at most 5 % allowed by the union bound; choosing the best pair without it, each at 0.05,
    exceeded 2 in 18 % of 400 such trials), median bound 1.61 (the audit is not blind either).
    """
    rng = np.random.default_rng(0)
    eps, m, trials = 2.0, 500, 200
    bounds = []
    for _ in range(trials):
        included = rng.random(m) < 0.5
        output = np.where(rng.random(m) < math.exp(eps) / (1 + math.exp(eps)), included, ~included)
        scores = output + 0.5 * rng.random(m)  # random tie-breaks within each output
        bounds.append(epsilon_lower_bound(scores, included, delta=0.0).epsilon_lb)
    assert np.mean(np.array(bounds) > eps) <= 0.05
    assert np.median(bounds) > 1.2


# -- bad input -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(included=np.ones(9, bool)), "lengths differ"),
        (dict(confidence=0.0), "confidence"),
        (dict(confidence=1.0), "confidence"),
        (dict(delta=-0.1), "delta"),
        (dict(delta=1.0), "delta"),
        (dict(guesses=[(8, 3)]), "k_plus"),
        (dict(guesses=[(0, 0)]), "k_plus"),
        (dict(scores=np.full(10, np.nan)), "finite"),
        (dict(included=np.full(10, 2)), "booleans"),
    ],
)
def test_bad_input_is_refused(kwargs, match):
    args = dict(scores=np.arange(10.0), included=np.arange(10) % 2 == 0, delta=0.0, confidence=0.95)
    args.update(kwargs)
    scores, included = args.pop("scores"), args.pop("included")
    with pytest.raises(ValueError, match=match):
        epsilon_lower_bound(scores, included, **args)


def test_too_few_canaries_are_refused():
    # 4 canaries: 2^-4 = 0.0625 > 0.05, no outcome can reject even eps = 0
    with pytest.raises(ValueError, match="too few"):
        epsilon_lower_bound(np.arange(4.0), np.array([1, 0, 1, 0]), delta=0.0, guesses=[(4, 0)])
