"""`python -m benchmarks.step_time --front-end both`: one tiny run under tf-keras and Keras 3 (one worker, ~20 s).

It checks the rows of both front ends, the Keras 3 ÷ tf-keras comparison in
the JSON and the Markdown section; it never touches benchmarks/RESULTS.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks import step_time
from benchmarks.step_time_compare import front_end_comparison
from benchmarks.step_time_front_ends import FrontEnd

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_front_end_flag_names_the_output_and_defaults_to_tf_keras():
    default = step_time.parse_args(["--vocab", "1000", "--json", "", "--png", "", "--results-md", ""])
    assert default.front_end == "keras2" and step_time.front_ends("keras2") == ["keras2"]
    both = step_time.parse_args(["--front-end", "both", "--vocab", "1000", "--png", "", "--results-md", ""])
    assert step_time.front_ends("both") == ["keras2", "keras3"]
    assert os.path.basename(both.json).startswith("step_time-uniform-both-1e3-")


def test_keras3_rows_it_cannot_run_are_refused_with_the_reason():
    keras3, keras2 = FrontEnd("keras3", None, None, None), FrontEnd("keras2", None, None, None)
    assert "no lookahead" in keras3.unsupported("lazy_lookahead")
    assert "tf-keras optimizer" in keras3.unsupported("tfp_keras_sgd")
    assert keras3.unsupported("lazy") is None and keras2.unsupported("lazy_lookahead") is None


def test_comparison_pairs_the_processes_of_each_repeat():
    def row(front_end, mechanism, medians, base):
        return {
            "front_end": front_end,
            "mechanism": mechanism,
            "vocab": 10,
            "median_step_s": medians[1],
            "median_step_s_runs": medians,
            "none_in_process_median_s_runs": base,
            "ratio_to_none": 1.2,
            "peak_rss_mb": 700.0,
        }

    rows = [
        row("keras2", "lazy", [1.0, 2.0, 4.0], [1.0, 1.0, 1.0]),
        row("keras3", "lazy", [1.1, 2.4, None], [1.0, 1.5, 2.0]),
        row("keras2", "dense", [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]),
    ]
    (entry,) = front_end_comparison(rows)  # dense has no Keras 3 row
    assert entry["mechanism"] == "lazy" and entry["keras3_over_keras2_runs"] == [1.1, 1.2]
    assert abs(entry["keras3_over_keras2"] - 1.15) < 1e-9 and entry["within_target"] is False
    assert entry["plain_keras3_over_keras2"] == 1.5


@pytest.mark.slow  # ~15 s: `make test-slow`
def test_step_time_both_front_ends_smoke(tmp_path):
    out_json, results_md = tmp_path / "step_time.json", tmp_path / "RESULTS.md"
    command = [sys.executable, "-m", "benchmarks.step_time", "--front-end", "both"]
    command += ["--mechanisms", "lazy", "--vocab", "1000", "--dim", "8", "--steps", "2"]
    command += ["--warmup", "1", "--isolation", "vocab", "--num-batches", "4", "--adafest-noise-rows", "0"]
    command += ["--json", str(out_json), "--results-md", str(results_md), "--png", ""]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    document = json.loads(out_json.read_text())
    assert document["settings"]["front_end"] == "both" and document["settings"]["pairing"] == "steps"
    assert [p["tag"] for p in document["processes"]] == ["v1000_lazy_both"]  # both front ends in one process
    rows = {r["front_end"]: r for r in document["results"]}
    assert set(rows) == {"keras2", "keras3"} and {r["mechanism"] for r in rows.values()} == {"lazy"}
    for row in rows.values():
        assert row["median_step_s"] > 0 and row["ratio_to_none"] > 0 and row["peak_rss_mb"] > 0, row["notes"]
        assert "history int32" in row["notes"]  # LazyDP's history under both front ends
        assert row["none_in_process_steps"] == 2 and "steps alternated" in row["notes"]

    (lazy,) = document["front_end_comparison"]
    assert lazy["mechanism"] == "lazy" and lazy["keras3_over_keras2"] > 0 and lazy["plain_keras3_over_keras2"] > 0
    assert lazy["keras2_peak_rss_mb"] > 0 and lazy["keras3_peak_rss_mb"] > 0

    section = results_md.read_text()
    assert "| lazy [Keras 3] | 1,000 |" in section and "| lazy | 1,000 |" in section
    assert "Keras 3 ÷ tf-keras (per repeat)" in section and "keras.optimizers.SGD" in section
