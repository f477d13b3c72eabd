"""Smoke test of `python -m benchmarks.streaming` at a tiny size (~2 min): JSON, Markdown section, plot, workers.

It never touches benchmarks/RESULTS.md or the repository's results folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# Nine fresh TensorFlow processes (~2 min on 2 cores): `make test-slow`. The default run keeps the arithmetic
# (test_estimate_is_linear_in_rows_read_plus_the_pilots_process_overhead below) and the one-pass and multi-pass
# samplers over a file (tests/pipelines/test_criteo_pipeline.py::test_streaming_and_in_memory_periods_hold_the_same_rows).
@pytest.mark.slow
def test_streaming_smoke(tmp_path):
    out_json, results_md, png = tmp_path / "s.json", tmp_path / "RESULTS.md", tmp_path / "s.png"
    command = [
        sys.executable,
        "-m",
        "benchmarks.streaming",
        "--rows",
        "3000",
        "--warmup-rows",
        "1000",
        "--batch",
        "100",
        "--buffer-rows",
        "400",
        "--repeats",
        "1",
        "--workdir",
        str(tmp_path / "data"),
        "--json",
        str(out_json),
        "--png",
        str(png),
        "--results-md",
        str(results_md),
    ]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out_json.read_text())
    summary = {s["method"]: s for s in result["summary"]}
    assert set(summary) == {"plain", "one_pass", "multi_pass"} and set(result["pilots"]) == set(summary)
    # q = 100 / 3000: 30 batches; multi-pass holds G = 400 // 100 = 4 per pass: 8 reads of the file.
    assert summary["plain"]["ratio_to_plain"] == summary["plain"]["cpu_ratio_to_plain"] == 1.0
    assert summary["multi_pass"]["passes"] == 8
    assert summary["one_pass"]["passes"] == 1 and summary["one_pass"]["spill_bytes"] > 0
    # Buckets of 400 // 100 = 4 steps of ~100 sampled rows each.
    assert 0 < summary["one_pass"]["largest_bucket_records"] < 400 + 6 * 20
    assert summary["plain"]["largest_bucket_records"] is None
    runs = {r["method"]: r for r in result["runs"]}
    assert runs["one_pass"]["batches"] == runs["multi_pass"]["batches"] == 30
    assert runs["plain"]["sampled_rows"] == 3000
    for run in runs.values():  # a fresh process each: its own pid's peak, at least its RSS before the epoch
        assert run["process_peak_rss_bytes"] >= run["rss_before_bytes"] > 0 and run["cpu_seconds"] > 0
    assert "## streaming" in results_md.read_text() and png.stat().st_size > 0
    assert "estimate (linear in rows read" in done.stdout and "total ~" in done.stdout
    assert not os.listdir(tmp_path / "data" / "spill")  # the spill is removed after each epoch
    assert sorted(os.listdir(tmp_path / "data")) == ["1e3", "3e3", "spill"]  # no partial files, no worker logs


def test_estimate_is_linear_in_rows_read_plus_the_pilots_process_overhead():
    from benchmarks.streaming import estimate_seconds, summarise
    from benchmarks.streaming_worker import file_reads

    # 100 batches of 100 rows; G = 400 // 100 = 4 batches per pass: 25 reads of the file.
    assert file_reads("multi_pass", 10_000, batch=100, buffer_rows=400) == 25
    assert file_reads("one_pass", 10_000, batch=100, buffer_rows=400) == 1
    pilots = {
        "one_pass": {"seconds": 2.0, "rows": 1000, "passes": 1, "process_wall_s": 12.0},
        "multi_pass": {"seconds": 8.0, "rows": 1000, "passes": 4, "process_wall_s": 20.0},
    }
    # (12 - 2) s of process overhead + 2 ms per row read x 10,000 rows x 1 read.
    assert estimate_seconds(pilots, 10_000, "one_pass", batch=100, buffer_rows=400) == 30.0
    # (20 - 8) + 8 / (1000 x 4) per row read x 10,000 x 25 reads = 12 + 500.
    assert estimate_seconds(pilots, 10_000, "multi_pass", batch=100, buffer_rows=400) == 512.0
    run = {"rows": 10, "passes": 1, "largest_bucket_records": None, "spill_bytes": 0, "rss_before_bytes": 5}
    runs = [
        run | {"method": "plain", "repeat": 0, "rows_per_s": 4.0, "cpu_seconds": 3.0, "epoch_peak_rss_bytes": 7},
        run | {"method": "one_pass", "repeat": 0, "rows_per_s": 2.0, "cpu_seconds": 4.0, "epoch_peak_rss_bytes": 9},
    ]
    for r in runs:
        r["process_peak_rss_bytes"] = 100
    one = {s["method"]: s for s in summarise(runs)}["one_pass"]
    assert one["ratio_to_plain"] == 0.5 and one["cpu_ratio_to_plain"] == 0.75 and one["epoch_rss_growth_bytes"] == 4
