"""precision@k / recall@k over all items, against a numpy brute force."""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed.metrics.retrieval import precision_recall_at_k


def _brute_force(queries, candidates, relevant_sets, ids, ks):
    scores = queries @ candidates.T
    out = {}
    for k in ks:
        precision, recall = [], []
        for i, rel in enumerate(relevant_sets):
            order = np.argsort(-scores[i], kind="stable")[:k]
            hits = len(set(ids[order].tolist()) & rel)
            precision.append(hits / k)
            recall.append(hits / len(rel))
        out[f"precision@{k}"], out[f"recall@{k}"] = np.mean(precision), np.mean(recall)
    return out


def test_matches_numpy_brute_force_single_and_multiple_relevant():
    rng = np.random.default_rng(0)
    queries, candidates = rng.normal(size=(37, 4)), rng.normal(size=(25, 4))
    ids = np.arange(100, 125)
    single = rng.choice(ids, size=37)
    expected = _brute_force(queries, candidates, [{int(x)} for x in single], ids, (1, 5, 10, 20))
    got = precision_recall_at_k(queries, candidates, single, candidate_ids=ids, batch_size=8)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-12), key
    assert got["queries"] == 37
    # Several relevant ids per query, padded with -1.
    multi = np.full((37, 3), -1)
    sets = []
    for i in range(37):
        r = rng.choice(ids, size=rng.integers(1, 4), replace=False)
        multi[i, : len(r)] = r
        sets.append(set(r.tolist()))
    expected = _brute_force(queries, candidates, sets, ids, (1, 3, 7))
    got = precision_recall_at_k(queries, candidates, multi, candidate_ids=ids, ks=(1, 3, 7), padding_id=-1)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-12), key


def test_hand_computed_example():
    # Scores of the one query: item 0 -> 3, item 1 -> 1, item 2 -> 2; relevant item 2 ranks second.
    queries = np.array([[1.0]])
    candidates = np.array([[3.0], [1.0], [2.0]])
    got = precision_recall_at_k(queries, candidates, np.array([2]), ks=(1, 2, 3))
    assert got["recall@1"] == 0 and got["recall@2"] == 1 and got["precision@2"] == 0.5
    assert got["precision@3"] == pytest.approx(1 / 3)


def test_bad_inputs():
    q, c = np.zeros((2, 3)), np.zeros((4, 3))
    with pytest.raises(ValueError, match="only 4 candidates"):
        precision_recall_at_k(q, c, np.array([0, 1]), ks=(5,))
    with pytest.raises(ValueError, match="share d"):
        precision_recall_at_k(q, np.zeros((4, 2)), np.array([0, 1]))
    with pytest.raises(ValueError, match="has 3 rows for 2 queries"):
        precision_recall_at_k(q, c, np.array([0, 1, 2]), ks=(1,))
    with pytest.raises(ValueError, match="no relevant id"):
        precision_recall_at_k(q, c, np.array([[0], [-1]]), ks=(1,), padding_id=-1)
    with pytest.raises(ValueError, match="integer ids"):
        precision_recall_at_k(q, c, np.array([0.5, 1.0]), ks=(1,))
