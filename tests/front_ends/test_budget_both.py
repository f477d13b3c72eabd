"""The accounting pins, once per front end: the budget callback stops at the last step the target allows.

The epsilon each front end's `PrivacyBudget` logs, and the step it stops at,
are pinned against `compute_epsilon` of the same composition (RDP, Poisson
sampled Gaussian at q = 1/4, sigma = 2), as tests/accounting/test_budget.py
pins them on a plain tf-keras model.
"""

from __future__ import annotations

import dp_accounting
import pytest

from tfdp_embed import mechanisms
from tfdp_embed.accounting import compute_epsilon

from .front_ends import ctr_batches

DELTA, SIGMA, BATCH, BATCHES = 1e-5, 2.0, 128, 4
Q = 1 / BATCHES


def _eps(steps: int) -> float:
    step = dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(SIGMA))
    return compute_epsilon([dp_accounting.SelfComposedDpEvent(step, steps)], target_delta=DELTA, accountant="rdp")


@pytest.mark.parametrize("name", ["DenseDPSGD", "LazyDP"])
def test_the_budget_stops_at_the_last_allowed_step_and_logs_the_pinned_epsilon(fe, name):
    k_max = 6  # second epoch, second batch
    mech = getattr(mechanisms, name)(l2_norm_clip=1.0, noise_multiplier=SIGMA, seed=0)
    budget = fe.PrivacyBudget(
        mech,
        sampling_probability=Q,
        target_epsilon=0.5 * (_eps(k_max) + _eps(k_max + 1)),
        target_delta=DELTA,
        accountant="rdp",
    )
    dp = fe.dp_model(fe.ctr_model(), mech, batch=BATCH)
    history = dp.fit(ctr_batches(n=BATCH * BATCHES, batch=BATCH), epochs=5, callbacks=[budget], verbose=0)
    assert budget.max_steps == k_max and budget.stopped_by_budget
    assert int(mech.steps.numpy()) == budget.ledger.steps == k_max  # the 7th step never ran
    assert history.history["epsilon"] == pytest.approx([_eps(BATCHES), _eps(k_max)], rel=1e-9)
    assert budget.epsilon == pytest.approx(_eps(k_max), rel=1e-9)


def test_eana_logs_its_nominal_epsilon_as_not_dp(fe):
    """EANA is not DP: its epsilon is reported under `epsilon_not_dp`, never as `epsilon`, on both front ends."""
    mech = mechanisms.EANA(l2_norm_clip=1.0, noise_multiplier=SIGMA, seed=0)
    budget = fe.PrivacyBudget(mech, sampling_probability=Q, target_epsilon=100.0, target_delta=DELTA, accountant="rdp")
    dp = fe.dp_model(fe.ctr_model(), mech, batch=BATCH)
    history = dp.fit(ctr_batches(n=BATCH * BATCHES, batch=BATCH), epochs=1, callbacks=[budget], verbose=0)
    assert "epsilon" not in history.history
    assert history.history["epsilon_not_dp"] == pytest.approx([_eps(BATCHES)], rel=1e-9)


def test_a_period_budget_stops_training_when_its_period_ends(fe):
    import importlib

    from tfdp_embed.accounting.periods import AccountingPeriod

    period_budget = importlib.import_module(f"tfdp_embed.{fe.name}.callbacks").PeriodBudget
    mech = mechanisms.LazyDP(l2_norm_clip=1.0, noise_multiplier=SIGMA, seed=0)
    budget = period_budget(
        mech, period=AccountingPeriod(Q, 6), target_epsilon=50.0, target_delta=DELTA, accountant="rdp"
    )
    dp = fe.dp_model(fe.ctr_model(), mech, batch=BATCH)
    dp.fit(ctr_batches(n=BATCH * BATCHES, batch=BATCH), epochs=5, callbacks=[budget], verbose=0)
    assert int(mech.steps.numpy()) == budget.ledger.steps == 6
