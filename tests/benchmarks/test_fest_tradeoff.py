"""benchmarks/fest_tradeoff: the curve's best rows and the private pick, on made-up run rows (no training here)."""

from __future__ import annotations

import argparse
import json

import pytest

from benchmarks import fest_tradeoff
from tfdp_embed.accounting import PrivacyLedger, compute_epsilon, dpsgd_event
from tfdp_embed.data.criteo import CRITEO_VOCAB_SIZES

EVENT = dpsgd_event(sampling_probability=0.01, noise_multiplier=1.0, steps=100)


def _row(mechanism, auc, reduction, flags=()):
    ledger = PrivacyLedger()
    ledger.record_steps(EVENT)
    return {
        "mechanism": mechanism,
        "epsilon_target": 1.0,
        "flags": list(flags),
        "auc": auc,
        "epsilon": 1.0,
        "delta": 1e-5,
        "noise_multiplier": 1.0,
        "gradient_size_reduction": reduction,
        "steps": 100,
        "median_step_s": 0.1,
        "ledger": json.loads(ledger.to_json()),
    }


ROWS = [
    _row("lazy", 0.750, 1.0),
    _row("fest", 0.749, 10.0, ("--top-fraction", "0.1")),
    _row("fest", 0.746, 100.0, ("--top-fraction", "0.01")),
    _row("fest", 0.700, 1000.0, ("--top-fraction", "0.001")),
]


@pytest.mark.parametrize("loss, expected", [(0.0005, None), (0.001, 10.0), (0.005, 100.0), (0.05, 1000.0)])
def test_best_reduction_is_the_largest_within_the_loss(loss, expected):
    best = fest_tradeoff.best_reduction(ROWS[1:], 0.750, loss)
    assert (best and best["gradient_size_reduction"]) == expected


def test_private_pick_releases_a_run_of_the_grid_and_states_the_search_cost():
    for seed in range(5):
        pick = fest_tradeoff.private_pick(ROWS[1:], 0.750, 0.005, delta=1e-5, seed=seed)
        assert pick["reduction"] in (None, 10.0, 100.0)  # never the infeasible 1000x, never an unrun setting
        assert pick["runs"] >= 1 or pick["flags"] is None
        assert pick["run_epsilon_rdp"] == pytest.approx(compute_epsilon(EVENT, target_delta=1e-5, accountant="rdp"))
        assert pick["search_epsilon"] > pick["run_epsilon_rdp"]


def test_summary_measures_every_mechanism_against_lazydp():
    a = argparse.Namespace(epsilons=[1.0], seed=0)
    summary = fest_tradeoff.summarize(a, ROWS)
    assert summary["baseline"] == {"1": 0.750}
    assert dict(summary["curves"]["fest eps=1"])[0.005] == 100.0
    assert [(p["mechanism"], p["loss"]) for p in summary["picks"]] == [("fest", 0.005), ("fest", 0.01)]


def test_the_full_grid_runs_the_small_grid_first_and_every_setting_once():
    order = fest_tradeoff.schedule("full", [1.0, 3.0])
    small = fest_tradeoff.schedule("small", [1.0, 3.0])
    assert order[: len(small)] == small and order[0] == (1.0, "lazy", ())
    assert len(order) == len(set(order)) == 2 * sum(len(v) for v in fest_tradeoff.GRIDS["full"].values())


def test_the_search_is_charged_for_its_costliest_run():
    import dp_accounting

    def run(selection_sigma):
        return dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(selection_sigma), EVENT])

    assert fest_tradeoff.dominating_event([run(400.0), run(120.0), run(250.0)]) == run(120.0)
    laplace = dp_accounting.ComposedDpEvent([dp_accounting.LaplaceDpEvent(0.5), EVENT])
    with pytest.raises(ValueError, match="dominates"):
        fest_tradeoff.dominating_event([laplace, run(3.0)])


def test_the_issue_grid_runs_what_issue_20_names_within_90_minutes_at_a_million_rows():
    order = fest_tradeoff.schedule("issue", [1.0, 3.0])
    assert len(order) == len(set(order))
    for eps in (1.0, 3.0):
        runs = [(m, f) for e, m, f in order if e == eps]
        assert runs[0] == ("lazy", ())
        assert ("dense", ()) in runs  # LazyDP is checked against dense DP-SGD itself
        fest_k = {f[1] for m, f in runs if m == "fest"}
        ada = {(f[1], f[3]) for m, f in runs if m == "adafest"}
        assert len(fest_k) >= 2 and any(m == "adafest+" for m, _ in runs)
        assert {r for r, _ in ada} == {"1", "5", "10"}
        assert ada == {(r, t) for r in ("1", "5", "10") for t in {t for _, t in ada}} and len({t for _, t in ada}) >= 2
    assert fest_tradeoff.expected_minutes(len(order), 1_000_000) <= 90
    assert fest_tradeoff.expected_minutes(10, 200_000) == pytest.approx(10 * fest_tradeoff.MINUTES_PER_RUN_AT_1E6 / 5)


def _report(**training):
    return {
        "training": {"momentum": 0.9, "learning_rate": 1.0, **training},
        "l2_norm_clip": 1.0,
        "model": {"hidden_units": [598, 598, 598, 598], "vocab_sizes": list(CRITEO_VOCAB_SIZES.values())},
    }


def test_a_kept_run_with_other_optimizer_settings_is_refused():
    settings = fest_tradeoff.SYNTHETIC_SETTINGS
    fest_tradeoff.check_kept(_report(), settings, "r.json")  # the grid's own settings
    with pytest.raises(ValueError, match="--momentum 0.0; this grid runs --momentum 0.9"):
        fest_tradeoff.check_kept(_report(momentum=0.0), settings, "r.json")
    with pytest.raises(ValueError, match="--learning-rate 0.1; this grid runs --learning-rate 1.0"):
        fest_tradeoff.check_kept(_report(learning_rate=0.1), settings, "r.json")
    with pytest.raises(ValueError, match="--hidden-units 512,256,128"):
        fest_tradeoff.check_kept(
            {**_report(), "model": {**_report()["model"], "hidden_units": [512, 256, 128]}}, settings, "r.json"
        )
    capped = [min(v, 10_000) for v in CRITEO_VOCAB_SIZES.values()]  # the data-scaled cap just under 10^6 rows
    with pytest.raises(ValueError, match="not DP-FEST Table 3"):
        fest_tradeoff.check_kept(
            {**_report(), "model": {**_report()["model"], "vocab_sizes": capped}}, settings, "r.json"
        )
