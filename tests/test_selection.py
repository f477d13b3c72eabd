"""`select_privately` (Papernot & Steinke 2022): its epsilon, what it may return, how many runs it makes."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as rdp_module
from scipy import stats

from tfdp_embed import PrivacyContractError, plan_run, select_privately
from tfdp_embed.accounting import PrivacyLedger, dpsgd_event
from tfdp_embed.mechanisms.topk_selection import pure_dp_dominating_noise_multiplier
from tfdp_embed.planning import Release, plan_search, search_report
from tfdp_embed.planning.selection import POISSON, plan_event, sample_run_count, tnb_gamma

DELTA = 1e-5
RUN = dpsgd_event(sampling_probability=0.01, noise_multiplier=1.1, steps=500)
CANDIDATES = [{"lr": lr} for lr in (1e-3, 3e-3, 9e-3)]


def dp_accounting_epsilon(event) -> float:
    return dp_accounting.rdp.RdpAccountant().compose(event).get_epsilon(DELTA)


def scored_train(calls: list):
    """A fake DP run: records the candidate and scores it by its learning rate."""

    def train(candidate):
        calls.append(candidate)
        return ("model", len(calls)), candidate["lr"]

    return train


@pytest.mark.parametrize("mean, shape", [(3.0, 1.0), (5.0, math.inf), (4.0, 0.0), (10.0, 0.5), (2.0, 3.0)])
def test_epsilon_equals_dp_accounting_rdp_for_the_same_event(mean, shape):
    result = select_privately(
        CANDIDATES, scored_train([]), run_event=RUN, mean_runs=mean, shape=shape, target_delta=DELTA, rng=0
    )
    expected = dp_accounting.dp_event.RepeatAndSelectDpEvent(RUN, mean, shape)
    assert result.event == expected
    assert result.epsilon == pytest.approx(dp_accounting_epsilon(expected), rel=1e-12)
    assert result.epsilon > dp_accounting_epsilon(RUN)  # the search costs more than one run


def test_the_whole_search_is_one_ledger_event_recorded_before_the_runs():
    ledger = PrivacyLedger()
    ledger.record_steps(RUN)
    seen: list = []

    def train(candidate):
        seen.append(len(ledger))
        return None, 0.0

    result = select_privately(CANDIDATES, train, run_event=RUN, mean_runs=3, target_delta=DELTA, ledger=ledger, rng=1)
    assert result.runs >= 1 and set(seen) == {2}
    assert [e.event for e in ledger.entries] == [RUN, result.event]
    combined = dp_accounting.ComposedDpEvent([RUN, result.event])
    assert ledger.epsilon(DELTA, "rdp") == pytest.approx(dp_accounting_epsilon(combined), rel=1e-12)


@pytest.mark.parametrize("seed", range(20))
def test_never_returns_a_candidate_that_was_not_run(seed):
    calls: list = []
    result = select_privately(CANDIDATES, scored_train(calls), run_event=RUN, mean_runs=2, target_delta=DELTA, rng=seed)
    assert result.runs == len(calls) >= 1
    assert any(result.candidate is c for c in calls)
    assert result.score == max(c["lr"] for c in calls)
    index = next(i for i, c in enumerate(calls) if c["lr"] == result.score)
    assert result.model == ("model", index + 1)  # the model that run returned, not a later one


def test_lower_is_better_picks_the_smallest_score():
    calls: list = []
    result = select_privately(
        CANDIDATES, scored_train(calls), run_event=RUN, mean_runs=8, target_delta=DELTA, rng=3, higher_is_better=False
    )
    assert result.score == min(c["lr"] for c in calls)


def test_poisson_with_no_run_selects_nothing():
    rng = np.random.default_rng(0)
    outcomes = [
        select_privately(
            CANDIDATES, scored_train([]), run_event=RUN, mean_runs=1.0, shape=POISSON, target_delta=DELTA, rng=rng
        )
        for _ in range(12)
    ]
    empty = [r for r in outcomes if r.runs == 0]
    assert empty and all(r.model is None and r.candidate is None and r.score is None for r in empty)


@pytest.mark.parametrize("mean, shape", [(3.0, 1.0), (2.5, math.inf), (4.0, 0.0), (4.0, 2.0)])
def test_number_of_runs_follows_the_distribution(mean, shape):
    rng = np.random.default_rng(1234)
    runs = np.array([sample_run_count(rng, mean=mean, shape=shape) for _ in range(4000)])
    k = np.arange(0, 60)
    if shape == math.inf:
        pmf = stats.poisson.pmf(k, mean)
    else:
        g = tnb_gamma(mean=mean, shape=shape)
        if shape == 0.0:
            pmf = np.where(k > 0, stats.logser.pmf(k, 1 - g), 0.0)
        else:  # truncated negative binomial: NB(shape, g) without 0
            pmf = np.where(k > 0, stats.nbinom.pmf(k, shape, g) / (1 - g**shape), 0.0)
    counts = np.bincount(runs, minlength=k.size)[: k.size]
    cells = np.flatnonzero(pmf * runs.size >= 5)
    observed = np.append(counts[cells], runs.size - counts[cells].sum())
    expected = np.append(pmf[cells], 1 - pmf[cells].sum()) * runs.size
    assert stats.chisquare(observed, expected).pvalue > 1e-3
    assert runs.mean() == pytest.approx(mean, rel=0.08)


def test_the_search_runs_train_exactly_the_sampled_number_of_times():
    calls: list = []
    results = [
        select_privately(
            [0], lambda c: (calls.append(c), 0.0), run_event=RUN, mean_runs=3.0, target_delta=DELTA, rng=seed
        ).runs
        for seed in range(8)
    ]
    expected = [sample_run_count(np.random.default_rng(seed), mean=3.0, shape=1.0) for seed in range(8)]
    assert results == expected and len(calls) == sum(expected) and len(set(expected)) > 1


@pytest.mark.parametrize("mean, shape", [(2.0, 0.0), (7.0, 0.5), (20.0, 3.0), (1.5, 10.0)])
def test_gamma_matches_dp_accounting(mean, shape):
    assert tnb_gamma(mean=mean, shape=shape) == pytest.approx(
        rdp_module._gamma_truncated_negative_binomial(shape, mean), rel=1e-6
    )


def test_a_mean_of_one_runs_exactly_once():
    rng = np.random.default_rng(0)
    assert {sample_run_count(rng, mean=1.0, shape=s) for s in (0.0, 1.0, 2.0) for _ in range(20)} == {1}


def test_candidates_with_different_events_are_refused():
    events = {1e-3: RUN, 3e-3: dpsgd_event(sampling_probability=0.02, noise_multiplier=1.1, steps=500)}
    calls: list = []
    with pytest.raises(PrivacyContractError, match="one event for every run"):
        select_privately(
            [1e-3, 3e-3],
            lambda c: calls.append(c) or (None, 0.0),
            run_event=events.__getitem__,
            mean_runs=2,
            target_delta=DELTA,
        )
    assert calls == []


def test_plan_event_is_the_plans_steps():
    plan = plan_run(
        "dense", target_epsilon=2.0, target_delta=DELTA, accountant="rdp", sampling_probability=0.01, steps=300
    )
    expected = dpsgd_event(sampling_probability=0.01, noise_multiplier=plan.noise_multiplier, steps=300)
    assert dp_accounting_epsilon(plan_event(plan)) == pytest.approx(dp_accounting_epsilon(expected), rel=1e-12)
    assert dp_accounting_epsilon(plan_event(plan)) == pytest.approx(2.0, rel=1e-3)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(candidates=[]), "candidates"),
        (dict(candidates="abc"), "candidates"),
        (dict(mean_runs=0.5), "mean_runs"),
        (dict(mean_runs=math.nan), "mean_runs"),
        (dict(mean_runs=0.9, shape=POISSON), "mean_runs"),
        (dict(shape=-1.0), "shape"),
        (dict(shape="geometric"), "shape"),
        (dict(target_delta=0.0), "delta"),
        (dict(run_event=dp_accounting.UnsupportedDpEvent()), "run_event"),
        (dict(run_event="dense"), "run_event"),
        (dict(train=None), "train"),
        (dict(train=lambda c: 0.5), r"\(model, score\)"),
        (dict(train=lambda c: (None, "high")), "a number as score"),
    ],
)
def test_bad_input_is_rejected_with_the_argument_named(kwargs, match):
    args = dict(
        candidates=CANDIDATES, train=lambda c: (None, 0.0), run_event=RUN, mean_runs=3.0, target_delta=DELTA, rng=0
    )
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        select_privately(args.pop("candidates"), args.pop("train"), **args)


def test_plan_event_charges_a_selecting_mechanisms_planned_selection():
    counts = {"items": np.arange(100.0)}
    plan = plan_run(
        "fest",
        target_epsilon=2.0,
        target_delta=DELTA,
        accountant="rdp",
        sampling_probability=0.01,
        steps=100,
        releases=[Release.selection(0.1)],
        top_k=10,
        counts=counts,
    )
    steps = dpsgd_event(sampling_probability=0.01, noise_multiplier=plan.noise_multiplier, steps=100)
    # eps_1 = 0.1 x 2.0 = 0.2 pure DP, charged as the Gaussian that dominates every 0.2-DP mechanism.
    selection = dp_accounting.GaussianDpEvent(pure_dp_dominating_noise_multiplier(0.2))
    assert plan_event(plan) == dp_accounting.ComposedDpEvent([selection, steps])
    assert dp_accounting_epsilon(plan_event(plan)) > dp_accounting_epsilon(steps)  # 6fce81d: the steps alone
    given = plan_run(
        "fest",
        noise_multiplier=1.0,
        target_delta=DELTA,
        sampling_probability=0.01,
        steps=100,
        top_k=10,
        counts=counts,
        selection_epsilon=0.3,
    )
    assert plan_event(given).events[0] == dp_accounting.GaussianDpEvent(pure_dp_dominating_noise_multiplier(0.3))


def test_the_search_ledger_is_the_callers_or_a_new_one_with_the_search_event():
    result = select_privately(CANDIDATES, scored_train([]), run_event=RUN, mean_runs=2, target_delta=DELTA, rng=0)
    assert [(e.kind, e.event) for e in result.ledger.entries] == [("setup", result.event)]
    ledger = PrivacyLedger()
    ledger.record_steps(RUN)
    mine = select_privately(
        CANDIDATES, scored_train([]), run_event=RUN, mean_runs=2, target_delta=DELTA, ledger=ledger, rng=0
    )
    assert mine.ledger is ledger and len(ledger) == 2


def test_search_report_refuses_what_the_search_sets_and_an_empty_search():
    result = select_privately(CANDIDATES, scored_train([]), run_event=RUN, mean_runs=2, target_delta=DELTA, rng=0)
    with pytest.raises(ValueError, match="mechanism"):
        search_report(result, sampling_probability=0.01, dataset_size=100, batching="poisson", steps=500)
    with pytest.raises(ValueError, match="the search's"):
        search_report(result, epsilon=1.0, mechanism=object(), batching="poisson", steps=500)
    rng = np.random.default_rng(0)
    empty = next(
        r
        for r in (
            select_privately(
                CANDIDATES, scored_train([]), run_event=RUN, mean_runs=1.0, shape=POISSON, target_delta=DELTA, rng=rng
            )
            for _ in range(30)
        )
        if r.runs == 0
    )
    with pytest.raises(ValueError, match="K = 0"):
        search_report(empty, sampling_probability=0.01, dataset_size=100)


@pytest.mark.parametrize("mean, shape, target", [(5.0, 1.0, 3.0), (3.0, math.inf, 1.0), (10.0, 0.5, 8.0)])
def test_plan_search_spends_the_target_on_the_whole_search(mean, shape, target):
    plan = plan_search(
        "dense",
        target_epsilon=target,
        target_delta=DELTA,
        mean_runs=mean,
        shape=shape,
        sampling_probability=0.01,
        steps=300,
    )
    assert plan.event == dp_accounting.dp_event.RepeatAndSelectDpEvent(plan.run_event, mean, shape)
    assert target * (1 - 1e-3) <= dp_accounting_epsilon(plan.event) <= target  # calibration's tolerance
    assert (
        dp_accounting_epsilon(plan.run_event) == pytest.approx(plan.run_epsilon, rel=1e-12)
        and plan.run_epsilon < target
    )
    # 1% less noise and the search overshoots: sigma is (about) the smallest that meets the target.
    looser = dpsgd_event(sampling_probability=0.01, noise_multiplier=plan.noise_multiplier * (1 - 1e-2), steps=300)
    assert dp_accounting_epsilon(dp_accounting.dp_event.RepeatAndSelectDpEvent(looser, mean, shape)) > target


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(noise_multiplier=1.0), "search's to set"),
        (dict(accountant="pld"), "search's to set"),
        (dict(target_epsilon=0.0), "target_epsilon"),
        (dict(mean_runs=0.5), "mean_runs"),
        (dict(target_epsilon=1e-6), "cannot be met"),
    ],
)
def test_plan_search_rejects_bad_input(kwargs, match):
    args = dict(target_epsilon=3.0, target_delta=DELTA, mean_runs=3.0, sampling_probability=0.01, steps=300)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        plan_search("dense", **args)


def test_reports_of_search_runs_say_one_run_during_it_and_need_the_search_after_it():
    from tfdp_embed import PrivacyContractError
    from tfdp_embed.accounting import privacy_report
    from tfdp_embed.mechanisms.dense import DenseDPSGD

    runs: list = []

    def report(mechanism, **kwargs):
        return privacy_report(
            mechanism=mechanism,
            delta=DELTA,
            sampling_probability=0.01,
            dataset_size=100,
            batching="poisson",
            accountant="rdp",
            **kwargs,
        )

    def train(candidate):
        run = type("Run", (), {"mechanism": DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.1)})()
        runs.append((run, report(run.mechanism, steps=500)))
        return run, candidate["lr"]

    result = select_privately(CANDIDATES, train, run_event=RUN, mean_runs=4, target_delta=DELTA, rng=4)
    assert len(runs) >= 2 and all("ONE RUN" in r["guarantee"] and "ONE RUN" in r["caveats"][-1] for _, r in runs)
    with pytest.raises(PrivacyContractError, match="whole search"):
        report(result.model.mechanism, steps=500)  # one run's steps alone
    # A ledger holding the search's event, or an epsilon at least the search's, is the search's report.
    assert report(result.model.mechanism, ledger=result.ledger)["epsilon"] == pytest.approx(result.epsilon)
    assert "ONE RUN" not in report(result.model.mechanism, epsilon=result.epsilon, steps=500)["guarantee"]
    others = [run for run, _ in runs if run is not result.model]
    with pytest.raises(PrivacyContractError, match="another run's"):
        report(others[0].mechanism, ledger=result.ledger)
