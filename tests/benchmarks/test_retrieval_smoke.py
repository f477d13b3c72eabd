"""Smoke test of `python -m benchmarks.retrieval` on a tiny generated MovieLens: popularity, the tuned TFRS
baseline, DP runs at a target epsilon and the DP gap; plus the ranking code every row is scored with.

It never touches benchmarks/RESULTS.md or the repository's results folder.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from benchmarks import retrieval, retrieval_baselines


def _generated(folder) -> str:
    """40 users x 15 ratings of 50 movies (ml-100k's u.data / u.item layout, 19 genre flags)."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    with open(os.path.join(folder, "u.item"), "w") as handle:
        for m in range(1, 51):
            flags = "|".join("1" if g == m % 19 else "0" for g in range(19))
            handle.write(f"{m}|Movie {m}|01-Jan-1995||http://example|{flags}\n")
    with open(os.path.join(folder, "u.data"), "w") as handle:
        for user in range(1, 41):
            movies = rng.choice(np.arange(2 * user, 2 * user + 20) % 50 + 1, size=15, replace=False)
            handle.writelines(f"{user}\t{m}\t5\t{1000 + t}\n" for t, m in enumerate(movies))
    return str(folder)


@pytest.mark.slow  # ~16 s: `make test-slow`
def test_retrieval_benchmark_tunes_tfrs_on_validation_and_reports_popularity_and_the_dp_gap(tmp_path):
    out = tmp_path / "r.json"
    argv = ["--data", _generated(tmp_path / "ml"), "--epochs", "1", "--batch-size", "64", "--dim", "8"]
    argv += ["--negatives", "16", "--dp-runs", "none:full,lazy:full,adafest:sampled", "--epsilon", "3"]
    argv += ["--tune-learning-rates", "0.05,0.1", "--tune-max-epochs", "2", "--interleaved-steps", "0"]
    argv += ["--synthetic-items", "0", "--json", str(out), "--png", "", "--results-md", str(tmp_path / "R.md")]
    assert retrieval.main(argv) == 0
    doc = json.loads(out.read_text())
    popularity, tfrs, *dp_runs = doc["runs"]
    assert popularity["mechanism"] == "popularity" and popularity["median_step_ms"] is None
    # 2 rates x (uncorrected, log-Q corrected) x epochs 1..2, each scored on the validation split
    assert len(doc["tuning"]["tried"]) == 8
    best = doc["tuning"]["best"]
    assert best["validation_recall@10"] == max(t["validation_recall@10"] for t in doc["tuning"]["tried"])
    assert tfrs["setting"] == {key: best[key] for key in ("learning_rate", "epochs", "corrected")}
    for row in doc["runs"]:
        assert all(0.0 <= row[key] <= 1.0 for key in ("recall@10", "recall@50", "recall@10 unrated"))
    private = [r for r in dp_runs if r["mechanism"] != "none"]
    assert [r["mechanism"] for r in private] == ["lazy", "adafest"]
    assert all(0 < r["epsilon"] <= 3.0 + 1e-6 for r in private)
    # only lazy:full has its control (none:full) in this run
    assert [g["run"] for g in doc["dp_gap"]] == ["DP lazy, full softmax"]
    assert doc["dp_gap"][0]["gap"] == dp_runs[0]["recall@10"] - private[0]["recall@10"]
    assert any("for the same model without DP" in note for note in doc["notes"])
    assert doc["recipe"]["epochs"] == 1 and doc["recipe"]["negatives"] == "full"
    assert "most popular movies" in (tmp_path / "R.md").read_text()


def test_ranked_recall_counts_ties_against_the_positive_nan_as_a_miss_and_excludes_rated_movies():
    scores = np.array(
        [
            [3.0, 2.0, 1.0, 0.0],  # positive 0: rank 0
            [1.0, 1.0, 0.0, 0.0],  # positive 1 tied with movie 0: rank 1
            [np.nan, 5.0, 1.0, 0.0],  # a NaN score: a miss, never a hit
            [9.0, 1.0, 2.0, 0.0],  # positive 2 behind movie 0, which user 1 rated in training: unrated rank 0
        ]
    )
    test = {"user_id": np.array([0, 0, 0, 1]), "movie_id": np.array([1, 2, 2, 3])}
    seen = np.zeros((2, 4), bool)
    seen[1, 0] = True
    found = retrieval_baselines.ranked_recall(lambda start, stop: scores[start:stop], test, seen, ks=(1, 2))
    assert found["recall@1"] == 1 / 4  # row 0 only
    assert found["recall@2"] == 3 / 4  # rows 0, 1 and 3 (rank 1)
    assert found["recall@1 unrated"] == 2 / 4  # rows 0 and 3
    assert found["recall@2 unrated"] == 3 / 4
