"""Tests of rank and extrapolated exposure (tfdp_embed/audit/exposure.py).

Hand-computed values in the comments: exposure = log2(n) - log2(m), m = 1 +
candidates ahead of the canary (EANA §2.3; Carlini et al. 2019 §4).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special, stats

from tfdp_embed.audit import (
    ScoreDistribution,
    canary_ranks,
    extrapolated_exposure,
    fit_score_distribution,
    rank_exposure,
)


def test_rank_exposure_hand_computed():
    candidates = [0.1, 0.4, 0.2, 0.3]  # n = 4, order does not matter
    # 0.5: nobody ahead, m = 1, exposure = log2 4 = 2 (the ceiling)
    # 0.25: 0.3 and 0.4 ahead, m = 3, exposure = 2 - log2 3 = 0.4150374993
    # 0.0: all 4 ahead, m = 5, exposure = 2 - log2 5 = -0.3219280949 (the floor, log2(n / (n + 1)))
    np.testing.assert_allclose(canary_ranks([0.5, 0.25, 0.0], candidates), [1, 3, 5])
    np.testing.assert_allclose(
        rank_exposure([0.5, 0.25, 0.0], candidates),
        [2.0, 0.4150374993, -0.3219280949],
        rtol=1e-9,
    )


def test_ties():
    candidates = [
        1.0,
        2.0,
        2.0,
        2.0,
        3.0,
    ]  # n = 5; canary 2.0: one strictly ahead (3.0), three tied
    # ahead:  m = 1 + 1 + 3   = 5   -> log2 5 - log2 5   = 0
    # behind: m = 1 + 1       = 2   -> log2(5 / 2)       = 1.3219280949
    # mid:    m = 1 + 1 + 1.5 = 3.5 -> log2(5 / 3.5)     = 0.5145731728
    assert rank_exposure([2.0], candidates)[0] == pytest.approx(0.0, abs=1e-12)  # default: "ahead"
    assert rank_exposure([2.0], candidates, ties="behind")[0] == pytest.approx(1.3219280949, rel=1e-9)
    assert rank_exposure([2.0], candidates, ties="mid")[0] == pytest.approx(0.5145731728, rel=1e-9)
    # no tie: the rule does not matter
    for ties in ("ahead", "behind", "mid"):
        assert rank_exposure([2.5], candidates, ties=ties)[0] == pytest.approx(math.log2(5 / 2))


@pytest.mark.parametrize(
    "canary, candidates, kwargs, match",
    [
        ([1.0], [], {}, "at least 1"),
        ([[1.0]], [1.0, 2.0], {}, "1-D"),
        ([1.0], [[1.0, 2.0]], {}, "1-D"),
        ([float("nan")], [1.0, 2.0], {}, "finite"),
        ([1.0], [1.0, float("inf")], {}, "finite"),
        ([1.0], [1.0, 2.0], {"ties": "random"}, "ties"),
    ],
)
def test_bad_rank_input_is_rejected(canary, candidates, kwargs, match):
    with pytest.raises(ValueError, match=match):
        rank_exposure(canary, candidates, **kwargs)


def test_bad_fit_input_is_rejected():
    with pytest.raises(ValueError, match="at least 3"):
        fit_score_distribution([1.0, 2.0])
    with pytest.raises(ValueError, match="all equal"):
        fit_score_distribution([1.0] * 10)
    with pytest.raises(ValueError, match="distribution"):
        fit_score_distribution([1.0, 2.0, 4.0], distribution="cauchy")


@pytest.mark.parametrize("distribution", ["skewnorm", "normal"])
def test_extrapolated_matches_rank_exposure_on_gaussian_scores(distribution):
    # 40,000 N(0, 1) candidates; canaries at z = 0 .. 2. Rank exposure estimates -log2 SF(z); at
    # z = 2, m ~ 40,000 * 0.02275 = 910, so its sampling std is 1 / (sqrt(910) ln 2) = 0.048 bit.
    # Tolerance 0.15 bit (about 3 std at the largest z, plus the fit's own error).
    rng = np.random.default_rng(0)
    candidates = rng.normal(size=40_000)
    canaries = np.array([0.0, 0.5, 1.0, 1.5, 2.0])
    by_rank = rank_exposure(canaries, candidates)
    by_fit = extrapolated_exposure(canaries, candidates, distribution=distribution)
    np.testing.assert_allclose(by_fit, by_rank, atol=0.15)
    np.testing.assert_allclose(by_fit, -stats.norm.logsf(canaries) / math.log(2), atol=0.15)


def test_extrapolation_goes_beyond_the_rank_ceiling():
    rng = np.random.default_rng(1)
    candidates = rng.normal(size=4096)  # ceiling log2 4096 = 12 bits
    canaries = np.array([5.0, 7.0, 9.0])
    assert np.all(rank_exposure(canaries, candidates) == 12.0)
    extra = extrapolated_exposure(canaries, candidates)
    # -log2 SF(5) = 21.9, SF(7) = 41.0, SF(9) = 63.9 bits for N(0, 1); the fitted parameters move them a little.
    assert np.all(np.diff(extra) > 0) and extra[0] > 12.0
    np.testing.assert_allclose(extra, -stats.norm.logsf(canaries) / math.log(2), rtol=0.1)


def test_deep_tail_is_computed_in_log_space():
    # skew-normal with shape 0 is N(loc, scale): ln SF(x) = log_ndtr(-x); at x = 50 (ln SF = -1254.8)
    # scipy's skewnorm.sf underflows to 0 (logsf -inf), the log-space integral does not.
    dist = ScoreDistribution("skewnorm", 0.0, 0.0, 1.0, 100, 0.0)
    for x in (6.0, 12.0, 30.0, 50.0):
        assert dist.log_tail([x])[0] == pytest.approx(float(special.log_ndtr(-x)), rel=1e-7)
    # with skew: the direct survival function and the log-space integral agree where both work
    skewed = ScoreDistribution("skewnorm", -3.0, 0.5, 2.0, 100, 0.0)
    xs = np.array([2.0, 4.0, 6.0])  # SF 7.8e-4, 7.1e-10, 5.1e-20: direct for the first, integral for the others
    np.testing.assert_allclose(skewed.log_tail(xs), stats.skewnorm(-3.0, 0.5, 2.0).logsf(xs), rtol=1e-6)


def test_skewnorm_fit_recovers_parameters():
    rng = np.random.default_rng(2)
    scores = stats.skewnorm(4.0, loc=-7.0, scale=2.0).rvs(size=20_000, random_state=rng)
    fit = fit_score_distribution(scores)
    assert fit.distribution == "skewnorm" and fit.num_candidates == 20_000
    assert fit.shape == pytest.approx(4.0, rel=0.25)
    assert fit.loc == pytest.approx(-7.0, abs=0.1) and fit.scale == pytest.approx(2.0, rel=0.05)
    assert fit.ks_statistic < 0.02  # sqrt(1 / 20,000) = 0.007: the bulk fits
