"""Tests for tfdp_embed.data.sequences: reading, leave-one-out split, padding, errors."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tfdp_embed.data.sequences import (
    SequenceFormatError,
    distinct_item_counts,
    left_pad,
    load_sequences,
    read_user_sequences,
    split_sequences,
    training_dataset,
    write_synthetic_sequences,
)

REAL = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "sasrec", "amazon_games.txt")


def _write(tmp_path, text):
    path = tmp_path / "seq.txt"
    path.write_text(text)
    return str(path)


def test_split_leave_one_out_and_left_padding(tmp_path):
    # user 1: 1 2 3 4 5 -> train input [1 2], targets [2 3]; valid hist [1 2 3] -> 4; test hist [1 2 3 4] -> 5
    # user 2: 7 8 (fewer than 3): trains on input [7] -> target [8], not evaluated
    path = _write(tmp_path, "1 1\n1 2\n2 7\n1 3\n1 4\n2 8\n1 5\n")
    data = load_sequences(path, max_len=3)
    assert data.num_users == 2 and data.num_items == 8
    np.testing.assert_array_equal(data.train_inputs, [[0, 1, 2], [0, 0, 7]])
    np.testing.assert_array_equal(data.train_targets, [[0, 2, 3], [0, 0, 8]])
    np.testing.assert_array_equal(data.valid_histories, [[1, 2, 3]])
    np.testing.assert_array_equal(data.valid_targets, [4])
    np.testing.assert_array_equal(data.test_histories, [[2, 3, 4]])  # last 3 of 1 2 3 4
    np.testing.assert_array_equal(data.test_targets, [5])
    np.testing.assert_array_equal(data.eval_users, [1])
    # item 2 appears in user 1's training input only; item 7 in user 2's; 3 is only a target
    counts = data.item_user_counts()
    assert counts.shape == (9,) and counts[2] == 1 and counts[7] == 1 and counts[3] == 0 and counts[0] == 0


def test_truncation_keeps_most_recent_items():
    users = {1: list(range(1, 11))}  # train part 1..8: input 1..7, targets 2..8
    data = split_sequences(users, max_len=4)
    np.testing.assert_array_equal(data.train_inputs[0], [4, 5, 6, 7])
    np.testing.assert_array_equal(data.train_targets[0], [5, 6, 7, 8])
    assert data.truncated_users == 1


def test_left_pad_and_distinct_counts():
    np.testing.assert_array_equal(left_pad([5, 6], 4), [0, 0, 5, 6])
    np.testing.assert_array_equal(left_pad([1, 2, 3, 4, 5], 3), [3, 4, 5])
    counts = distinct_item_counts(np.array([[0, 3, 3], [3, 1, 2]]), 4)
    np.testing.assert_array_equal(counts, [0, 1, 1, 2, 0])  # item 3 counted once per row


@pytest.mark.parametrize(
    "text, match",
    [
        ("1 2\n1\n", r"seq.txt:2: expected 2 fields"),
        ("1 2\n1 x\n", r"seq.txt:2: user and item must be integers"),
        ("1 0\n", r"seq.txt:1: ids must be >= 1"),
        ("1 2\n1 2 3\n", r"seq.txt:2: expected 2 fields 'user item', found 3.*--layout sequences"),
        ("", r"no interactions"),
    ],
)
def test_malformed_lines_name_file_and_line(tmp_path, text, match):
    with pytest.raises(SequenceFormatError, match=match):
        read_user_sequences(_write(tmp_path, text))


def test_bad_arguments(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        read_user_sequences(str(tmp_path / "missing.txt"))
    with pytest.raises(ValueError, match="`max_len` must be an int >= 2"):
        split_sequences({1: [1, 2, 3]}, max_len=1)


def test_training_dataset_and_synthetic_file(tmp_path):
    path = write_synthetic_sequences(str(tmp_path / "s.txt"), num_users=20, num_items=30, seed=1)
    data = load_sequences(path, max_len=8)
    assert data.num_users == 20 and len(data.test_targets) == 20
    x, y = next(iter(training_dataset(data)))
    assert x.shape == (8,) and y.shape == (8,)
    # the signal: every target is the input item + 1 (mod num_items)
    mask = data.train_targets > 0
    assert np.all((data.train_inputs[mask] % 30) + 1 == data.train_targets[mask])


@pytest.mark.skipif(not os.path.exists(REAL), reason="../shared/data/sasrec/amazon_games.txt is absent")
def test_amazon_games_statistics():
    data = load_sequences(REAL, max_len=50)
    assert data.num_users == 31013 and data.num_items == 23715  # the numbers of the issue / SASRec
    users = read_user_sequences(REAL)
    assert len(data.test_targets) == sum(len(items) >= 3 for items in users.values())  # 30,901 here
    assert data.test_targets.max() <= 23715 and data.train_inputs.min() == 0
