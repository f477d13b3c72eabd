"""NDCG@k / HIT@k over the full catalogue, checked against a numpy brute force."""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed.metrics.ranking import (
    hit_at_k,
    ndcg_at_k,
    ranking_metrics,
    target_ranks,
)


def _brute_force(scores, targets, k):
    """Sort all items (padding column 0 dropped); pessimistic ties: target after equal items."""
    ndcg, hit = [], []
    for row, target in zip(scores, targets):
        items = np.arange(1, row.size)
        # sort by score descending, and among equal scores put the target last
        order = sorted(items, key=lambda j: (-row[j], j == target))
        rank = order.index(target)
        hit.append(rank < k)
        ndcg.append(1 / np.log2(rank + 2) if rank < k else 0.0)
    return float(np.mean(ndcg)), float(np.mean(hit))


def test_matches_numpy_brute_force_with_ties():
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 6, size=(50, 40)).astype(np.float32)  # many ties
    scores[:, 0] = 100.0  # padding column must never count
    targets = rng.integers(1, 40, size=50)
    ranks = target_ranks(scores, targets).numpy()
    for k in (1, 5, 10):
        ndcg, hit = _brute_force(scores, targets, k)
        assert ndcg_at_k(ranks, k) == pytest.approx(ndcg, rel=1e-12)
        assert hit_at_k(ranks, k) == pytest.approx(hit, rel=1e-12)


def test_hand_computed_values():
    # items 1..4 scores: 0.9, 0.1, 0.5, 0.7 -> order 1, 4, 3, 2
    scores = np.array([[0.0, 0.9, 0.1, 0.5, 0.7]] * 3, np.float32)
    ranks = target_ranks(scores, [1, 3, 2]).numpy()
    np.testing.assert_array_equal(ranks, [0, 2, 3])
    # NDCG@3 = (1/log2(2) + 1/log2(4) + 0) / 3 = (1 + 0.5) / 3
    assert ndcg_at_k(ranks, 3) == pytest.approx(0.5)
    assert hit_at_k(ranks, 3) == pytest.approx(2 / 3)
    assert ranking_metrics(ranks, 3) == {"ndcg@3": pytest.approx(0.5), "hit@3": pytest.approx(2 / 3), "users": 3}


def test_constant_scores_rank_last():
    ranks = target_ranks(np.zeros((2, 101), np.float32), [1, 100]).numpy()
    np.testing.assert_array_equal(ranks, [99, 99])
    assert hit_at_k(ranks, 10) == 0.0


def test_bad_input_rejected():
    with pytest.raises(ValueError, match="`scores` must be"):
        target_ranks(np.zeros(5), [1])
    with pytest.raises(Exception, match="target id"):
        target_ranks(np.zeros((1, 5), np.float32), [5])
    with pytest.raises(Exception, match="must be >= 1"):
        target_ranks(np.zeros((1, 5), np.float32), [0])
    with pytest.raises(ValueError, match="`k` must be an int >= 1"):
        ndcg_at_k(np.array([1]), 0)
    with pytest.raises(ValueError, match="0-based ranks"):
        hit_at_k(np.array([-1]), 10)
