"""Smoke test of `python -m benchmarks.streaming` at a tiny size (~2 min): JSON, Markdown section, plot, workers.

It never touches benchmarks/RESULTS.md or the repository's results folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_streaming_smoke(tmp_path):
    out_json, results_md, png = tmp_path / "s.json", tmp_path / "RESULTS.md", tmp_path / "s.png"
    command = [
        sys.executable, "-m", "benchmarks.streaming", "--rows", "3000", "--warmup-rows", "1000", "--batch", "100",
        "--buffer-rows", "400", "--repeats", "1", "--workdir", str(tmp_path / "data"), "--json", str(out_json),
        "--png", str(png), "--results-md", str(results_md),
    ]  # fmt: skip
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
