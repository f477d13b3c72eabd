"""Top-k retrieval metrics over the FULL catalogue, updated by the retrieval task (TFRS' FactorizedTopK, per k).

For query i with one relevant item (its positive p_i) and scores s_ij = q_i . c_j
over every catalogue item j:

    rank_i = #{j : s_ij > s_ip} + #{j != p_i : s_ij = s_ip}     (0-based; ties pessimistic)
    recall@k_i = 1[rank_i < k],   precision@k_i = 1[rank_i < k] / k

averaged over the queries seen since the metrics were last reset (Keras
resets them at each epoch and `evaluate`); NaN when none was seen (e.g. in
`fit`'s training logs, where the task skips them by default), and NaN once
a query's scores were not all finite (a diverged model): NaN compares
false with everything, so its positive would otherwise rank first and
count as a hit. The metrics are Keras `Mean`
metrics named `recall_at_{k}` and `precision_at_{k}`, so `fit` and
`evaluate` print and return them like TFRS' `factorized_top_k/top_k_categorical_accuracy`.

They are OPERATOR-ONLY and NOT differentially private: computed from the
raw queries and labels of the data they are evaluated on, with no
clipping or noise. They are kept out of every checkpoint, weights file and
SavedModel of the model (`Retrieval` holds them untracked); never release
them beside a model or in a privacy report. Evaluate on held-out data.

References: TFRS `metrics/factorized_top_k.py`; Krichene & Rendle, KDD
2020 (rank against all items, not a sample).
"""

from __future__ import annotations

from collections.abc import Sequence

from tfdp_embed.keras2._keras import keras, tf


def check_ks(ks: Sequence[int], num_items: int) -> tuple:
    """The cut-offs as a tuple of ints in [1, num_items]; ValueError otherwise."""
    ks = tuple(ks)
    if not ks or any(isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= num_items for k in ks):
        raise ValueError(
            f"`ks` must be a non-empty list of ints in [1, {num_items}] (the catalogue size); received {ks!r}."
        )
    return ks


class _MeanOrNaN(keras.metrics.Mean):
    """A mean that reads NaN, not 0, before its first update (metrics skipped in training steps)."""

    def result(self):
        return tf.where(self.count > 0, tf.math.divide_no_nan(self.total, self.count), float("nan"))


class TopKMetrics:
    """recall@k and precision@k Keras metrics of full-catalogue retrieval (see the module docstring).

    Args:
      ks: cut-offs k.
    """

    def __init__(self, ks: Sequence[int]):
        self.ks = tuple(ks)
        self.recall = [_MeanOrNaN(name=f"recall_at_{k}") for k in self.ks]
        self.precision = [_MeanOrNaN(name=f"precision_at_{k}") for k in self.ks]

    @property
    def metrics(self) -> list:
        return [*self.recall, *self.precision]

    def updatable(self) -> bool:
        """False outside a replica context when the metrics were created under a `tf.distribute` strategy.

        There Keras makes their variables SyncOnRead (summed over the replicas
        when read), which are only added to per replica: in the steps of `fit`
        and `evaluate` (`strategy.run`). Eager passes outside them (the build
        and contract checks of `DPModel.prepare`) leave the metrics alone.
        """
        variables = [v for metric in self.metrics for v in metric.variables]
        if not any(isinstance(v, tf.distribute.DistributedValues) for v in variables):
            return True
        return tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context()

    def update(self, queries, candidates, positives, sample_weight=None) -> tf.Operation:
        """Ranks each positive among all candidates and updates every metric.

        Args:
          queries: float `[B, d]`.
          candidates: float `[N, d]`, the whole catalogue.
          positives: int `[B]` catalogue rows of the positives.
          sample_weight: optional `[B]` weights of the queries.
        """
        scores = tf.matmul(queries, tf.cast(candidates, queries.dtype), transpose_b=True)
        positive = tf.gather(scores, positives, batch_dims=1)[:, None]
        ahead = tf.reduce_sum(tf.cast(scores > positive, tf.int32), axis=1)
        ties = tf.reduce_sum(tf.cast(tf.equal(scores, positive), tf.int32), axis=1) - 1
        ranks = ahead + ties
        # A query with a NaN or Inf score has no rank: its hit is NaN, and so is the mean.
        finite = tf.reduce_all(tf.math.is_finite(scores), axis=1)
        updates = []
        for k, recall, precision in zip(self.ks, self.recall, self.precision):
            hit = tf.where(finite, tf.cast(ranks < k, tf.float32), float("nan"))
            updates.append(recall.update_state(hit, sample_weight))
            updates.append(precision.update_state(hit / float(k), sample_weight))
        return tf.group(updates)


__all__ = ["TopKMetrics", "check_ks"]
