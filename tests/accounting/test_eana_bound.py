"""Tests of EANA's data-dependent bounds (tfdp_embed/accounting/eana_bound.py).

Expected values are computed by hand from EANA (RecSys 2022) eq. (1) and
eq. (9); the arithmetic is in the comments.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tfdp_embed.accounting.eana_bound import (
    EanaRdpBound,
    eana_per_instance_rdp_bound,
    eana_rdp_bound,
)


def theorem(**kwargs) -> EanaRdpBound:
    args = dict(noise_multiplier=1.0, touch_counts=[9, 12, 40], max_coordinates_per_example=2, delta=1e-5)
    args.update(kwargs)
    return eana_rdp_bound(**args)


def test_theorem_3_1_hand_computed():
    # z = sigma / L = 1, C_0 = min(9, 12, 40) = 9, d_0 = 2.
    # alpha = 2: alpha / (2 (C_0 + 1 - alpha) z^2) = 2 / (2 * 8)        = 0.125
    #            (d_0 / 2) ln(1 + 1/C_0)           = ln(10/9)            = 0.1053605157
    #            d_0 / (2 (alpha-1)) ln(10 / 8)    = ln(1.25)            = 0.2231435513
    #            total                                                    = 0.4535040670
    # alpha = 3: 3 / (2 * 7) = 0.2142857143; ln(10/9) = 0.1053605157;
    #            2 / 4 * ln(10 / 7) = 0.5 * 0.3566749439 = 0.1783374720; total = 0.4979837020
    # alpha = 9.5: C_0 + 1 - alpha = 0.5 > 0, finite; alpha = 10: C_0 + 1 - alpha = 0 -> inf.
    bound = theorem(orders=[2, 3, 9.5, 10, 11])
    assert bound.rdp[0] == pytest.approx(0.4535040670, rel=1e-9)
    assert bound.rdp[1] == pytest.approx(0.4979837020, rel=1e-9)
    assert math.isfinite(bound.rdp[2])
    assert bound.rdp[3] == math.inf and bound.rdp[4] == math.inf
    # Classic conversion (paper §2.2): min_alpha rdp + ln(1/delta) / (alpha - 1), ln(1e5) = 11.512925465
    #   alpha = 2: 0.4535040670 + 11.512925465 = 11.966429532
    #   alpha = 3: 0.4979837020 + 5.7564627325 = 6.2544464345  <- min over {2, 3}
    two_three = theorem(orders=[2, 3])
    assert two_three.epsilon_classic == pytest.approx(6.2544464345, rel=1e-9)
    # dp_accounting's conversion (Canonne et al. 2020) is never looser.
    assert two_three.epsilon <= two_three.epsilon_classic
    assert two_three.optimal_order in (2.0, 3.0)


def test_result_is_labelled_not_dp():
    bound = theorem()
    assert bound.is_dp is False
    assert "NOT a differential-privacy guarantee" in bound.label
    assert "data-dependent" in bound.label
    report = bound.as_dict()
    assert report["is_dp"] is False and "epsilon" not in report  # only data_dependent_* keys
    assert report["data_dependent_epsilon"] == bound.epsilon


def test_untouched_row_gives_infinite_bound():
    # A row with 0 noise draws: ln(1 + 1/0) = inf. Its value reveals that nobody used it.
    bound = theorem(touch_counts=[0, 500, 500])
    assert all(r == math.inf for r in bound.rdp)
    assert bound.epsilon == math.inf and bound.optimal_order is None


def test_more_draws_smaller_bound_and_above_dp_sgd_baseline():
    eps = [theorem(touch_counts=[c]).epsilon for c in (100, 1_000, 10_000, 100_000)]
    assert all(a > b for a, b in zip(eps, eps[1:]))
    # Remark 1: DP-SGD with the same total noise (sigma_g^2 = C_0 sigma^2) has RDP
    # alpha / (2 C_0 z^2); EANA's bound is above it at every order.
    bound = theorem(touch_counts=[1_000], orders=[2, 10, 100])
    for alpha, rdp in zip(bound.orders, bound.rdp):
        assert rdp > alpha / (2 * 1_000)


def test_per_instance_hand_computed():
    # z = 0.5, L = 1 (sigma^2 = 0.25); rows C = (4, 99), s = (0.36, 0.64), one coordinate each, alpha = 2:
    # row 1: 2 * 0.36 / (2 * 3 * 0.25) = 0.48;  0.5 ln(1.25) = 0.1115717757;  0.5 ln(5/3) = 0.2554128119
    # row 2: 2 * 0.64 / (2 * 98 * 0.25) = 0.0261224490;  0.5 ln(100/99) = 0.0050251681;  0.5 ln(100/98) = 0.0101013536
    # total = 0.48 + 0.1115717757 + 0.2554128119 + 0.0261224490 + 0.0050251681 + 0.0101013536 = 0.8882335583
    bound = eana_per_instance_rdp_bound(
        noise_multiplier=0.5,
        touch_counts=[4, 99],
        row_squared_norms=[0.36, 0.64],
        row_dims=1,
        delta=1e-5,
        orders=[2, 5, 6],
    )
    assert bound.kind == "remark_2_eq_9" and bound.is_dp is False
    assert bound.rdp[0] == pytest.approx(0.8882335583, rel=1e-9)
    # alpha = 5, 6: C_1 + 1 - alpha = 4 + 1 - 5 <= 0 -> inf (alpha = 4.9 is finite, below).
    assert bound.rdp[1] == math.inf and bound.rdp[2] == math.inf
    # Embedding rows of dimension 2: the log terms count twice (one per coordinate):
    # 0.48 + 0.0261224490 + 2 * (0.1115717757 + 0.2554128119 + 0.0050251681 + 0.0101013536) = 1.2703446676
    two = eana_per_instance_rdp_bound(
        noise_multiplier=0.5,
        touch_counts=[4, 99],
        row_squared_norms=[0.36, 0.64],
        row_dims=[2, 2],
        delta=1e-5,
        orders=[2, 4.9],
    )
    assert two.rdp[0] == pytest.approx(1.2703446676, rel=1e-9)
    assert math.isfinite(two.rdp[1])


def test_per_instance_matches_theorem_at_worst_case():
    # eq. (9) implies eq. (1): with every C_j = C_0, d_0 coordinates and sum_j s_j = L^2 they agree.
    rng = np.random.default_rng(0)
    s = rng.random(6)
    s = 2.0**2 * s / s.sum()  # L = 2
    per = eana_per_instance_rdp_bound(
        noise_multiplier=0.7,
        l2_norm_clip=2.0,
        touch_counts=[50] * 6,
        row_squared_norms=s,
        row_dims=4,
        delta=1e-6,
        orders=[2, 7, 30],
    )
    thm = eana_rdp_bound(
        noise_multiplier=0.7,
        touch_counts=[50, 80],
        max_coordinates_per_example=24,
        delta=1e-6,
        orders=[2, 7, 30],
    )
    np.testing.assert_allclose(per.rdp, thm.rdp, rtol=1e-12)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(noise_multiplier=0.0), "noise_multiplier"),
        (dict(noise_multiplier=-1.0), "noise_multiplier"),
        (dict(delta=0.0), "delta"),
        (dict(delta=1.0), "delta"),
        (dict(orders=[1.0, 2.0]), "orders"),
        (dict(max_coordinates_per_example=0), "max_coordinates_per_example"),
        (dict(touch_counts=[-1, 5]), "touch_counts"),
    ],
)
def test_theorem_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        theorem(**kwargs)


def test_per_instance_bad_arguments():
    base = dict(noise_multiplier=1.0, touch_counts=[10, 10], row_squared_norms=[0.5, 0.5], row_dims=1, delta=1e-5)
    with pytest.raises(ValueError, match="row_squared_norms"):
        eana_per_instance_rdp_bound(**{**base, "row_squared_norms": [0.9, 0.9]})  # sum 1.8 > L^2 = 1
    with pytest.raises(ValueError, match="row_squared_norms"):
        eana_per_instance_rdp_bound(**{**base, "row_squared_norms": [0.5]})
    with pytest.raises(ValueError, match="row_dims"):
        eana_per_instance_rdp_bound(**{**base, "row_dims": 0})
