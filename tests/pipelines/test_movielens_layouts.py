"""The MovieLens CLI on an ml-latest / ML-20M style dataset directory: dense ids, original-id serving, baselines."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from pipelines import movielens
from pipelines.movielens import pipeline as movielens_pipeline
from pipelines.movielens import report as movielens_report
from tfdp_embed import tf

MOVIES = np.array([450, 2711, 5508, 6719, 12338, 28740, 44238, 45483, 50477, 64639, 82586, 83813, 89148, 90906, 91820,
                   99478, 103684, 104444, 106492, 110019, 119627, 119663, 125441, 133360, 133793, 139477, 140611,
                   149675, 153342, 163949])  # fmt: skip
FLAGS = [
    "--privacy-unit",  # the CLI's default unit is the user (issue 30); these runs check the file layouts
    "example",
    "--mechanism",
    "none",
    "--epochs",
    "2",
    "--batch-size",
    "32",
    "--embedding-dim",
    "8",
    "--context-length",
    "3",
    "--seed",
    "1",
    "--learning-rate",
    "0.1",
    "--accountant",
    "rdp",
    "--quiet",
    "--k",
    "5",
]


def write_ml_latest(directory, *, users=40, length=16, seed=0) -> str:
    """ratings.csv as GroupLens writes it: header, CRLF, half stars, sparse movie ids (walks of the catalogue)."""
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    lines = ["userId,movieId,rating,timestamp"]
    for user in range(1, users + 1):
        start = int(rng.integers(0, MOVIES.size))
        lines += [
            f"{user},{MOVIES[(start + t) % MOVIES.size]},{rng.integers(1, 11) / 2},{1000 + 10 * t}"
            for t in range(length)
        ]
    with open(os.path.join(directory, "ratings.csv"), "w", newline="") as f:
        f.write("\r\n".join(lines) + "\r\n")
    return str(directory)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    data_dir = write_ml_latest(tmp_path_factory.mktemp("ml-latest"))
    out = str(tmp_path_factory.mktemp("run") / "out")
    assert movielens.main([*FLAGS, "--data", data_dir, "--out", out]) == 0
    with open(os.path.join(out, "report.json")) as f:
        report = json.load(f)
    data = movielens.load_movielens(movielens.MovieLensConfig(data_path=data_dir, context_length=3, mechanism="none"))
    return report, data, out


def test_dataset_directory_is_read_and_items_numbered_densely(run):
    report, data, _ = run
    assert report["data"]["path"].endswith("ratings.csv")
    assert report["model"]["num_items"] == data.num_items == 30  # not 163,949 rows
    assert report["data"]["item_ids"]["largest_original_id"] == 163949
    # the table matches the distinct ids: no table warning (2 epochs leave the loss at ln(30): issue 35's warning)
    assert not [w for w in report["warnings"] if "loss is stuck" not in w and "does not beat" not in w]
    # no catalogue beside the ratings, a non-private run: the shipped id map comes from the ratings, and a caveat
    # says so (a DP run releases the map with DP: tests/privacy/test_vocabulary_exit.py); nothing is assumed
    assert any("movie-id map shipped with the model" in text for text in report["caveats"])
    assert not any("movie-id map" in text for text in report["assumptions"])
    np.testing.assert_array_equal(data.item_ids.ids, MOVIES)


def test_baselines_are_numbers_beside_the_metrics(run):
    report, data, _ = run
    baselines = report["baselines"]
    assert "not private" in baselines["popularity_counts"] and "baselines" in report["not_released"]
    for k in (1, 5, 10, 20):
        assert baselines["chance"][f"recall@{k}"] == pytest.approx(k / 30)
        assert baselines["chance"][f"precision@{k}"] == pytest.approx(1 / 30)
    # popularity oracle in ORIGINAL ids: count the training users' ratings, rank by (-count, movie id)
    train_items = data.item_ids.to_original(np.concatenate(list(data.train_timelines.values())))
    counts = {movie: int(np.sum(train_items == movie)) for movie in MOVIES}
    ranking = sorted(MOVIES, key=lambda movie: (-counts[movie], movie))
    labels = data.item_ids.to_original(data.test_labels)
    for k in (1, 5, 10, 20):
        expected = np.mean([label in ranking[:k] for label in labels])
        assert baselines["popularity"][f"recall@{k}"] == pytest.approx(expected)
        assert baselines["popularity"][f"precision@{k}"] == pytest.approx(expected / k)


def test_saved_model_serves_original_ids_with_an_unknown_id_fallback(run):
    _, data, out = run
    serve = tf.saved_model.load(os.path.join(out, "retrieval_saved_model")).signatures["serving_default"]

    def top(history):
        result = serve(history=tf.constant(history, tf.int32))
        return result["item_ids"].numpy().tolist(), result["known_ids"].numpy().tolist()

    ids, known = top([[110019, 119627, 0], [450, 0, 0]])
    assert known == [2, 1] and set(np.ravel(ids)) <= set(MOVIES.tolist())
    # shorter and longer histories: any width is accepted
    assert top([[110019, 119627]])[0] == [ids[0]]
    assert top([[110019, 119627, 0, 0, 0, 0, 0]])[0] == [ids[0]]
    # unknown ids (7: no such movie; -3; 2**31 - 1) are dropped like padding
    assert top([[110019, 7, 119627, -3, 2**31 - 1]]) == ([ids[0]], [2])
    # a history with no known id gets the empty-history answer, the same as a 0-column request
    empty_ids, empty_known = top([[7, 0], [-1, 99]])
    assert empty_known == [0, 0] and empty_ids[0] == empty_ids[1]
    assert serve(history=tf.zeros([1, 0], tf.int32))["item_ids"].numpy().tolist() == [empty_ids[0]]


def test_a_failed_run_leaves_no_out_directory(tmp_path, monkeypatch, capsys):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "ratings.csv").write_text("userId,movieId,rating,timestamp\n1,2,3.5,10\n1,3,four,11\n")
    out = tmp_path / "out"
    assert movielens.main([*FLAGS, "--data", str(bad), "--out", str(out)]) == 1
    assert "ratings.csv:3: field 'rating' must be a number; found 'four'" in capsys.readouterr().err
    assert not out.exists()
    # a failure after the export created the directory removes it too
    good = write_ml_latest(tmp_path / "good", users=12, length=6)

    def failing_write(path, report):
        raise ValueError("disk full (simulated)")

    monkeypatch.setattr(movielens_pipeline, "write_privacy_report", failing_write)
    assert movielens.main([*FLAGS, "--data", good, "--out", str(out), "--epochs", "1"]) == 1
    assert "disk full (simulated)" in capsys.readouterr().err and not out.exists()
    # a directory that existed before the run is left as it was
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert movielens.main([*FLAGS, "--data", str(bad), "--out", str(out)]) == 1
    assert (out / "keep.txt").read_text() == "mine"


def test_a_catalogue_much_larger_than_the_rated_movies_is_warned_about(tmp_path):
    data_dir = write_ml_latest(tmp_path / "ml", users=12, length=6)
    with open(os.path.join(data_dir, "movies.csv"), "w") as f:
        f.write("movieId,title,genres\n" + "".join(f"{movie},M{movie},Drama\n" for movie in range(1, 163950)))
    data = movielens.load_movielens(movielens.MovieLensConfig(data_path=data_dir, context_length=3, mechanism="none"))
    assert data.num_items == 163949 and data.rated_items <= 30
    (warning,) = movielens_report.run_warnings(movielens.MovieLensConfig(mechanism="none"), data, final_loss=1.0)
    assert f"163950 rows for {data.rated_items} distinct ids" in warning and "--item-catalogue none" in warning
