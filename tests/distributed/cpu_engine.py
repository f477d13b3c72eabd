"""`CpuEngine`: TPUEmbeddingV2's interface on CPU, for the TPU DP step tests (test_tpu_step.py, mirrored_cases.py).

Tables are `tf.Variable`s; `dequeue` looks rows up and pools them as the
engine does (sum / mean / sqrtn times the feature weights, or one
activation per id for sequence features); `apply_gradients` back-propagates
each feature's activation gradient through its combiner, sums every
feature's and every replica's contributions per row (merge_call on more than
one replica) and applies SGD once, as SparseCore does. Eager calls are
recorded.
"""

from __future__ import annotations

from tfdp_embed.keras2._keras import tf


class CpuEngine:
    """TPUEmbeddingV2's enqueue / dequeue / apply_gradients / embedding_tables on CPU, SGD, recording calls.

    Args:
      tables: {table name: initial [vocabulary, dim] array}.
      features: {feature name: (table name, combiner or None)}.
      learning_rate: the tables' SGD learning rate.
    """

    def __init__(self, tables: dict, features: dict, learning_rate: float):
        # Plain variables (create the engine outside a strategy scope): one table for all replicas.
        self.embedding_tables = {name: tf.Variable(value, name=name) for name, value in tables.items()}
        self.feature_tables = dict(features)
        self.learning_rate = learning_rate
        self.calls = []

    def _record(self, *entry):
        if tf.executing_eagerly():
            self.calls.append(tuple(x.numpy() if isinstance(x, tf.Tensor) else x for x in entry))

    def enqueue(self, features, weights=None):
        unknown = sorted(set(features) - set(self.feature_tables))
        if unknown:
            raise ValueError(f"CpuEngine: features {unknown} are not in the feature config")
        weights = weights or {}
        features = {k: tf.convert_to_tensor(v) for k, v in features.items()}
        weights = {k: None if w is None else tf.convert_to_tensor(w, tf.float32) for k, w in weights.items()}
        for name in sorted(features):
            self._record("enqueue", name, features[name], weights.get(name))
        return {"features": features, "weights": weights}

    def _occurrence_weights(self, name, ids, weights):
        """Per-id weight of a pooled feature: combiner weight times the feature weight."""
        _, combiner = self.feature_tables[name]
        if ids.shape.rank == 1:
            w = tf.ones(tf.shape(ids), tf.float32)
        else:
            n = tf.cast(tf.shape(ids)[1], tf.float32)
            per = {"sum": 1.0, "mean": 1.0 / n, "sqrtn": tf.math.rsqrt(n)}[combiner]
            w = tf.fill(tf.shape(ids), per)
        if weights is not None:
            w = w * tf.reshape(weights, [-1] + [1] * (ids.shape.rank - 1))
        return w

    def dequeue(self, partitioned):
        activations = {}
        for name, ids in partitioned["features"].items():
            table, combiner = self.feature_tables[name]
            rows = tf.gather(self.embedding_tables[table], ids)
            weights = partitioned["weights"].get(name)
            if combiner is None and ids.shape.rank == 2:
                activations[name] = rows
            else:
                w = self._occurrence_weights(name, ids, weights)
                activations[name] = (
                    rows * w[..., None] if ids.shape.rank == 1 else tf.reduce_sum(rows * w[..., None], 1)
                )
        return activations, partitioned

    def apply_gradients(self, gradients, preserved):
        for name in sorted(gradients):
            grad = gradients[name]
            if grad is None:
                continue
            ids = preserved["features"][name]
            weights = preserved["weights"].get(name)
            table, combiner = self.feature_tables[name]
            self._record("apply_gradients", name, ids, weights, grad)
            if combiner is None and ids.shape.rank == 2:
                per_id = grad
            else:
                w = self._occurrence_weights(name, ids, weights)
                per_id = grad * w[..., None] if ids.shape.rank == 1 else grad[:, None, :] * w[..., None]
            flat_ids = tf.reshape(ids, [-1])
            per_id = tf.reshape(per_id, [-1, grad.shape[-1]])
            self._sgd(table, flat_ids, per_id)

    def _sgd(self, table, ids, grads):
        """table[ids] -= lr * grads, summed over every replica's call (one update per step)."""
        variable = self.embedding_tables[table]
        ctx = tf.distribute.get_replica_context()
        if ctx is None or ctx.num_replicas_in_sync == 1:
            variable.scatter_sub(tf.IndexedSlices(self.learning_rate * grads, ids))
            return

        def merged(strategy, ids, grads):
            all_ids = tf.concat(strategy.experimental_local_results(ids), 0)
            all_grads = tf.concat(strategy.experimental_local_results(grads), 0)
            variable.scatter_sub(tf.IndexedSlices(self.learning_rate * all_grads, all_ids))

        ctx.merge_call(merged, args=(ids, grads))

    def applied(self, feature):
        """(ids, weights, gradients) of every apply_gradients call for `feature`, in order."""
        return [c[2:] for c in self.calls if c[0] == "apply_gradients" and c[1] == feature]
