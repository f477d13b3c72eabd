"""MovieLens at user level (the default unit) and example level with the group-privacy epsilon (issue 30).

Runs: the bundled ml-100k at user level (tiny settings), an ml-latest-style ratings.csv whose movie ids
reach 163,000, an ML-1M-style ratings.dat with k released with DP, a tiny u.data at example level; bad input
refused in one line naming the flag or file:line.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from test_movielens_pipeline import tiny_config, write_ratings

from pipelines import movielens
from pipelines.movielens.config import DEFAULT_DATA_PATH

LATEST_IDS = np.unique(np.r_[1, 2, 50, 5_952, 60_069, 122_904, 163_000, np.linspace(100, 162_000, 24).astype(int)])


def _tiny_flags(out, *extra) -> list:
    return [
        "--mechanism", "dense", "--noise-multiplier", "1.0", "--epochs", "1", "--embedding-dim", "8",
        "--context-length", "3", "--seed", "0", "--quiet", "--accountant", "rdp", "--out", str(out), *extra,
    ]  # fmt: skip


def _write_latest(directory, *, users=30, length=12, bad_line: str | None = None) -> str:
    """ml-latest layout: ratings.csv (header, comma) and movies.csv beside it; movie ids up to 163,000."""
    rng = np.random.default_rng(1)
    lines = ["userId,movieId,rating,timestamp"]
    for user in range(1, users + 1):
        start = int(rng.integers(0, len(LATEST_IDS)))
        for t in range(length + user % 5):  # 12 to 16 ratings per user
            movie = LATEST_IDS[(start + t) % len(LATEST_IDS)]
            lines.append(f"{user * 7},{movie},{rng.integers(1, 6)}.0,{1_500_000_000 + 60 * t}")
    if bad_line is not None:
        lines.insert(5, bad_line)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "ratings.csv"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(directory, "movies.csv"), "w") as f:
        f.write("movieId,title,genres\n" + "".join(f"{i},Movie {i} (2001),Drama\n" for i in LATEST_IDS))
    return os.path.join(directory, "ratings.csv")


def _write_ml_1m(directory, *, users=60) -> str:
    """ML-1M layout: ratings.dat (`UserID::MovieID::Rating::Timestamp`, no header) and movies.dat beside it."""
    rng = np.random.default_rng(2)
    lines = []
    for user in range(1, users + 1):
        start = int(rng.integers(0, 30))
        lines += [
            f"{user}::{(start + t) % 30 + 1}::{rng.integers(1, 6)}::{978_300_000 + 60 * t}"
            for t in range(10 + user % 7)
        ]
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "ratings.dat"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(directory, "movies.dat"), "w") as f:
        f.write("".join(f"{i}::Movie {i} (2000)::Drama\n" for i in range(1, 31)))
    return os.path.join(directory, "ratings.dat")


def _release_names(report) -> list:
    return [r["name"] for r in report["extra"]["plan"]["releases"]]


def _reports(out) -> tuple:
    report = json.loads((out / "report.json").read_text())
    shipped = json.loads((out / "retrieval_saved_model" / "privacy_report.json").read_text())
    return report, shipped


@pytest.mark.skipif(not os.path.isfile(DEFAULT_DATA_PATH), reason="the bundled ml-100k is not present")
def test_user_level_on_the_bundled_ml_100k_reports_the_unit_k_and_users(tmp_path, capsys):
    out = tmp_path / "run"
    config = movielens.MovieLensConfig(
        privacy_unit="user", mechanism="dense", noise_multiplier=1.0, epochs=1, batch_size=64,
        embedding_dim=8, hidden_units=(16,), context_length=5, seed=0, verbose=0, accountant="rdp",
        max_test_examples=500,
    )  # fmt: skip
    result = movielens.train_and_evaluate(config, out_dir=str(out))
    report, shipped = _reports(out)
    for r in (report, shipped):
        assert r["privacy_unit"] == "user" and r["adjacency"] == "add-or-remove-one-user"
        assert 700 <= r["num_units"] == r["dataset_size"] <= 800  # ml-100k: 943 users, 80% train (754), N~
    k = report["max_examples_per_unit"]
    assert k == report["max_examples_per_user"] == shipped["max_examples_per_unit"]
    # no --max-examples-per-user: k released with DP (z 10) and charged; 128 in 998 of 1,000 draws on ml-100k
    assert k == 128 and report["max_examples_per_user_choice"].startswith("released with DP: quantile 0.75")
    assert any(c.startswith(f"k = {k}: released with DP") for c in shipped["caveats"])
    assert shipped["extra"]["max_examples_per_user_release"]["value"] == k
    assert _release_names(report) == _release_names(shipped) == ["dataset_size", "contribution_bound"]
    assert report["sampling_probability"] == pytest.approx(64 / report["num_units"])
    assert report["steps_run"] == round(report["num_units"] / 64)  # one epoch over users
    print(movielens.format_report(result.report))
    assert f"at most {k} examples per user per step" in capsys.readouterr().out


def test_user_level_on_ml_latest_ratings_csv_with_ids_up_to_163k(tmp_path, capsys):
    path = _write_latest(tmp_path / "ml-latest")
    out = tmp_path / "run"
    status = movielens.main(_tiny_flags(out, "--data", path, "--max-examples-per-user", "4", "--batch-size", "8"))
    assert status == 0
    report, shipped = _reports(out)
    assert report["privacy_unit"] == shipped["privacy_unit"] == "user"
    assert report["max_examples_per_unit"] == 4 and report["max_examples_per_user_choice"].startswith("given")
    assert "max_examples_per_user_release" not in shipped["extra"] and _release_names(shipped) == ["dataset_size"]
    assert LATEST_IDS.max() == 163_000 and report["model"]["num_items"] == len(LATEST_IDS) == 31  # mapped to 1..31
    assert report["data"]["train_users"] == 24 and 20 <= report["num_units"] <= 30  # N~ of 24 users
    assert report["users_with_more_examples_than_k"] == 24  # every user has 11-15 examples > k = 4
    printed = capsys.readouterr().out
    assert "privacy unit" in printed and "at most 4 examples per user per step" in printed


def test_user_level_on_ml_1m_ratings_dat_releases_k_with_dp_within_the_target_epsilon(tmp_path, capsys):
    path = _write_ml_1m(tmp_path / "ml-1m")  # 60 users with 10-16 ratings: 9-15 examples each
    out = tmp_path / "run"
    flags = ["--data", path, "--mechanism", "dense", "--epsilon", "3", "--epochs", "1", "--embedding-dim", "8"]
    flags += ["--context-length", "3", "--seed", "0", "--quiet", "--accountant", "rdp", "--batch-size", "8"]
    assert movielens.main([*flags, "--out", str(out)]) == 0
    report, shipped = _reports(out)
    assert report["privacy_unit"] == shipped["privacy_unit"] == "user" and report["data"]["train_users"] == 48
    k = report["max_examples_per_unit"]
    release = shipped["extra"]["max_examples_per_user_release"]
    assert release["value"] == k and k in release["bucket_edges"] and release["noise_multiplier"] == 10.0
    assert report["max_examples_per_user_choice"].startswith("released with DP: quantile 0.75 of examples per user")
    # the release is one of the plan's, composed with the steps: the whole run stays within the target
    planned = {r["name"]: r for r in shipped["extra"]["plan"]["releases"]}
    assert list(planned) == ["dataset_size", "contribution_bound"]
    assert planned["contribution_bound"]["noise_multiplier"] == 10.0 and planned["contribution_bound"]["epsilon"] > 0
    assert planned["contribution_bound"]["epsilon"] < shipped["epsilon"] <= 3.0 + 1e-9
    assert f"at most {k} examples per user per step" in capsys.readouterr().out


def test_example_level_reports_the_group_privacy_epsilon_of_a_median_and_the_largest_user(tmp_path, capsys):
    path = write_ratings(tmp_path / "u.data", users=40, length=16)
    for user in range(41, 44):  # three heavy users: 40 ratings each
        with open(path, "a") as f:
            f.write("".join(f"{user}\t{t % 30 + 1}\t3\t{2000 + t}\n" for t in range(40)))
    out = tmp_path / "run"
    assert movielens.main(_tiny_flags(out, "--data", path, "--privacy-unit", "example", "--batch-size", "16")) == 0
    report, shipped = _reports(out)
    assert report["adjacency"] == "add-or-remove-one-example" and report.get("max_examples_per_unit") is None
    group = report["group_privacy"]
    eps = report["epsilon"]
    median, largest = group["median_user"], group["largest_user"]
    assert median["examples"] == 15 and largest["examples"] == 39  # 16 and 40 ratings: 15 and 39 examples
    assert eps * median["examples"] < median["epsilon"] < largest["epsilon"]  # chaining costs more than k eps
    assert "group_privacy" not in shipped and "group_privacy" in report["not_released"]
    assert "per user (group privacy)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--max-examples-per-user", "0"], "--max-examples-per-user"),
        (["--max-examples-per-user", "2.5"], "--max-examples-per-user"),
        (["--privacy-unit", "example", "--max-examples-per-user", "3"], "--max-examples-per-user"),
        (["--privacy-unit", "users"], "--privacy-unit"),
    ],
)
def test_bad_flags_get_one_line_naming_the_flag(tmp_path, capsys, flags, needle):
    with pytest.raises(SystemExit) as exit_:
        movielens.main(_tiny_flags(tmp_path / "run", *flags))
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert needle in error and "error" in error


@pytest.mark.parametrize(
    "bad_line, needle",
    [("abc,50,4.0,1500000000", "field 'user' must be an integer"), (",50,4.0,1500000000", "field 'user'")],
)
def test_missing_or_non_integer_user_ids_get_one_line_naming_file_and_line(tmp_path, capsys, bad_line, needle):
    path = _write_latest(tmp_path / "ml-latest", bad_line=bad_line)
    out = tmp_path / "run"
    assert movielens.main(_tiny_flags(out, "--data", path)) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"{path}:6:" in lines[0] and needle in lines[0]
    assert not out.exists()


def test_user_level_refuses_canaries_in_one_line(tmp_path):
    path = write_ratings(tmp_path / "u.data")
    config = tiny_config(path, privacy_unit="user", mechanism="dense", noise_multiplier=1.0)
    extra = (np.array([[1, 2, 3]], np.int32), np.array([4], np.int32))
    with pytest.raises(ValueError, match="canaries.*privacy_unit 'example'"):
        movielens.train_and_evaluate(config, extra_train_examples=extra)


@pytest.mark.parametrize("mechanism, sigma", [("none", None), ("eana", 0.01), ("lazy", 1.0), ("adafest", 1.0)])
def test_every_mechanism_trains_at_user_level(tmp_path, mechanism, sigma):
    # LazyDP's lookahead reads the next batch's [users, k, L] ids; EANA's bounds are per example: not computed.
    config = tiny_config(
        write_ratings(tmp_path / "u.data"), privacy_unit="user", mechanism=mechanism, noise_multiplier=sigma,
        batch_size=8, max_examples_per_user=4,
    )  # fmt: skip
    report = movielens.train_and_evaluate(config).report
    assert report["steps_run"] == report["planned_steps"] > 0 and np.isfinite(report["final_train_loss"])
    assert report["max_examples_per_unit"] == 4 and "eana_bound" not in report
    if mechanism == "none":
        assert report["epsilon"] is None
    elif mechanism in ("lazy", "adafest"):
        assert report["privacy_unit"] == "user" and report["epsilon"] > 0
