"""The PrivacyBudget callback (tfdp_embed/accounting/budget.py).

A tiny Keras model is trained with the callback; the expected last allowed
step is found independently by brute force with the same accountant.
"""

from __future__ import annotations

import json
import logging

import dp_accounting
import numpy as np
import pytest

from tfdp_embed.accounting import PrivacyBudget, PrivacyLedger, compute_epsilon
from tfdp_embed.errors import PrivacyBudgetExceededError
from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.mechanisms.base import NoiseMechanism
from tfdp_embed.mechanisms.capabilities import MechanismCapabilities

DELTA = 1e-5
N, BATCH = 40, 4  # 10 batches per epoch
Q = BATCH / N
SIGMA = 2.0  # RDP of the sampled Gaussian is fast at q = 0.1, sigma = 2
SETUP_SIGMA = 8.0  # a one-off Gaussian worth about 4 steps


class FakeMechanism(NoiseMechanism):
    """A DP mechanism that only reports events (the tiny model trains without it)."""

    name = "fake"
    capabilities = MechanismCapabilities(one_off_events=True)

    def __init__(self, *, noise_multiplier: float, setup_noise_multiplier: float | None = None):
        super().__init__(l2_norm_clip=1.0, noise_multiplier=noise_multiplier, seed=0)
        self.setup_noise_multiplier = setup_noise_multiplier

    def update(self, clipped):
        return []

    def step_event(self, sampling_probability):
        return dp_accounting.PoissonSampledDpEvent(
            sampling_probability, dp_accounting.GaussianDpEvent(self.noise_multiplier)
        )

    def setup_event(self):
        if self.setup_noise_multiplier is None:
            return None
        return dp_accounting.GaussianDpEvent(self.setup_noise_multiplier)


class FakeNotDP(FakeMechanism):
    """Like EANA: not DP, its step event is unsupported by every accountant."""

    name = "fake_not_dp"
    is_dp = False

    def step_event(self, sampling_probability):
        return dp_accounting.UnsupportedDpEvent()


def _model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.layers.Dense(1, input_shape=(4,))])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    return model


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, 4)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, x.sum(1, keepdims=True))).batch(BATCH)


def _eps(k, sigma=SIGMA, setup=None, accountant="rdp"):
    events = [] if setup is None else [dp_accounting.GaussianDpEvent(setup)]
    step = dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(sigma))
    events.append(dp_accounting.SelfComposedDpEvent(step, k))
    return compute_epsilon(events, target_delta=DELTA, accountant=accountant)


def _target_between(k, **kwargs):
    """A target epsilon allowing exactly k steps: halfway between eps(k) and eps(k+1)."""
    return 0.5 * (_eps(k, **kwargs) + _eps(k + 1, **kwargs))


def test_stops_exactly_at_last_allowed_step_and_logs_epsilon():
    k_max = 13  # second epoch, third batch
    target = _target_between(k_max)
    mechanism = FakeMechanism(noise_multiplier=SIGMA)
    budget = PrivacyBudget(
        mechanism, sampling_probability=Q, target_epsilon=target, target_delta=DELTA, accountant="rdp"
    )
    model = _model()
    history = model.fit(_data(), epochs=10, callbacks=[budget], verbose=0)
    assert budget.max_steps == k_max
    assert int(model.optimizer.iterations.numpy()) == k_max  # the 14th step never ran
    assert budget.ledger.steps == k_max
    assert budget.stopped_by_budget
    # epsilon reaches History at every epoch end (2 epochs: 10, 13 steps).
    assert history.history["epsilon"] == pytest.approx([_eps(10), _eps(13)], rel=1e-9)
    assert history.history["epsilon"][-1] <= target
    assert budget.epsilon == pytest.approx(_eps(13), rel=1e-9)


def test_setup_event_counted_once_and_resume_continues():
    k_max = 14
    target = _target_between(k_max, setup=SETUP_SIGMA)
    assert _eps(k_max + 4) < target  # without the setup event 4+ more steps would fit
    mechanism = FakeMechanism(noise_multiplier=SIGMA, setup_noise_multiplier=SETUP_SIGMA)
    budget = PrivacyBudget(
        mechanism, sampling_probability=Q, target_epsilon=target, target_delta=DELTA, accountant="rdp"
    )
    model = _model()
    model.fit(_data(), epochs=1, callbacks=[budget], verbose=0)  # 10 steps
    assert budget.ledger.steps == 10 and not budget.stopped_by_budget
    model.fit(_data(), epochs=10, callbacks=[budget], verbose=0)  # resumes: 4 more
    assert budget.ledger.steps == k_max
    assert int(model.optimizer.iterations.numpy()) == k_max
    assert [e.kind for e in budget.ledger.entries] == ["setup", "step"]  # setup recorded once
    # A new run from the saved ledger has no step left and refuses to start.
    restored = PrivacyLedger.from_json(budget.ledger.to_json())
    again = PrivacyBudget(
        mechanism, sampling_probability=Q, target_epsilon=target, target_delta=DELTA, accountant="rdp", ledger=restored
    )
    with pytest.raises(PrivacyBudgetExceededError, match="Not even one more step"):
        _model().fit(_data(), epochs=1, callbacks=[again], verbose=0)


def test_reselection_events_are_recorded_with_multiplicity():
    # DP-FEST keeps one event per (re-)selection in `selection_events`; two
    # identical re-selections cost twice.
    mechanism = FakeMechanism(noise_multiplier=SIGMA)
    selection = dp_accounting.GaussianDpEvent(SETUP_SIGMA)
    mechanism.selection_events = [selection]
    budget = PrivacyBudget(mechanism, sampling_probability=Q, target_epsilon=5.0, target_delta=DELTA, accountant="rdp")
    model = _model()
    model.fit(_data(), epochs=1, callbacks=[budget], verbose=0)
    mechanism.selection_events = [selection, dp_accounting.GaussianDpEvent(SETUP_SIGMA)]  # equal, new object
    model.fit(_data(), epochs=1, callbacks=[budget], verbose=0)
    assert [e.kind for e in budget.ledger.entries] == ["setup", "step", "setup", "step"]
    assert budget.spent_epsilon() == pytest.approx(
        compute_epsilon(
            [selection, selection, dp_accounting.SelfComposedDpEvent(mechanism.step_event(Q), 20)],
            target_delta=DELTA,
            accountant="rdp",
        ),
        rel=1e-12,
    )


def test_steps_before_this_run_count():
    k_max = 12
    target = _target_between(k_max)
    mechanism = FakeMechanism(noise_multiplier=SIGMA)
    mechanism.steps.assign(7)  # restored from a checkpoint, no ledger
    budget = PrivacyBudget(
        mechanism, sampling_probability=Q, target_epsilon=target, target_delta=DELTA, accountant="rdp"
    )
    model = _model()
    model.fit(_data(), epochs=5, callbacks=[budget], verbose=0)
    assert int(model.optimizer.iterations.numpy()) == k_max - 7
    assert budget.ledger.steps == k_max
    # initial_steps larger than mechanism.steps wins (conservative).
    budget = PrivacyBudget(
        FakeMechanism(noise_multiplier=SIGMA),
        sampling_probability=Q,
        target_epsilon=target,
        target_delta=DELTA,
        accountant="rdp",
        initial_steps=10,
    )
    budget.on_train_begin()
    assert budget.remaining_steps == 2


def test_already_over_budget_raises_at_train_begin():
    ledger = PrivacyLedger()
    ledger.record_steps(dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(SIGMA)), 1000)
    budget = PrivacyBudget(
        FakeMechanism(noise_multiplier=SIGMA),
        sampling_probability=Q,
        target_epsilon=1.0,
        target_delta=DELTA,
        accountant="rdp",
        ledger=ledger,
    )
    model = _model()
    with pytest.raises(PrivacyBudgetExceededError, match=r"already spent epsilon .* > `target_epsilon`=1"):
        model.fit(_data(), epochs=1, callbacks=[budget], verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 0


def test_pld_search_is_exact():
    target = 2.0
    budget = PrivacyBudget(
        FakeMechanism(noise_multiplier=2.0), sampling_probability=0.01, target_epsilon=target, target_delta=DELTA
    )
    budget.on_train_begin()
    k = budget.max_steps
    step = dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(2.0))

    def eps(n):
        return compute_epsilon(dp_accounting.SelfComposedDpEvent(step, n), target_delta=DELTA, accountant="pld")

    assert eps(k) <= target < eps(k + 1)
    assert k > 1000  # several epochs of q = 0.01


def test_non_dp_mechanism_logs_nominal_epsilon_under_its_own_key(caplog):
    k_max = 6
    target = _target_between(k_max)  # nominal: DP-SGD with the same sigma
    mechanism = FakeNotDP(noise_multiplier=SIGMA)
    budget = PrivacyBudget(
        mechanism, sampling_probability=Q, target_epsilon=target, target_delta=DELTA, accountant="rdp"
    )
    model = _model()
    with caplog.at_level(logging.WARNING, logger="tfdp_embed.accounting.budget"):
        history = model.fit(_data(), epochs=3, callbacks=[budget], verbose=0)
    assert "epsilon" not in history.history
    assert history.history["epsilon_not_dp"] == pytest.approx([_eps(6)], rel=1e-9)
    assert int(model.optimizer.iterations.numpy()) == k_max
    assert "NOT differentially private" in caplog.text
    assert "NOMINAL" in caplog.text
    # The ledger holds what really happened: unsupported events, no epsilon.
    with pytest.raises(ValueError, match="no DP guarantee"):
        budget.ledger.epsilon(DELTA)


def test_bad_arguments():
    mechanism = FakeMechanism(noise_multiplier=SIGMA)
    with pytest.raises(ValueError, match="`target_epsilon`"):
        PrivacyBudget(mechanism, sampling_probability=Q, target_epsilon=0, target_delta=DELTA)
    with pytest.raises(ValueError, match="`sampling_probability`"):
        PrivacyBudget(mechanism, sampling_probability=0, target_epsilon=1.0, target_delta=DELTA)
    with pytest.raises(ValueError, match="`accountant`"):
        PrivacyBudget(mechanism, sampling_probability=Q, target_epsilon=1.0, target_delta=DELTA, accountant="x")
    with pytest.raises(TypeError, match="`mechanism`"):
        PrivacyBudget("dense", sampling_probability=Q, target_epsilon=1.0, target_delta=DELTA)


# -- resuming from a checkpointed ledger; the report the budget writes --------------------------


def test_resume_from_checkpointed_ledger_stops_at_the_uninterrupted_step_and_writes_report(tmp_path):
    k_max = 23  # third epoch, fourth batch
    target = _target_between(k_max, setup=SETUP_SIGMA)
    mechanism = FakeMechanism(noise_multiplier=SIGMA, setup_noise_multiplier=SETUP_SIGMA)

    def budget(**kwargs):
        return PrivacyBudget(
            mechanism,
            sampling_probability=Q,
            target_epsilon=target,
            target_delta=DELTA,
            accountant="rdp",
            dataset_size=N,
            **kwargs,
        )

    class StopAt(keras.callbacks.Callback):
        def __init__(self, steps):
            super().__init__()
            self.steps, self.seen = steps, 0

        def on_train_batch_end(self, batch, logs=None):
            self.seen += 1
            if self.seen == self.steps:
                self.model.stop_training = True

    first = budget()
    _model().fit(_data(), epochs=10, callbacks=[first, StopAt(17)], verbose=0)  # "killed" after 17 steps
    checkpointed = first.ledger.to_json()
    resumed = budget(report_path=str(tmp_path / "report.json"))
    resumed.resume_from(PrivacyLedger.from_json(checkpointed))
    model = _model()
    model.fit(_data(), epochs=10, callbacks=[resumed], verbose=0)
    # The resumed run stops after the 6 steps that were left: 23 in total, as uninterrupted.
    assert int(model.optimizer.iterations.numpy()) == k_max - 17
    assert resumed.ledger.steps == k_max and resumed.stopped_by_budget
    assert [e.kind for e in resumed.ledger.entries] == ["setup", "step"]  # setup counted once
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["steps"] == k_max and report["extra"]["budget"]["stopped_by_budget"] is True
    assert report["epsilon"] == pytest.approx(_eps(k_max, setup=SETUP_SIGMA), rel=1e-6)
    assert report["epsilon"] <= target


def test_budget_refusing_to_start_says_so_and_writes_report(tmp_path):
    k_max = 13
    target = _target_between(k_max)
    mechanism = FakeMechanism(noise_multiplier=SIGMA)
    spent = PrivacyLedger()
    spent.record_steps(mechanism.step_event(Q), k_max)
    budget = PrivacyBudget(
        mechanism,
        sampling_probability=Q,
        target_epsilon=target,
        target_delta=DELTA,
        accountant="rdp",
        report_path=str(tmp_path / "report.json"),
        dataset_size=N,
    )
    budget.resume_from(spent)
    with pytest.raises(PrivacyBudgetExceededError, match="Not even one more step"):
        _model().fit(_data(), epochs=1, callbacks=[budget], verbose=0)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["extra"]["budget"]["refused_to_start"] is True and report["steps"] == k_max


def test_resume_from_refuses_to_drop_or_double_count_entries():
    mechanism = FakeMechanism(noise_multiplier=SIGMA)
    step = mechanism.step_event(Q)
    saved = PrivacyLedger()
    saved.record_setup(dp_accounting.GaussianDpEvent(SETUP_SIGMA))
    saved.record_steps(step, 7)
    fresh = PrivacyLedger()
    fresh.record_setup(dp_accounting.GaussianDpEvent(SETUP_SIGMA))  # a new process records its setup again
    fresh.resume_from(saved)
    assert fresh == saved and fresh.steps == 7
    other = PrivacyLedger()
    other.record_steps(step, 3)  # steps the checkpointed ledger does not start with
    with pytest.raises(ValueError, match="drop or double-count"):
        other.resume_from(saved)
    with pytest.raises(TypeError, match="PrivacyLedger"):
        PrivacyBudget(mechanism, sampling_probability=Q, target_epsilon=1.0, target_delta=DELTA).resume_from({})
    with pytest.raises(ValueError, match="dataset_size"):
        PrivacyBudget(mechanism, sampling_probability=Q, target_epsilon=1.0, target_delta=DELTA, report_path="r.json")


@pytest.mark.parametrize("planned_steps", [8, 13, 30], ids=["within", "exactly_the_last", "beyond"])
def test_planned_steps_are_only_a_hint_for_where_training_stops(planned_steps, monkeypatch):
    # A run that plans k steps which fit checks them alone at train begin; the search for the last step
    # that fits runs only if training goes past them. Where training stops never depends on the plan.
    k_max = 13
    target = _target_between(k_max)
    searches = []
    original = PrivacyBudget._max_extra_steps
    monkeypatch.setattr(
        PrivacyBudget, "_max_extra_steps", lambda self, spent: searches.append(1) or original(self, spent)
    )
    budget = PrivacyBudget(
        FakeMechanism(noise_multiplier=SIGMA),
        sampling_probability=Q,
        target_epsilon=target,
        target_delta=DELTA,
        accountant="rdp",
        planned_steps=planned_steps,
    )
    model = _model()
    model.fit(_data(), epochs=10, callbacks=[budget], verbose=0)
    assert budget.ledger.steps == k_max and budget.stopped_by_budget  # the 14th step never ran
    assert len(searches) == 1  # at train begin when 30 steps do not fit, else once training passed the plan
    assert budget.max_steps == k_max and len(searches) == 1


def test_planned_steps_that_fit_skip_the_search():
    target = _target_between(13)
    budget = PrivacyBudget(
        FakeMechanism(noise_multiplier=SIGMA),
        sampling_probability=Q,
        target_epsilon=target,
        target_delta=DELTA,
        accountant="rdp",
        planned_steps=10,
    )
    model = _model()
    model.fit(_data(), epochs=1, callbacks=[budget], verbose=0)
    assert budget.ledger.steps == 10 and not budget.stopped_by_budget
    assert budget._max_steps is None  # never searched: training stayed within the planned steps
    assert budget.max_steps == 13  # searched when read
    with pytest.raises(ValueError, match="planned_steps"):
        PrivacyBudget(
            FakeMechanism(noise_multiplier=SIGMA),
            sampling_probability=Q,
            target_epsilon=target,
            target_delta=DELTA,
            planned_steps=0,
        )
