"""Reference points for full-ranking metrics: a random ranking (chance) and the most-popular ranking.

A retrieval or next-item metric means little alone: on 30,000 items a
recall@10 of 0.0004 is chance, and on MovieLens ranking every user the
same most-rated movies beats many trained models. The pipelines print both
references next to the model's numbers.

Chance (expected value of a uniformly random ranking of n items, one relevant item per query):

    recall@k = HIT@k = k / n,    precision@k = 1 / n,    NDCG@k = (1 / n) sum_{r=0}^{k-1} 1 / log2(r + 2)

Popularity: every query gets the same ranking, items by descending count in
the TRAINING split. The counts are exact (not private), so this reference is
computed from non-private data: report it next to the model, never release
it with the model.

Example:
    >>> chance_retrieval(100, ks=(1, 10))
    {'precision@1': 0.01, 'recall@1': 0.01, 'precision@10': 0.01, 'recall@10': 0.1}
    >>> popularity_retrieval(np.array([0, 5, 9, 1]), labels=np.array([2, 3]), ks=(1,))   # order: 2, 1, 3
    {'precision@1': 0.5, 'recall@1': 0.5}

References: Krichene & Rendle, "On Sampled Metrics for Item Recommendation",
KDD 2020 (full ranking); Ji et al., "A Critical Study on Data Leakage in
Recommender System Offline Evaluation", 2020 (popularity as the reference).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tfdp_embed._checks import check_int
from tfdp_embed.metrics.ranking import ranking_metrics

NOT_RELEASED_NOTE = (
    "references for the metrics above: chance is a uniformly random ranking; popularity ranks items by their "
    "count in the training split, computed from non-private data. Neither is part of the released model."
)


def chance_retrieval(num_items: int, *, ks: Sequence[int]) -> dict:
    """Expected precision@k / recall@k of a random ranking of `num_items` items (one relevant item per query)."""
    n = check_int("num_items", num_items)
    out = {}
    for k in ks:
        out[f"precision@{k}"] = 1.0 / n
        out[f"recall@{k}"] = min(k, n) / n
    return out


def chance_ranking(num_items: int, *, k: int = 10) -> dict:
    """Expected NDCG@k / HIT@k of a random ranking of `num_items` items (one target per user)."""
    n, k = check_int("num_items", num_items), check_int("k", k)
    gains = 1.0 / np.log2(np.arange(min(k, n)) + 2.0)
    return {f"ndcg@{k}": float(gains.sum() / n), f"hit@{k}": min(k, n) / n}


def popularity_order(counts) -> np.ndarray:
    """Item ids 1..n by descending `counts[id]` (ties: smaller id first); `counts[0]` (padding) ignored."""
    counts = np.asarray(counts)
    return np.lexsort((np.arange(1, counts.size), -counts[1:])) + 1


def _popularity_ranks(counts, labels) -> np.ndarray:
    rank_of = np.empty(np.asarray(counts).size, np.int64)
    rank_of[popularity_order(counts)] = np.arange(np.asarray(counts).size - 1)
    labels = np.asarray(labels, np.int64)
    if labels.size and (labels.min() < 1 or labels.max() >= rank_of.size):
        raise ValueError(
            f"`labels` must be item ids in [1, {rank_of.size - 1}]; received {labels.min()}..{labels.max()}."
        )
    return rank_of[labels]


def popularity_retrieval(counts, labels, *, ks: Sequence[int]) -> dict:
    """precision@k / recall@k of ranking every query by `counts` (`[n + 1]`, index = item id) for `labels` `[q]`."""
    ranks = _popularity_ranks(counts, labels)
    out = {}
    for k in ks:
        hit = float(np.mean(ranks < k)) if ranks.size else float("nan")
        out[f"precision@{k}"] = hit / k
        out[f"recall@{k}"] = hit
    return out


def popularity_ranking(counts, targets, *, k: int = 10) -> dict:
    """NDCG@k / HIT@k of ranking every user by `counts` (`[n + 1]`, index = item id) for `targets` `[u]`."""
    metrics = ranking_metrics(_popularity_ranks(counts, targets), k)
    return {key: metrics[key] for key in (f"ndcg@{k}", f"hit@{k}")}


def item_counts(item_ids, num_items: int) -> np.ndarray:
    """`[num_items + 1]` occurrences of each id in `item_ids` (0, padding, not counted)."""
    ids = np.asarray(item_ids, np.int64).reshape(-1)
    counts = np.bincount(ids[ids > 0], minlength=num_items + 1)
    counts[0] = 0
    return counts


__all__ = [
    "NOT_RELEASED_NOTE",
    "chance_ranking",
    "chance_retrieval",
    "item_counts",
    "popularity_order",
    "popularity_ranking",
    "popularity_retrieval",
]
