"""Coarse-to-exact PLD searches (tfdp_embed/accounting/coarse_to_exact.py): fast, and exact where it counts.

The oracle is `dp_accounting` on the exact (default) grid: the calibrated
sigma meets the target there, one tolerance less does not; the budget's
step count k fits there and k + 1 does not. "Fast" is checked as the number
of evaluations on the exact grid (the costly ones), not as time.
"""

from __future__ import annotations

import collections
import math

import dp_accounting
import pytest

from tfdp_embed.accounting import PrivacyBudget, calibrate_noise_multiplier, compute_epsilon, dpsgd_event
from tfdp_embed.accounting import calibration as calibration_module
from tfdp_embed.accounting.calibration import PLD_VALUE_DISCRETIZATION_INTERVAL
from tfdp_embed.accounting.coarse_to_exact import Unreachable, largest_count, search_intervals, smallest_parameter
from tfdp_embed.mechanisms.base import NoiseMechanism

RTOL = 1e-4  # the calibrator's relative tolerance on sigma
# (target epsilon, delta, q, T): the README example (n = 20,000, batch 256, 1 epoch) and the Criteo
# pipeline's default (200,000 rows, batch 2,048, 2 epochs, 5% of epsilon 3 for the output calibration).
README = (3.0, 1 / 20_000, 256 / 20_000, 78)
CRITEO = (2.85, 1 / 200_000, 2_048 / 200_000, 196)


def exact_epsilon(q, sigma, steps, delta):
    return compute_epsilon(dpsgd_event(sampling_probability=q, noise_multiplier=sigma, steps=steps), target_delta=delta)


@pytest.fixture
def exact_evaluations(monkeypatch):
    """Counts epsilon evaluations of non-empty events per PLD grid, with the memos cleared."""
    counts = collections.Counter()
    compute = calibration_module.compute_epsilon

    def counting(events, *, value_discretization_interval=None, **kwargs):
        if events and kwargs.get("accountant", "pld") == "pld":
            counts[value_discretization_interval or PLD_VALUE_DISCRETIZATION_INTERVAL] += 1
        return compute(events, value_discretization_interval=value_discretization_interval, **kwargs)

    monkeypatch.setattr(calibration_module, "compute_epsilon", counting)
    calibration_module._entries_epsilon.cache_clear()
    return counts


@pytest.mark.parametrize("case", [README, CRITEO], ids=["readme", "criteo"])
def test_calibrated_sigma_is_exact_and_asks_the_exact_grid_little(case, exact_evaluations):
    target, delta, q, steps = case
    sigma = calibrate_noise_multiplier(target_epsilon=target, target_delta=delta, sampling_probability=q, steps=steps)
    asked = exact_evaluations[PLD_VALUE_DISCRETIZATION_INTERVAL]
    # The guarantee, on the exact grid: sigma meets the target; one tolerance less does not (the smallest).
    assert exact_epsilon(q, sigma, steps, delta) <= target < exact_epsilon(q, sigma / (1 + 2 * RTOL), steps, delta)
    # The old search asked the exact grid 7-8 times here (RDP bracket, then Brent's method on PLD).
    assert asked <= 2, dict(exact_evaluations)


def test_a_long_run_whose_coarse_grid_is_far_off_still_lands_exactly(exact_evaluations):
    # T = 1000: the 1e-2 grid puts sigma 11% too high; the finer grids walk it back.
    target, delta, q, steps = 1.0, 1e-5, 0.01, 1000
    sigma = calibrate_noise_multiplier(target_epsilon=target, target_delta=delta, sampling_probability=q, steps=steps)
    assert exact_epsilon(q, sigma, steps, delta) <= target < exact_epsilon(q, sigma / (1 + 2 * RTOL), steps, delta)
    assert exact_evaluations[PLD_VALUE_DISCRETIZATION_INTERVAL] <= 3, dict(exact_evaluations)


def test_calibration_is_memoised(exact_evaluations):
    target, delta, q, steps = README
    first = calibrate_noise_multiplier(target_epsilon=target, target_delta=delta, sampling_probability=q, steps=steps)
    before = sum(exact_evaluations.values())
    again = calibrate_noise_multiplier(target_epsilon=target, target_delta=delta, sampling_probability=q, steps=steps)
    assert again == first
    assert sum(exact_evaluations.values()) == before


class _Dense(NoiseMechanism):
    """A DP-SGD mechanism that only reports its events."""

    name = "dense_events"

    def update(self, clipped):
        return []

    def step_event(self, sampling_probability):
        return dp_accounting.PoissonSampledDpEvent(
            sampling_probability, dp_accounting.GaussianDpEvent(self.noise_multiplier)
        )


def test_budget_after_its_calibration_fits_exactly_and_reuses_it(exact_evaluations):
    target, delta, q, steps = README
    sigma = calibrate_noise_multiplier(target_epsilon=target, target_delta=delta, sampling_probability=q, steps=steps)
    exact_evaluations.clear()
    budget = PrivacyBudget(
        _Dense(l2_norm_clip=1.0, noise_multiplier=sigma, seed=0),
        sampling_probability=q,
        target_epsilon=target,
        target_delta=delta,
    )
    budget.on_train_begin()
    k = budget.max_steps
    assert k == steps
    assert exact_epsilon(q, sigma, k, delta) <= target < exact_epsilon(q, sigma, k + 1, delta)
    # k itself was computed by the calibration (memoised); only k + 1 is new on the exact grid.
    assert exact_evaluations[PLD_VALUE_DISCRETIZATION_INTERVAL] <= 1, dict(exact_evaluations)


# -- the searches on synthetic epsilon curves -------------------------------------------------------
# eps_g(x) = 10 / x + bias_g. The exact level has no bias; coarse levels are off by their bias, in either
# direction (a coarse grid that UNDER-states epsilon must not leak into the answer).


def curve(bias):
    return lambda x: 10.0 / x + bias


@pytest.mark.parametrize("biases", [(0.5, 0.05), (-0.5, -0.05), (0.3, -0.02), (2.0, 1.0)])
def test_smallest_parameter_lands_on_the_exact_curve_whatever_the_coarse_curves_say(biases):
    levels = [curve(b) for b in biases] + [curve(0.0)]
    x, at_lowest = smallest_parameter(
        levels, 2.0, start=1.0, factor=2.0, lowest=1e-2, highest=1e4, rtol=RTOL
    )  # the exact root is 5
    assert not at_lowest
    assert 10.0 / x <= 2.0 and x <= 5.0 * (1 + RTOL)


def test_smallest_parameter_unreachable_on_the_exact_curve_only():
    # The coarse curve cannot meet the target below `highest`, the exact one can: no error.
    levels = [curve(3.0), curve(0.0)]
    x, _ = smallest_parameter(levels, 2.5, start=1.0, factor=2.0, lowest=1e-2, highest=100.0, rtol=RTOL)
    assert 10.0 / x <= 2.5 and x <= 4.0 * (1 + RTOL)
    with pytest.raises(Unreachable) as raised:
        smallest_parameter([curve(0.0), curve(1.0)], 1.05, start=1.0, factor=2.0, lowest=1e-2, highest=100.0, rtol=RTOL)
    assert raised.value.epsilon_at_highest == pytest.approx(1.1)


@pytest.mark.parametrize("biases", [(0.3, 0.01), (-0.3, -0.01), (0.0, 0.0)])
def test_largest_count_lands_on_the_exact_curve(biases):
    # eps_g(k) = sqrt(k) / 10 + bias_g; exact: the largest k with sqrt(k) <= 10 x 3 is 900.
    levels = [lambda k, b=b: math.sqrt(k) / 10 + max(b, -math.sqrt(k) / 10) for b in biases]
    levels.append(lambda k: math.sqrt(k) / 10)
    assert largest_count(levels, 3.0, start=10, highest=2**40) == 900


def test_search_intervals_are_coarse_to_exact():
    assert search_intervals(1e-4) == (1e-2, 1e-3, 1e-4)
    assert search_intervals(1e-3) == (1e-2, 1e-3)
    assert search_intervals(8e-3) == (8e-3,)
