"""Attack (M2): a model tuned by `select_privately` is released with one run's epsilon, not the search's.

A private search trains a random number of DP runs and releases the best
(Papernot & Steinke 2022); releasing that model costs the whole search's
`RepeatAndSelectDpEvent`, not one run. The model's own budget ledger only
knows its run: on 6fce81d a report built from it (the usual recipe,
`privacy_report(mechanism=dp.mechanism, ledger=budget.ledger, ...)`)
stated the run's epsilon for the tuned model, and `export_saved_model`
wrote it beside the model. The attack reads the released report and
checks whether it understates the search's epsilon.

New code: that report is refused (`PrivacyContractError`), the export too;
`search_report(result, ...)` states the search's epsilon and the selected
run's steps; and `plan_search` spends a target epsilon on the whole search.
The search runs once per front end (tf-keras, Keras 3); the planned search
trains on tf-keras.
"""

from __future__ import annotations

import numpy as np
import pytest
from tiny_model import embedding_dense_model

from tfdp_embed import PrivacyContractError, select_privately
from tfdp_embed.accounting import compute_epsilon, dpsgd_event, privacy_report
from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.export import export_saved_model
from tfdp_embed.keras2.training import DPModel
from tfdp_embed.mechanisms.dense import DenseDPSGD

N, VOCAB, DIM, BATCH = 32, 20, 3, 8
Q, DELTA, SIGMA = BATCH / N, 1e-5, 1.5
STEPS = N // BATCH  # one epoch
RUN = dpsgd_event(sampling_probability=Q, noise_multiplier=SIGMA, steps=STEPS)
MEAN_RUNS, SEED = 3.0, 1  # the seed draws K = 2 runs (checked below): the chosen model saw one run's steps


def _dataset() -> tf.data.Dataset:
    rng = np.random.default_rng(0)
    x = rng.integers(0, VOCAB, (N, 2)).astype(np.int32)
    y = rng.integers(0, 2, (N, 1)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)


def _train(fe, candidate):
    """One DP run of a learning rate on front end `fe`: its own mechanism and budget ledger; score -(final loss)."""
    mechanism = DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=SIGMA, seed=None)
    model = embedding_dense_model(VOCAB, DIM, table_seed=1, dense_seed=2, fe=fe)
    dp = fe.DPModel(model, mechanism=mechanism, expected_batch_size=BATCH)
    dp.compile(optimizer=fe.sgd(candidate), loss=fe.keras.losses.BinaryCrossentropy(from_logits=True))
    budget = fe.PrivacyBudget(
        mechanism, sampling_probability=Q, target_epsilon=50.0, target_delta=DELTA, accountant="rdp"
    )
    history = dp.fit(_dataset(), epochs=1, verbose=0, callbacks=[budget])
    dp.run_ledger = budget.ledger  # the model's own ledger, as a user keeps it next to the model
    return dp, -float(history.history["loss"][-1])


@pytest.fixture(scope="module", params=["keras2", "keras3"])
def search(request):
    """(result, every run's model): one private search over two learning rates, once per front end."""
    from front_ends.front_ends import front_end

    fe, models = front_end(request.param), []

    def train(candidate):
        model, score = _train(fe, candidate)
        models.append(model)
        return model, score

    result = select_privately([0.05, 0.2], train, run_event=RUN, mean_runs=MEAN_RUNS, target_delta=DELTA, rng=SEED)
    assert result.runs == len(models) == 2
    return result, models


def _own_report(dp):
    return privacy_report(
        mechanism=dp.mechanism,
        ledger=dp.run_ledger,
        delta=DELTA,
        sampling_probability=Q,
        dataset_size=N,
        batching=dp.batching,
        accountant="rdp",
    )


def test_the_tuned_models_own_report_never_understates_the_search(search):
    result, _ = search
    run_epsilon = compute_epsilon(RUN, target_delta=DELTA, accountant="rdp")
    assert result.epsilon > 1.3 * run_epsilon  # what the search cost vs one run
    try:
        stated = _own_report(result.model)["epsilon"]
    except PrivacyContractError:
        return  # refused: the run's ledger alone is not the tuned model's report
    assert stated >= result.epsilon - 1e-9, (
        f"the tuned model's report states epsilon {stated:.4f}; the search cost {result.epsilon:.4f}"
    )


def test_the_export_refuses_a_report_of_one_run(search, tmp_path):
    result, _ = search
    own = privacy_report(
        mechanism=DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=SIGMA),
        ledger=result.model.run_ledger,
        delta=DELTA,
        sampling_probability=Q,
        dataset_size=N,
        batching="poisson",
        accountant="rdp",
    )
    with pytest.raises(PrivacyContractError, match="whole search"):
        export_saved_model(result.model, str(tmp_path / "tuned"), report=own)
    with pytest.raises(PrivacyContractError, match="without a privacy report"):
        export_saved_model(result.model, str(tmp_path / "tuned"))


def test_search_report_states_the_search_epsilon_and_the_selected_runs_steps(search, tmp_path):
    from tfdp_embed.planning import search_report

    result, models = search
    report = search_report(result, sampling_probability=Q, dataset_size=N)
    assert report["epsilon"] == pytest.approx(result.epsilon, abs=1e-6)
    assert report["steps"] == STEPS == int(result.model.mechanism.steps.numpy())
    assert report["selection"]["search_epsilon"] == pytest.approx(result.epsilon, abs=1e-9)
    assert report["selection"]["run_epsilon"] < report["epsilon"]
    assert "runs" not in report["selection"]  # K stays hidden
    assert [e["kind"] for e in report["ledger"]["entries"]] == ["setup"]
    export_saved_model(result.model, str(tmp_path / "tuned"), report=report)  # the search's report is accepted
    # A run that was not selected is not covered by the search: its report is refused.
    other = next(model for model in models if model is not result.model)
    with pytest.raises(PrivacyContractError, match="another run's"):
        _own_report(other)


def test_a_planned_search_meets_its_target():
    from tfdp_embed.planning import plan_search, search_report

    plan = plan_search(
        "dense", target_epsilon=3.0, target_delta=DELTA, mean_runs=MEAN_RUNS, sampling_probability=Q, steps=STEPS
    )
    search = compute_epsilon(plan.event, target_delta=DELTA, accountant="rdp")
    assert search == pytest.approx(plan.epsilon, rel=1e-12)
    assert 3.0 * (1 - 1e-3) <= search <= 3.0
    assert plan.run_epsilon < 0.75 * 3.0  # each run gets much less than the target
    budgets = []

    def train(candidate):
        run = plan.run_plan()
        dp = DPModel(
            embedding_dense_model(VOCAB, DIM, table_seed=1, dense_seed=2),
            mechanism=run.mechanism,
            expected_batch_size=BATCH,
        )
        dp.compile(optimizer=keras.optimizers.legacy.SGD(candidate), loss=keras.losses.BinaryCrossentropy(True))
        budgets.append(plan.budget(run))
        history = dp.fit(_dataset(), epochs=1, verbose=0, callbacks=[budgets[-1]])
        return dp, -float(history.history["loss"][-1])

    result = plan.select([0.05, 0.2], train, rng=2)  # K = 1: one training run keeps the test short
    assert result.epsilon == pytest.approx(search, rel=1e-12)
    assert [(b.ledger.steps, b.stopped_by_budget) for b in budgets] == [(STEPS, False)] * result.runs
    report = search_report(result, sampling_probability=Q, dataset_size=N)
    assert report["epsilon"] <= 3.0 and report["steps"] == STEPS
