"""Unit tests of step_time's speed-up-vs-dense summary and its adafest@R threshold (no subprocess)."""

from __future__ import annotations

import pytest

from benchmarks import step_time
from tfdp_embed.mechanisms.adafest import (
    noise_survival_probability,
    split_noise_multiplier,
)


def _row(mechanism, vocab, median):
    return {"mechanism": mechanism, "vocab": vocab, "median_step_s": median}


def test_speedups_divide_dense_and_tfp_medians_by_the_mechanism_median():
    rows = [
        _row("none", 10, 0.002),
        _row("dense", 10, 0.5),
        _row("tfp_keras_sgd", 10, 4.0),
        _row("adafest", 10, 0.004),
        _row("eana", 10, None),
        _row("none", 20, 0.002),
        _row("adafest", 20, 0.008),
        _row("dense", 20, None),
    ]
    got = {(e["mechanism"], e["vocab"]): e for e in step_time.speedups_vs_dense(rows)}
    assert set(got) == {("adafest", 10), ("eana", 10), ("adafest", 20)}  # sparse rows only
    assert got[("adafest", 10)]["dense_over_mechanism"] == pytest.approx(125.0)
    assert got[("adafest", 10)]["tfp_keras_sgd_over_mechanism"] == pytest.approx(1000.0)
    assert got[("eana", 10)]["dense_over_mechanism"] is None  # the mechanism was not measured
    assert got[("adafest", 20)]["dense_over_mechanism"] is None  # dense not measured at 20
    assert got[("adafest", 20)]["tfp_keras_sgd_over_mechanism"] is None  # nor tfp
    table = step_time.speedup_table(rows)
    assert "| adafest | 10 | 4.00 ms | 125× | 1,000× |" in table
    assert "| adafest | 20 | 8.00 ms | not measured | not measured |" in table


def test_adafest_budget_threshold_gives_the_requested_noise_rows():
    args = step_time.parse_args(["--adafest-noise-rows", "250", "--adafest-ratio", "5"])
    sigma1, _ = split_noise_multiplier(args.noise_multiplier, ratio=5.0)
    for vocab in (10**5, 5 * 10**7):
        tau = step_time.adafest_budget_threshold(args, vocab)
        p = noise_survival_probability(
            threshold=tau, contribution_clip=args.adafest_contribution_clip, contribution_noise_multiplier=sigma1
        )
        assert p * vocab == pytest.approx(250.0, rel=1e-9)
    assert step_time.adafest_budget_name(250.0) == "adafest@250"
    assert step_time.parse_args([]).adafest_noise_rows == 1000.0  # on by default, 0 turns it off
    with pytest.raises(SystemExit):
        step_time.parse_args(["--adafest-noise-rows", "-1"])


def _run(mechanism, median, base, cpu, cpu_base, rss=100.0, notes=""):
    return {
        "mechanism": mechanism,
        "vocab": 10,
        "median_step_s": median,
        "p10_step_s": median * 0.9,
        "p90_step_s": median * 1.1,
        "steps_timed": 30,
        "none_in_process_median_s": base,
        "cpu_median_step_s": cpu,
        "none_in_process_cpu_median_s": cpu_base,
        "peak_rss_mb": rss,
        "notes": notes,
    }


def test_repeats_merge_into_the_median_of_per_process_ratios():
    runs = [
        _run("lazy", 0.0030, 0.0020, 0.004, 0.0032, rss=100, notes="history int32"),  # 1.50x, CPU 1.25x
        _run("lazy", 0.0024, 0.0020, 0.003, 0.0025, rss=300),  # 1.20x, CPU 1.20x
        _run("lazy", 0.0026, 0.0020, 0.006, 0.0040, rss=200),  # 1.30x, CPU 1.50x
    ]
    row = step_time.merge_repeats(runs)
    step_time._add_ratios([row])
    assert row["ratio_to_none"] == pytest.approx(1.30)  # median of 1.5, 1.2, 1.3: never a cross-process ratio
    assert row["cpu_ratio_to_none"] == pytest.approx(1.25)
    assert row["median_step_s"] == pytest.approx(0.0026) and row["none_in_process_median_s"] == pytest.approx(0.0020)
    assert row["steps_timed"] == 90 and row["peak_rss_mb"] == 300 and row["processes"] == 3
    assert row["notes"].startswith("3 processes, × none (same process) each: 1.20×, 1.30×, 1.50×")
    assert "history int32" in row["notes"]
    assert step_time.merge_repeats(runs[:1]) is runs[0]  # one process: the row as measured

    failed = {"mechanism": "lazy", "vocab": 10, "median_step_s": None, "not_measured": "killed: RSS"}
    partial = step_time.merge_repeats([runs[1], failed])
    step_time._add_ratios([partial])
    assert (
        partial["ratio_to_none"] == pytest.approx(1.20)
        and "1 of 2 processes not measured: killed: RSS" in partial["notes"]
    )
    assert step_time.merge_repeats([failed, dict(failed)])["median_step_s"] is None


def test_repeats_must_be_positive():
    assert step_time.parse_args(["--repeats", "3"]).repeats == 3
    with pytest.raises(SystemExit):
        step_time.parse_args(["--repeats", "0"])
