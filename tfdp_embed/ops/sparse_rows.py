"""Fused sparse-row ops of the DP step, each with its TensorFlow reference.

Every function here computes what a short chain of stock TensorFlow ops
computes (the `*_reference` functions, which are also the fallback), in the
same floating-point order, so the fused op's output is bit-identical to the
reference (tests/ops/test_sparse_rows.py). The ops live in `sparse_rows.cc`,
compiled into the same library as the Gaussian sampler
(`tfdp_embed.ops.fast_normal`: same cache, lock, `TFDP_EMBED_FAST_NORMAL=0`
switch and one-time warning). When the library is unavailable, the
reference runs instead: slower, identical results.

    scaled_segment_sum      pooled table's clipped sum (clipping stage)
    pooled_weight_squares   pooled table's per-example norm factor (clipping stage)
    noised_values           (values + N(0, s^2)) / B in one pass (mechanisms)
    lazy_catch_up           LazyDP's plain-SGD aggregated catch-up, in place

Example:
    >>> values = noised_values(generator, grad.values, stddev=1.0, divisor=1024.0)

References: Bu et al. 2022 (book-keeping clipped sums); LazyDP (Lim et al.,
ASPLOS 2024) §5.2, Alg. 1 (aggregated noise sampling).
"""

from __future__ import annotations

from tfdp_embed._keras import tf
from tfdp_embed.ops import fast_normal


def _op():
    """The loaded op module, or None (fallback, one warning per process)."""
    return fast_normal._op_or_none()  # noqa: SLF001 - same library, same fallback policy


def available() -> bool:
    """True when the fused ops are built and loaded."""
    return fast_normal.available()


# -- clipping: pooled tables ---------------------------------------------------
def scaled_segment_sum_reference(grad, examples, row_index, weights, clip_factors, num_rows) -> tf.Tensor:
    """unsorted_segment_sum((c[ex] * w)[:, None] * grad[ex], row_index, num_rows)."""
    scale = tf.gather(clip_factors, examples) * weights
    return tf.math.unsorted_segment_sum(scale[:, None] * tf.gather(grad, examples), row_index, num_rows)


def scaled_segment_sum(grad, examples, row_index, weights, clip_factors, num_rows) -> tf.Tensor:
    """Clipped sum of a pooled table: out[row_index[k]] += c[examples[k]] w[k] grad[examples[k]].

    Args:
      grad: float32 `[batch, dim]` output gradient of the pooled layer.
      examples: int32 `[n]` example of each occurrence.
      row_index: int32 `[n]` output row of each occurrence (position among unique rows).
      weights: float32 `[n]` combiner weights.
      clip_factors: float32 `[batch]` per-example clip factors c_i.
      num_rows: int32 scalar, number of output rows.

    Returns:
      float32 `[num_rows, dim]`, bit-identical to `scaled_segment_sum_reference`.

    Raises:
      tf.errors.InvalidArgumentError: an index out of range (the message names it).
    """
    args = (
        tf.cast(grad, tf.float32),
        tf.cast(examples, tf.int32),
        tf.cast(row_index, tf.int32),
        tf.cast(weights, tf.float32),
        tf.cast(clip_factors, tf.float32),
        tf.cast(num_rows, tf.int32),
    )
    op = _op()
    if op is None:
        return scaled_segment_sum_reference(*args)
    return op.tfdp_embed_scaled_segment_sum(*args)


def pooled_weight_squares_reference(row_index, examples, weights, batch_size) -> tf.Tensor:
    """sum_r (sum_{k in i, row_k = r} w_k)^2 per example, by unique + segment sums."""
    batch64 = tf.cast(batch_size, tf.int64)
    keys = tf.cast(row_index, tf.int64) * batch64 + tf.cast(examples, tf.int64)
    group_keys, group_index = tf.unique(keys)
    group_weights = tf.math.unsorted_segment_sum(weights, group_index, tf.size(group_keys))
    return tf.math.unsorted_segment_sum(tf.square(group_weights), group_keys % batch64, batch64)


def pooled_weight_squares(row_index, examples, weights, batch_size) -> tf.Tensor:
    """Per-example sum over distinct rows of the squared summed combiner weight.

    ||grad_i||^2 of a pooled table is this times ||g_i||^2 (g_i: output gradient).

    Args:
      row_index: int32 `[n]` row of each occurrence (any int ids work).
      examples: int32 `[n]` example of each occurrence.
      weights: float32 `[n]` combiner weights.
      batch_size: int32 scalar.

    Returns:
      float32 `[batch_size]`, bit-identical to `pooled_weight_squares_reference`.
    """
    args = (
        tf.cast(row_index, tf.int32),
        tf.cast(examples, tf.int32),
        tf.cast(weights, tf.float32),
        tf.cast(batch_size, tf.int32),
    )
    op = _op()
    if op is None:
        return pooled_weight_squares_reference(*args)
    return op.tfdp_embed_pooled_weight_squares(*args)


# -- mechanisms -----------------------------------------------------------------
def noised_values_many(generator: tf.random.Generator, values_list, *, stddev, divisor) -> list:
    """`noised_values` of several tensors from ONE key draw (stream i for tensor i).

    Tensor i gets the Gaussian stream of (k0, k1 + i): disjoint Philox
    counter ranges, so the noises are independent, and one generator draw
    (a handful of ops) serves the whole step. Without the op, each tensor
    falls back to its own `fast_normal.normal` draw.

    Args:
      generator: the mechanism's `tf.random.Generator`.
      values_list: float32 tensors.
      stddev: Python float or float32 scalar, >= 0 (the same for all).
      divisor: Python float or float32 scalar, > 0.

    Returns:
      list of float32 tensors, (values_i + N(0, stddev^2)) / divisor.
    """
    values_list = [tf.convert_to_tensor(v) for v in values_list]
    op = _op() if all(v.dtype == tf.float32 for v in values_list) else None
    if op is None or not values_list:
        return [noised_values(generator, v, stddev=stddev, divisor=divisor) for v in values_list]
    key = generator.uniform_full_int([2], dtype=tf.int64)
    stddev, divisor = tf.cast(stddev, tf.float32), tf.cast(divisor, tf.float32)
    return [
        op.tfdp_embed_noised_values(v, key, stddev, divisor, stream=i) for i, v in enumerate(values_list)
    ]


def noised_values_reference(values, key, stddev, divisor, stream: int = 0) -> tf.Tensor:
    """(values + fast_normal(shape(values), key + [0, stream], stddev)) / divisor."""
    key = tf.convert_to_tensor(key, tf.int64) + tf.constant([0, stream], tf.int64)
    noise = fast_normal.fast_normal(tf.shape(values, out_type=tf.int64), key, stddev)
    return (values + noise) / divisor


def noised_values(generator: tf.random.Generator, values, *, stddev, divisor) -> tf.Tensor:
    """(values + N(0, stddev^2)) / divisor for float32 `values`, one fused pass.

    Draws one fresh key from `generator` exactly as `fast_normal.normal`
    does, so the result equals `(values + fast_normal.normal(generator,
    shape, stddev)) / divisor` bit for bit. Falls back to that composition
    (or to `generator.normal` when no op is available).

    Args:
      generator: the mechanism's `tf.random.Generator`.
      values: float32 tensor (any shape).
      stddev: Python float or float32 scalar, >= 0.
      divisor: Python float or float32 scalar, > 0 (e.g. the expected batch size).

    Returns:
      float32 tensor shaped like `values`.
    """
    values = tf.convert_to_tensor(values)
    op = _op() if values.dtype == tf.float32 else None
    if op is None:
        return (values + fast_normal.normal(generator, tf.shape(values), stddev, dtype=values.dtype)) / divisor
    key = generator.uniform_full_int([2], dtype=tf.int64)
    return op.tfdp_embed_noised_values(
        values, key, tf.cast(stddev, tf.float32), tf.cast(divisor, tf.float32)
    )


def lazy_catch_up(table: tf.Variable, history: tf.Variable, rows, p_hi, p_lo, now, stamp, key, *, unique: bool):
    """LazyDP's plain-SGD aggregated catch-up of `rows`, in place (the fused op only).

    Rows r with history[r] != 2 now (deduplicated in first-appearance order
    unless `unique`) get table[r] += sqrt(S0) z_j, S0 the owed variance from
    the step sums (p_hi, p_lo), z the Gaussian stream of `key`; then
    history[r] = stamp for every row. See `LazyDP._catch_up` for the
    TensorFlow version (the reference, used when the op is unavailable).

    Returns:
      int64 scalar, number of rows caught up.

    Raises:
      fast_normal.BuildError: the op is unavailable (callers check `available()`).
    """
    op = fast_normal._load()  # noqa: SLF001
    return op.tfdp_embed_lazy_catch_up(
        table.handle,
        history.handle,
        tf.cast(rows, tf.int64),
        p_hi,
        p_lo,
        tf.cast(now, tf.int32),
        tf.cast(stamp, tf.int32),
        key,
        unique=unique,
    )
