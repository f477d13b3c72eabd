"""Evaluation of a next-item model: NDCG@10 / HIT@10 ranking ALL items (Krichene & Rendle 2020).

One traced forward pass per batch of histories gives `[B, V + 1]` scores;
`tfdp_embed.metrics.ranking.target_ranks` turns them into the rank of each
target among all items (padding excluded, history items kept, ties
pessimistic).
"""

from __future__ import annotations

import numpy as np

from tfdp_embed import tf
from tfdp_embed.metrics.ranking import ranking_metrics, target_ranks


def evaluate(model, histories: np.ndarray, targets: np.ndarray, *, k: int = 10, batch_size: int = 512) -> dict:
    """`{"ndcg@k", "hit@k", "users", "unknown_targets"}` of `model.scores` on `histories [U, L]` -> `targets [U]`.

    A target 0 (an item outside the run's vocabulary) counts as a miss.
    """
    if len(histories) != len(targets):
        raise ValueError(f"{len(histories)} histories but {len(targets)} targets.")
    if len(targets) == 0:
        return {f"ndcg@{k}": float("nan"), f"hit@{k}": float("nan"), "users": 0}

    @tf.function(input_signature=[tf.TensorSpec([None, histories.shape[1]], tf.int32), tf.TensorSpec([None], tf.int32)])
    def ranks_of(h, t):
        return target_ranks(model.scores(h, training=False), t)

    # A target outside the run's item vocabulary (id 0 after `remap_items`) cannot be ranked: it is a miss.
    known = np.asarray(targets) > 0
    histories, known_targets = np.asarray(histories)[known], np.asarray(targets)[known]
    ranks = [
        ranks_of(tf.constant(histories[i : i + batch_size]), tf.constant(known_targets[i : i + batch_size])).numpy()
        for i in range(0, len(known_targets), batch_size)
    ]
    miss = np.iinfo(np.int32).max
    all_ranks = np.full(len(targets), miss, np.int64)
    all_ranks[known] = np.concatenate(ranks) if ranks else np.zeros(0, np.int64)
    return {**ranking_metrics(all_ranks, k), "unknown_targets": int((~known).sum())}


__all__ = ["evaluate"]
