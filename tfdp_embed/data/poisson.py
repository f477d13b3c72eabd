"""Poisson-sampled batches for `tf.data`, so that DP accounting is honest.

DP-SGD's accounting (`PoissonSampled(q, Gaussian(sigma))`) assumes each of
the N examples is in each batch independently with probability q:

    P[x_i in batch t] = q, independently over i and t;  |batch t| ~ Binomial(N, q)

Batch sizes vary, a batch can be empty (that step is noise only), and one
"epoch" here is round(1/q) batches (about N examples in total).

Two exact samplers here (and a third, one-pass, in `one_pass.py`):

* `poisson_batches` (data that fits in memory): the examples are loaded once
  into tensors (or given as arrays: no copy through `tf.data`, whose
  per-example tensors cost kilobytes per example); for each batch a fresh seed is drawn and the batch's index set
  is sampled exactly: for q >= 0.25 a Bernoulli(q) mask over all N examples
  (float64 uniforms, granularity 2^-53); below, a Binomial(N, q) count k (TF's
  exact BTRS/inversion sampler) and k distinct uniform indices (the first k
  distinct values of an i.i.d. uniform stream, O(k) instead of O(N); integer
  uniforms are biased by at most N / 2^64). Given its size, a Poisson sample
  is a uniformly random subset of that size, so both are exactly Poisson.
* `streaming_poisson_batches` (data too large to hold): exact Poisson without
  holding the data. A single pass cannot produce exact Poisson batches (batch
  1 may need the last example of the stream), so each pass over the source
  produces G = `batches_per_pass` batches at once: their G index sets over
  the stream positions 0..N-1 are sampled first (exactly as above), the pass
  keeps only the examples at those positions (about G q N examples in
  memory) and then emits the G batches. An epoch reads the source
  ceil(round(1/q) / G) times. The source may even change its order between
  passes (e.g. a reshuffling reader): the index sets are independent of the
  order, so inclusions stay independent Bernoulli(q); it must yield each of
  its `num_examples` examples exactly once per pass (checked at run time).
* `tfdp_embed.data.one_pass_poisson_batches` (large data, one read per
  epoch): every example draws the steps it joins, the sampled records are
  spilled to local disk and read back in step order (`one_pass.py`).

Oversized batches (`max_batch_size`): a batch larger than the cap is cut to
a uniformly random subset of `max_batch_size` examples (which ones are cut
does not depend on the data), and the counters `truncated_batches` /
`truncated_examples` in `BatchingInfo` record it. This is accounted for, not
hidden: the truncated run equals the untruncated one except on the event
"some batch overflowed", so it is (eps, delta')-DP with
delta' = delta + (1 + e^eps) * T * P[Binomial(N + 1, q) > max_batch_size]
(`tfdp_embed.accounting.report.truncation_delta`; the report shows it).
Resampling an oversized batch instead would have the same delta' but makes
the batch distribution a conditioned one and costs time; truncation is
simpler. Choose `max_batch_size` so that `truncation_delta` is far below
delta (for qN = 100, T = 500: qN + 6 sqrt(qN) adds ~2e-5, qN + 8 sqrt(qN)
adds ~3e-10).

Fixed-size shuffled batches (`fixed_size_batches`) are offered only on
explicit request; their `BatchingInfo.batching` is "fixed_shuffled" and the
privacy report then says that the Poisson accounting does not describe them.

Every dataset returned here is registered with its `BatchingInfo`
(`tfdp_embed.data.provenance`): `DPModel.fit` reads the batching from the
data it is fed, and reports claim Poisson only for these samplers.

Seeds: `seed=None` draws the sampling RNG's state from OS entropy; an int
makes the batches reproducible (tests). The RNG is a `tf.random.Generator`
whose state advances across epochs: every epoch gets fresh batches.

Example:
    >>> batches, info = poisson_batches(ds, sampling_probability=0.01)
    >>> model.fit(batches, epochs=10)   # 100 Poisson batches per epoch
    >>> privacy_report(..., batching=info)

References: Abadi et al. 2016 §3.1 (Poisson "lots"); Chua et al., "Scalable
DP-SGD: Shuffling vs. Poisson Subsampling", NeurIPS 2024 (truncated Poisson
batches; why shuffled batches are not covered by Poisson accounting).
"""

from __future__ import annotations

import math
import numbers

import tensorflow as tf

from tfdp_embed._checks import check_int
from tfdp_embed._rng import make_generator
from tfdp_embed._sorted_sets import is_member
from tfdp_embed.data.provenance import BatchingInfo, register
from tfdp_embed.data.tuning import without_autotuning

# Above this rate a Bernoulli mask over all N examples is cheaper than
# drawing distinct indices.
_MASK_THRESHOLD = 0.25


def poisson_batches(
    dataset: tf.data.Dataset,
    *,
    sampling_probability: float,
    seed: int | None = None,
    max_batch_size: int | None = None,
    num_examples: int | None = None,
) -> tuple[tf.data.Dataset, BatchingInfo]:
    """Exactly Poisson-sampled batches of an in-memory dataset.

    P[example i in batch t] = q independently over i and t; round(1/q) batches per epoch.

    Args:
      dataset: unbatched examples as a `tf.data.Dataset` (any nest of
        tensors; varying shapes are batched as `tf.RaggedTensor`), read once
        and held in memory; or the examples already in memory: a nest of
        arrays / tensors whose leading dimension indexes the examples (held
        as one tensor per component: ~1x their size, where loading a
        `Dataset` of many small components peaks at several times it).
      sampling_probability: q in (0, 1].
      seed: int for reproducible batches, None for OS entropy.
      max_batch_size: optional cap; larger batches are truncated to a uniform
        random subset and counted (see the module docstring for the delta cost).
      num_examples: optional N, checked against the data.

    Returns:
      `(batches, info)`: a `tf.data.Dataset` of round(1/q) variable-size
      batches (fresh ones on every iteration) and its `BatchingInfo`.

    Raises:
      ValueError: empty dataset, bad q / cap / N.

    Example:
        >>> batches, info = poisson_batches(ds, sampling_probability=0.01, seed=1)

    References: Abadi et al. 2016 §3.1; Chua et al. 2024 (truncation).
    """
    q = _check_q(sampling_probability)
    max_batch_size = _check_cap(max_batch_size)
    data = _load_all(dataset)
    n = int(_leading_dim(data))
    if n == 0:
        raise ValueError("`dataset` is empty: Poisson sampling needs at least one example.")
    if num_examples is not None and int(num_examples) != n:
        raise ValueError(f"`num_examples`={num_examples!r} but the dataset holds {n} examples.")
    generator = make_generator(seed, seed_as="counter")
    info = _poisson_info(n, q, max_batch_size, seed, streaming=False, batches_per_pass=None)

    def make_batch(_):
        seed_ = generator.make_seeds(1)[:, 0]
        indices = _poisson_indices(seed_, n, q)
        if max_batch_size is not None:
            indices = _truncate(indices, seed_, max_batch_size, info, ordered=q < _MASK_THRESHOLD)
        return tf.nest.map_structure(lambda t: tf.gather(t, indices), data)

    batches = tf.data.Dataset.range(info.batches_per_epoch).map(make_batch)  # sequential: RNG order fixed
    return register(without_autotuning(batches), info), info


def streaming_poisson_batches(
    dataset: tf.data.Dataset,
    *,
    sampling_probability: float,
    num_examples: int,
    batches_per_pass: int,
    seed: int | None = None,
    max_batch_size: int | None = None,
    read_chunk_size: int = 4096,
    source_batched: bool = False,
) -> tuple[tf.data.Dataset, BatchingInfo]:
    """Exactly Poisson-sampled batches of a dataset too large to hold in memory.

    Each pass over `dataset` yields G = `batches_per_pass` batches; memory ~ G q N
    examples (G x the expected batch size), independent of N (how: `_pass_batches`).

    Args:
      dataset: examples with fully defined per-example shapes; unbatched, or
        (`source_batched=True`) batches of consecutive examples of any sizes
        (e.g. `criteo_dataset(files, batch_size=8192)`, much faster than
        unbatching). Each iteration must yield all `num_examples` examples
        exactly once, in any order (checked at run time).
      sampling_probability: q in (0, 1].
      num_examples: N (> 0).
      batches_per_pass: G >= 1; an epoch reads the source ceil(round(1/q) / G) times.
      seed: int for reproducible batches, None for OS entropy.
      max_batch_size: optional cap (truncation, counted; see module docstring).
      read_chunk_size: examples per vectorised membership test while reading
        an unbatched source (ignored with `source_batched=True`).
      source_batched: the source yields batches of examples, not examples.

    Returns:
      `(batches, info)` as for `poisson_batches`.

    Raises:
      ValueError: bad arguments, or per-example shapes not fully defined.
      tf.errors.InvalidArgumentError (while iterating): the source did not
        yield exactly `num_examples` examples in a pass.

    References: Abadi et al. 2016 §3.1; Chua et al. 2024 (massively parallel
    Poisson batch construction).
    """
    q = _check_q(sampling_probability)
    max_batch_size = _check_cap(max_batch_size)
    if isinstance(num_examples, bool) or not isinstance(num_examples, int) or num_examples < 0:
        raise ValueError(f"`num_examples` must be an int > 0; received {num_examples!r}.")
    if num_examples == 0:
        raise ValueError("`num_examples` is 0: the dataset is empty; Poisson sampling needs at least one example.")
    batches_per_pass = check_int("batches_per_pass", batches_per_pass)
    specs, chunks = _example_chunks(dataset, source_batched, read_chunk_size)
    generator = make_generator(seed, seed_as="counter")
    info = _poisson_info(num_examples, q, max_batch_size, seed, streaming=True, batches_per_pass=batches_per_pass)
    return register(_pass_batches(chunks, specs, info, generator, batches_per_pass), info), info


def _example_chunks(dataset, source_batched: bool, read_chunk_size: int) -> tuple:
    """`(per-example specs, chunks of examples)` of a streaming source; refuses shapes not fully defined."""
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"`dataset` must be a `tf.data.Dataset`; received {type(dataset).__name__}.")
    specs = dataset.element_spec
    for spec in tf.nest.flatten(specs):
        shape = spec.shape[1:] if source_batched and isinstance(spec, tf.TensorSpec) else getattr(spec, "shape", None)
        if shape is None or not isinstance(spec, tf.TensorSpec) or not shape.is_fully_defined():
            raise ValueError(
                "`streaming_poisson_batches` needs examples with fully defined shapes (pad "
                f"variable-length features first); received element spec {dataset.element_spec}"
                + (" (batches: the first dimension may vary)." if source_batched else ".")
            )
    if source_batched:
        return tf.nest.map_structure(lambda s: tf.TensorSpec(s.shape[1:], s.dtype), specs), dataset
    return specs, dataset.batch(read_chunk_size)


def _pass_batches(chunks, specs, info: BatchingInfo, generator, batches_per_pass: int) -> tf.data.Dataset:
    """The batches of `info`, G = `batches_per_pass` per pass over `chunks`.

    One pass: the G index sets are sampled first; the source is read once,
    chunk by chunk, keeping only the rows at wanted positions (a vectorised
    binary search per chunk); the kept rows are collected with one
    `Dataset.rebatch` (O(kept rows), no per-example work, no re-copying of the
    growing buffer) and the G batches are gathered from them. A sentinel
    chunk at the end of the pass carries the number of rows read, which is
    checked against `num_examples` before any batch of the pass is emitted.
    """
    n, q, cap = info.num_examples, info.sampling_probability, info.max_batch_size
    total = info.batches_per_epoch
    g_max = min(batches_per_pass, total)
    # The pass ends with a sentinel chunk (one zero row, flagged) that reports the rows read.
    sentinel = tf.nest.map_structure(lambda s: tf.zeros([1] + s.shape.as_list(), s.dtype), specs)
    flagged = chunks.map(lambda *e: (e[0] if len(e) == 1 else e, False)).concatenate(
        tf.data.Dataset.from_tensors((sentinel, True))
    )

    def one_pass(pass_index):
        sets = _index_sets(generator.make_seeds(g_max), n, q, cap, info)  # [G, None], sorted
        wanted, _ = tf.unique(sets.flat_values)
        rows, positions = _kept_rows(flagged, tf.sort(wanted), n)
        in_pass = tf.minimum(tf.constant(g_max, tf.int64), total - pass_index * g_max)

        def emit(j):
            loc = tf.searchsorted(positions, sets[j])
            return tf.nest.map_structure(lambda r: tf.gather(r, loc), rows)

        return tf.data.Dataset.range(in_pass).map(emit)

    return tf.data.Dataset.range(math.ceil(total / g_max)).flat_map(one_pass)


def _index_sets(seeds, n: int, q: float, cap: int | None, info: BatchingInfo) -> tf.RaggedTensor:
    """One sorted Poisson index set over 0..n-1 per column of `seeds` ([2, G]), each cut at `cap` (counted)."""

    def sample_set(seed_):
        indices = _poisson_indices(seed_, n, q)
        if cap is not None:
            indices = _truncate(indices, seed_, cap, info, ordered=q < _MASK_THRESHOLD)
        return tf.sort(indices)

    return tf.map_fn(
        sample_set, tf.transpose(seeds), fn_output_signature=tf.RaggedTensorSpec([None], tf.int64, ragged_rank=0)
    )


def _kept_rows(flagged: tf.data.Dataset, wanted: tf.Tensor, n: int) -> tuple:
    """`(rows, positions)` of one read of `flagged` kept at the sorted `wanted` positions; checks n rows were read."""

    def keep(offset, chunk):
        examples, is_end = chunk
        size = tf.shape(tf.nest.flatten(examples)[0], out_type=tf.int64)[0]
        pos = offset + tf.range(size, dtype=tf.int64)
        hit = tf.logical_or(is_end, is_member(pos, wanted))
        pos = tf.where(is_end, -offset - 1, pos)  # the sentinel's position encodes the rows read
        kept = tf.nest.map_structure(lambda e: tf.boolean_mask(e, hit), examples)
        return offset + tf.where(is_end, tf.constant(0, tf.int64), size), (kept, tf.boolean_mask(pos, hit))

    # Positions are distinct, so at most |wanted| + 1 rows are kept: one rebatch element.
    kept = flagged.scan(tf.constant(0, tf.int64), keep).rebatch(tf.size(wanted, out_type=tf.int64) + 1)
    rows, positions = kept.get_single_element()
    seen = -positions[-1] - 1
    check = tf.debugging.assert_equal(
        seen,
        tf.constant(n, tf.int64),
        message="streaming_poisson_batches: the source did not yield exactly `num_examples` examples in a pass",
    )
    with tf.control_dependencies([check]):
        positions = tf.identity(positions[:-1])
    return tf.nest.map_structure(lambda r: r[:-1], rows), positions


def fixed_size_batches(
    dataset: tf.data.Dataset, *, batch_size: int, seed: int | None, num_examples: int | None = None
) -> tuple[tf.data.Dataset, BatchingInfo]:
    """Shuffled fixed-size batches: NOT Poisson; only when explicitly asked for.

    Poisson accounting does not describe these batches (each example is used
    exactly once per epoch); the returned info has batching="fixed_shuffled"
    and the privacy report adds a caveat saying so.

    Args:
      dataset: unbatched examples (held in the shuffle buffer: full
        shuffle), or a nest of arrays / tensors with the examples along the
        leading dimension (then the example indices are shuffled and
        gathered: ~1x the data in memory).
      batch_size: examples per batch (the last, smaller batch is dropped).
      seed: int or None (OS entropy); keyword required so the choice is explicit.
      num_examples: N if known (else counted with one pass).

    Returns:
      `(batches, info)`.

    Raises:
      ValueError: empty dataset, bad batch size.
    """
    batch_size = check_int("batch_size", batch_size)
    if not isinstance(dataset, tf.data.Dataset):
        data = _load_all(dataset)
        n = int(_leading_dim(data))
        if num_examples is not None and int(num_examples) != n:
            raise ValueError(f"`num_examples`={num_examples!r} but the data holds {n} examples.")
        info = _fixed_size_info(n, batch_size, seed)
        order = tf.data.Dataset.range(n).shuffle(n, seed=seed, reshuffle_each_iteration=True)
        batches = order.batch(batch_size, drop_remainder=True).map(
            lambda idx: tf.nest.map_structure(lambda t: tf.gather(t, idx), data)
        )
        return register(batches, info), info
    size = num_examples
    if size is None:
        size = int(dataset.cardinality())
        if size < 0:
            size = int(dataset.reduce(tf.constant(0, tf.int64), lambda c, _: c + 1))
    info = _fixed_size_info(size, batch_size, seed)
    batches = dataset.shuffle(size, seed=seed, reshuffle_each_iteration=True).batch(batch_size, drop_remainder=True)
    return register(batches, info), info


def _fixed_size_info(n: int, batch_size: int, seed) -> BatchingInfo:
    """Checks N against the batch size; the `BatchingInfo` of shuffled fixed-size batches."""
    if n == 0:
        raise ValueError("`dataset` is empty: batching needs at least one example.")
    if batch_size > n:
        raise ValueError(f"`batch_size`={batch_size} exceeds the {n} examples of the dataset.")
    return BatchingInfo(
        batching="fixed_shuffled",
        num_examples=n,
        sampling_probability=batch_size / n,
        expected_batch_size=float(batch_size),
        batches_per_epoch=n // batch_size,
        seeded=seed is not None,
    )


# -- sampling ----------------------------------------------------------------------


def _poisson_indices(seed, n: int, q: float) -> tf.Tensor:
    """int64 indices of one exact Poisson(q) sample of range(n)."""
    if q >= _MASK_THRESHOLD:
        uniform = tf.random.stateless_uniform([n], seed=seed, dtype=tf.float64)
        return tf.where(uniform < q)[:, 0]
    count = tf.random.stateless_binomial(
        [], seed=seed, counts=tf.constant(float(n), tf.float64), probs=tf.constant(q, tf.float64), output_dtype=tf.int64
    )
    return _distinct_uniform(tf.random.experimental.stateless_fold_in(seed, 1), count, n)


def _distinct_uniform(seed, count, n: int) -> tf.Tensor:
    """`count` distinct uniform ints in [0, n), in uniformly random order.

    The first `count` distinct values of an i.i.d. uniform stream: each new
    value is uniform over the values not seen yet (tf.unique keeps order).
    """

    def body(i, found):
        missing = count - tf.size(found, out_type=tf.int64)
        draw = missing + missing // 8 + 8
        fresh = tf.random.stateless_uniform(
            tf.reshape(draw, [1]),
            seed=tf.random.experimental.stateless_fold_in(seed, i),
            minval=0,
            maxval=n,
            dtype=tf.int64,
        )
        found, _ = tf.unique(tf.concat([found, fresh], 0))
        return i + 1, found

    _, found = tf.while_loop(
        lambda i, found: tf.size(found, out_type=tf.int64) < count,
        body,
        (tf.constant(0, tf.int64), tf.zeros([0], tf.int64)),
        shape_invariants=(tf.TensorShape([]), tf.TensorShape([None])),
    )
    return found[:count]


def _truncate(indices, seed, cap: int, info: BatchingInfo, *, ordered: bool) -> tf.Tensor:
    """Cuts a batch above `cap` to a uniformly random subset of size `cap`; counts it."""
    size = tf.size(indices, out_type=tf.int64)
    over = size > cap
    batches, examples = info.truncated_batches, info.truncated_examples
    assert batches is not None and examples is not None  # made with a cap (_poisson_info)
    batches.assign_add(tf.cast(over, tf.int64))
    examples.assign_add(tf.maximum(size - cap, 0))
    if not ordered:  # mask path: indices are sorted, shuffle before cutting

        def shuffled():
            seed_ = tf.random.experimental.stateless_fold_in(seed, 2)
            keys = tf.random.stateless_uniform(tf.shape(indices), seed=seed_)
            return tf.gather(indices, tf.argsort(keys))

        indices = tf.cond(over, shuffled, lambda: indices)
    return indices[:cap]


# -- helpers -------------------------------------------------------------------------


def _poisson_info(n, q, cap, seed, *, streaming, batches_per_pass) -> BatchingInfo:
    info = BatchingInfo(
        batching="poisson",
        num_examples=n,
        sampling_probability=q,
        expected_batch_size=q * n,
        batches_per_epoch=max(1, round(1.0 / q)),
        max_batch_size=cap,
        streaming=streaming,
        batches_per_pass=batches_per_pass,
        seeded=seed is not None,
    )
    info.sampler = "multi_pass" if streaming else "in_memory"
    if cap is not None:
        info.truncated_batches = tf.Variable(0, dtype=tf.int64, trainable=False, name="truncated_batches")
        info.truncated_examples = tf.Variable(0, dtype=tf.int64, trainable=False, name="truncated_examples")
    return info


def _check_q(q) -> float:
    if isinstance(q, bool) or not isinstance(q, numbers.Real) or not 0 < float(q) <= 1:
        raise ValueError(f"`sampling_probability` must be a number in (0, 1]; received {q!r}.")
    return float(q)


def _check_cap(cap) -> int | None:
    if cap is None:
        return None
    if isinstance(cap, bool) or not isinstance(cap, numbers.Integral) or cap < 1:
        raise ValueError(f"`max_batch_size` must be an int >= 1 or None; received {cap!r}.")
    return int(cap)


def _load_all(dataset):
    """The whole dataset as one nest of tensors with a leading example dimension.

    A nest of arrays / tensors (already in memory) is converted component by
    component; their leading dimensions must agree.
    """
    if not isinstance(dataset, tf.data.Dataset):
        try:
            data = tf.nest.map_structure(tf.convert_to_tensor, dataset)
        except (TypeError, ValueError) as error:
            raise TypeError(
                "`dataset` must be a `tf.data.Dataset` or a nest of arrays / tensors with the examples along the "
                f"leading dimension; received {type(dataset).__name__} ({error})."
            ) from None
        leading = {int(t.shape[0]) if t.shape.rank else None for t in tf.nest.flatten(data)}
        if len(leading) != 1 or None in leading:
            raise ValueError(
                "In-memory `dataset` components must share one leading (example) dimension; received leading "
                f"sizes {sorted(leading, key=str)}."
            )
        return data
    for spec in tf.nest.flatten(dataset.element_spec):
        if not isinstance(spec, (tf.TensorSpec, tf.RaggedTensorSpec)):
            raise ValueError(f"`dataset` elements must be tensors or ragged tensors; received a component {spec}.")
    n = int(dataset.cardinality())
    if n == tf.data.INFINITE_CARDINALITY:
        raise ValueError("`dataset` is infinite (e.g. `.repeat()`d); pass one pass over the examples.")
    if n < 0:  # unknown: count with one pass (the data fits in memory anyway)
        n = int(dataset.reduce(tf.constant(0, tf.int64), lambda count, _: count + 1))
    if n == 0:
        return tf.nest.map_structure(lambda s: tf.zeros([0], s.dtype), dataset.element_spec)
    # Batching with the exact count: ragged batching preallocates per batch slot.
    return next(iter(dataset.ragged_batch(n)))


def _leading_dim(data) -> int:
    first = tf.nest.flatten(data)[0]
    if isinstance(first, tf.RaggedTensor):
        return int(first.nrows())
    return int(tf.shape(first)[0])


__all__ = ["BatchingInfo", "fixed_size_batches", "poisson_batches", "streaming_poisson_batches"]
