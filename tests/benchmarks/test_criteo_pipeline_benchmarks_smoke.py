"""benchmarks/end_to_end.py and benchmarks/criteo_memory.py run end to end on a few hundred rows and write their JSON.

Each runs its children (`python -m pipelines.criteo` in fresh processes) on
tiny generated data with a tiny model and RDP accounting, writes JSON to
`tmp_path`, and no plot or RESULTS.md section. What is checked is what the
lead reads from a real run: every run succeeded, the stages and ratios are
there, the pipeline's numbers made it into the JSON.
"""

from __future__ import annotations

import json

import pytest

from benchmarks import criteo_memory, end_to_end

TINY_MODEL = (
    "--hash-size 20 --embedding-dim 2 --hidden-units 8 --batch 100 --accountant rdp --calibration-fraction 0.05"
)


# `make test-slow`: two fresh pipeline processes (~55 s). The default run keeps the same two runs in process
# (tests/pipelines/test_criteo_pipeline.py::test_end_to_end_report_and_saved_model[none] and [dense]); what only this
# test checks is the benchmark's own stage table and JSON.
@pytest.mark.slow
def test_end_to_end_runs_none_and_one_mechanism_and_writes_its_json(tmp_path, capsys):
    path = tmp_path / "end_to_end.json"
    argv = [
        "--mechanisms",
        "dense",
        "--train-rows",
        "400",
        "--eval-rows",
        "200",
        "--extra",
        TINY_MODEL,
        "--workdir",
        str(tmp_path / "work"),
        "--json",
        str(path),
        "--png",
        "",
        "--results-md",
        "",
        "--timeout",
        "300",
    ]
    assert end_to_end.main(argv) == 0
    document = json.loads(path.read_text())
    results = document["results"]
    assert [r["mechanism"] for r in results] == ["none", "dense"]
    assert all("error" not in r for r in results), [r.get("error") for r in results]
    for result in results:
        assert result["status"] == 0 and result["steps"] == 4  # round(400 / 100) Poisson steps, one epoch
        assert result["wall_s"] > result["fit_start_to_first_step_s"] > 0 and result["peak_rss_bytes"] > 0
    dense = results[1]["seconds"]
    assert dense["release.output_calibration"] > 0 and dense["plan.noise_calibration"] > 0
    summary = document["summary"]
    assert set(summary) == {"none", "dense"} and summary["dense"]["runs"] == 1
    assert set(summary["dense"]["stages"]) == {label for label, _ in end_to_end.STAGES}
    printed = capsys.readouterr().out
    assert "| dense |" in printed and "÷ none" in printed


# `make test-slow`: a fresh pipeline process (~35 s). The default run keeps the streamed pipeline end to end
# (tests/pipelines/test_criteo_pipeline.py::test_end_to_end_report_and_saved_model[adafest], `--streaming on`) and this
# benchmark's row check (test_criteo_memory_flags_missing_rows_but_not_the_noise_of_n_tilde below).
@pytest.mark.slow
def test_criteo_memory_runs_one_mechanism_streamed_and_writes_its_json(tmp_path):
    path = tmp_path / "criteo_memory.json"
    argv = [
        "--rows",
        "2048",
        "--mechanisms",
        "dense",
        "--modes",
        "on",
        "--max-steps",
        "1",
        "--block-rows",
        "1024",
        "--eval-rows",
        "200",
        "--stream-buffer-rows",
        "2048",
        "--workdir",
        str(tmp_path / "work"),
        "--json",
        str(path),
        "--png",
        "",
        "--results-md",
        "",
        "--timeout",
        "300",
    ]
    assert criteo_memory.main(argv) == 0
    results = json.loads(path.read_text())["results"]
    assert [(r["rows"], r["mechanism"], r["streaming"]) for r in results] == [(2048, "dense", "on")]
    assert all("error" not in r for r in results), [r.get("error") for r in results]
    assert [r["streamed"] for r in results] == [True]  # the file is scanned, not held in memory
    for result in results:
        # rows_read is N~ (DP-released, noise sd 20): near the 2,048 rows written, never required to equal them.
        assert abs(result["rows_read"] - 2048) < 120 and result["steps"] == 1 and result["peak_rss_bytes"] > 0
        assert result["epsilon"] <= 3.0
    assert not (tmp_path / "work").exists()  # the data files are removed without --keep-files


def test_criteo_memory_flags_missing_rows_but_not_the_noise_of_n_tilde():
    release = {"dataset_size_release": {"noise_multiplier": 20.0}}
    assert criteo_memory._rows_read_problem({"rows_read": 2051, **release}, 2048) is None
    assert "expected 2048" in criteo_memory._rows_read_problem({"rows_read": 1024, **release}, 2048)
    assert "expected 2048" in criteo_memory._rows_read_problem({"rows_read": 2047}, 2048)  # no release: exact


def test_end_to_end_worker_finds_every_stage_it_times():
    """The worker's stage wrappers name functions that exist (the full run above is slow, so check them here)."""
    import subprocess
    import sys

    code = "from benchmarks import end_to_end_worker; end_to_end_worker.install(); print('installed')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "installed" in done.stdout, done.stderr[-2000:]
