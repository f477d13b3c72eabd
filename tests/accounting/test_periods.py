"""Streaming periods under parallel composition (tfdp_embed/accounting/periods.py), with a plain event source.

The source below is not a NoiseMechanism: the accounting reads events only.
"""

from __future__ import annotations

import types

import dp_accounting
import pytest

from tfdp_embed.accounting import EventSource, calibrate_noise_multiplier, compute_epsilon, dpsgd_event
from tfdp_embed.accounting.periods import (
    PARALLEL,
    AccountingPeriod,
    add_period_accounting,
    calibrate_periods,
    parallel_epsilon,
    period_ledger,
    period_ledgers,
)
from tfdp_embed.errors import PrivacyBudgetExceededError
from tfdp_embed.keras2.callbacks import PeriodBudget

DELTA = 1e-5
SELECTION = dp_accounting.GaussianDpEvent(20.0)
CALIBRATION = dp_accounting.LaplaceDpEvent(1 / 0.1)  # a 0.1-DP output calibration


class Source:
    """A DP-SGD step with `sigma` and the one-off events made so far."""

    name, steps = "source", 0

    def __init__(self, sigma: float, one_off=(), is_dp: bool = True):
        self.noise_multiplier, self.is_dp, self.made = sigma, is_dp, list(one_off)

    def step_event(self, q):
        if not self.is_dp:
            return dp_accounting.UnsupportedDpEvent()
        return dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(self.noise_multiplier))

    def one_off_events(self):
        return list(self.made)

    def report(self):
        return {}


def test_a_plain_object_is_an_event_source():
    assert isinstance(Source(1.0), EventSource)
    assert not isinstance(object(), EventSource)


def test_the_noisier_period_decides_sigma():
    periods = [AccountingPeriod(0.02, 100), AccountingPeriod(0.05, 100)]
    both = calibrate_periods(periods, target_epsilon=2.0, target_delta=DELTA, accountant="rdp")
    alone = calibrate_noise_multiplier(
        target_epsilon=2.0, target_delta=DELTA, sampling_probability=0.05, steps=100, accountant="rdp"
    )
    assert both == alone
    with pytest.raises(ValueError, match="at least one period"):
        calibrate_periods([], target_epsilon=2.0, target_delta=DELTA)


def test_each_period_is_charged_its_steps_and_every_one_off_event():
    sigma = calibrate_periods([AccountingPeriod(0.05, 100)], target_epsilon=2.0, target_delta=DELTA, accountant="rdp")
    source = Source(sigma, [SELECTION])
    ledger = period_ledger(source, AccountingPeriod(0.05, 100), planned_one_off_events=3, events=[CALIBRATION])
    assert ledger.steps == 100
    assert [e.event for e in ledger.entries if e.kind == "setup"] == [SELECTION] * 3 + [CALIBRATION]
    oracle = [SELECTION] * 3 + [CALIBRATION, dpsgd_event(sampling_probability=0.05, noise_multiplier=sigma, steps=100)]
    assert ledger.epsilon(DELTA, "rdp") == pytest.approx(compute_epsilon(oracle, target_delta=DELTA, accountant="rdp"))
    # After the run only the events really made are charged; sequential composition would charge more.
    final = period_ledgers(source, [AccountingPeriod(0.02, 100), AccountingPeriod(0.05, 100)], events=[CALIBRATION])
    epsilons, worst = parallel_epsilon(final, delta=DELTA, accountant="rdp")
    assert worst == 1 and epsilons[0] < epsilons[1] <= 2.0 + 0.1 + 1e-6
    sequential = period_ledger(source, AccountingPeriod(0.05, 200), events=[CALIBRATION])
    assert sequential.epsilon(DELTA, "rdp") > epsilons[1]


def test_a_non_dp_source_is_charged_the_nominal_dp_sgd_step():
    ledger = period_ledger(Source(0.8, is_dp=False), AccountingPeriod(0.05, 10))
    assert ledger.entries[-1].event == dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(0.8))


def test_period_budget_refuses_a_plan_over_the_target_and_stops_after_its_steps():
    sigma = calibrate_periods([AccountingPeriod(0.05, 100)], target_epsilon=2.0, target_delta=DELTA, accountant="rdp")

    def budget(steps, planned=0):
        return PeriodBudget(
            Source(sigma, [SELECTION]),
            period=AccountingPeriod(0.05, steps),
            target_epsilon=2.5,
            target_delta=DELTA,
            accountant="rdp",
            planned_one_off_events=planned,
        )

    fits = budget(100)
    fits.set_model(types.SimpleNamespace(stop_training=False))
    fits.on_train_begin()
    for batch in range(100):
        assert not fits.model.stop_training
        fits.on_train_batch_end(batch)
    assert fits.model.stop_training and fits.ledger.steps == 100
    with pytest.raises(PrivacyBudgetExceededError, match="does not cover it"):
        budget(400).on_train_begin()
    with pytest.raises(PrivacyBudgetExceededError, match="does not cover it"):
        budget(100, planned=200).on_train_begin()  # 199 more selections still to come


def test_report_fields_name_the_worst_period():
    ledgers = period_ledgers(Source(1.0), [AccountingPeriod(0.01, 10), AccountingPeriod(0.05, 10)])
    epsilons, worst = parallel_epsilon(ledgers, delta=DELTA, accountant="rdp")
    report = add_period_accounting({"caveats": []}, ledgers, epsilons, worst)
    assert report["composition"] == PARALLEL
    assert [a["period"] for a in report["period_accounting"]] == [1, 2]
    assert report["ledger"]["entries"][0]["count"] == 10 and "Worst period: 2" in report["caveats"][0]
