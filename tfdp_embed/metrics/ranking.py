"""NDCG@k and HIT@k for next-item prediction, ranking the FULL item catalogue.

Krichene & Rendle (2020) show that sampled metrics (rank the target among
100 random negatives) can reverse the order of models; DPFormer (App. A.9.4)
and this module rank the target among ALL items:

    rank = #{j != 0 : s_j > s_target} + #{j != 0, j != target : s_j = s_target}   (0-based)
    HIT@k  = 1[rank < k]
    NDCG@k = 1[rank < k] / log2(rank + 2)       (one relevant item, so IDCG = 1)

Column 0 of the score matrix is the padding id and is never ranked.
Nothing else is excluded: items of the user's history stay in the ranking
(SASRec's sampled evaluation excluded them; with full ranking we keep the
plain definition). Ties are broken pessimistically (every other item with the
target's score ranks ahead of it), so a constant model scores ~0, not 1.

Example:
    >>> ranks = target_ranks(scores, targets)      # scores [B, V + 1], targets [B]
    >>> ndcg_at_k(ranks, 10), hit_at_k(ranks, 10)

References: Krichene & Rendle, "On Sampled Metrics for Item Recommendation",
KDD 2020; DPFormer App. A.9.4 (eq. 32-34).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfdp_embed._checks import check_int


def target_ranks(scores, targets) -> tf.Tensor:
    """0-based rank of each target among all items (column 0, padding, excluded; ties pessimistic).

    Args:
      scores: float `[B, V + 1]`, one score per item id (column 0 = padding).
      targets: int `[B]`, target item ids in [1, V].

    Returns:
      int32 `[B]` ranks.

    Raises:
      ValueError: wrong ranks/shapes (static), or a target outside [1, V]
        (`tf.errors.InvalidArgumentError` when only known at run time).
      tf.errors.InvalidArgumentError: an item score is NaN (a diverged model).
    """
    scores = tf.convert_to_tensor(scores)
    targets = tf.convert_to_tensor(targets)
    if scores.shape.rank != 2 or targets.shape.rank != 1:
        raise ValueError(
            f"`scores` must be [batch, items + 1] and `targets` [batch]; received shapes {scores.shape} "
            f"and {targets.shape}."
        )
    num_columns = tf.shape(scores, out_type=tf.int64)[1]
    targets = tf.cast(targets, tf.int64)
    check = tf.debugging.assert_less(
        tf.reduce_max(tf.concat([[tf.constant(0, tf.int64)], targets], 0)),
        num_columns,
        message="target_ranks: a target id is >= the number of score columns (items + 1).",
    )
    check_low = tf.debugging.assert_positive(
        targets, message="target_ranks: target ids must be >= 1 (0 is the padding id)."
    )
    items = scores[:, 1:]  # drop padding
    # NaN compares false with everything: a NaN target would rank first. -inf and +inf rank as usual.
    check_nan = tf.debugging.Assert(
        tf.logical_not(tf.reduce_any(tf.math.is_nan(items))),
        ["target_ranks: some item scores are NaN (the model diverged), so no rank is defined."],
    )
    with tf.control_dependencies([check, check_low, check_nan]):
        target_scores = tf.gather(scores, targets, batch_dims=1)[:, None]
    ahead = tf.reduce_sum(tf.cast(items > target_scores, tf.int32), axis=1)
    ties = tf.reduce_sum(tf.cast(tf.equal(items, target_scores), tf.int32), axis=1) - 1  # minus the target itself
    return ahead + ties


def hit_at_k(ranks, k: int = 10) -> float:
    """Mean of 1[rank < k] over users."""
    ranks = np.asarray(ranks)
    _check(ranks, k)
    return float(np.mean(ranks < k)) if ranks.size else float("nan")


def ndcg_at_k(ranks, k: int = 10) -> float:
    """Mean of 1[rank < k] / log2(rank + 2) over users."""
    ranks = np.asarray(ranks)
    _check(ranks, k)
    if not ranks.size:
        return float("nan")
    gains = np.where(ranks < k, 1.0 / np.log2(ranks.astype(np.float64) + 2.0), 0.0)
    return float(np.mean(gains))


def ranking_metrics(ranks, k: int = 10) -> dict:
    """`{"ndcg@k": ..., "hit@k": ..., "users": n}` from 0-based ranks."""
    ranks = np.asarray(ranks)
    return {f"ndcg@{k}": ndcg_at_k(ranks, k), f"hit@{k}": hit_at_k(ranks, k), "users": int(ranks.size)}


def _check(ranks: np.ndarray, k) -> None:
    check_int("k", k)
    if ranks.ndim != 1 or (ranks.size and ranks.min() < 0):
        raise ValueError(f"`ranks` must be a 1-D array of 0-based ranks >= 0; received shape {ranks.shape}.")


__all__ = ["hit_at_k", "ndcg_at_k", "ranking_metrics", "target_ranks"]
