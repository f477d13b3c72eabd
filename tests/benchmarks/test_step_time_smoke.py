"""Smoke test of `python -m benchmarks.step_time` at a tiny size (two rounds of one worker process, ~30 s).

It checks the JSON schema, the Markdown section and the plot; it never
touches benchmarks/RESULTS.md or benchmarks/step_time.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULT_KEYS = {
    "mechanism",
    "vocab",
    "dim",
    "batch",
    "zipf",
    "median_step_s",
    "p10_step_s",
    "p90_step_s",
    "steps_timed",
    "ratio_to_none",
    "peak_rss_mb",
    "notes",
}


@pytest.mark.slow  # the worker also runs in test_step_time_front_ends.py's smoke test (default run)
def test_step_time_smoke(tmp_path):
    out_json, results_md, png = tmp_path / "step_time.json", tmp_path / "RESULTS.md", tmp_path / "step_time.png"
    command = [
        sys.executable,
        "-m",
        "benchmarks.step_time",
        "--mechanisms",
        "none,dense",
        "--vocab",
        "1000",
        "--steps",
        "3",
        "--warmup",
        "1",
        "--isolation",
        "vocab",
        "--repeats",
        "2",
        "--num-batches",
        "4",
        "--json",
        str(out_json),
        "--results-md",
        str(results_md),
        "--png",
        str(png),
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    document = json.loads(out_json.read_text())
    assert document["command"].startswith("python -m benchmarks.step_time --mechanisms none,dense")
    info = document["machine"]
    for key in ("nproc", "memory_total_gb", "cpu_model", "gpus", "date_utc", "versions", "load_average_at_start"):
        assert key in info, key
    for package in ("tensorflow", "tf-keras", "dp-accounting"):
        assert info["versions"][package] != "not installed", package
    assert "tensorflow-privacy" in info["versions"]  # recorded ("not installed" outside .venv-peers)

    rows = {r["mechanism"]: r for r in document["results"]}
    assert set(rows) == {"none", "dense"}
    for row in rows.values():
        assert RESULT_KEYS <= set(row), RESULT_KEYS - set(row)
        assert row["vocab"] == 1000 and row["dim"] == 64 and row["batch"] == 1024 and row["zipf"] is None
        assert row["steps_timed"] == 6 and row["processes"] == 2, row["notes"]  # 3 steps in each of 2 processes
        assert 0 < row["p10_step_s"] <= row["median_step_s"] <= row["p90_step_s"]
        assert row["peak_rss_mb"] > 0
    assert rows["none"]["ratio_to_none"] == 1.0
    assert rows["none"]["table_gradient"] == "IndexedSlices"  # the fast path, never densified
    assert rows["none"]["vocab_sized_ops"] == {}
    assert rows["dense"]["ratio_to_none"] > 0
    assert rows["dense"]["none_in_process_steps"] == 3  # per process
    assert len(rows["dense"]["ratio_to_none_runs"]) == 2 and rows["dense"]["notes"].startswith("2 processes")
    assert rows["dense"]["vocab_sized_ops"], "dense DP-SGD must show its [vocab, dim] noise"
    assert rows["none"]["cpu_ratio_to_none"] == 1.0 and rows["dense"]["cpu_ratio_to_none"] > 0
    assert rows["dense"]["cpu_median_step_s"] > 0 and rows["dense"]["none_in_process_cpu_median_s"] > 0

    section = results_md.read_text()
    assert "## step_time" in section and document["command"] in section
    assert "2 processes per mechanism and vocabulary, run round-robin" in section
    assert "| none | 1,000 |" in section and "| dense | 1,000 |" in section
    assert "× none, CPU time (same process)" in section and "- Fused ops (tfdp_embed.ops, sparse_rows): " in section
    assert png.stat().st_size > 1000


@pytest.mark.peer
def test_peer_benchmark_runs_beside_its_own_non_private_step(tmp_path):
    """tensorflow-privacy's DPKerasSGDOptimizer, timed against `none` in the same process (.venv-peers)."""
    pytest.importorskip("tensorflow_privacy", reason="the peer runs in .venv-peers (make test-peers)")
    out_json = tmp_path / "peer.json"
    command = [
        sys.executable,
        "-m",
        "benchmarks.step_time",
        "--mechanisms",
        "none,tfp_keras_sgd",
        "--vocab",
        "1000",
        "--steps",
        "3",
        "--warmup",
        "1",
        "--num-batches",
        "4",
        "--json",
        str(out_json),
        "--results-md",
        "",
        "--png",
        "",
    ]
    env = dict(os.environ, PYTHONPATH=REPO)
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    document = json.loads(out_json.read_text())
    assert document["machine"]["versions"]["tensorflow-privacy"] == "0.9.0"
    rows = {r["mechanism"]: r for r in document["results"]}
    assert set(rows) == {"none", "tfp_keras_sgd"} and rows["tfp_keras_sgd"]["ratio_to_none"] > 0
