"""benchmarks.movielens_user_level: the section's table and findings come from the runs; a tiny end-to-end run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks import movielens_user_level
from benchmarks.results_questions import user_level_text


def _write_ratings(directory, *, users=30, length=10) -> str:
    """u.data timelines walking a 30-movie catalogue (u.item beside it: the movie ids are public)."""
    rng = np.random.default_rng(0)
    lines = []
    for user in range(1, users + 1):
        start = int(rng.integers(0, 30))
        lines += [f"{user}\t{(start + t) % 30 + 1}\t4\t{1000 + t}" for t in range(length)]
    (directory / "u.data").write_text("\n".join(lines) + "\n")
    (directory / "u.item").write_text("".join(f"{i}|Movie {i} (1995)|01-Jan-1995||\n" for i in range(1, 31)))
    return str(directory / "u.data")


def _run(name, unit, eps, k, recall, **extra):
    row = {"run": name, "privacy_unit": unit, "epsilon": eps, "k": k, "recall@10": recall, "steps": 60}
    row["batch_size"] = 64 if unit == "user" else 256
    row.update({"num_units": 757, "popularity_recall@10": 0.05, **extra})
    return row


def _doc():
    group = {"group_epsilon_median_user": 300.0, "group_epsilon_largest_user": 4000.0}
    group.update(median_user_examples=64, largest_user_examples=736)
    runs = [_run("none", "none", None, None, 0.10)]
    for eps, example, users in ((1.0, 0.06, (0.03, 0.02, 0.01)), (3.0, 0.08, (0.02, 0.04, 0.03))):
        runs.append(_run("example", "example", eps, None, example, **group))
        runs += [_run(f"user k={k}", "user", eps, k, r) for k, r in zip((8, 32, 128), users)]
    config = {"epsilons": "1,3", "ks": "8,32,128", "delta": 1e-5, "epochs": 5, "batch_size": 256}
    return {"config": {**config, "users_per_batch": 64, "default_k": 64}, "runs": runs}


def test_the_section_names_the_cost_and_the_best_k_and_says_choosing_k_by_test_is_not_private():
    text = user_level_text(_doc())
    assert "| 1 | 0.0600 | 300 / 4e+03 | 0.0300 | 0.0200 | 0.0100 |" in text  # one batch size: one value a cell
    assert "| 3 | 0.0800 | 300 / 4e+03 | 0.0200 | 0.0400 | 0.0300 |" in text
    assert "user level k=128 R@10 (64 users per batch)" in text
    # 0.03 / 0.06 = 50 % and 0.04 / 0.08 = 50 % of example level; popularity 0.05 is beaten at neither epsilon
    assert "reaches 0.0300 against example level's 0.0600 (50% of it)" in text
    assert "beats the popularity ranking at 0 of 2" in text
    assert "k = 8 (64 users per batch) at 1 of 2" in text or "k = 32 (64 users per batch) at 1 of 2" in text
    assert "not private and not accounted" in text


@pytest.mark.slow  # ~16 s: `make test-slow`
def test_a_tiny_run_writes_json_and_png(tmp_path):
    data = _write_ratings(tmp_path)
    out_json, out_png = tmp_path / "r.json", tmp_path / "r.png"
    flags = ["--data", data, "--epochs", "1", "--epsilons", "8", "--ks", "2", "--batch-size", "32"]
    flags += ["--users-per-batch", "8", "--json", str(out_json), "--png", str(out_png), "--results-md", ""]
    assert movielens_user_level.main(flags) == 0
    doc = json.loads(out_json.read_text())
    assert [r["run"] for r in doc["runs"]] == ["none", "example", "user k=2 B=8"]
    assert doc["runs"][2]["privacy_unit"] == "user" and doc["runs"][2]["k"] == 2
    assert doc["runs"][1]["group_epsilon_median_user"] > doc["runs"][1]["epsilon"]
    assert out_png.stat().st_size > 0 and doc["command"].startswith("python -m benchmarks.movielens_user_level")
