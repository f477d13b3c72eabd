"""One run's epsilons are computed once per distinct event sequence, and are the numbers `dp_accounting` gives.

Oracle: a fresh `dp_accounting.pld.PLDAccountant` (no memo anywhere) composing
the same event; equality is exact (==), not approximate: the memo may only
skip work, never change a bit of epsilon.
"""

from __future__ import annotations

import dp_accounting
import pytest

from tfdp_embed import Release, plan_run
from tfdp_embed.accounting import PrivacyLedger, compute_epsilon, make_accountant
from tfdp_embed.accounting import calibration as calibration_module
from tfdp_embed.accounting.pld_steps import StepMemoPLDAccountant, composed_steps, step_distribution

DELTA = 1e-5


def _fresh(event, interval=1e-4, delta=DELTA) -> float:
    """epsilon from dp_accounting's own PLD accountant, nothing memoised."""
    return dp_accounting.pld.PLDAccountant(value_discretization_interval=interval).compose(event).get_epsilon(delta)


def _step(q, sigma):
    return dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))


EVENTS = {
    "dp-sgd": dp_accounting.SelfComposedDpEvent(_step(0.01, 0.9), 300),
    "laplace then steps": dp_accounting.ComposedDpEvent(
        [dp_accounting.LaplaceDpEvent(1 / 0.15), dp_accounting.SelfComposedDpEvent(_step(0.01, 0.9), 98)]
    ),
    "two step events (adafest-like)": dp_accounting.SelfComposedDpEvent(
        dp_accounting.ComposedDpEvent([_step(0.02, 1.1), _step(0.02, 3.0)]), 50
    ),
    "one bare step": _step(0.05, 2.0),
    "sigma 0 (not private)": dp_accounting.SelfComposedDpEvent(_step(0.01, 0.0), 10),
    "q 0 (no step)": dp_accounting.SelfComposedDpEvent(_step(0.0, 1.0), 10),
}


@pytest.mark.parametrize("name", list(EVENTS))
def test_memo_accountant_gives_dp_accountings_exact_epsilon_on_first_and_repeated_use(name):
    event = EVENTS[name]
    expected = _fresh(event, interval=1e-3)
    for _ in range(2):  # the second time the step distributions come from the memo
        assert StepMemoPLDAccountant(value_discretization_interval=1e-3).compose(event).get_epsilon(DELTA) == expected


def test_make_accountant_is_the_memo_accountant_and_shares_step_distributions():
    assert isinstance(make_accountant("pld"), StepMemoPLDAccountant)
    assert isinstance(make_accountant("pld"), dp_accounting.pld.PLDAccountant)
    step_distribution.cache_clear()
    composed_steps.cache_clear()
    for count in (98, 118, 119):  # the calibration's, then the budget's k and k + 1: one distribution built
        event = dp_accounting.SelfComposedDpEvent(_step(0.01024, 0.68), count)
        assert compute_epsilon(event, target_delta=DELTA) == _fresh(event)
    info = step_distribution.cache_info()
    assert (info.misses, info.hits) == (1, 2)


def test_the_steps_self_composition_is_shared_and_exact():
    # The calibration's confirmation, then the budget's check with a Laplace release: one self-composition.
    composed_steps.cache_clear()
    steps = dp_accounting.SelfComposedDpEvent(_step(0.01024, 0.68), 98)
    with_release = dp_accounting.ComposedDpEvent([dp_accounting.LaplaceDpEvent(1 / 0.15), steps])
    assert compute_epsilon(steps, target_delta=DELTA) == _fresh(steps)
    assert compute_epsilon(with_release, target_delta=DELTA) == _fresh(with_release)
    info = composed_steps.cache_info()
    assert (info.misses, info.hits) == (1, 1)


def test_a_runs_reported_epsilon_is_dp_accountings_and_the_budgets_is_reused(monkeypatch):
    # The Criteo pipeline's sequence on a smaller run: a Laplace release (5% of epsilon), then T DP-SGD steps.
    plan = plan_run(
        "dense",
        target_epsilon=3.0,
        target_delta=DELTA,
        sampling_probability=0.02,
        steps=60,
        releases=[Release("output_calibration", epsilon_share=0.05)],
        seed=0,
    )
    budget = plan.budget()
    budget.set_model(type("Model", (), {"batching": None, "stop_training": False})())
    budget.on_train_begin()
    budget.ledger.record_steps(budget.mechanism.step_event(plan.sampling_probability), 60)
    logs: dict = {}
    budget.on_epoch_end(0, logs)
    evaluations = []
    original = StepMemoPLDAccountant.get_epsilon
    monkeypatch.setattr(
        StepMemoPLDAccountant, "get_epsilon", lambda self, d: evaluations.append(d) or original(self, d)
    )
    report = plan.report(dataset_size=5000, batching="poisson", ledger=budget.ledger)
    expected = _fresh(budget.ledger.as_event())  # what the report computed before the memo (same event)
    assert report["epsilon"] == logs["epsilon"] == budget.epsilon == expected
    # The report's epsilon (at DELTA) is the budget's epoch-end one, not computed again; the trade-off
    # rows (`attacker_bound.pld_bounds`) size their epsilon grid from epsilon at delta 1e-6 only.
    assert DELTA not in evaluations and set(evaluations) <= {1e-6}, evaluations


def test_ledger_epsilon_composes_entries_as_recorded():
    # Two identical one-off events in a row are composed one after the other, as `as_event` says, not merged.
    laplace, step = dp_accounting.LaplaceDpEvent(5.0), _step(0.01, 1.0)
    ledger = PrivacyLedger()
    ledger.record_setup(laplace)
    ledger.record_setup(laplace)
    ledger.record_steps(step, 40)
    for accountant, fresh in (
        ("pld", lambda e: _fresh(e)),
        ("rdp", lambda e: dp_accounting.rdp.RdpAccountant().compose(e).get_epsilon(DELTA)),
    ):
        assert ledger.epsilon(DELTA, accountant) == fresh(ledger.as_event())
        assert ledger.epsilon(DELTA, accountant) == fresh(ledger.as_event())  # memo hit, same number
    assert PrivacyLedger().epsilon(DELTA) == 0.0
    with pytest.raises(ValueError, match="target_delta"):
        ledger.epsilon(0.0)


def test_entries_memo_does_not_mix_up_deltas_grids_or_accountants():
    entries = ((dp_accounting.LaplaceDpEvent(2.0), 1), (_step(0.01, 1.0), 30))
    event = dp_accounting.ComposedDpEvent(
        [dp_accounting.LaplaceDpEvent(2.0), dp_accounting.SelfComposedDpEvent(_step(0.01, 1.0), 30)]
    )
    values = {
        (delta, interval): calibration_module.entries_epsilon(entries, delta=delta, accountant="pld", interval=interval)
        for delta in (1e-5, 1e-6)
        for interval in (1e-3, 1e-4)
    }
    for (delta, interval), value in values.items():
        assert value == _fresh(event, interval=interval, delta=delta)
    assert len(set(values.values())) == 4
