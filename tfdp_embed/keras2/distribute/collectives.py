"""A replica's clipped sums made global with collectives, and their flat form for `merge_call`.

    dense: sum_r S_r (all_reduce);  tables: all_reduce of the IndexedSlices, then one row per
    distinct index (union_of_rows);  clip factors and lookups: all_gather, example and segment
    ids offset by the replicas before

Shared by the synchronous step (`sync.noised_gradients`) and the TPU step
(`TpuDPStep`), which both run the mechanism once in `merge_call` on the
result: `_flatten` turns `ClippedGradients` into the flat tensor list
`merge_call` takes, `_encode_grad` / `_decode_grad` carry `IndexedSlices`
back out of it.

References: TensorFlow `tf.distribute` guide (all_reduce, all_gather,
merge_call); EANA (RecSys 2022) §3 (noise on the union of touched rows).
"""

from __future__ import annotations

import dataclasses

from tfdp_embed.keras2._keras import tf
from tfdp_embed.keras2.layers.embedding import EmbeddingOccurrences
from tfdp_embed.mechanisms.base import ClippedGradients, TableGradient


def all_reduce_clipped(clipped: ClippedGradients, ctx, *, with_lookups: bool) -> ClippedGradients:
    """The global batch's `ClippedGradients` from each replica's, with collectives.

        dense: sum_r S_r;  tables: IndexedSlices over the union of touched rows,
        values summed per row;  batch_size: sum_r B_r;  with_lookups: clip
        factors and lookups concatenated in replica order (example and
        segment ids offset by the replicas before); `shared_rows` (rows
        scored whatever the data): their union over the replicas, sorted.

    Every replica receives the same result.

    Args:
      clipped: this replica's clipped sums.
      ctx: the `tf.distribute.ReplicaContext`.
      with_lookups: also gather `clip_factors` and `occurrences` (DP-AdaFEST
        builds its contribution map from them).
    """
    dense_sums = ctx.all_reduce("sum", [g for _, g in clipped.dense]) if clipped.dense else []
    batch = tf.cast(clipped.batch_size, tf.int32)
    batches = ctx.all_gather(tf.reshape(batch, [1]), axis=0)
    example_offset = _offset(batches, ctx)
    tables = []
    for table in clipped.tables:
        summed = _all_reduced_rows(table.gradient, ctx)
        occurrences, factors = [], table.clip_factors
        if with_lookups:
            factors = ctx.all_gather(table.clip_factors, axis=0)
            occurrences = [_gather_occurrences(o, ctx, example_offset) for o in table.occurrences]
        shared = None if table.shared_rows is None else _union_across(table.shared_rows, ctx)
        tables.append(
            dataclasses.replace(
                table, gradient=summed, occurrences=occurrences, clip_factors=factors, shared_rows=shared
            )
        )
    return ClippedGradients(
        tables=tables,
        dense=[(v, g) for (v, _), g in zip(clipped.dense, dense_sums)],
        expected_batch_size=clipped.expected_batch_size,
        batch_size=tf.reduce_sum(batches),
    )


def union_of_rows(slices: tf.IndexedSlices) -> tf.IndexedSlices:
    """Sums the values of repeated indices: one row per distinct index (first-seen order)."""
    rows, position = tf.unique(tf.cast(slices.indices, tf.int64), out_idx=tf.int32)
    values = tf.math.unsorted_segment_sum(slices.values, position, tf.size(rows))
    return tf.IndexedSlices(values, rows, slices.dense_shape)


def _all_reduced_rows(slices: tf.IndexedSlices, ctx) -> tf.IndexedSlices:
    """`union_of_rows` of the replicas' all-reduced `slices`; fine when every replica's are empty.

    TensorFlow's sparse all_reduce crashes the process (SIGSEGV, TF 2.21 on
    CPU) when every replica contributes zero rows, e.g. a step whose batch
    is all padding (weight-0 examples are absent and touch no row). Each
    replica adds one zero row at index `dense_shape[0]`, outside the table,
    removed after the union: the rows and their order are unchanged.
    """
    sentinel = tf.cast(slices.dense_shape[0], tf.int64)
    values = tf.convert_to_tensor(slices.values)
    zero = tf.zeros(tf.concat([[1], tf.shape(values)[1:]], 0), values.dtype)
    padded = tf.IndexedSlices(
        tf.concat([values, zero], 0), tf.concat([tf.cast(slices.indices, tf.int64), [sentinel]], 0), slices.dense_shape
    )
    summed = union_of_rows(ctx.all_reduce("sum", padded))
    keep = summed.indices < sentinel
    return tf.IndexedSlices(
        tf.boolean_mask(summed.values, keep), tf.boolean_mask(summed.indices, keep), summed.dense_shape
    )


def _union_across(rows: tf.Tensor, ctx) -> tf.Tensor:
    """Sorted distinct int64 `rows` of all replicas (the same rows on each, for a data-independent read)."""
    (gathered,) = _gather_lookups([tf.reshape(tf.cast(rows, tf.int64), [-1])], ctx)
    return tf.sort(tf.unique(gathered).y)


def _offset(sizes: tf.Tensor, ctx) -> tf.Tensor:
    """Sum of `sizes` of the replicas before this one (exclusive prefix sum)."""
    before = tf.range(tf.size(sizes)) < ctx.replica_id_in_sync_group
    return tf.reduce_sum(tf.where(before, sizes, tf.zeros_like(sizes)))


def _gather_occurrences(occ: EmbeddingOccurrences, ctx, example_offset) -> EmbeddingOccurrences:
    num_segments = tf.cast(occ.num_segments, tf.int32)
    segment_offset = _offset(ctx.all_gather(tf.reshape(num_segments, [1]), axis=0), ctx)
    batch = tf.cast(occ.batch_size, tf.int32)
    ids, segments, weights = _gather_lookups(
        [occ.ids, tf.cast(occ.segments, tf.int32) + segment_offset, occ.weights], ctx
    )
    return EmbeddingOccurrences(
        ids=ids,
        segments=segments,
        weights=weights,
        num_segments=ctx.all_reduce("sum", num_segments),
        segment_examples=ctx.all_gather(tf.cast(occ.segment_examples, tf.int32) + example_offset, axis=0),
        batch_size=ctx.all_reduce("sum", batch),
    )


def _gather_lookups(tensors: list, ctx) -> list:
    """`ctx.all_gather(t, axis=0)` of equally long 1-D `tensors`; fine when every replica's are empty.

    TensorFlow's all_gather crashes the process (SIGSEGV, TF 2.21 on CPU)
    when every replica gathers zero elements, e.g. a step whose batch is
    all padding (weight-0 examples are absent: no lookups). Each replica
    appends one dummy element, dropped after the gather by a gathered mask.
    """
    real = tf.concat([tf.ones_like(tensors[0], tf.int32), [0]], 0)
    keep = tf.cast(ctx.all_gather(real, axis=0), tf.bool)
    out = []
    for tensor in tensors:
        padded = tf.concat([tensor, tf.zeros([1], tensor.dtype)], 0)
        out.append(tf.boolean_mask(ctx.all_gather(padded, axis=0), keep))
    return out


def _flatten(clipped: ClippedGradients):
    """Tensors of `clipped` as a flat list, and a function rebuilding it from such a list."""
    flat = []

    def push(x):
        flat.append(tf.convert_to_tensor(x))
        return len(flat) - 1

    plan = []
    for table in clipped.tables:
        g = table.gradient
        slots = (push(g.values), push(g.indices), push(g.dense_shape), push(table.clip_factors))
        occ_slots = [
            tuple(push(getattr(o, f.name)) for f in dataclasses.fields(EmbeddingOccurrences)) for o in table.occurrences
        ]
        shared_slot = None if table.shared_rows is None else push(table.shared_rows)
        plan.append((table, slots, occ_slots, shared_slot))
    dense_slots = [push(g) for _, g in clipped.dense]
    batch_slot = push(clipped.batch_size)

    def rebuild(values) -> ClippedGradients:
        tables = []
        for table, (vs, ix, shape, factors), occ_slots, shared_slot in plan:
            occurrences = [EmbeddingOccurrences(*(values[i] for i in slots)) for slots in occ_slots]
            tables.append(
                TableGradient(
                    layer=table.layer,
                    variable=table.variable,
                    gradient=tf.IndexedSlices(values[vs], values[ix], values[shape]),
                    occurrences=occurrences,
                    clip_factors=values[factors],
                    shared_rows=None if shared_slot is None else values[shared_slot],
                )
            )
        return ClippedGradients(
            tables=tables,
            dense=[(v, values[i]) for (v, _), i in zip(clipped.dense, dense_slots)],
            expected_batch_size=clipped.expected_batch_size,
            batch_size=values[batch_slot],
        )

    return flat, rebuild


def _encode_grad(grad):
    if isinstance(grad, tf.IndexedSlices):
        return (grad.values, grad.indices, grad.dense_shape)
    return grad


def _decode_grad(grad):
    if isinstance(grad, (tuple, list)):
        return tf.IndexedSlices(*grad)
    return grad


__all__ = ["all_reduce_clipped", "union_of_rows"]
