"""One-off releases composed with the training steps (tfdp_embed/accounting/one_off_releases.py), checked with dp_accounting directly."""

from __future__ import annotations

import dp_accounting
import pytest

from tfdp_embed.accounting import (
    calibrate_noise_multiplier,
    calibrate_noise_multiplier_with_releases,
    make_accountant,
    release_epsilon,
    release_noise_multiplier,
)
from tfdp_embed.accounting.calibration import dpsgd_event

# A coarser PLD grid than the library's default keeps these tests fast; planner and oracle use the same.
GRID = 1e-3


def _epsilon(events, delta, accountant):
    """The oracle: dp_accounting itself on the composed events."""
    acc = make_accountant(accountant, value_discretization_interval=GRID if accountant == "pld" else None)
    return acc.compose(dp_accounting.ComposedDpEvent(list(events))).get_epsilon(delta)


def _check_plan(*, eps, delta, q, steps, accountant, share=0.1):
    grid = dict(accountant=accountant, value_discretization_interval=GRID if accountant == "pld" else None)
    z = release_noise_multiplier(epsilon=share * eps, delta=delta, **grid)
    release = dp_accounting.GaussianDpEvent(z)
    # the release alone costs its share (never more)
    assert share * eps * (1 - 1e-3) <= _epsilon([release], delta, accountant) <= share * eps
    common = dict(target_epsilon=eps, target_delta=delta, sampling_probability=q, steps=steps, **grid)
    sigma = calibrate_noise_multiplier_with_releases(releases=[release], **common)
    steps_event = dpsgd_event(sampling_probability=q, noise_multiplier=sigma, steps=steps)
    # release + T steps meets the target (within 0.1%, never above)
    assert eps * (1 - 1e-3) <= _epsilon([release, steps_event], delta, accountant) <= eps
    # and pays for the release: more noise than the steps alone would need
    assert sigma > calibrate_noise_multiplier(**common)


@pytest.mark.parametrize("eps", [0.5, 1.0, 4.0, 8.0])
def test_small_dataset_pld(eps):
    # 300 users, batch 256, 5 epochs: the old fixed bracket [sigma, 50 sigma] raised brentq's ValueError
    # at eps 8 and 4 (the release barely moves epsilon, so both ends lay on one side).
    _check_plan(eps=eps, delta=1 / 300, q=256 / 300, steps=5, accountant="pld")


@pytest.mark.parametrize("eps", [0.5, 1.0, 4.0, 8.0])
def test_small_dataset_rdp_many_steps(eps):
    _check_plan(eps=eps, delta=1 / 300, q=40 / 300, steps=35, accountant="rdp")


@pytest.mark.parametrize("eps, accountant", [(1.0, "rdp"), (8.0, "rdp"), (8.0, "pld")])
def test_large_dataset(eps, accountant):
    # Amazon Games' size: 31,013 users, batch 256, 2 epochs
    _check_plan(eps=eps, delta=1 / 31013, q=256 / 31013, steps=2 * 121, accountant=accountant)


def test_large_share_and_several_releases():
    delta, q, steps = 1e-5, 0.01, 200
    releases = [dp_accounting.GaussianDpEvent(1.5), dp_accounting.LaplaceDpEvent(2.0)]
    sigma = calibrate_noise_multiplier_with_releases(
        target_epsilon=6.0, target_delta=delta, sampling_probability=q, steps=steps, releases=releases, accountant="rdp"
    )
    events = [*releases, dpsgd_event(sampling_probability=q, noise_multiplier=sigma, steps=steps)]
    assert 6.0 * (1 - 1e-3) <= _epsilon(events, delta, "rdp") <= 6.0
    assert release_epsilon(releases, delta=delta, accountant="rdp") == pytest.approx(_epsilon(releases, delta, "rdp"))
    # a release that spends 96% of the target: sigma lies far above the steps-only one and is still found
    greedy = [dp_accounting.GaussianDpEvent(0.5)]
    assert 0.95 * 8.0 < _epsilon(greedy, 1 / 300, "rdp") < 8.0
    kwargs = dict(target_epsilon=8.0, target_delta=1 / 300, sampling_probability=256 / 300, steps=5, accountant="rdp")
    sigma = calibrate_noise_multiplier_with_releases(releases=greedy, **kwargs)
    assert sigma > 3 * calibrate_noise_multiplier(**kwargs)
    events = [*greedy, dpsgd_event(sampling_probability=256 / 300, noise_multiplier=sigma, steps=5)]
    assert 8.0 * (1 - 1e-3) <= _epsilon(events, 1 / 300, "rdp") <= 8.0


def test_no_release_is_plain_calibration():
    kwargs = dict(target_epsilon=2.0, target_delta=1e-5, sampling_probability=0.01, steps=500, accountant="rdp")
    assert calibrate_noise_multiplier_with_releases(**kwargs) == calibrate_noise_multiplier(**kwargs)


@pytest.mark.parametrize(
    "mechanism, event", [("gaussian", dp_accounting.GaussianDpEvent), ("laplace", dp_accounting.LaplaceDpEvent)]
)
def test_release_noise_multiplier_is_the_smallest(mechanism, event):
    z = release_noise_multiplier(epsilon=0.5, delta=1e-5, mechanism=mechanism)
    assert _epsilon([event(z)], 1e-5, "pld") <= 0.5 < _epsilon([event(z * 0.995)], 1e-5, "pld")
    if mechanism == "laplace":  # pure DP: eps = 1 / z, so z is about 2 (delta only helps)
        assert z == pytest.approx(2.0, rel=0.01)
    big = release_noise_multiplier(epsilon=30.0, delta=1e-5, mechanism=mechanism, accountant="rdp")
    assert big < 1.0 and _epsilon([event(big)], 1e-5, "rdp") <= 30.0  # searches below its start too


def test_unreachable_targets_raise_clear_errors():
    common = dict(target_delta=1e-5, sampling_probability=0.01, steps=100, accountant="rdp")
    with pytest.raises(ValueError, match="releases alone spend epsilon .* >= `target_epsilon`=1.0"):
        calibrate_noise_multiplier_with_releases(
            target_epsilon=1.0, releases=[dp_accounting.GaussianDpEvent(1.0)], **common
        )
    with pytest.raises(ValueError, match="cannot be met"):  # the steps alone cannot meet it either
        calibrate_noise_multiplier_with_releases(
            target_epsilon=0.05,
            target_delta=1e-5,
            sampling_probability=1.0,
            steps=10**6,
            accountant="rdp",
            releases=[dp_accounting.GaussianDpEvent(1e3)],
        )
    with pytest.raises(ValueError, match="noise multiplier above"):
        release_noise_multiplier(epsilon=1e-9, delta=1e-5, accountant="rdp")


def test_bad_arguments():
    common = dict(target_epsilon=1.0, target_delta=1e-5, sampling_probability=0.01, steps=100, accountant="rdp")
    with pytest.raises(TypeError, match="`releases`"):
        calibrate_noise_multiplier_with_releases(releases=["gaussian"], **common)
    with pytest.raises(ValueError, match="cannot compose the release event"):
        calibrate_noise_multiplier_with_releases(releases=[dp_accounting.UnsupportedDpEvent()], **common)
    with pytest.raises(ValueError, match="`mechanism`"):
        release_noise_multiplier(epsilon=1.0, delta=1e-5, mechanism="exponential")
    with pytest.raises(ValueError, match="`epsilon`"):
        release_noise_multiplier(epsilon=0.0, delta=1e-5)
    with pytest.raises(ValueError, match="`delta`"):
        release_noise_multiplier(epsilon=1.0, delta=1.0)
