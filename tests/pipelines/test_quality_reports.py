"""Reports compare the released model with its references and warn (issue 35): bad models, duplicates, skipped rows.

Each pipeline runs twice on tiny learnable data: once with a learning rate of
1e-9 (the model stays at its initialization: the audit's "loss stuck at
ln(#items)", "below popularity", "log loss above the base rate"), once
non-private with settings that learn. The bad run must warn in `report.json`
and on stderr, and the comparison must stay out of the released
`privacy_report.json`; the good run must not warn. The bad runs also read
dirty data: MovieLens ratings with repeated (user, movie) rows, a Criteo day
whose rows are half malformed (with `--skip-bad-rows`).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from pipelines import criteo, movielens, quality, sequential
from tfdp_embed.data.criteo.synthetic import write_synthetic_criteo
from tfdp_embed.data.sequences import write_synthetic_sequences

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NUM_ITEMS = 30
DEAD = ["--learning-rate", "1e-9"]  # the model never leaves its initialization


def _read(path) -> dict:
    with open(path) as f:
        return json.load(f)


def _released_and_operator(out, saved_model: str) -> tuple[dict, dict]:
    return _read(os.path.join(out, saved_model, "privacy_report.json")), _read(os.path.join(out, "report.json"))


def _assert_not_released(released: dict, operator: dict) -> None:
    """The comparison (evaluation split, exact training counts) is in report.json only."""
    assert "references" in operator and "references" not in released
    assert not any("does not beat" in w or "stuck" in w for w in released.get("warnings", []))


# -- MovieLens ----------------------------------------------------------------------------------
def _write_ratings(directory, *, walked: int = NUM_ITEMS, repeats: int = 0) -> str:
    """40 users walking movies 1..`walked` of the 30-movie catalogue (t+1 follows t, no movie twice); the first
    `repeats` users rate their first movie again, later."""
    rng = np.random.default_rng(0)
    lines = []
    for user in range(1, 41):
        start = int(rng.integers(0, walked))
        lines += [f"{user}\t{(start + t) % walked + 1}\t3\t{1000 + 10 * t}" for t in range(min(16, walked))]
        if user <= repeats:
            lines.append(f"{user}\t{start + 1}\t4\t2000")
    (directory / "u.data").write_text("\n".join(lines) + "\n")
    (directory / "u.item").write_text("".join(f"{i}|Movie {i} (1995)|01-Jan-1995||\n" for i in range(1, 31)))
    return str(directory / "u.data")


def _movielens(tmp_path, data: str, *extra) -> tuple[int, dict, dict]:
    out = tmp_path / "out"
    flags = ["--mechanism", "none", "--batch-size", "32", "--embedding-dim", "8", "--context-length", "3"]
    flags += ["--privacy-unit", "example"]  # the CLI's default unit is the user (issue 30)
    code = movielens.main(["--data", data, "--out", str(out), *flags, "--seed", "1", "--quiet", *extra])
    return (code, *_released_and_operator(out, "retrieval_saved_model"))


def test_movielens_dead_model_and_repeated_ratings_are_warned(tmp_path, capsys):
    data = _write_ratings(tmp_path, walked=12, repeats=5)  # 12 movies rated: the 10 most rated cover 10/12 labels
    code, released, report = _movielens(tmp_path, data, "--epochs", "1", *DEAD)
    err = capsys.readouterr().err
    assert code == 0
    # at initialization the full softmax over 30 movies is uniform: loss ln(30) = 3.401, recall@10 near chance 1/3
    references = report["references"]
    assert references["popularity"]["recall@10"] > 0.8 and references["chance"]["recall@10"] == pytest.approx(1 / 3)
    assert references["beats_popularity"] is False
    assert any("does not beat the popularity ranking" in w and "recall@10" in w for w in report["warnings"])
    assert any("training loss is stuck" in w and "ln(30 movies) = 3.401" in w for w in report["warnings"])
    # 5 users rate their first movie again: kept (5 more timeline positions), counted, warned naming the file
    assert report["data_quality"] == {"ratings": 485, "duplicate_user_movie_ratings": 5, "duplicates": "kept"}
    assert any(w.startswith(f"{data}: 5 of 485 rows repeat an earlier (user, movie) pair") for w in report["warnings"])
    for warning in report["warnings"]:
        assert f"python -m pipelines.movielens: WARNING: {warning}" in err
    _assert_not_released(released, report)


def test_movielens_learning_run_beats_its_references_without_warnings(tmp_path, capsys):
    code, _, report = _movielens(tmp_path, _write_ratings(tmp_path), "--epochs", "10", "--learning-rate", "0.1")
    assert code == 0
    references = report["references"]
    assert references["beats_chance"] and references["beats_popularity"]
    assert references["model"]["recall@10"] > references["popularity"]["recall@10"]
    assert report["warnings"] == [] and "WARNING" not in capsys.readouterr().err
    assert report["data_quality"]["duplicate_user_movie_ratings"] == 0


# -- sequential ---------------------------------------------------------------------------------
SEQUENTIAL = ["--batch", "40", "--max-len", "6", "--dim", "8", "--blocks", "1", "--dropout", "0.1", "--verbose", "0"]
SEQUENTIAL += [
    "--seed",
    "3",
    "--epsilon",
    "inf",
    "--item-catalogue",
    os.path.join(ROOT, "tests/pipelines/items_1_to_30.txt"),
]


@pytest.fixture(scope="module")
def sequences(tmp_path_factory):
    return write_synthetic_sequences(
        str(tmp_path_factory.mktemp("seq") / "s.txt"), num_users=200, num_items=30, min_length=4, max_length=9, seed=0
    )


def _sequential(tmp_path, sequences, *extra) -> tuple[int, dict, dict]:
    out = tmp_path / "out"
    code = sequential.main(["--data", sequences, "--out", str(out), *SEQUENTIAL, *extra])
    return (code, *_released_and_operator(out, "saved_model"))


def test_sequential_dead_model_is_warned_below_popularity_and_chance(sequences, tmp_path, capsys):
    code, released, report = _sequential(tmp_path, sequences, "--epochs", "1", "--lr", "1e-9")
    err = capsys.readouterr().err
    assert code == 0
    references = report["references"]
    assert references["beats_popularity"] is False and references["beats_chance"] is False
    assert references["popularity"]["hit@10"] > references["chance"]["hit@10"] == pytest.approx(10 / 30)
    names = ("does not beat the popularity ranking", "does not beat the chance ranking", "training loss is stuck")
    for name in names:
        assert sum(name in w for w in report["warnings"]) == 1, name
        assert any(
            line.startswith("python -m pipelines.sequential: WARNING: ") and name in line for line in err.split("\n")
        )
    _assert_not_released(released, report)


def test_sequential_learning_run_has_no_warning(sequences, tmp_path, capsys):
    code, _, report = _sequential(tmp_path, sequences, "--epochs", "5", "--lr", "0.01")
    assert code == 0
    assert report["references"]["beats_popularity"] and report["references"]["beats_chance"]
    assert report["warnings"] == [] and "WARNING" not in capsys.readouterr().err


# -- Criteo -------------------------------------------------------------------------------------
CRITEO = ["--hash-size", "20", "--embedding-dim", "2", "--hidden-units", "8", "--batch", "100", "--momentum", "0"]
CRITEO += ["--seed", "0", "--verbose", "0", "--accountant", "rdp", "--mechanism", "none", "--skip-bad-rows"]


@pytest.fixture(scope="module")
def days(tmp_path_factory):
    """Two synthetic days of 400 rows, labelled by a rule a model learns (click iff I1 > 1); a copy of day 0 with
    400 malformed rows (label 2) after its good ones."""
    directory = tmp_path_factory.mktemp("criteo")
    paths = write_synthetic_criteo(str(directory), num_rows=800, seed=0, days=2, vocab_scale=0.01)
    for path in paths:
        with open(path, "rb") as f:
            rows = [line.split(b"\t") for line in f.read().splitlines()]
        with open(path, "wb") as f:
            f.write(b"".join(b"\t".join([b"1" if r[1] and int(r[1]) > 1 else b"0", *r[1:]]) + b"\n" for r in rows))
    with open(paths[0], "rb") as f:
        body = f.read()
    bad = b"".join(b"\t".join([b"2", *line.split(b"\t")[1:]]) + b"\n" for line in body.splitlines())
    dirty = str(directory / "half_bad.tsv")
    with open(dirty, "wb") as f:
        f.write(body + bad)
    return paths[0], paths[1], dirty


def _criteo(tmp_path, train: str, evaluate: str, *extra) -> tuple[int, dict, dict]:
    out = tmp_path / "out"
    code = criteo.main(["--train", train, "--eval", evaluate, "--out", str(out), *CRITEO, *extra])
    return (code, *_released_and_operator(out, "saved_model"))


def test_criteo_dead_model_and_skipped_half_of_a_file_are_warned(days, tmp_path, capsys):
    _, evaluate, dirty = days
    code, released, report = _criteo(tmp_path, dirty, evaluate, "--epochs", "1", *DEAD)
    err = capsys.readouterr().err
    assert code == 0
    references = report["references"]
    assert references["chance_auc"] == 0.5 and references["base_rate_logloss"] == report["base_rate_logloss"]
    assert references["beats_base_rate"] is False and report["logloss"] >= report["base_rate_logloss"]
    assert any("does not beat the base rate" in w for w in report["warnings"])
    # 400 of the 800 lines of half_bad.tsv dropped (bad label): counted, and a warning names the file
    assert report["rows_skipped"]["bad_label"] == 400
    skipped = report["rows_skipped_by_file"][0]
    assert skipped["files"] == [dirty] and (skipped["skipped"], skipped["lines"]) == (400, 800)
    assert any(w.startswith(f"{dirty}: --skip-bad-rows skipped 400 of 800 rows (50%") for w in report["warnings"])
    for warning in report["warnings"]:
        assert f"python -m pipelines.criteo: WARNING: {warning}" in err
    _assert_not_released(released, report)


def test_criteo_learning_run_beats_base_rate_and_chance_without_warnings(days, tmp_path, capsys):
    train, evaluate, _ = days
    code, _, report = _criteo(tmp_path, train, evaluate, "--epochs", "3", "--learning-rate", "0.3")
    assert code == 0
    assert report["references"]["beats_base_rate"] and report["references"]["beats_chance"]
    assert report["rows_skipped_by_file"][0]["skipped"] == 0
    assert report["warnings"] == [] and "WARNING" not in capsys.readouterr().err


# -- the shared rules, without training ------------------------------------------------------------
def test_thresholds_of_the_shared_rules():
    # 1 % of a file's lines may be skipped quietly (the Criteo fixture of test_criteo_pipeline: 3 of 403); 2 % warns
    assert quality.skipped_rows_warning(quality.skipped_rows({"lines": 403, "total_skipped": 3}, ["d0"])) is None
    assert quality.skipped_rows_warning(quality.skipped_rows({"lines": 100, "total_skipped": 2}, ["d0"])).startswith(
        "d0: --skip-bad-rows skipped 2 of 100 rows (2%"
    )
    # a diverged (NaN) model beats nothing; an undefined reference is not compared
    assert quality.beats(float("nan"), 0.5) is False and quality.beats(0.7, float("nan")) is None
    # log loss 0.5616 < 0.999 x 0.5623 beats the base rate; 0.5620 does not (within the 0.1 % margin)
    assert quality.click_references({"logloss": 0.5616, "base_rate_logloss": 0.5623, "auc": 0.6})[0]["beats_base_rate"]
    references, warnings = quality.click_references({"logloss": 0.5620, "base_rate_logloss": 0.5623, "auc": 0.505})
    assert references["beats_base_rate"] is False and references["beats_chance"] is False and len(warnings) == 2
    # [1, 2, 1, 3, 2] has 2 repeats; another user's 1 is not one
    assert quality.duplicate_pairs([np.array([1, 2, 1, 3, 2]), np.array([1])]) == (2, 6)
    # ln(30) = 3.401: 3.34 is within 2 % (stuck), 3.33 is not
    assert quality.stuck_loss_warning(3.34, quality.uniform_softmax_loss(30), initial="ln(30 items)")
    assert quality.stuck_loss_warning(3.33, quality.uniform_softmax_loss(30), initial="ln(30 items)") is None
