"""`tfdp_embed.plan_run`: calibration per mechanism, releases, budgets and reports, checked with dp_accounting.

RDP throughout (PLD calibration takes seconds to minutes); the planner runs
the same code for both.
"""

from __future__ import annotations

import types

import dp_accounting
import numpy as np
import pytest

from tfdp_embed import Release, mechanisms, plan_run
from tfdp_embed.accounting import (
    AccountingPeriod,
    PeriodBudget,
    PrivacyBudget,
    calibrate_noise_multiplier,
    compute_epsilon,
    dpsgd_event,
    release_epsilon,
)
from tfdp_embed.accounting import calibration as calibration_module
from tfdp_embed.mechanisms.adafest import effective_noise_multiplier

DELTA = 1e-5
RUN = dict(target_delta=DELTA, accountant="rdp", sampling_probability=0.05, steps=200)
COUNTS = {"t": np.arange(100, dtype=np.int64)}


def rdp_epsilon(events) -> float:
    return compute_epsilon(events, target_delta=DELTA, accountant="rdp")


def steps_event(sigma: float):
    return dpsgd_event(sampling_probability=0.05, noise_multiplier=sigma, steps=200)


def test_dense_sigma_is_the_calibrators_and_meets_the_target():
    plan = plan_run("dense", target_epsilon=1.0, **RUN)
    sigma = calibrate_noise_multiplier(
        target_epsilon=1.0, target_delta=DELTA, sampling_probability=0.05, steps=200, accountant="rdp"
    )
    assert plan.noise_multiplier == sigma and plan.mechanism.noise_multiplier == sigma
    assert isinstance(plan.mechanism, mechanisms.DenseDPSGD) and plan.is_dp and plan.events == ()
    assert rdp_epsilon(steps_event(sigma)) <= 1.0 < rdp_epsilon(steps_event(sigma * (1 - 1e-3)))


def test_fest_selection_is_deducted_by_basic_composition():
    plan = plan_run("fest", target_epsilon=1.0, releases=[Release.selection(0.1)], top_k=5, counts=COUNTS, **RUN)
    sigma = plan.noise_multiplier
    assert plan.mechanism.selection_epsilon == pytest.approx(0.1) and plan.training_epsilon == pytest.approx(0.9)
    assert rdp_epsilon(steps_event(sigma)) <= 0.9 < rdp_epsilon(steps_event(sigma * (1 - 1e-3)))
    assert plan.events == ()  # the mechanism records its own selection event
    streaming = plan_run(
        "fest", target_epsilon=1.0, releases=[Release.selection(0.1, count=4)], top_k=5, counts=COUNTS, **RUN
    )
    assert streaming.mechanism.selection_epsilon == pytest.approx(0.025)  # one of 4 selections


def test_adafest_split_keeps_the_step_gaussian_and_sets_tau_in_noise_units():
    plan = plan_run("adafest", target_epsilon=2.0, ratio=3.0, contribution_clip=0.5, threshold_sigmas=2.0, **RUN)
    mechanism, sigma = plan.mechanism, plan.noise_multiplier
    assert mechanism.contribution_noise_multiplier / mechanism.noise_multiplier == pytest.approx(3.0)
    assert effective_noise_multiplier(mechanism.contribution_noise_multiplier, mechanism.noise_multiplier) == (
        pytest.approx(sigma)
    )
    assert mechanism.threshold == pytest.approx(2.0 * mechanism.contribution_noise_multiplier * 0.5)
    summary = plan.summary()
    assert summary["noise_multiplier"] == sigma  # the step's DP-SGD-equivalent sigma; sigma1, sigma2 beside it
    assert summary["mechanism_arguments"]["contribution_noise_multiplier"] == mechanism.contribution_noise_multiplier
    assert sigma == plan_run("dense", target_epsilon=2.0, **RUN).noise_multiplier
    explicit = plan_run("adafest", target_epsilon=2.0, contribution_clip=0.5, threshold=7.0, threshold_sigmas=2, **RUN)
    assert explicit.mechanism.threshold == 7.0  # an explicit tau wins


def test_adafest_plus_selects_from_counts_with_a_top_fraction():
    plan = plan_run(
        "adafest+",
        target_epsilon=2.0,
        releases=[Release.selection(0.2)],
        top_fraction=0.25,
        counts=COUNTS,
        contribution_clip=1.0,
        threshold=9.0,
        seed=0,
        **RUN,
    )
    assert plan.mechanism.selection_epsilon == pytest.approx(0.4)
    assert len(plan.mechanism._selected_rows["t"]) == 25  # floor(0.25 x 100)
    assert plan.noise_multiplier == plan_run("dense", target_epsilon=1.6, **RUN).noise_multiplier


def test_eana_gets_dense_sigma_as_a_nominal_setting_and_says_so():
    plan = plan_run("eana", target_epsilon=2.0, **RUN)
    assert not plan.is_dp and plan.noise_multiplier == plan_run("dense", target_epsilon=2.0, **RUN).noise_multiplier
    report = plan.report(dataset_size=1000, batching="poisson", steps=10)
    assert report["epsilon"] is None and "NOT" in report["guarantee"]
    assert any("what dense DP-SGD would need" in c for c in report["caveats"])
    assert isinstance(plan.budget(), PrivacyBudget)  # a nominal cap, logged as epsilon_not_dp


def test_pure_share_is_precharged_as_its_laplace_event():
    plan = plan_run("dense", target_epsilon=3.0, releases=[Release("output_calibration", epsilon_share=0.05)], **RUN)
    (event,) = plan.events
    assert event == dp_accounting.LaplaceDpEvent(1 / (0.05 * 3.0))
    assert plan.release("output_calibration").epsilon == pytest.approx(0.15)
    assert plan.noise_multiplier == plan_run("dense", target_epsilon=2.85, **RUN).noise_multiplier
    budget = plan.budget()
    assert [e.event for e in budget.ledger.entries] == [event]
    summary = plan.summary()
    assert summary["releases"][0]["epsilon_share"] == 0.05 and summary["training_epsilon"] == pytest.approx(2.85)


def test_sized_release_is_composed_by_the_accountant():
    plan = plan_run(
        "dense", target_epsilon=4.0, releases=[Release("counts", epsilon_share=0.1, noise="gaussian")], **RUN
    )
    release = plan.release("counts")
    assert release.events == (dp_accounting.GaussianDpEvent(release.noise_multiplier),)
    alone = release_epsilon(list(release.events), delta=DELTA, accountant="rdp")
    assert alone <= 0.4 and alone == pytest.approx(0.4, rel=5e-3) and release.epsilon == alone
    both = [*release.events, steps_event(plan.noise_multiplier)]
    assert rdp_epsilon(both) == pytest.approx(4.0, rel=1e-3) and rdp_epsilon(both) <= 4.0
    assert plan.training_epsilon == 4.0  # nothing deducted: the accountant composes it


def test_a_given_noise_report_counts_the_plans_releases():
    """Sigma given (no budget, no ledger): the report's epsilon still composes the plan's accounted releases."""
    release = Release("item_counts", event=dp_accounting.GaussianDpEvent(2.0))
    plain = plan_run("dense", noise_multiplier=1.3, **RUN).report(dataset_size=1000, batching="poisson", steps=200)
    with_release = plan_run("dense", noise_multiplier=1.3, releases=[release], **RUN)
    report = with_release.report(dataset_size=1000, batching="poisson", steps=200)
    expected = rdp_epsilon([release.event, steps_event(1.3)])  # the release and the 200 steps
    assert report["epsilon"] == pytest.approx(expected, rel=1e-6) and report["epsilon"] > plain["epsilon"]
    assert with_release.steps_ledger(200).steps == 200


def test_given_noise_plans_nothing_and_enforces_nothing():
    plan = plan_run("dense", noise_multiplier=1.3, **RUN)
    assert plan.noise_source == "given" and plan.target_epsilon is None and plan.mechanism.noise_multiplier == 1.3
    with pytest.raises(ValueError, match="no epsilon target"):
        plan.budget()
    with pytest.raises(ValueError, match="no target epsilon to take shares of"):
        plan_run("dense", noise_multiplier=1.3, releases=[Release("x", epsilon_share=0.1)], **RUN)
    with pytest.raises(ValueError, match="exactly one of `target_epsilon`"):
        plan_run("dense", target_epsilon=1.0, noise_multiplier=1.3, **RUN)


def test_none_has_nothing_to_calibrate_or_charge():
    plan = plan_run("none", seed=0, **RUN)
    assert plan.noise_multiplier == 0.0 and plan.noise_source == "non-private" and not plan.is_dp
    assert isinstance(plan.mechanism, mechanisms.NonPrivate)
    with pytest.raises(ValueError, match="no epsilon target"):
        plan.budget()
    with pytest.raises(ValueError, match="trains without noise"):
        plan_run("none", releases=[Release("x", epsilon_share=0.1)], **RUN)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(mechanism="fest", top_k=5, counts=COUNTS), "makes a DP selection"),
        (
            dict(mechanism="fest", top_k=5, counts=COUNTS, selection_epsilon=0.1, releases=[Release.selection(0.1)]),
            "not as `selection_epsilon`",
        ),
        (dict(mechanism="dense", releases=[Release.selection(0.1)]), "makes no DP selection"),
        (dict(mechanism="dense", ratio=2.0), "contribution map"),
        (dict(mechanism="dense", top_k=5), "takes no option"),
        (dict(mechanism="adafest", contribution_clip=1.0), "needs \\['threshold'\\]"),
        (
            dict(mechanism="dense", releases=[Release("a", epsilon_share=0.6), Release("b", epsilon_share=0.5)]),
            "leave nothing for training",
        ),
        (dict(mechanism="dp-sgd"), "must be one of"),
    ],
)
def test_bad_plans_are_refused_naming_what_is_allowed(kwargs, match):
    kwargs = dict(kwargs)
    with pytest.raises(ValueError, match=match):
        plan_run(kwargs.pop("mechanism"), target_epsilon=1.0, **kwargs, **RUN)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(epsilon_share=1.0),
        dict(epsilon_share=0.1, event=dp_accounting.GaussianDpEvent(1.0)),
        dict(),
        dict(epsilon_share=0.1, noise="cauchy"),
        dict(epsilon_share=0.1, noise="gaussian", count=2),
    ],
)
def test_bad_releases_are_refused(kwargs):
    with pytest.raises(ValueError, match="Release 'r'"):
        Release("r", **kwargs)


def test_periods_compose_in_parallel():
    run = dict(target_delta=DELTA, accountant="rdp")
    periods = [AccountingPeriod(0.02, 100), AccountingPeriod(0.05, 100)]
    plan = plan_run(
        "fest",
        target_epsilon=2.0,
        periods=periods,
        releases=[Release.selection(0.1, count=2)],
        top_k=5,
        counts=COUNTS,
        seed=0,
        **run,
    )
    assert plan.parallel and plan.steps == 200 and plan.sampling_probability == 0.05
    assert (
        plan.noise_multiplier
        == plan_run("dense", target_epsilon=1.8, sampling_probability=0.05, steps=100, **run).noise_multiplier
    )
    budget = plan.budget(period=0)
    assert isinstance(budget, PeriodBudget) and budget.planned_one_off_events == 2
    with pytest.raises(ValueError, match="`period` must be an index"):
        plan.budget()
    from tfdp_embed.keras2.layers.embedding import DPEmbedding

    plan.mechanism.init(tables=[DPEmbedding(100, 2, name="t")], dense_variables=[], optimizer=None)
    budget.on_train_begin()  # both selections charged up front, within the target
    assert budget.planned_epsilon <= 2.0
    report = plan.report(dataset_size=1000, batching="poisson", steps_by_period=[100, 100])
    assert report["composition"] == "parallel over streaming periods"
    assert report["epsilon"] == max(a["epsilon"] for a in report["period_accounting"])
    with pytest.raises(ValueError, match="steps_by_period"):
        plan.report(dataset_size=1000, batching="poisson")


def test_report_reads_the_batching_fit_recorded_and_states_the_plan():
    plan = plan_run("dense", target_epsilon=3.0, assumptions=["the vocabulary is public"], **RUN)
    budget = plan.budget()
    budget.ledger.record_steps(plan.mechanism.step_event(0.05), 200)
    report = plan.report(
        dataset_size=100, dp_model=types.SimpleNamespace(batching="fixed_shuffled"), ledger=budget.ledger
    )
    assert report["batching"] == "fixed_shuffled" and report["epsilon"] <= 3.0
    assert "CONDITIONAL on: the vocabulary is public" in report["guarantee"]
    assert report["extra"]["plan"] == plan.summary()
    with pytest.raises(ValueError, match="dp_model"):
        plan.report(dataset_size=100, steps=1)


def test_repeated_plans_reuse_the_calibration(monkeypatch):
    calibration_module._entries_epsilon.cache_clear()
    first = plan_run("lazy", target_epsilon=1.5, **RUN)
    calls = []
    compute = calibration_module.compute_epsilon
    monkeypatch.setattr(calibration_module, "compute_epsilon", lambda *a, **k: calls.append(a) or compute(*a, **k))
    again = plan_run("dense", target_epsilon=1.5, **RUN)
    assert again.noise_multiplier == first.noise_multiplier and calls == []  # every epsilon is memoised by event


def _sampled(q: float, n: int = 200):
    from tfdp_embed import data, tf

    ids = np.arange(n, dtype=np.int32).reshape(n, 1) % 10
    dataset = tf.data.Dataset.from_tensor_slices((ids, (ids % 2).astype("float32")))
    return data.poisson_batches(dataset, sampling_probability=q, num_examples=n, seed=1)


def _tiny_model():
    from tfdp_embed import DPEmbedding, keras

    inputs = keras.Input((1,), dtype="int32")
    x = DPEmbedding(10, 2, combiner="mean")(inputs)
    return keras.Model(inputs, keras.layers.Dense(1)(x))


def test_plan_from_batching_info_is_the_plan_from_q_and_steps():
    _, info = _sampled(0.05)
    read = plan_run("dense", target_epsilon=3.0, target_delta=DELTA, accountant="rdp", batching=info, epochs=10)
    stated = plan_run("dense", target_epsilon=3.0, **RUN)  # q = 0.05, T = 200 = 10 epochs / q
    assert read.noise_multiplier == stated.noise_multiplier and read.steps == 200
    assert read.dataset_size == 200 and stated.dataset_size is None
    with pytest.raises(ValueError, match=r"`sampling_probability`=0.1 but `batching` was sampled with q=0.05"):
        plan_run("dense", target_epsilon=3.0, target_delta=DELTA, batching=info, sampling_probability=0.1, steps=9)
    with pytest.raises(TypeError, match="BatchingInfo"):
        plan_run("dense", target_epsilon=3.0, target_delta=DELTA, batching="poisson", steps=9)


def test_dp_model_from_a_plan_is_the_model_from_its_mechanism_and_batch_size():
    from tfdp_embed import DPModel

    _, info = _sampled(0.05)
    plan = plan_run("dense", noise_multiplier=1.0, target_delta=DELTA, batching=info, epochs=1)
    wired = DPModel(_tiny_model(), plan=plan)
    explicit = DPModel(_tiny_model(), mechanism=plan.mechanism, expected_batch_size=0.05 * 200)
    assert wired.mechanism is explicit.mechanism and wired.expected_batch_size == explicit.expected_batch_size == 10
    with pytest.raises(ValueError, match=r"`expected_batch_size`=32 but the plan's q N is 10"):
        DPModel(_tiny_model(), plan=plan, expected_batch_size=32)


def test_batches_sampled_with_another_q_are_refused_before_the_first_step():
    from tfdp_embed import DPModel, PrivacyContractError, keras

    _, info = _sampled(0.05)
    batches, _ = _sampled(0.1)
    plan = plan_run("dense", noise_multiplier=1.0, target_delta=DELTA, batching=info, epochs=1)
    dp = DPModel(_tiny_model(), plan=plan)
    dp.compile(optimizer=keras.optimizers.legacy.SGD(0.1), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    with pytest.raises(PrivacyContractError, match=r"q=0.05.*sampled with q=0.1"):
        dp.fit(batches, epochs=1, verbose=0)
    assert int(dp.optimizer.iterations.numpy()) == 0  # refused before any step
