"""Group privacy from a unit-level curve: (k eps', delta' (e^{k eps'} - 1) / (e^{eps'} - 1)), best eps'."""

from __future__ import annotations

import math

import dp_accounting
import pytest

from tfdp_embed.accounting import compute_epsilon
from tfdp_embed.accounting.group_privacy import group_epsilon

GAUSSIAN = dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.0))
STEPS = dp_accounting.SelfComposedDpEvent(GAUSSIAN, 1000)


def test_a_group_of_one_is_the_unit_guarantee():
    got = group_epsilon(STEPS, group_size=1, target_delta=1e-6)
    assert got["epsilon"] == pytest.approx(compute_epsilon(STEPS, target_delta=1e-6), rel=1e-9)  # PLD: tighter


def test_pure_dp_scales_by_k():
    # Laplace with scale 1/eps0 (sensitivity 1) is (eps0, 0)-DP: a group of k is (k eps0, 0)-DP, so eps_k -> k eps0.
    laplace = dp_accounting.LaplaceDpEvent(2.0)  # eps0 = 0.5
    got = group_epsilon(laplace, group_size=10, target_delta=1e-9)
    assert got["epsilon"] == pytest.approx(5.0, rel=2e-3)


@pytest.mark.parametrize("k", [2, 5, 30])
def test_the_point_used_meets_the_target_and_costs_more_than_k_times_the_unit_epsilon(k):
    delta = 1e-6
    got = group_epsilon(STEPS, group_size=k, target_delta=delta)
    unit = compute_epsilon(STEPS, target_delta=delta)
    eps = got["unit_epsilon"]
    log_unit_delta = math.log(got["unit_delta"]) if got["unit_delta"] > 0 else -math.inf  # RDP's tail can underflow
    log_chained = log_unit_delta + (k - 1) * eps + math.log(-math.expm1(-k * eps) / -math.expm1(-eps))
    assert log_chained <= math.log(delta) + 1e-6
    assert got["epsilon"] == pytest.approx(k * eps) and got["epsilon"] > k * unit  # delta' < delta forces eps' > eps


def test_a_huge_group_is_vacuous_not_an_error():
    # RDP's tail reaches any group (at an enormous epsilon); PLD's grid floor (~1e-14) does not.
    got = group_epsilon(STEPS, group_size=100_000, target_delta=1e-6)
    assert got["accountant"] == "rdp" and got["epsilon"] > 1e5
    assert math.isinf(group_epsilon(STEPS, group_size=100_000, target_delta=1e-6, accountants=("pld",))["epsilon"])


@pytest.mark.parametrize("kwargs", [dict(group_size=0, target_delta=1e-6), dict(group_size=2, target_delta=1.0)])
def test_bad_input_is_refused(kwargs):
    with pytest.raises(ValueError, match="group_size|target_delta"):
        group_epsilon(STEPS, **kwargs)
