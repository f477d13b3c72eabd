"""The sequential CLI on an S3-Rec file: --max-steps, baselines, a SavedModel taking any history length, failed runs."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from pipelines import sequential
from tfdp_embed import tf
from tfdp_embed.data.sequences import read_user_sequences, write_synthetic_sequences
from tfdp_embed.keras2.models.sasrec import fit_history

MAX_LEN = 6
FLAGS = [
    "--model",
    "transformer",
    "--epsilon",
    "5",
    "--epochs",
    "1",
    "--batch",
    "20",
    "--max-len",
    str(MAX_LEN),
    "--dim",
    "8",
    "--blocks",
    "1",
    "--dropout",
    "0.1",
    "--accountant",
    "rdp",
    "--verbose",
    "0",
    "--seed",
    "3",
]


def write_s3rec(directory) -> str:
    """The synthetic walks of `write_synthetic_sequences`, one user per line ("user item item ...")."""
    pairs = write_synthetic_sequences(
        str(directory / "pairs.txt"), num_users=60, num_items=30, min_length=3, max_length=11, seed=1
    )
    users = read_user_sequences(pairs, layout="pairs")
    path = directory / "Beauty.txt"
    path.write_text("".join(f"{user} {' '.join(map(str, items))}\n" for user, items in users.items()))
    return str(path)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    data = write_s3rec(tmp_path_factory.mktemp("s3rec"))
    root = tmp_path_factory.mktemp("run")
    out, catalogue = str(root / "out"), root / "items.txt"
    catalogue.write_text("# the public item list\n" + "".join(f"{i}\n" for i in range(1, 31)))  # 60 users: too few
    args = ["--data", data, "--out", out, "--max-steps", "2", "--item-catalogue", str(catalogue), *FLAGS]
    assert sequential.main(args) == 0
    with open(os.path.join(out, "report.json")) as f:
        return json.load(f), data, out


def test_s3rec_file_trains_for_max_steps_with_the_noise_calibrated_for_them(run):
    report, _, _ = run
    assert report["data"]["layout"] == "sequences" and report["data"]["users"] == 60
    assert report["steps"] == 2 and report["extra"]["calibrated_steps"] == 2  # not 1 epoch = 60 / 20 = 3
    assert report["settings"]["max_steps"] == 2
    assert report["is_dp"] and report["epsilon"] == pytest.approx(5.0, rel=1e-3)
    # no table warning; 2 DP steps learn nothing, and the comparison with the references says so (issue 35)
    assert not [w for w in report["warnings"] if "does not beat" not in w and "loss is stuck" not in w]


def test_chance_and_popularity_references_are_numbers(run):
    report, data, _ = run
    baselines = report["baselines"]
    assert baselines["chance"]["hit@10"] == pytest.approx(10 / 30)
    assert baselines["chance"]["ndcg@10"] == pytest.approx(sum(1 / math.log2(r + 2) for r in range(10)) / 30)
    # oracle from the raw file: per user the training part (all but the last 2 items), as the model sees it
    # (its last max_len + 1 items: inputs and the final target); targets = last items of users with >= 3
    users = read_user_sequences(data)
    counts = np.zeros(31)
    for items in users.values():
        train = items[:-2] if len(items) >= 3 else items
        for item in train[-(MAX_LEN + 1) :] if len(train) >= 2 else []:
            counts[item] += 1
    order = sorted(range(1, 31), key=lambda item: (-counts[item], item))
    ranks = [order.index(items[-1]) for items in users.values() if len(items) >= 3]
    assert baselines["popularity"]["hit@10"] == pytest.approx(np.mean([r < 10 for r in ranks]))
    assert baselines["popularity"]["ndcg@10"] == pytest.approx(
        np.mean([1 / math.log2(r + 2) if r < 10 else 0 for r in ranks])
    )
    assert "baselines" in report["not_released"] and "not private" in baselines["popularity_counts"]


def test_saved_model_takes_any_history_length_and_unknown_ids(run):
    _, _, out = run
    loaded = tf.saved_model.load(os.path.join(out, "saved_model"))
    serve = loaded.signatures["serving_default"]
    assert serve.structured_input_signature[1]["history"].shape.as_list() == [None, None]

    def top(history):
        result = serve(history=tf.constant(history, tf.int32))
        return result["items"].numpy().tolist(), result["known_ids"].numpy().tolist()

    exact = top([[0, 0, 3, 4, 5, 6]])[0]
    assert top([[3, 4, 5, 6]]) == (exact, [4])  # shorter: left-padded inside
    assert top([[9, 9, 1, 2, 3, 4, 5, 6]])[0] == top([[1, 2, 3, 4, 5, 6]])[0]  # longer: the last max_len kept
    assert top([[3, 4, 31, 5, -2, 6, 999]]) == (exact, [4])  # unknown ids dropped
    empty = top([[31, 0], [-1, 1000]])
    assert empty[1] == [0, 0] and empty[0][0] == empty[0][1]
    assert serve(history=tf.zeros([1, 0], tf.int32))["items"].numpy().tolist() == [empty[0][0]]
    known, padded = fit_history(tf.constant([[3, 4, 31, 5, -2, 6, 999]]), num_items=30, max_len=MAX_LEN)
    assert known.numpy().tolist() == [4] and padded.numpy().tolist() == [[0, 0, 3, 4, 5, 6]]


def test_failed_runs_leave_no_out_directory(run, tmp_path, capsys):
    _, data, _ = run
    bad = tmp_path / "bad.txt"
    bad.write_text("1 4 5 6\n2 7 x\n")
    out = tmp_path / "out"
    assert sequential.main(["--data", str(bad), "--out", str(out), *FLAGS]) == 1
    assert "bad.txt:2: field 3 (item) must be an integer >= 1" in capsys.readouterr().err and not out.exists()
    # settings the data cannot support, found after the data was read
    assert sequential.main(["--data", data, "--out", str(out), *FLAGS, "--batch", "999"]) == 1
    # the bound is N~ (the DP-released user count), not the exact number of users (60)
    err = capsys.readouterr().err
    assert "`batch` must lie in [1, " in err and "released with DP" in err and not out.exists()
    # read as pairs, the S3-Rec file is refused with the hint; a directory that existed stays
    out.mkdir()
    assert sequential.main(["--data", data, "--out", str(out), *FLAGS, "--layout", "pairs"]) == 1
    assert "--layout sequences" in capsys.readouterr().err and out.is_dir()
    with pytest.raises(SystemExit):
        sequential.parse_args(["--data", data, "--out", "x", "--max-steps", "0"])
