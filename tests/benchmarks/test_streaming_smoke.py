"""Smoke test of `python -m benchmarks.streaming` at a tiny size (~1 min): JSON, Markdown section, plot.

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
    assert set(summary) == {"plain", "one_pass", "multi_pass"}
    # q = 100 / 3000: 30 batches; multi-pass holds G = 400 // 100 = 4 per pass: 8 reads of the file.
    assert summary["plain"]["ratio_to_plain"] == 1.0 and summary["multi_pass"]["passes"] == 8
    assert summary["one_pass"]["passes"] == 1 and summary["one_pass"]["spill_bytes"] > 0
    runs = {r["method"]: r for r in result["runs"]}
    assert runs["one_pass"]["batches"] == runs["multi_pass"]["batches"] == 30
    assert runs["plain"]["sampled_rows"] == 3000
    assert "## streaming" in results_md.read_text() and png.stat().st_size > 0
    assert not os.listdir(tmp_path / "data" / "spill")  # the spill is removed after each epoch
