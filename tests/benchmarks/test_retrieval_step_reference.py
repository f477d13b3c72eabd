"""Smoke test of `python -m benchmarks.retrieval_step --reference ... --json ...` on a tiny generated MovieLens.

DP-AdaFEST, LazyDP and the non-private step of one model, stepped in one
rotation: one result with both DP ratios and the machine's load. It never
touches benchmarks/RESULTS.md or the repository's results folder.
"""

from __future__ import annotations

import json

import pytest

from benchmarks import retrieval_step
from tests.benchmarks.test_retrieval_smoke import _generated


@pytest.mark.slow  # three models traced: ~20 s
def test_reference_mechanisms_step_in_the_same_rotation_and_the_json_records_the_load(tmp_path):
    out = tmp_path / "side.json"
    argv = ["--data", _generated(tmp_path / "ml"), "--batch-size", "32", "--dim", "8", "--negatives", "8"]
    argv += ["--steps", "4", "--mechanism", "adafest", "--reference", "lazy", "--json", str(out)]
    assert retrieval_step.main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "retrieval_step" and "--reference lazy" in doc["command"]
    assert len(doc["machine"]["load_average_at_start"]) == 3
    result = doc["result"]
    assert result["mechanism"] == "adafest" and list(result["references"]) == ["lazy"]
    for found in (result, result["references"]["lazy"]):
        assert found["wall_ratio"] > 0 and found["cpu_ratio"] > 0
    assert result["dp"]["wall_ms"] > 0 and result["none"]["cpu_ms"] >= 0
