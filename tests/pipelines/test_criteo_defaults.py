"""The Criteo CLI on small files: data-size defaults, divergence stops, calibration skip, single-class AUC.

The defaults run is the issue's check: the CLI's own defaults (only `--batch
64` set, as a 1,000-row file forces) on 1,000 rows of the repository's
synthetic generator must end within 10% of the base-rate log loss. The other
runs use tiny settings (hash size 20, one hidden layer of 8, RDP) to stay fast.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from pipelines import criteo
from pipelines.criteo import calibration as criteo_calibration
from pipelines.criteo import defaults as criteo_defaults
from pipelines.criteo import divergence
from pipelines.criteo import evaluation as criteo_eval
from tfdp_embed.data.criteo import CRITEO_VOCAB_SIZES
from tfdp_embed.data.criteo.synthetic import write_synthetic_criteo

TINY = [
    "--hash-size",
    "20",
    "--embedding-dim",
    "2",
    "--hidden-units",
    "8",
    "--batch",
    "100",
    "--epochs",
    "1",
    "--seed",
    "0",
    "--verbose",
    "0",
    "--accountant",
    "rdp",
]


@pytest.fixture(scope="module")
def days(tmp_path_factory):
    directory = tmp_path_factory.mktemp("criteo_small")
    return write_synthetic_criteo(str(directory), num_rows=800, seed=1, days=2, vocab_scale=0.01)


def _report(out) -> tuple[dict, str]:
    with open(os.path.join(out, "report.json")) as f:
        text = f.read()
    return json.loads(text), text


# -- the rules ---------------------------------------------------------------------------
def test_rules_scale_with_the_training_rows():
    # B = N / 16 rounded to a power of two in [32, 2048]: 1000 / 16 = 62.5 -> 64; 7200 / 16 = 450 -> 512.
    assert [criteo_defaults.batch_size(n) for n in (100, 1000, 7200, 10**5, 10**8)] == [32, 64, 512, 2048, 2048]
    assert criteo_defaults.batch_size(20) == 20  # never more than the rows
    # Hash cap max(1000, 10^(floor(log10 N) - 1)).
    assert [criteo_defaults.hash_size_cap(n) for n in (1000, 7200, 99_999, 200_000, 10**8)] == [
        1000,
        1000,
        1000,
        10_000,
        10**7,
    ]
    vocab = criteo_defaults.vocabulary(200_000)
    assert vocab["C3"] == 10_000 and vocab["C1"] == CRITEO_VOCAB_SIZES["C1"] == 1472
    assert criteo_defaults.vocabulary(10**8) == dict(CRITEO_VOCAB_SIZES)  # Table 3 untouched at scale
    assert criteo_defaults.hidden_units(1000) == (64, 32)
    assert criteo_defaults.hidden_units(5 * 10**6) == (512, 256, 128)
    assert criteo_defaults.hidden_units(10**8) == (598,) * 4
    # eta = min(1, B x 0.3 / 512) / C: B = 512, C = 1 -> 0.3 (the Kaggle-sample setting); B = 64, C = 10 -> 0.00375.
    assert criteo_defaults.learning_rate("dense", 512, 1.0) == pytest.approx(0.3)
    assert criteo_defaults.learning_rate("adafest", 64, 10.0) == pytest.approx(0.00375)
    assert criteo_defaults.learning_rate("dense", 4096, 1.0) == 1.0
    assert criteo_defaults.learning_rate("none", 64, 10.0) == pytest.approx(0.00375)  # the DP step without noise
    chosen = criteo_defaults.resolve(
        mechanism="dense",
        clip=10.0,
        rows=1000,
        smallest_period=1000,
        batch=64,
        hidden=None,
        lr=None,
        hash_size=None,
        rows_estimate=1000,
    )
    assert chosen.chosen == ("hidden_units", "learning_rate", "vocabulary") and chosen.batch == 64


def test_cli_defaults_on_1000_generated_rows_stay_near_the_base_rate(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["--synthetic-rows", "1000", "--synthetic-eval-rows", "2000", "--batch", "64", "--seed", "0"]
    assert criteo.main([*argv, "--verbose", "0", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    report, text = _report(out)
    base = report["base_rate_logloss"]
    r = report["eval_click_rate"]
    assert base == pytest.approx(-(r * math.log(r) + (1 - r) * math.log(1 - r)))
    assert math.isfinite(report["logloss"]) and report["logloss"] <= 1.1 * base, (report["logloss"], base)
    assert abs(report["eval_mean_prediction"] - r) < 0.1  # no collapse
    # The chosen settings are recorded and printed.
    defaults = report["defaults"]
    assert defaults["chosen_from_data"] == ["hidden_units", "learning_rate", "vocabulary"]
    assert defaults["values"]["hidden_units"] == [64, 32] and defaults["values"]["batch"] == 64
    assert defaults["values"]["learning_rate"] == pytest.approx(0.00375)  # 64 x 0.3 / 512 / C (C = 10)
    assert report["model"]["hidden_units"] == [64, 32] and report["training"]["learning_rate"] == pytest.approx(0.00375)
    assert "hidden units 64,32 (chosen)" in printed and "capped at 1000 buckets (chosen)" in printed
    # The output calibration (5% of epsilon 3 = 0.15) is skipped on ~1,000 rows: sd sqrt(82) x 2 / 0.15 / N~,
    # N~ the DP-released row count (the exact 1,000 is not released), within a few rows of 1,000.
    released_rows = report["dataset_size"]
    assert released_rows == report["rows_read"] and abs(released_rows - 1000) < 50
    calibration = report["output_calibration"]
    assert calibration["skipped"] is True and calibration["epsilon_to_training"] == pytest.approx(0.15)
    assert calibration["expected_click_rate_error"] == pytest.approx(math.sqrt(82) * 2 / 0.15 / released_rows)
    assert "output calibration skipped" in printed and "went to training" in printed
    assert not any("Output calibration" in c for c in report["caveats"])
    assert report["epsilon"] == pytest.approx(3.0, rel=1e-3)  # all of it spent on training
    assert "NaN" not in text and '"nan"' not in text


# -- divergence ---------------------------------------------------------------------------
@pytest.mark.parametrize("mechanism", ["none", "dense"])
def test_a_diverging_run_stops_without_exporting(mechanism, days, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["--train", days[0], "--eval", days[1], "--out", str(out), *TINY, "--mechanism", mechanism]
    assert criteo.main([*argv, "--learning-rate", "1e6", "--momentum", "0.9", "--batch", "50"]) == 1
    err = capsys.readouterr().err
    assert "Training diverged" in err and "Nothing was exported" in err and "--learning-rate (now 1e+06)" in err
    assert not os.path.exists(out / "saved_model") and not os.path.exists(out / "report.json")


def _feed(monitor, epochs):
    """Feeds per-batch losses to the monitor as Keras logs them: the epoch's running mean."""
    for epoch in epochs:
        monitor.on_epoch_begin(0)
        for i in range(len(epoch)):
            running = float(np.mean(epoch[: i + 1]))
            monitor.on_train_batch_end(i, {"loss": running})
            if monitor.problem:
                return


class _Model:
    stop_training = False


def test_monitor_recovers_batch_losses_and_stops_at_the_explosion():
    monitor = divergence.DivergenceMonitor(factor=4.0, window=2)
    monitor.set_model(_Model())
    # First loss 0.7 -> limit 4 x 0.7 = 2.8; window means: .7, .65, .6, then (0.6 + 5) / 2 = 2.8 (not above), 5.
    _feed(monitor, [[0.7, 0.6, 0.6], [0.6, 5.0, 5.0, 0.5]])
    assert monitor.recent == [5.0, 5.0] and monitor.steps == 6 and monitor.model.stop_training
    assert "exploded" in monitor.problem and "step 6" in monitor.problem

    quiet = divergence.DivergenceMonitor(window=2)
    quiet.set_model(_Model())
    _feed(quiet, [[0.7, 0.6, 0.5], [0.5, 0.4]])
    assert quiet.problem is None and quiet.steps == 5 and quiet.recent == pytest.approx([0.5, 0.4])

    nan = divergence.DivergenceMonitor()
    nan.set_model(_Model())
    _feed(nan, [[0.7, float("nan")]])
    assert "non-finite" in nan.problem and "step 2" in nan.problem


def test_released_model_checks_name_the_problem():
    good = {"examples": 1000, "logloss": 0.1, "base_rate_logloss": 0.1, "click_rate": 0.021, "mean_prediction": 0.02}
    assert divergence.released_model_problem(good) is None
    # The Criteo-1TB sample: log loss 401, mean prediction 0 for a click rate of 0.021.
    assert "log loss 401" in divergence.released_model_problem({**good, "logloss": 401.0})
    collapsed = divergence.released_model_problem({**good, "mean_prediction": 1e-6})
    assert "collapsed" in collapsed and "0.021" in collapsed
    assert "non-finite" in divergence.released_model_problem({**good, "logloss": float("nan")})
    # An untrained model (p = 1/2, log loss log 2) is not a divergence, even for a rare click.
    assert divergence.released_model_problem({**good, "logloss": math.log(2), "mean_prediction": 0.5}) is None


# -- output calibration decision -----------------------------------------------------------
def test_calibration_skip_rule_is_its_public_noise_level():
    # sd = sqrt(2 (40 + 1)) x 2 / eps_c / N.
    assert criteo_calibration.expected_click_rate_error(1000, 0.15) == pytest.approx(math.sqrt(82) * 2 / 0.15 / 1000)
    reason = criteo_calibration.skip_reason(1000, 0.15)
    assert "scale 13.3" in reason and "0.12" in reason and "went to training" in reason
    # Runs from N >= sqrt(82) x 2 / (0.15 x 0.01) = 12,074 rows at eps_c 0.15.
    assert criteo_calibration.skip_reason(12_075, 0.15) is None
    assert criteo_calibration.skip_reason(12_073, 0.15) is not None


# -- single-class evaluation -----------------------------------------------------------------
def test_single_class_eval_reports_null_auc_with_a_reason(days, tmp_path, capsys):
    with open(days[1]) as f:
        lines = ["0" + line[1:] for line in f]  # every label 0
    no_clicks = tmp_path / "no_clicks.tsv"
    no_clicks.write_text("".join(lines))
    out = tmp_path / "run"
    argv = ["--train", days[0], "--eval", str(no_clicks), "--out", str(out), *TINY, "--mechanism", "none"]
    assert criteo.main(argv) == 0
    printed = capsys.readouterr().out
    report, text = _report(out)
    assert report["auc"] is None and "all 400 evaluation rows are non-clicks" in report["auc_note"]
    assert report["eval_click_rate"] == 0.0 and report["base_rate_logloss"] == 0.0
    assert isinstance(report["logloss"], float) and report["warnings"] == [report["auc_note"] + "."]
    assert "nan" not in text.lower()
    assert "n/a (AUC undefined: all 400 evaluation rows are non-clicks" in printed


def test_auc_note_and_base_rate():
    assert criteo_eval.auc_note(np.array([0, 1, 0])) is None
    assert "clicks (label 1)" in criteo_eval.auc_note(np.ones(3))
    assert "no rows" in criteo_eval.auc_note(np.zeros(0))
    assert criteo_eval.base_rate_log_loss(0.25) == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))


def test_vocabulary_table3_keeps_table_3_uncapped_whatever_the_rows(days, tmp_path):
    chosen = criteo_defaults.resolve(
        mechanism="dense",
        clip=1.0,
        rows=1000,
        smallest_period=1000,
        batch=64,
        hidden=(8,),
        lr=0.1,
        hash_size=None,
        rows_estimate=None,
        table3_vocabulary=True,
    )
    assert chosen.vocabulary == "DP-FEST Table 3 (uncapped)" and "vocabulary" not in chosen.chosen
    flags = [f for f in TINY if f not in ("--hash-size", "20")]
    out = tmp_path / "run"
    argv = ["--train", days[0], "--eval", days[1], "--vocabulary", "table3", "--out", str(out), *flags]
    assert criteo.main(argv) == 0
    report, _ = _report(out)
    assert report["model"]["vocab_sizes"] == list(CRITEO_VOCAB_SIZES.values())
    assert report["defaults"]["values"]["vocabulary"] == "DP-FEST Table 3 (uncapped)"
    with pytest.raises(SystemExit):
        criteo.parse_args([*argv, "--hash-size", "20"])


def test_top_min_rows_keeps_small_tables_whole_and_a_dp_run_does_not_stop_on_the_training_loss(
    days, tmp_path, monkeypatch
):
    from pipelines.criteo import privacy as criteo_privacy

    # Whether a DP model is released must not hinge on the raw training loss (single rows): the monitor that
    # stops on it is attached to non-private runs only; a DP run is judged on the held-out evaluation rows.
    seen = []

    class Spy(divergence.DivergenceMonitor):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(batch)
            super().on_train_batch_end(batch, logs)

    monkeypatch.setattr(divergence, "DivergenceMonitor", Spy)

    counts = {"a": np.zeros(4), "b": np.zeros(30), "c": np.zeros(5000)}
    settings = criteo_privacy.PrivacySettings(mechanism="fest", epsilon=1.0, delta=1e-5, top_fraction=0.1)
    assert criteo_privacy.top_rows(settings, counts) == {"top_fraction": 0.1}  # default: the fraction as given
    wide = criteo_privacy.PrivacySettings(mechanism="fest", epsilon=1.0, delta=1e-5, top_fraction=0.1, top_min_rows=10)
    assert criteo_privacy.top_rows(wide, counts) == {"top_k": {"a": 4, "b": 10, "c": 500}}
    flags = [f for f in TINY if f not in ("--hash-size", "20")] + ["--hash-size", "40"]  # 41 rows a table
    out = tmp_path / "run"
    argv = ["--train", days[0], "--eval", days[1], "--mechanism", "fest", "--top-min-rows", "12", "--out", str(out)]
    assert criteo.main([*argv, *flags]) == 0
    assert seen == []  # DP-FEST: no training-loss monitor
    report, _ = _report(out)
    # The 26 tables of 41 rows are one stack (one width): it keeps 26 x 12 rows, not 26 x floor(0.1 x 41) = 104,
    # chosen by one top-k over all its buckets; --no-stack-tables keeps 12 per table.
    assert list(report["mechanism_report"]["selections"][0]["top_k"].values()) == [26 * 12]
    assert criteo_privacy.top_rows(wide, counts, {"c": [4000, 1000]}) == {"top_k": {"a": 4, "b": 10, "c": 500}}
