"""Sequence files in the S3-Rec layout ("user item item ...") beside SASRec pairs; the baselines' formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tfdp_embed.data.sequence_files import SequenceFormatError, read_sequence_file
from tfdp_embed.data.sequences import load_sequences
from tfdp_embed.metrics.baselines import chance_ranking, chance_retrieval, popularity_ranking, popularity_retrieval

PAIRS = "1 1\n1 2\n2 7\n1 3\n1 4\n2 8\n1 5\n"
S3REC = "1 1 2 3 4 5\r\n2 7 8\r\n"  # the same users, one per line (CRLF as some copies have)


def _write(tmp_path, text, name="seq.txt"):
    path = tmp_path / name
    path.write_text(text, newline="")
    return str(path)


def test_s3rec_layout_is_detected_and_reads_like_the_pairs(tmp_path):
    users, layout = read_sequence_file(_write(tmp_path, S3REC))
    assert layout == "sequences" and users == {1: [1, 2, 3, 4, 5], 2: [7, 8]}
    assert read_sequence_file(_write(tmp_path, PAIRS, "p.txt")) == (users, "pairs")
    a = load_sequences(_write(tmp_path, S3REC), max_len=3)
    b = load_sequences(_write(tmp_path, PAIRS, "p.txt"), max_len=3, layout="pairs")
    assert (a.layout, b.layout) == ("sequences", "pairs") and a.distinct_items == 7
    for field in ("train_inputs", "train_targets", "valid_histories", "test_histories", "test_targets"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))


def test_explicit_layout_reads_a_first_line_with_one_item(tmp_path):
    # auto would take "3 9" for a pair and then refuse line 2; the flag says what the file is
    path = _write(tmp_path, "3 9\n4 1 2 6\n")
    with pytest.raises(
        SequenceFormatError, match=r"seq.txt:2: expected 2 fields 'user item', found 4.*--layout sequences"
    ):
        read_sequence_file(path)
    assert read_sequence_file(path, layout="sequences") == ({3: [9], 4: [1, 2, 6]}, "sequences")


@pytest.mark.parametrize(
    "text, match",
    [
        ("1 2 3\n2 5 x\n", r"seq.txt:2: field 3 \(item\) must be an integer >= 1 \(0 is the padding id\); found 'x'"),
        ("1 2 3\n2 5 0\n", r"seq.txt:2: field 3 \(item\) must be an integer >= 1"),
        ("1 2 3\nu 5 6\n", r"seq.txt:2: field 1 \(user\) must be an integer >= 1"),
        ("1 2 3\n7\n", r"seq.txt:2: expected 'user item item \.\.\.' \(at least 2 fields\), found 1"),
        ("1 2 3\n\n2 4 5\n", r"seq.txt:2: expected 'user item item \.\.\.' \(at least 2 fields\), found 0"),
        ("1 2 3\n1 4 5\n", r"seq.txt:2: user 1 already has a line \(1\); the sequences layout holds one line per user"),
    ],
)
def test_malformed_s3rec_lines_name_file_line_and_field(tmp_path, text, match):
    with pytest.raises(SequenceFormatError, match=match):
        read_sequence_file(_write(tmp_path, text))


def test_a_pairs_file_read_as_sequences_is_refused_and_bad_layout_names(tmp_path):
    with pytest.raises(SequenceFormatError, match=r"seq.txt:2: user 1 already has a line"):
        read_sequence_file(_write(tmp_path, PAIRS), layout="sequences")
    with pytest.raises(ValueError, match=r"`layout` must be one of \('auto', 'pairs', 'sequences'\)"):
        read_sequence_file(_write(tmp_path, PAIRS), layout="s3rec")


def test_chance_and_popularity_formulas():
    # random ranking of 20 items: HIT@10 = 10/20; NDCG@10 = (1/20) sum_{r=0..9} 1/log2(r+2)
    chance = chance_ranking(20, k=10)
    assert chance["hit@10"] == 0.5
    assert chance["ndcg@10"] == pytest.approx(sum(1 / math.log2(r + 2) for r in range(10)) / 20)
    assert chance_retrieval(30, ks=(1, 20)) == {
        "precision@1": 1 / 30,
        "recall@1": 1 / 30,
        "precision@20": 1 / 30,
        "recall@20": 20 / 30,
    }
    # counts of items 1..3 = 3, 1, 3 -> order 1, 3, 2 (ties: smaller id first); targets 1, 3, 2 -> ranks 0, 1, 2
    counts = np.array([0, 3, 1, 3])
    ranked = popularity_ranking(counts, np.array([1, 3, 2]), k=2)
    assert ranked["hit@2"] == pytest.approx(2 / 3)
    assert ranked["ndcg@2"] == pytest.approx((1 + 1 / math.log2(3)) / 3)
    assert popularity_retrieval(counts, np.array([3, 2]), ks=(1, 2)) == {
        "precision@1": 0.0,
        "recall@1": 0.0,
        "precision@2": 0.25,
        "recall@2": 0.5,
    }
    with pytest.raises(ValueError, match=r"`labels` must be item ids in \[1, 3\]"):
        popularity_ranking(counts, np.array([4]))
