"""Precision@k and recall@k for retrieval, ranking the FULL item catalogue (no sampling).

For query i with relevant set R_i and the k highest-scoring candidates T_i(k):

    precision@k = mean_i |T_i(k) ∩ R_i| / k,    recall@k = mean_i |T_i(k) ∩ R_i| / |R_i|

Scores are q_i . v_j for every candidate j (dot product, as the two-tower
model scores), computed in query batches of `batch_size` so that only a
`[batch_size, num_candidates]` block exists at a time. Nothing is excluded:
items already in a query's history are ranked like any other (in MovieLens
a user rates a movie once, so the next movie is never in its own context).
Ties are broken by `tf.math.top_k` (lower candidate index first).

With one relevant item per query (next-item prediction, EANA §4.1.3),
recall@k is the hit rate (label in the top k) and precision@k = recall@k / k.

Example:
    >>> metrics = precision_recall_at_k(queries, items, labels, candidate_ids=np.arange(1, n + 1))
    >>> metrics["precision@10"], metrics["recall@10"]

References: EANA (RecSys 2022) §4.1.3 (precision@k, recall@k, k in 1, 5, 10,
20); Krichene & Rendle, "On Sampled Metrics for Item Recommendation", KDD
2020 (rank against all items, not a sample).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from tfdp_embed._checks import check_int

DEFAULT_KS = (1, 5, 10, 20)


def _check_ks(ks: Sequence[int], num_candidates: int) -> tuple:
    ks = tuple(ks)
    if not ks or any(isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1 for k in ks):
        raise ValueError(f"`ks` must be a non-empty list of ints >= 1; received {ks!r}.")
    if max(ks) > num_candidates:
        raise ValueError(f"`ks` has k = {max(ks)} but there are only {num_candidates} candidates.")
    return tuple(int(k) for k in ks)


def _relevant_matrix(relevant, padding_id) -> np.ndarray:
    relevant = np.asarray(relevant)
    if relevant.ndim == 1:
        relevant = relevant[:, None]
    if relevant.ndim != 2 or not np.issubdtype(relevant.dtype, np.integer):
        raise ValueError(
            "`relevant` must be integer ids, shape [n] (one relevant item per query) or [n, r] "
            f"(padded with `padding_id`); received dtype {relevant.dtype}, shape {relevant.shape}."
        )
    return relevant.astype(np.int64)


def precision_recall_at_k(
    queries,
    candidates,
    relevant,
    *,
    candidate_ids=None,
    ks: Sequence[int] = DEFAULT_KS,
    padding_id: int | None = None,
    batch_size: int = 1024,
) -> dict:
    """Precision@k and recall@k of dot-product retrieval over all candidates.

    Args:
      queries: float `[n, d]` query embeddings.
      candidates: float `[m, d]` candidate (item) embeddings.
      relevant: int `[n]` (one relevant id per query) or `[n, r]` relevant ids
        padded with `padding_id`.
      candidate_ids: int `[m]` id of each candidate row (default 0..m-1).
      ks: cut-offs k (each <= m).
      padding_id: the id padding `relevant` rows (required for ragged relevance).
      batch_size: queries scored per block.

    Returns:
      `{"precision@k": float, "recall@k": float for each k, "queries": n}`; NaN metrics when a
      score is NaN or Inf (a diverged model), never a count of NaN scores as hits.

    Raises:
      ValueError: mismatched shapes, an empty query set, a query with no
        relevant id, bad `ks` or `batch_size`.
    """
    queries = np.asarray(queries, dtype=np.float32)
    candidates = np.asarray(candidates, dtype=np.float32)
    if queries.ndim != 2 or candidates.ndim != 2 or queries.shape[1] != candidates.shape[1]:
        raise ValueError(
            f"`queries` [n, d] and `candidates` [m, d] must share d; received shapes {queries.shape} "
            f"and {candidates.shape}."
        )
    n, m = queries.shape[0], candidates.shape[0]
    if n == 0:
        raise ValueError("`queries` is empty: no query to evaluate.")
    ks = _check_ks(ks, m)
    batch_size = check_int("batch_size", batch_size)
    ids = np.arange(m, dtype=np.int64) if candidate_ids is None else np.asarray(candidate_ids, dtype=np.int64)
    if ids.shape != (m,):
        raise ValueError(f"`candidate_ids` needs one id per candidate ({m}); received shape {ids.shape}.")
    rel = _relevant_matrix(relevant, padding_id)
    if rel.shape[0] != n:
        raise ValueError(f"`relevant` has {rel.shape[0]} rows for {n} queries.")
    valid = np.ones_like(rel, dtype=bool) if padding_id is None else rel != padding_id
    counts = valid.sum(axis=1)
    if np.any(counts == 0):
        raise ValueError(f"Query {int(np.argmax(counts == 0))} has no relevant id; every query needs at least one.")
    hits = _hits_at_k(queries, candidates, ids, rel, valid, ks, batch_size)
    out = {}
    for k in ks:
        out[f"precision@{k}"] = float(np.mean(hits[k] / k))
        out[f"recall@{k}"] = float(np.mean(hits[k] / counts))
    out["queries"] = int(n)
    return out


def _hits_at_k(queries, candidates, ids, rel, valid, ks: tuple, batch_size: int) -> dict:
    """`{k: float [n]}`: how many of each query's top k candidates are relevant (NaN for a non-finite score)."""
    n = queries.shape[0]
    cand = tf.constant(candidates)
    kmax = max(ks)
    hits = {k: np.zeros(n, np.float64) for k in ks}
    for start in range(0, n, batch_size):
        stop = min(start + batch_size, n)
        scores = tf.matmul(tf.constant(queries[start:stop]), cand, transpose_b=True)
        top = ids[tf.math.top_k(scores, k=kmax).indices.numpy()]  # [b, kmax] candidate ids
        finite = np.isfinite(scores.numpy()).all(axis=1)  # a NaN or Inf score: no ranking, NaN hits
        block_rel, block_valid = rel[start:stop], valid[start:stop]
        # found[b, j]: the j-th ranked candidate is relevant to query b.
        found = np.any((top[:, :, None] == block_rel[:, None, :]) & block_valid[:, None, :], axis=2)
        cumulative = np.cumsum(found, axis=1)
        for k in ks:
            hits[k][start:stop] = np.where(finite, cumulative[:, k - 1], np.nan)
    return hits


__all__ = ["DEFAULT_KS", "precision_recall_at_k"]
