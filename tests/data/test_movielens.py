"""MovieLens reading, timelines, user split and (context, label) examples."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tfdp_embed.data.movielens import (
    MovieLensFormatError,
    context_windows,
    load_movielens_data,
    read_item_genres,
    read_ratings,
    split_users,
    timeline_examples,
    user_timelines,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REAL = os.path.join(ROOT, "..", "shared", "data", "movielens", "ml-100k", "u.data")


def _write(tmp_path, lines, name="u.data"):
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def test_timelines_sorted_by_time_with_stable_ties(tmp_path):
    path = _write(
        tmp_path,
        [
            "1\t10\t5\t300",
            "1\t11\t3\t100",
            "2\t12\t4\t50",
            "1\t13\t4\t100",
            "1\t14\t4\t200",
        ],
    )
    timelines = user_timelines(read_ratings(path))
    # user 1: t=100 (11, then 13: file order on the tie), t=200 (14), t=300 (10).
    assert timelines[1].tolist() == [11, 13, 14, 10]
    assert timelines[2].tolist() == [12]


def test_contexts_are_previous_items_left_aligned_and_zero_padded():
    timeline = np.array([5, 6, 7, 8, 9], np.int32)
    windows = context_windows(timeline, np.array([1, 2, 4]), context_length=3)
    assert windows.tolist() == [[5, 0, 0], [5, 6, 0], [6, 7, 8]]
    contexts, labels = timeline_examples([timeline, np.array([3], np.int32)], context_length=2)
    # Positions 1..4 of the first timeline; a one-item timeline has no example.
    assert labels.tolist() == [6, 7, 8, 9]
    assert contexts.tolist() == [[5, 0], [5, 6], [6, 7], [7, 8]]
    assert contexts.dtype == np.int32 and labels.dtype == np.int32


def test_user_split_is_seeded_and_disjoint():
    users = list(range(1, 101))
    train, test = split_users(users, test_fraction=0.2, seed=3)
    assert len(test) == 20 and len(train) == 80
    assert set(train).isdisjoint(test) and set(train) | set(test) == set(users)
    again = split_users(users, test_fraction=0.2, seed=3)
    assert again[1].tolist() == test.tolist()
    assert split_users(users, test_fraction=0.2, seed=4)[1].tolist() != test.tolist()


@pytest.mark.parametrize(
    "line, message",
    [
        ("1\t2\t3", "expected 4 tab-separated fields"),
        ("1\tx\t3\t4", "field 'item' must be an integer"),
        ("1\t0\t3\t4", "id 0 is reserved for padding"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path, line, message):
    path = _write(tmp_path, ["1\t2\t3\t4", line])
    with pytest.raises(MovieLensFormatError, match=message) as error:
        read_ratings(path)
    assert f"{path}:2" in str(error.value)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="u.data"):
        read_ratings(str(tmp_path / "nope"))
    with pytest.raises(MovieLensFormatError, match="empty"):
        read_ratings(_write(tmp_path, []))
    with pytest.raises(ValueError, match="test_fraction"):
        split_users([1, 2, 3], test_fraction=1.0)


def test_load_builds_every_position_of_both_splits(tmp_path):
    rng = np.random.default_rng(0)
    lines = [f"{u}\t{rng.integers(1, 30)}\t3\t{t}" for u in range(1, 11) for t in range(u + 1)]
    data = load_movielens_data(_write(tmp_path, lines), context_length=4, test_fraction=0.3, split_seed=1)
    assert len(data.test_timelines) == 3 and len(data.train_timelines) == 7
    assert data.num_train_examples == sum(len(t) - 1 for t in data.train_timelines.values())
    assert data.num_test_examples == sum(len(t) - 1 for t in data.test_timelines.values())
    assert np.all(np.any(data.train_contexts != 0, axis=1))  # no empty context
    items = sorted({int(line.split("\t")[1]) for line in lines})
    assert data.num_items == len(items)  # dense ids 1..n, n = distinct items (no catalogue beside the file)
    assert data.item_ids.to_original(np.arange(1, len(items) + 1)).tolist() == items


@pytest.mark.realdata
def test_real_ml100k():
    if not os.path.exists(REAL):
        pytest.skip(f"ml-100k not found at {REAL} (../shared/data is absent)")
    data = load_movielens_data(REAL)
    assert data.num_users == 943 and data.num_items == 1682
    assert len(data.test_timelines) == 189
    assert data.num_train_examples + data.num_test_examples == 100_000 - 943


def test_item_genres_from_u_item(tmp_path):
    flags = ["0"] * 19
    action_comedy = list(flags)
    action_comedy[1] = action_comedy[5] = "1"
    lines = [
        "1|Toy Story (1995)|01-Jan-1995||http://x|" + "|".join(action_comedy),
        "7|Caf\xe9 (1996)|01-Jan-1996||http://y|" + "|".join(flags),  # latin-1 title, no genre flag
    ]
    path = tmp_path / "u.item"
    path.write_bytes("".join(line + "\n" for line in lines).encode("latin-1"))
    ids, genres = read_item_genres(str(path))
    assert ids.tolist() == [1, 7] and genres == [[1, 5], [0]]
    path.write_text("1|Toy Story|01-Jan-1995||http://x|0|2\n")
    with pytest.raises(MovieLensFormatError, match=r"u.item:1: expected .*19 0/1 genre flags"):
        read_item_genres(str(path))
