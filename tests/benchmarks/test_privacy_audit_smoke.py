"""Smoke test of `python -m benchmarks.privacy_audit` at toy scale (64 canaries, 8 steps, 3 settings).

It runs the script in-process, writing only under tmp_path (never benchmarks/RESULTS.md or
benchmarks/results/), and checks the JSON fields, the Markdown section and the plot.
"""

from __future__ import annotations

import json

import pytest

from benchmarks import privacy_audit
from benchmarks.privacy_audit_report import max_provable_epsilon
from tfdp_embed.audit.fdp_one_run import METHODS
from tfdp_embed.audit.one_run import default_guess_pairs


def _run(tmp_path, argv: list) -> tuple[dict, dict]:
    """Runs the benchmark with `argv` plus its outputs under `tmp_path`: (its JSON document, the output paths)."""
    out = {name: tmp_path / name for name in ("audit.json", "audit.png", "page.md")}
    argv = [*argv, "--json", str(out["audit.json"]), "--png", str(out["audit.png"])]
    argv += ["--results-md", str(out["page.md"])]
    assert privacy_audit.main(argv) == 0
    return json.loads(out["audit.json"].read_text()), out


def test_privacy_audit_smoke(tmp_path):
    argv = ["--canaries", "64", "--steps", "8", "--real-examples", "100", "--repeats", "1"]
    argv += ["--epsilons", "8", "--mechanisms", "dense,fest,none"]
    document, out = _run(tmp_path, argv)
    assert document["benchmark"] == "privacy_audit"
    assert document["command"].startswith("python -m benchmarks.privacy_audit --canaries 64")
    for key in ("nproc", "cpu_model", "date_utc", "git", "load_average_at_start"):
        assert key in document["machine"], key
    # 64 canaries, 11 guess pairs x 3 methods (audit_run's audit_lower_bound): all 64 correct proves at most 3.97
    # (the mu-GDP curve; Steinke et al.'s alone, at 0.05 / 11, logit((0.05 / 11) ** (1 / 64)) ~ 2.43)
    ceiling = document["max_provable_epsilon"]
    assert ceiling == pytest.approx(max_provable_epsilon(64, delta=1e-5, confidence=0.95)) and 3.5 < ceiling < 4.5
    runs = {r["mechanism"]: r for r in document["runs"]}
    assert set(runs) == {"dense", "fest", "none"}
    for run in runs.values():
        assert run["num_canaries"] == 64 and 0 <= run["correct"] <= run["guesses"] <= 64
        assert run["method"] in METHODS and run["num_tests"] == len(default_guess_pairs(64)) * len(METHODS)
        assert 0.0 <= run["epsilon_lb"] <= ceiling + 1e-9 and run["wall_s"] > 0
        assert run["zero_scores_in"] + run["zero_scores_out"] <= 64
    assert runs["dense"]["claimed_epsilon"] == 8.0 and runs["dense"]["noise_multiplier"] > 0
    assert runs["fest"]["noise_multiplier"] > runs["dense"]["noise_multiplier"]  # sigma for 8 - eps_1
    assert runs["none"]["claimed_epsilon"] is None and runs["none"]["noise_multiplier"] == 0.0
    # no noise: an excluded canary's row never moves
    assert runs["none"]["zero_scores_out"] == 64 - runs["none"]["num_included"]
    assert [s["mechanism"] for s in document["settings"]] == ["dense", "fest", "none"]
    assert isinstance(document["flags"], list)

    section = out["page.md"].read_text().split("### privacy_audit — ", 1)[1]
    assert "| dense | 8 |" in section and "| none | — (non-private) | 0 | 64 |" in section
    assert "no outcome proves more than" in section
    assert out["audit.png"].stat().st_size > 5_000


def test_flag_lines_name_only_dp_runs_above_their_claim():
    row = {"claimed_epsilon": 1.0, "seed": 0, "epsilon_lb": 1.2}
    runs = [
        {**row, "mechanism": "dense"},  # 1.2 > 1: flagged
        {**row, "mechanism": "lazy", "epsilon_lb": 0.9},  # below its claim
        {**row, "mechanism": "eana", "claimed_epsilon": None, "epsilon_lb": 3.9},  # not DP: no claim to exceed
    ]
    flags = privacy_audit._flags(runs)
    assert len(flags) == 1 and flags[0].startswith("FLAG: dense at claimed eps=1 ")


def test_privacy_audit_white_box_smoke(tmp_path):
    """--canary-kind white-box: 500 gradient canaries, T = 4 at q = 1, every mechanism (the DP ones at eps 8).

    Dense, EANA and none observed step by step; LazyDP, DP-FEST, DP-AdaFEST and DP-AdaFEST+ through the
    released table.
    """
    argv = ["--canary-kind", "white-box", "--canaries", "500", "--steps", "4", "--repeats", "1", "--epsilons", "8"]
    document, out = _run(tmp_path, argv)
    assert document["config"]["canary_kind"] == "white-box" and document["config"]["sampling_probability"] == 1.0
    runs = {r["mechanism"]: r for r in document["runs"]}
    assert set(runs) == {"dense", "lazy", "fest", "adafest", "adafest+", "eana", "none"}
    for name in ("lazy", "fest", "adafest", "adafest+"):
        assert runs[name]["observe"] == "released" and runs[name]["where"] == "table"
        assert 0.0 <= runs[name]["epsilon_lb"] <= runs[name]["accountant_epsilon"] <= 8.01
    assert runs["dense"]["observe"] == "update" and not document["flags"]
    assert runs["dense"]["accountant_epsilon"] == pytest.approx(8.0, abs=0.01)
    assert 0.0 < runs["dense"]["epsilon_lb"] <= 8.0 and runs["dense"]["method"] in runs["dense"]["by_method"]
    # without noise every canary is told apart; EANA leaves the rows of canaries left out unnoised
    assert runs["none"]["epsilon_lb"] > runs["dense"]["epsilon_lb"]
    assert runs["eana"]["zero_scores_out"] == 500 - runs["eana"]["num_included"]
    section = out["page.md"].read_text()
    assert "gradient canaries vs claimed ε" in section and "| dense | update | 8 |" in section
    assert "| lazy | released table | 8 |" in section


def test_white_box_refuses_mechanisms_it_cannot_audit(capsys):
    with pytest.raises(SystemExit):
        privacy_audit.main(["--canary-kind", "white-box", "--mechanisms", "lazy,sparse", "--json", "", "--png", ""])
    assert "not for --canary-kind white-box" in capsys.readouterr().err


def test_privacy_audit_two_tower_smoke(tmp_path):
    """--model two-tower: 100 canaries in the MovieLens pipeline's two-tower on 40 generated users, 2 epochs."""
    from tests.pipelines.test_movielens_pipeline import write_ratings

    (tmp_path / "ml").mkdir()
    ratings = write_ratings(tmp_path / "ml" / "u.data")
    argv = ["--model", "two-tower", "--data", ratings, "--canaries", "100", "--epochs", "2", "--batch-size", "32"]
    argv += ["--repeats", "1", "--epsilons", "8", "--mechanisms", "dense,eana,none"]
    document, out = _run(tmp_path, argv)
    config = document["config"]
    assert config["model"] == "two-tower" and config["canary_kind"] == "rare-id" and config["num_canaries"] == 100
    runs = {r["mechanism"]: r for r in document["runs"]}
    assert set(runs) == {"dense", "eana", "none"}
    assert runs["dense"]["claimed_epsilon"] == 8.0 and runs["dense"]["noise_multiplier"] > 0
    assert runs["eana"]["noise_multiplier"] == pytest.approx(document["eana_noise_multiplier"])
    for run in runs.values():
        assert 0 <= run["correct"] <= run["guesses"] <= 100 and run["log_prob"]["guesses"] <= 100
        assert 0.0 <= run["epsilon_lb"] <= document["max_provable_epsilon"] + 1e-9
    assert runs["dense"]["epsilon_lb"] <= 8.0 and runs["dense"]["zero_scores_out"] == 0  # every row noised
    for name in ("eana", "none"):  # the history rows of canaries left out never move
        assert runs[name]["zero_scores_out"] == 100 - runs[name]["num_included"]
    # observed: none and EANA 1.59 (86/100 right), dense 0.0
    assert runs["none"]["epsilon_lb"] > runs["dense"]["epsilon_lb"] and document["gaps"]["none"] > 0
    section = out["page.md"].read_text()
    assert "rare-id canaries in the MovieLens two-tower" in section and "| dense | 8 |" in section
    assert out["audit.png"].stat().st_size > 5_000


@pytest.mark.parametrize(
    "flags, match",
    [
        (["--mechanisms", "fest"], "not for --model two-tower"),
        (["--canary-kind", "white-box", "--mechanisms", "adafest+"], "not for --model two-tower --canary-kind"),
    ],
)
def test_two_tower_refuses_what_it_cannot_audit(capsys, flags, match):
    with pytest.raises(SystemExit):
        privacy_audit.main(["--model", "two-tower", *flags, "--json", "", "--png", ""])
    assert match in capsys.readouterr().err


def test_privacy_audit_two_tower_white_box_smoke(tmp_path):
    """--model two-tower --canary-kind white-box: 500 gradient canaries in a full-softmax scored table, T = 4.

    Observed (epsilon 8): dense 2.94, LazyDP 2.16, DP-AdaFEST 2.16, EANA 2.94 (= dense: a scored table's every
    row is noised), none 6.15.
    """
    argv = ["--model", "two-tower", "--canary-kind", "white-box", "--canaries", "500", "--steps", "4"]
    argv += ["--repeats", "1", "--epsilons", "8"]
    document, out = _run(tmp_path, argv)
    assert document["config"]["model"] == "two-tower" and document["config"]["canary_kind"] == "white-box"
    runs = {r["mechanism"]: r for r in document["runs"]}
    assert set(runs) == {"dense", "lazy", "adafest", "eana", "none"} and not document["flags"]
    assert {r["where"] for r in runs.values()} == {"scored-table"}
    for name in ("dense", "lazy", "adafest"):
        assert 0.0 < runs[name]["epsilon_lb"] <= runs[name]["accountant_epsilon"] <= 8.01
    assert runs["eana"]["epsilon_lb"] == pytest.approx(runs["dense"]["epsilon_lb"])  # every scored row noised
    assert runs["none"]["epsilon_lb"] > runs["dense"]["epsilon_lb"]
    assert "white-box, two-tower" in out["page.md"].read_text()
