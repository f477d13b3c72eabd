"""Building blocks of the DP step on TPU SparseCore's gradient path: the noise feature and clipped activation gradients.

The engine sums every feature's activation gradients per row, so sending

    batch features: c_i / B x activation gradients (clipped_activation_gradients)
    noise feature:  ids = the cross-replica union of touched rows, each owned by one replica
                    (noise_feature_rows), gradients N(0, stddev^2) (noise_feature_gradients)

gives each row its clipped sum / B plus exactly one draw of noise. Also the
row helpers `TpuDPStep` uses (`_owned_rows`, `_values_at`).

References: EANA (RecSys 2022) §3 (noise on the rows of the batch);
docs/tpu_sparsecore.md.
"""

from __future__ import annotations

from tfdp_embed.keras2._keras import tf

NOISE_FEATURE_SUFFIX = "_dp_noise"


def noise_feature_name(table: str) -> str:
    """Name of the noise feature of engine table `table` in the engine's feature structure."""
    return f"{table}{NOISE_FEATURE_SUFFIX}"


def noise_feature_rows(touched_rows: tf.Tensor, *, max_rows: int, ctx=None) -> tuple:
    """Rows this replica noises so that every row touched by any replica is noised exactly once.

        union = unique(all_gather(touched rows of every replica));  replica r owns union[j] for j % R == r

    Args:
      touched_rows: int `[n]` rows this replica's batch touched (repeats allowed).
      max_rows: static size of the returned ids (TPU shapes are static):
        padding rows are 0 with weight 0.
      ctx: the replica context (default: the current one; None or one replica
        means this replica owns the whole union).

    Returns:
      (ids int32 `[max_rows]`, weights float32 `[max_rows]` (1 for owned rows, 0
      for padding), count of owned rows). Feed ids/weights as the noise
      feature; give its activation gradients from `noise_feature_gradients`.

    Raises:
      tf.errors.InvalidArgumentError: when more than `max_rows` rows are owned.

    References: EANA §3 (noise on the rows of the batch); docs/tpu_sparsecore.md.
    """
    rows = tf.reshape(tf.cast(touched_rows, tf.int32), [-1])
    ctx = ctx or tf.distribute.get_replica_context()
    replicas, me = 1, 0
    if ctx is not None and ctx.num_replicas_in_sync > 1:
        rows = ctx.all_gather(rows, axis=0)
        replicas, me = ctx.num_replicas_in_sync, ctx.replica_id_in_sync_group
    union = tf.sort(tf.unique(rows).y)  # the same order on every replica
    return _owned_rows(
        union,
        max_rows,
        replicas,
        me,
        message=f"noise_feature_rows: more owned rows than max_rows={max_rows}; raise it.",
    )


def noise_feature_gradients(generator, weights: tf.Tensor, *, dim: int, stddev: float) -> tf.Tensor:
    """Activation gradients of the noise feature: N(0, stddev^2) per owned row, 0 on padding.

    With `stddev = sigma C / B` and SGD on the engine, row j moves by
    -lr (clipped sum_j + N(0, sigma^2 C^2)) / B, EANA's update.

    Args:
      generator: a `tf.random.Generator` created inside the strategy scope:
        in replica context each replica then draws from its own stream, as
        its rows need independent noise.
      weights: `[max_rows]` from `noise_feature_rows`.
      dim: embedding dimension.
      stddev: per-coordinate standard deviation (>= 0).
    """
    from tfdp_embed.ops import fast_normal

    size = tf.shape(weights)[0]
    return fast_normal.normal(generator, [size, dim], stddev) * weights[:, None]


def clipped_activation_gradients(
    activation_gradients: tf.Tensor, clip_factors: tf.Tensor, *, expected_batch_size: float
):
    """Per-example activation gradients scaled by c_i / B: the engine's per-row sum is then the clipped sum / B.

    Args:
      activation_gradients: `[batch, ...]` gradients of the loss *sum* w.r.t.
        one feature's activations (row i belongs to example i).
      clip_factors: `[batch]` c_i = C / max(||g_i||, C).
      expected_batch_size: B.
    """
    factors = tf.cast(clip_factors, activation_gradients.dtype) / expected_batch_size
    shape = tf.concat([tf.shape(factors), tf.ones([tf.rank(activation_gradients) - 1], tf.int32)], 0)
    return activation_gradients * tf.reshape(factors, shape)


def _owned_rows(rows: tf.Tensor, max_rows: int, replicas, me, *, message: str) -> tuple:
    """(ids, weights, count): the rows of sorted, replica-identical `rows` replica `me` of
    `replicas` owns (position j % replicas == me), padded to `max_rows` (weight 0)."""
    rows = tf.cast(rows, tf.int32)
    owned = tf.boolean_mask(rows, tf.equal(tf.range(tf.size(rows)) % replicas, me))
    count = tf.size(owned)
    check = tf.debugging.assert_less_equal(count, max_rows, message=message)
    with tf.control_dependencies([check]):
        padding = max_rows - count
        ids = tf.pad(owned, [[0, padding]])
        weights = tf.pad(tf.ones([count], tf.float32), [[0, padding]])
    return ids, weights, count


def _values_at(slices: tf.IndexedSlices, ids: tf.Tensor) -> tf.Tensor:
    """Rows `ids` of `slices` (unique indices, any order); zeros for ids it does not hold."""
    indices = tf.cast(slices.indices, tf.int64)
    values = slices.values  # [n, dim]
    ids = tf.cast(ids, tf.int64)
    order = tf.argsort(indices)
    ordered = tf.concat([tf.gather(indices, order), tf.constant([-1], tf.int64)], 0)  # -1: no id matches
    at = tf.searchsorted(ordered[:-1], ids, side="left")  # in [0, n]; n reads the sentinel
    found = tf.equal(tf.gather(ordered, at), ids)
    padded = tf.concat([values, tf.zeros([1, tf.shape(values)[1]], values.dtype)], 0)
    rows = tf.gather(padded, tf.gather(tf.concat([order, [tf.size(indices)]], 0), at))
    return rows * tf.cast(found, values.dtype)[:, None]


__all__ = [
    "NOISE_FEATURE_SUFFIX",
    "clipped_activation_gradients",
    "noise_feature_gradients",
    "noise_feature_name",
    "noise_feature_rows",
]
