"""Fused sparse-row ops of the DP step, each with its TensorFlow reference.

Every function here computes what a short chain of stock TensorFlow ops
computes (the `*_reference` functions, which are also the fallback), in the
same floating-point order, so the fused op's output is bit-identical to the
reference (tests/ops/test_sparse_rows.py). The ops live in `sparse_rows.cc`,
compiled into the same library as the Gaussian sampler
(`tfdp_embed.ops.fast_normal`: same cache, lock, `TFDP_EMBED_FAST_NORMAL=0`
switch and one-time warning). When the library is unavailable, the
reference runs instead: slower, identical results.

    unique                  tf.unique(x, out_idx=int32), one open-addressing pass
    is_distinct             True for exactly the tensors `unique` returned as distinct values
    scaled_segment_sum      pooled table's clipped sum (clipping stage)
    pooled_weight_squares   pooled table's per-example norm factor (clipping stage)
    dense_ghost_norms       a Dense layer's per-example squared norms (clipping
                            stage; float32 sums in another order than Eigen's:
                            the one function here that is not bit-identical)
    noised_values           (values + N(0, s^2)) / B in one pass (mechanisms)
    lazy_catch_up           LazyDP's plain-SGD aggregated catch-up, in place
    lazy_catch_up_gather    the same, returning the caught-up rows (the lookup's gather)
    lazy_catch_up_split     the same in two ops (draws first, table write last)
    lazy_record_step        LazyDP's per-step bookkeeping (step sums, key, counter)
    lazy_momentum_add       LazyDP's momentum catch-up (drift and owed noise) of distinct rows, in place
    lazy_ops                the four LazyDP ops above, custom or reference, chosen once
    prefetch_rows           a hint: brings rows of a table into cache (no reference:
                            it computes nothing)
    prefetch_written_rows   the same for every sparse (gradient, variable) pair a step applies
    rows_sum                float64 sum of table rows read in place: finite iff every entry is
    scatter_add_sum         SGD's sparse step in place, returning rows_sum of what it wrote
    momentum_sum            the same for Keras' sparse momentum step

Example:
    >>> values = noised_values(generator, grad.values, stddev=1.0, divisor=1024.0)

References: Bu et al. 2022 (book-keeping clipped sums); LazyDP (Lim et al.,
ASPLOS 2024) §5.2, Alg. 1 (aggregated noise sampling).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import NamedTuple

import tensorflow as tf

from tfdp_embed.ops import fast_normal, placement


def _op(*variables):
    """The loaded op module, or None: the reference runs (see `placement`).

    None when the library is unavailable (one warning per process) or when an
    accelerator is visible and `variables` do not all live on the CPU.
    """
    if not placement.fused_allowed_for(variables):
        return None
    return fast_normal._op_or_none()  # noqa: SLF001 - same library, same fallback policy


def available() -> bool:
    """True when the fused ops are built and loaded."""
    return fast_normal.available()


# -- grouping --------------------------------------------------------------------
@tf.autograph.experimental.do_not_convert
def unique(x) -> tuple:
    """`tf.unique(x, out_idx=tf.int32)` as `(y, idx)`, bit for bit, faster on CPU.

    TensorFlow's kernel hashes with `absl::flat_hash_map` and allocates per
    call; the fused op is one open-addressing pass over a table of 2n slots.

    Args:
      x: int32 or int64 vector.

    Returns:
      `(y, idx)`: the distinct values in first-appearance order (dtype of
      `x`) and int32 `[n]` positions with `y[idx] == x`.
    """
    x = tf.convert_to_tensor(x)
    if x.dtype not in (tf.int32, tf.int64):
        raise TypeError(f"unique takes int32 or int64 ids; received {x.dtype.name}.")
    op = _op()
    y, idx = tf.unique(x, out_idx=tf.int32) if op is None else op.tfdp_embed_unique(x)
    _DISTINCT[id(y)] = y
    return y, idx


# The distinct values `unique` returned, by id, held weakly: `is_distinct` vouches for exactly these tensors.
_DISTINCT: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def is_distinct(x) -> bool:
    """True when `x` is a tensor `unique` returned as its distinct values: no value appears twice in it.

    What the clipping's rows are (`tfdp_embed.clipping.embedding`), and stay while a mechanism
    keeps the tensor as its gradient's indices; any other tensor, even one with distinct values, is False.
    """
    return _DISTINCT.get(id(x)) is x


# -- clipping: pooled tables ---------------------------------------------------
@tf.autograph.experimental.do_not_convert
def scaled_segment_sum_reference(grad, examples, row_index, weights, clip_factors, num_rows) -> tf.Tensor:
    """unsorted_segment_sum((c[ex] * w)[:, None] * grad[ex], row_index, num_rows)."""
    scale = tf.gather(clip_factors, examples) * weights
    return tf.math.unsorted_segment_sum(scale[:, None] * tf.gather(grad, examples), row_index, num_rows)


@tf.autograph.experimental.do_not_convert
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


@tf.autograph.experimental.do_not_convert
def pooled_weight_squares_reference(row_index, examples, weights, batch_size) -> tf.Tensor:
    """sum_r (sum_{k in i, row_k = r} w_k)^2 per example, by unique + segment sums."""
    batch64 = tf.cast(batch_size, tf.int64)
    keys = tf.cast(row_index, tf.int64) * batch64 + tf.cast(examples, tf.int64)
    group_keys, group_index = tf.unique(keys)
    group_weights = tf.math.unsorted_segment_sum(weights, group_index, tf.size(group_keys))
    return tf.math.unsorted_segment_sum(tf.square(group_weights), group_keys % batch64, batch64)


@tf.autograph.experimental.do_not_convert
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


# -- clipping: dense layers -----------------------------------------------------
@tf.autograph.experimental.do_not_convert
def dense_ghost_norms_reference(x, g, *, use_bias: bool) -> tf.Tensor:
    """(||x_i||^2 + use_bias) * ||g_i||^2 per row, with reduce_sum (float32 sums)."""
    g_sq = tf.reduce_sum(tf.square(g), axis=1)
    kernel_sq = tf.reduce_sum(tf.square(x), axis=1) * g_sq
    return kernel_sq + g_sq if use_bias else kernel_sq


@tf.autograph.experimental.do_not_convert
def dense_ghost_norms(x, g, *, use_bias: bool) -> tf.Tensor:
    """Per-example squared gradient norm of a Dense layer called once on `[batch, d]` inputs.

    ||x_i||^2 ||g_i||^2 (kernel) plus ||g_i||^2 (bias) in one op instead of
    six (two squares, two sums, a product, a sum).

    Args:
      x: `[batch, d]` layer inputs.
      g: `[batch, p]` gradients of the summed loss w.r.t. the pre-activation outputs.
      use_bias: whether the layer has a bias.

    Returns:
      `[batch]` in the dtype of `x`. float32 inputs use the op (float32
      sums in 8 interleaved partial sums: as accurate as
      `dense_ghost_norms_reference`, not bit-identical to it); other dtypes,
      or no op library, use the reference.
    """
    x = tf.convert_to_tensor(x)
    g = tf.convert_to_tensor(g, dtype=x.dtype)
    op = _op()
    if op is None or x.dtype != tf.float32 or x.shape.rank != 2 or g.shape.rank != 2:
        return dense_ghost_norms_reference(x, g, use_bias=use_bias)
    return op.tfdp_embed_dense_ghost_norms(x, g, use_bias=bool(use_bias))


# -- mechanisms -----------------------------------------------------------------
@tf.autograph.experimental.do_not_convert
def noised_values_many(generator: tf.random.Generator, values_list, *, stddev, divisor, key=None) -> list:
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
      key: int64 `[2]` to use instead of a fresh draw (LazyDP shares its
        step key with its catch-up streams); ignored by the fallback.

    Returns:
      list of float32 tensors, (values_i + N(0, stddev^2)) / divisor.
    """
    values_list = [tf.convert_to_tensor(v) for v in values_list]
    op = _op() if all(v.dtype == tf.float32 for v in values_list) else None
    if op is None or not values_list:
        return [noised_values(generator, v, stddev=stddev, divisor=divisor) for v in values_list]
    if key is None:
        key = generator.uniform_full_int([2], dtype=tf.int64)
    stddev, divisor = tf.cast(stddev, tf.float32), tf.cast(divisor, tf.float32)
    return [op.tfdp_embed_noised_values(v, key, stddev, divisor, stream=i) for i, v in enumerate(values_list)]


@tf.autograph.experimental.do_not_convert
def noised_values_reference(values, key, stddev, divisor, stream: int = 0) -> tf.Tensor:
    """(values + fast_normal(shape(values), key + [0, stream], stddev)) / divisor."""
    key = tf.convert_to_tensor(key, tf.int64) + tf.constant([0, stream], tf.int64)
    noise = fast_normal.fast_normal(tf.shape(values, out_type=tf.int64), key, stddev)
    return (values + noise) / divisor


@tf.autograph.experimental.do_not_convert
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
    return op.tfdp_embed_noised_values(values, key, tf.cast(stddev, tf.float32), tf.cast(divisor, tf.float32))


# -- LazyDP (plain SGD, aggregated noise sampling) --------------------------------
# History entries are (step << 1) | flag in an int32.
LAZY_MAX_STEPS = (1 << 30) - 1


def _stream_normal(shape, key) -> tf.Tensor:
    """N(0, 1) float32 of `shape`: the fast op's stream of `key`, else TF's stateless Philox."""
    if fast_normal.available():
        return fast_normal.fast_normal(tf.cast(shape, tf.int64), key, 1.0)
    return tf.random.stateless_normal(shape, seed=key, alg="philox")


def _as_float64(x) -> tf.Tensor:
    """x as float64 without a float32 detour (tf.cast of a Python float rounds it to float32 first)."""
    x = tf.convert_to_tensor(x, dtype_hint=tf.float64)
    return x if x.dtype == tf.float64 else tf.cast(x, tf.float64)


def _flat_rows(rows) -> tf.Tensor:
    rows = tf.convert_to_tensor(rows)
    if rows.dtype not in (tf.int32, tf.int64):
        rows = tf.cast(rows, tf.int64)
    return rows if rows.shape.rank == 1 else tf.reshape(rows, [-1])


@tf.autograph.experimental.do_not_convert
def lazy_catch_up_reference(table, history, rows, p_hi, p_lo, steps, stream) -> tf.Tensor:
    """The TensorFlow ops `lazy_catch_up` replaces (same results, bit for bit, with the op's normals).

    Args and Returns: as `lazy_catch_up`.

    Raises:
      tf.errors.InvalidArgumentError: a row outside the table or a step
        counter past 2^30 - 1 (the message says which).
    """
    rows = tf.cast(_flat_rows(rows), tf.int64)
    vocab = tf.shape(history, out_type=tf.int64)[0]
    now64 = steps.read_value()
    checks = [
        tf.debugging.assert_less_equal(
            now64, tf.constant(LAZY_MAX_STEPS, tf.int64), message="LazyDP's int32 history holds 2^30 - 1 steps."
        ),
        tf.debugging.assert_equal(
            tf.reduce_all((rows >= 0) & (rows < vocab)),
            True,
            message="LazyDP catch-up: ids must lie in [0, vocabulary_size) unless the table hashes them (hash_ids=True).",
        ),
    ]
    with tf.control_dependencies(checks):
        now = tf.cast(now64, tf.int32)
    current = 2 * now
    behind = tf.not_equal(tf.gather(history, rows), current)
    stale = tf.unique(tf.boolean_mask(rows, behind)).y
    count = tf.size(stale, out_type=tf.int64)

    def catch_up():
        start = tf.bitwise.right_shift(tf.gather(history, stale), 1)
        s0 = tf.maximum(
            (tf.gather(p_hi, now) - tf.gather(p_hi, start)) + (tf.gather(p_lo, now) - tf.gather(p_lo, start)),
            tf.zeros([], tf.float64),
        )
        std = tf.cast(tf.sqrt(s0), tf.float32)
        words = stream.read_value()
        z = _stream_normal(
            tf.stack([count, tf.shape(table, out_type=tf.int64)[1]]), tf.stack([words[0], words[1] + words[2]])
        )
        with tf.control_dependencies([z]):
            advanced = stream.assign_add(tf.constant([0, 0, 1], tf.int64))
        with tf.control_dependencies([advanced]):
            table.scatter_add(tf.IndexedSlices(std[:, None] * z, stale))
        return tf.constant(0)

    done = tf.cond(count > 0, catch_up, lambda: tf.constant(0))
    with tf.control_dependencies([done]):
        history.scatter_update(tf.IndexedSlices(tf.fill(tf.shape(stale), current), stale))
        return tf.identity(count)


@tf.autograph.experimental.do_not_convert
def lazy_catch_up(table: tf.Variable, history: tf.Variable, rows, p_hi, p_lo, steps, stream):
    """LazyDP's plain-SGD aggregated catch-up of `rows`, in place, in one op.

    With t = steps, rows r with history[r] != 2 t (deduplicated in
    first-appearance order) get table[r] += sqrt(S0) z_j, S0 the variance
    owed since step history[r] >> 1 from the step sums (p_hi, p_lo), z the
    Gaussian stream of key (stream[0], stream[1] + stream[2]); stream[2] then
    counts the call; the caught-up rows are current (history[r] = 2 t).

    Args:
      table: float32 `[vocab, dim]` resource variable.
      history: int32 `[vocab]` variable (LazyDP's HistoryTable).
      rows: int32 or int64 ids (any shape; repeats allowed).
      p_hi, p_lo: float64 `[>t]` variables, the step sums.
      steps: int64 scalar variable, the step counter t.
      stream: int64 `[3]` variable (key, key, calls), set by `lazy_record_step`.

    Returns:
      int64 scalar, the number of rows caught up.

    Raises:
      tf.errors.InvalidArgumentError: a row outside [0, vocab), an invalid
        history entry, step sums too short, or t > 2^30 - 1.
    """
    ops = lazy_ops(table, history, p_hi, p_lo, steps, stream)
    return ops.catch_up(table, history, rows, p_hi, p_lo, steps, stream)


def _lazy_catch_up_op(op, table, history, rows, p_hi, p_lo, steps, stream) -> tf.Tensor:
    return op.tfdp_embed_lazy_catch_up(
        table.handle, history.handle, _flat_rows(rows), p_hi.handle, p_lo.handle, steps.handle, stream.handle
    )


@tf.autograph.experimental.do_not_convert
def lazy_catch_up_gather(table: tf.Variable, history: tf.Variable, rows, p_hi, p_lo, steps, stream) -> tf.Tensor:
    """`lazy_catch_up`, then the caught-up rows: `tf.gather(table, flat rows)` in the same op.

    The catch-up has the rows in cache under the table's lock; returning
    them saves the lookup's separate gather. The gradient with respect to
    `table` is the gather's (`IndexedSlices` over `rows`), so a tape sees the
    lookup as `tf.gather` would; the other inputs get none.

    Returns:
      float32 `[n, dim]`, n the number of entries of `rows`.
    """
    ops = lazy_ops(table, history, p_hi, p_lo, steps, stream)
    return ops.catch_up_gather(table, history, rows, p_hi, p_lo, steps, stream)


@tf.autograph.experimental.do_not_convert
def lazy_catch_up_gather_reference(table, history, rows, p_hi, p_lo, steps, stream) -> tf.Tensor:
    """`lazy_catch_up_reference`, then `tf.gather(table, flat rows)`."""
    flat = _flat_rows(rows)
    with tf.control_dependencies([lazy_catch_up_reference(table, history, flat, p_hi, p_lo, steps, stream)]):
        return tf.gather(table, flat)


def _lazy_catch_up_gather_op(op, table, history, rows, p_hi, p_lo, steps, stream) -> tf.Tensor:
    flat = _flat_rows(rows)
    # A read of no rows marks `table` as accessed for any recording tape (the public
    # way; the op takes the handle), so the gradient below reaches the variable.
    table.sparse_read(flat[:0])
    _, values = op.tfdp_embed_lazy_catch_up_gather(
        table.handle, history.handle, flat, p_hi.handle, p_lo.handle, steps.handle, stream.handle
    )
    return values


@tf.RegisterGradient("TfdpEmbedLazyCatchUpGather")
def _lazy_catch_up_gather_grad(op, _, grad):
    """As ResourceGather's: the values' gradient scattered onto `rows` of the table."""
    shape = tf.raw_ops.VariableShape(input=op.inputs[0], out_type=tf.int64)
    rows = tf.cast(op.inputs[2], tf.int64)
    return [tf.IndexedSlices(grad, rows, shape)] + [None] * 6


@tf.autograph.experimental.do_not_convert
def lazy_catch_up_split(table: tf.Variable, history: tf.Variable, rows, p_hi, p_lo, steps, stream) -> tf.Tensor:
    """`lazy_catch_up` as two ops, the first of which does not touch the table.

    `TfdpEmbedLazyCatchUpNoise` (history scan, marks, Gaussian draws: the
    expensive half) reads only the history and the step state, so inside a
    `tf.function` it can run while the optimizer still writes the table;
    `TfdpEmbedLazyAddRows` then adds the rows. Same table, history and
    stream as `lazy_catch_up`, bit for bit (its reference is
    `lazy_catch_up_reference`). Args, Returns and Raises as there.
    """
    ops = lazy_ops(table, history, p_hi, p_lo, steps, stream)
    return ops.catch_up_split(table, history, rows, p_hi, p_lo, steps, stream)


def _lazy_catch_up_split_op(op, table, history, rows, p_hi, p_lo, steps, stream) -> tf.Tensor:
    stale, noise = op.tfdp_embed_lazy_catch_up_noise(
        history.handle,
        _flat_rows(rows),
        p_hi.handle,
        p_lo.handle,
        steps.handle,
        stream.handle,
        dim=int(table.shape[1]),
    )
    op.tfdp_embed_lazy_add_rows(table.handle, stale, noise)
    return tf.size(stale, out_type=tf.int64)


@tf.autograph.experimental.do_not_convert
def lazy_record_step_reference(p_hi, p_lo, steps, stream, learning_rate, noise_scale, key, *, first_stream: int = 0):
    """The TensorFlow ops `lazy_record_step` replaces (bit-identical)."""
    now = steps.read_value()
    check = tf.debugging.assert_less(
        now, tf.constant(LAZY_MAX_STEPS, tf.int64), message="LazyDP's int32 history holds 2^30 - 1 steps."
    )
    with tf.control_dependencies([check]):
        step = now + 1
    capacity = tf.shape(p_hi, out_type=tf.int64)[0]

    def grow():
        extra = tf.maximum(capacity, step + 1 - capacity)
        for var in (p_hi, p_lo):
            var.assign(tf.concat([var, tf.zeros([extra], tf.float64)], 0))
        return tf.constant(0)

    grown = tf.cond(step >= capacity, grow, lambda: tf.constant(0))
    with tf.control_dependencies([grown]):
        hi, lo = tf.gather(p_hi, now), tf.gather(p_lo, now)
    std = tf.cast(learning_rate, tf.float64) * _as_float64(noise_scale)
    w = tf.square(std)
    total = hi + w
    err = tf.where(tf.abs(hi) >= tf.abs(w), (hi - total) + w, (w - total) + hi)  # Neumaier
    ops = [
        p_hi.scatter_update(tf.IndexedSlices(total[None], step[None])),
        p_lo.scatter_update(tf.IndexedSlices((lo + err)[None], step[None])),
        stream.assign(tf.stack([key[0], key[1] + first_stream, tf.constant(0, tf.int64)])),
    ]
    with tf.control_dependencies(ops):
        return steps.assign(step)


@tf.autograph.experimental.do_not_convert
def lazy_record_step(p_hi, p_lo, steps, stream, learning_rate, noise_scale, key, *, first_stream: int = 0):
    """Ends LazyDP's plain-SGD step t in one op: step sums, catch-up key, step counter.

    p[t + 1] = p[t] + (eta sigma C / B)^2 (compensated pair, grown when full),
    stream = (key[0], key[1] + first_stream, 0), steps = t + 1.

    Args:
      p_hi, p_lo: float64 `[None]` variables, the step sums.
      steps: int64 scalar variable (t).
      stream: int64 `[3]` variable, the catch-up stream.
      learning_rate: float32 scalar, the eta the optimizer applies at step t + 1.
      noise_scale: float64 scalar, sigma C / B.
      key: int64 `[2]`, the step's key; streams below `first_stream` are used
        by the dense noise of the same step.
      first_stream: int >= 0.

    Raises:
      tf.errors.InvalidArgumentError: t + 1 > 2^30 - 1, or a non-finite
        learning rate or scale.
    """
    if not isinstance(first_stream, int) or first_stream < 0:
        raise ValueError(f"`first_stream` must be an int >= 0; received {first_stream!r}.")
    key = tf.convert_to_tensor(key, tf.int64)
    ops = lazy_ops(p_hi, p_lo, steps, stream)
    return ops.record_step(p_hi, p_lo, steps, stream, learning_rate, noise_scale, key, first_stream=first_stream)


def _lazy_record_step_op(op, p_hi, p_lo, steps, stream, learning_rate, noise_scale, key, *, first_stream: int = 0):
    return op.tfdp_embed_lazy_record_step(
        p_hi.handle,
        p_lo.handle,
        steps.handle,
        stream.handle,
        tf.cast(learning_rate, tf.float32),
        _as_float64(noise_scale),
        tf.convert_to_tensor(key, tf.int64),
        first_stream=first_stream,
    )


class LazyOps(NamedTuple):
    """One implementation of LazyDP's four ops: the custom ops (`fused`) or their TensorFlow references.

    Chosen by `lazy_ops` for the variables the ops will run on; calling a
    member decides nothing. Each member takes the arguments of the public
    function of its name (`lazy_catch_up`, `lazy_catch_up_gather`,
    `lazy_catch_up_split`, `lazy_record_step`), after their checks.
    """

    fused: bool
    catch_up: Callable[..., tf.Tensor]
    catch_up_gather: Callable[..., tf.Tensor]
    catch_up_split: Callable[..., tf.Tensor]
    record_step: Callable[..., tf.Tensor]


LAZY_REFERENCE = LazyOps(
    fused=False,
    catch_up=lazy_catch_up_reference,
    catch_up_gather=lazy_catch_up_gather_reference,
    catch_up_split=lazy_catch_up_reference,
    record_step=lazy_record_step_reference,
)


def lazy_ops(*variables) -> LazyOps:
    """The implementation of LazyDP's ops on `variables`: the custom ops where they may run, else the references.

    The one place that choice is made: the op library must be loaded and
    `placement` must allow its CPU kernels on `variables`. LazyDP makes it
    once per table at `init` and keeps the result (`lazy.fused.choose`);
    the public functions above make it per call, for callers holding none.
    """
    op = _op(*variables)
    if op is None:
        return LAZY_REFERENCE
    return LazyOps(
        fused=True,
        catch_up=functools.partial(_lazy_catch_up_op, op),
        catch_up_gather=functools.partial(_lazy_catch_up_gather_op, op),
        catch_up_split=functools.partial(_lazy_catch_up_split_op, op),
        record_step=functools.partial(_lazy_record_step_op, op),
    )


@tf.autograph.experimental.do_not_convert
def prefetch_rows(table, rows) -> None:
    """Brings `table[rows]` into cache ahead of a scatter into rows no lookup read this step.

    A hint that changes no value: rows out of range are skipped, and without
    the op (no library, a table on an accelerator, a variable without one
    resource handle such as a sharded table or a distribution strategy's
    variable, a dtype other than float32) nothing runs. TensorFlow's CPU
    scatter waits for memory row after row; prefetched, the cache misses
    overlap (DP-AdaFEST's 1,001 noise-only survivors a step at 10^8 x 16:
    scatter 875 -> 78 us, prefetch 30 us; benchmarks/RESULTS.md).

    Args:
      table: the table variable the optimizer will update.
      rows: int64 row ids (any shape).
    """
    op = _op(table) if takes_table(table) else None
    if op is not None:
        op.tfdp_embed_prefetch_rows(table.handle, tf.cast(_flat_rows(rows), tf.int64))


@tf.autograph.experimental.do_not_convert
def prefetch_written_rows(pairs) -> None:
    """`prefetch_rows` of the rows each sparse `(gradient, variable)` pair is about to write.

    Both front ends' DP steps call it before the optimizer: in a large table every
    row is a cache and TLB miss by the time the scatter reaches it, however
    recently the lookup read it; prefetched together, the misses overlap.
    """
    for grad, variable in pairs:
        if isinstance(grad, tf.IndexedSlices):
            prefetch_rows(variable, grad.indices)


def rows_sum_reference(table, rows) -> tf.Tensor:
    """float64 sum of `table[rows]`: `reduce_sum(cast(gather(table, rows), float64))`."""
    return tf.reduce_sum(tf.cast(tf.gather(table, _flat_rows(rows)), tf.float64))


@tf.autograph.experimental.do_not_convert
def rows_sum(table, rows) -> tf.Tensor:
    """The float64 sum of `table[rows]`, finite exactly when every entry read is finite.

    A float64 sum of float32 values cannot overflow (it would take 10^270 of
    them), so unlike a float32 sum it is not finite only when an entry is
    NaN or Inf. One op reads the rows in place, prefetched ahead
    (`TfdpEmbedRowsSum`); without it (see `prefetch_rows`), the reference.

    Args:
      table: a float32 table variable (the reference takes any float dtype
        narrower than float64).
      rows: int64 row ids in `[0, vocabulary)` (any shape).
    """
    op = _op(table) if takes_table(table) else None
    if op is not None:
        return op.tfdp_embed_rows_sum(table.handle, tf.cast(_flat_rows(rows), tf.int64))
    return rows_sum_reference(table, rows)


def scatter_add_sum_reference(table, rows, updates, scale) -> tf.Tensor:
    """`table.scatter_add(updates * scale at rows)`, then `rows_sum_reference` of the written rows."""
    rows = _flat_rows(rows)
    write = table.scatter_add(tf.IndexedSlices(updates * scale, rows))
    with tf.control_dependencies([write.op if hasattr(write, "op") else write]):
        return rows_sum_reference(table, rows)


@tf.autograph.experimental.do_not_convert
def scatter_add_sum(table, rows, updates, scale) -> tf.Tensor:
    """SGD's sparse step `table[rows] += updates * scale`, in place; returns the float64 sum of what it wrote.

    One op (`TfdpEmbedScatterAddSum`) writes the rows as `ResourceScatterAdd`
    of `updates * scale` does (the same float32 products and sums, repeated
    rows in order: bit-identical) and sums the written values while they are in
    cache, so the sum is finite exactly when every written entry is (see
    `rows_sum`). Without the op (see `prefetch_rows`), the reference: the
    scatter, then `rows_sum` reads the rows again.

    Args:
      table: a float32 table variable.
      rows: int64 row ids in `[0, vocabulary)`, shape [n].
      updates: float32 [n, dim].
      scale: float32 scalar (-learning rate for SGD).
    """
    op = _op(table) if takes_table(table) else None
    if op is not None:
        rows = tf.cast(_flat_rows(rows), tf.int64)
        return op.tfdp_embed_scatter_add_sum(table.handle, rows, updates, tf.cast(scale, tf.float32))
    return scatter_add_sum_reference(table, rows, updates, scale)


def momentum_sum_reference(table, accum, rows, grad, lr, momentum, *, nesterov: bool) -> tf.Tensor:
    """`ResourceSparseApplyKerasMomentum` (lr and momentum in the table's dtype), then `rows_sum_reference`."""
    rows, dtype = _flat_rows(rows), table.dtype.base_dtype
    lr, momentum = tf.cast(lr, dtype), tf.cast(momentum, dtype)
    write = tf.raw_ops.ResourceSparseApplyKerasMomentum(
        var=table.handle, accum=accum.handle, lr=lr, grad=grad, indices=rows, momentum=momentum, use_nesterov=nesterov
    )
    with tf.control_dependencies([write]):
        return rows_sum_reference(table, rows)


@tf.autograph.experimental.do_not_convert
def momentum_sum(table, accum, rows, grad, lr, momentum, *, nesterov: bool) -> tf.Tensor:
    """Keras' sparse momentum step on `table[rows]` and `accum[rows]`, in place; the float64 sum of what it wrote.

    `accum[r] = accum[r] * momentum - g * lr`, then `table[r] += accum[r]`
    (Nesterov: `+= accum[r] * momentum - g * lr`), as
    `ResourceSparseApplyKerasMomentum` computes it (bit-identical), with the
    rows split between the CPU workers and prefetched, and the written values
    summed as `scatter_add_sum` does. Without the op, the reference.

    Args:
      table, accum: float32 variables of one shape (the table, its momentum slot).
      rows: int64 row ids in `[0, vocabulary)`, shape [n] (Keras dedups them first).
      grad: float32 [n, dim].
      lr, momentum: float32 scalars.
      nesterov: Nesterov momentum.
    """
    op = _op(table, accum) if takes_table(table) and takes_table(accum) else None
    if op is None:
        return momentum_sum_reference(table, accum, rows, grad, lr, momentum, nesterov=nesterov)
    rows = tf.cast(_flat_rows(rows), tf.int64)
    lr, momentum = tf.cast(lr, tf.float32), tf.cast(momentum, tf.float32)
    return op.tfdp_embed_momentum_sum(table.handle, accum.handle, rows, grad, lr, momentum, use_nesterov=nesterov)


def lazy_momentum_add_reference(table, momentum, rows, decay, gain, l11, l21, l22, x, y, y_rows) -> None:
    """LazyDP's momentum catch-up of distinct `rows` in TensorFlow ops (see `lazy_momentum_add`)."""
    column = [-1, 1]
    y_full = tf.scatter_nd(tf.reshape(y_rows, [-1, 1]), y, tf.shape(x, tf.int64))
    m = tf.gather(momentum, rows)
    noise_m = tf.reshape(l11, column) * x
    noise_theta = tf.reshape(l21, column) * x + tf.reshape(l22, column) * y_full
    theta_delta = tf.reshape(gain, column) * m + noise_theta
    momentum.scatter_update(tf.IndexedSlices(tf.reshape(decay, column) * m + noise_m, rows))
    table.scatter_add(tf.IndexedSlices(theta_delta, rows))


@tf.autograph.experimental.do_not_convert
def lazy_momentum_add(table, momentum, rows, decay, gain, l11, l21, l22, x, y, y_rows) -> None:
    """LazyDP's momentum catch-up of distinct `rows`, in place, in one op (`TfdpEmbedLazyMomentumAdd`).

    For row j: `momentum[r] = decay_j m + l11_j x_j`, `table[r] += gain_j m + (l21_j x_j + l22_j y_j)`, m the
    row's momentum before, y_j the row of `y` whose `y_rows` entry is j (0 if none), all float32 as the
    reference's ops round them (bit-identical). Without the op, the reference.

    Args:
      table, momentum: float32 variables of one shape.
      rows: distinct int64 row ids `[n]`.
      decay, gain, l11, l21, l22: float32 `[n]` per-row factors (drift, Cholesky of the owed noise).
      x: float32 `[n, dim]` normals; y: float32 `[k, dim]` normals of the rows at positions `y_rows` (int64 `[k]`).
    """
    op = _op(table, momentum) if takes_table(table) and takes_table(momentum) else None
    if op is None:
        return lazy_momentum_add_reference(table, momentum, rows, decay, gain, l11, l21, l22, x, y, y_rows)
    rows, y_rows = tf.cast(rows, tf.int64), tf.cast(y_rows, tf.int64)
    op.tfdp_embed_lazy_momentum_add(table.handle, momentum.handle, rows, decay, gain, l11, l21, l22, x, y, y_rows)
    return None


def takes_table(table) -> bool:
    """True for a table the in-place ops can read and write: a float32 variable with one resource handle.

    Not a distribution strategy's variable (its replicas' tables; its
    handle raises outside a replica) nor a sharded one (no handle).
    """
    if isinstance(table, tf.distribute.DistributedValues):
        return False
    dtype = getattr(table, "dtype", None)
    return dtype is not None and dtype.base_dtype == tf.float32 and getattr(table, "handle", None) is not None


__all__ = [
    "LAZY_MAX_STEPS",
    "LAZY_REFERENCE",
    "LazyOps",
    "available",
    "dense_ghost_norms",
    "dense_ghost_norms_reference",
    "lazy_catch_up",
    "lazy_catch_up_gather",
    "lazy_catch_up_gather_reference",
    "lazy_catch_up_reference",
    "lazy_catch_up_split",
    "lazy_momentum_add",
    "lazy_momentum_add_reference",
    "lazy_ops",
    "lazy_record_step",
    "lazy_record_step_reference",
    "momentum_sum",
    "momentum_sum_reference",
    "noised_values",
    "noised_values_many",
    "noised_values_reference",
    "pooled_weight_squares",
    "pooled_weight_squares_reference",
    "prefetch_rows",
    "prefetch_written_rows",
    "rows_sum",
    "rows_sum_reference",
    "scaled_segment_sum",
    "scaled_segment_sum_reference",
    "scatter_add_sum",
    "scatter_add_sum_reference",
    "is_distinct",
    "takes_table",
    "unique",
]
