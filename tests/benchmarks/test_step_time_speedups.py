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
        _row("none", 10, 0.002), _row("dense", 10, 0.5), _row("tfp_keras_sgd", 10, 4.0),
        _row("adafest", 10, 0.004), _row("eana", 10, None),
        _row("none", 20, 0.002), _row("adafest", 20, 0.008), _row("dense", 20, None),
    ]  # fmt: skip
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
