"""Exact per-example norms and sparse clipped sums for `DPEmbedding` tables.

The gradient of example i with respect to the table has one non-zero row
per distinct row r that the example reads, across every call of the layer:

    grad_i[r] = sum over occurrences k of example i with id_k = r of w_k * g[segment_k],

where w_k is the combiner weight and g the output gradient of the segment
(pooled output row, or sequence position) that occurrence k adds into. So
an id repeated inside one example adds up *before* the square: occurrences
are grouped by (example, row), the group sums squared, and the squares
summed per example. The work is O(occurrences x dim); a `[batch, vocab,
dim]` tensor is never built. The groups are exactly the non-zero rows of
the per-example gradients, so the clipped sum sum_i c_i grad_i is one more
segment sum of them into the unique touched rows: a `tf.IndexedSlices`.
When the layer vouches that no example reads a row twice (a
`StackedEmbedding`: one id per feature, the features' rows disjoint; it
asserts this on the recorded ids), the groups are the occurrences
themselves and the grouping is skipped.

A call inside a shared computation (a candidate tower over the catalogue,
`tfdp_embed.clipping.shared`) reads the same ids for every example, with
per-example output gradients: each of its occurrences is counted once per
example (O(batch x occurrences x dim)), and its rows are reported as
`shared_rows` rather than as the batch's lookups, since which rows it reads
does not depend on the data. When the tower above the table is a fixed
row-wise linear map, the output gradients come factored,
g_ik = sum_f G_fik u_fi (`shared_factored.FactoredGrads`), and the call's
part of example i's gradient is sum_f S_fi ⊗ u_fi with S_fi = A G_fi, A
`[rows, K]` summing each row's occurrences (repeats first): O(batch x
occurrences) for S, no per-example rows are built.

The rule reads the taps of `DPEmbedding.lookup` (the default registry
records that method, not `call`): the output gradient it sees then
includes whatever a subclass's `call` does with the looked-up rows (a
scale, a normalisation), so the norms are exact for what the subclass
computes. Those taps are flattened with `DPEmbedding.occurrences`, which
describes `lookup` (a subclass's own `occurrences` describes its `call`).

Example:
    >>> registry = LayerRegistry()
    >>> registry.register(DPEmbedding, embedding_layer_gradients,
    ...                   tapped_method="lookup", if_overridden="refuse")

References: Li et al. 2022 ghost clipping; Bu et al. 2022 book-keeping;
tensorflow/privacy fast_gradient_clipping/registry_functions/embedding.py.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import tensorflow as tf

from tfdp_embed.clipping.registry import LayerGradients
from tfdp_embed.clipping.shared_factored import FactoredGrads
from tfdp_embed.clipping.taps import LayerTaps, call_inputs
from tfdp_embed.layers.lookup import EmbeddingLookup
from tfdp_embed.ops import sparse_rows


@tf.autograph.experimental.do_not_convert
def embedding_layer_gradients(
    layer: EmbeddingLookup, taps: LayerTaps, output_grads: Sequence[tf.Tensor]
) -> LayerGradients:
    """Exact per-example squared norms and the sparse clipped sum of one table.

    ||grad_i||^2 = sum_r ||sum_{k in i, id_k = r} w_k g_{segment_k}||^2, over all calls.

    Args:
      layer: a `DPEmbedding` (or subclass); each call's ids are read back through
        `DPEmbedding.occurrences` for taps of `lookup`, `layer.occurrences` for
        taps of `call` (a subclass's `occurrences` describes its `call`).
      taps: the layer's recorded calls of `lookup` or `call`.
      output_grads: d(sum_i loss_i)/d(output) for each call (`[B, dim]` pooled or
        single id, `[B, n, dim]` for unpooled sequences).

    Returns:
      `LayerGradients` over `[layer.embeddings]`; `clipped_sum` returns a
      `tf.IndexedSlices` with unique int64 row indices and the table's dense shape;
      `occurrences` holds one `EmbeddingOccurrences` per call.

    References: Li et al. 2022 ghost clipping; Bu et al. 2022 book-keeping.
    """
    table = layer.embeddings
    flatten = _occurrences_fn(layer, taps)
    if any(isinstance(grad, FactoredGrads) for grad in output_grads):  # a candidate tower ending linearly
        return _factored_layer_gradients(layer, taps, output_grads, flatten, table.dtype.base_dtype)
    has_shared = any(call.shared is not None for call in taps.calls)
    if len(taps.calls) == 1 and not has_shared and _is_pooled(layer, taps.calls[0]):
        return _pooled_layer_gradients(layer, taps.calls[0], output_grads[0], flatten)
    if len(taps.calls) == 1 and not has_shared and _has_distinct_rows(layer, taps):
        return _distinct_rows_layer_gradients(layer, taps.calls[0], output_grads[0], flatten)
    dtype = table.dtype.base_dtype
    occurrences, (rows, examples, contributions), shared_rows, batch_size = _all_calls_blocks(
        layer, taps, output_grads, flatten, dtype
    )
    # Group occurrences by (example, row): the non-zero rows of the per-example grads.
    unique_rows, row_index = sparse_rows.unique(rows)
    keys = tf.cast(row_index, tf.int64) * batch_size + examples
    group_keys, group_index = sparse_rows.unique(keys)
    num_groups = tf.size(group_keys)
    group_rows = group_keys // batch_size  # positions in unique_rows
    group_examples = group_keys % batch_size
    per_example_rows = tf.math.unsorted_segment_sum(contributions, group_index, num_groups)
    squared = tf.math.unsorted_segment_sum(
        tf.reduce_sum(tf.square(per_example_rows), axis=1), group_examples, batch_size
    )

    @tf.autograph.experimental.do_not_convert
    def clipped_sum(clip_factors: tf.Tensor) -> list:
        c = tf.gather(tf.cast(clip_factors, dtype), group_examples)
        values = tf.math.unsorted_segment_sum(c[:, None] * per_example_rows, group_rows, tf.size(unique_rows))
        return [tf.IndexedSlices(values, unique_rows, dense_shape=tf.shape(table))]

    return _table_gradients(table, squared, clipped_sum, occurrences, shared_rows)


embedding_layer_gradients.supports_shared_calls = True  # type: ignore[attr-defined]
# Exact over a unit axis [users, k, ...] (user-level batches), as over a sequence axis: tests/user_level.
embedding_layer_gradients.handles_unit_axis = True  # type: ignore[attr-defined]
embedding_layer_gradients.shared_factored = "leaf"  # type: ignore[attr-defined]


def _factored_layer_gradients(layer, taps: LayerTaps, output_grads: Sequence, flatten, dtype) -> LayerGradients:
    """Calls with factored shared output gradients (`FactoredGrads`) next to any other calls.

    A factored call's gradient for example i is sum_f S_fi ⊗ u_fi, where
    S_fi[r] = sum over the call's occurrences o of row r of w_o G_fi[k_o]
    (repeated negatives add up here, before any square). With P_ri the
    example's other rows (grouped by (example, row) as in the general path):

        ||grad_i||^2 = sum_{f,h} (S_fi . S_hi)(u_fi . u_hi) + 2 sum_{r,f} S_fi[r] (u_fi . P_ri) + sum_r ||P_ri||^2
    """
    table = layer.embeddings
    dim = table.shape[-1]
    occurrences, blocks, factored, shared_rows = [], [], [], []
    for call, grad in zip(taps.calls, output_grads):
        occ = flatten(call_inputs(layer, call), check_range=False)  # `call` range-checked these ids
        if isinstance(grad, FactoredGrads):
            factored.append((occ, grad))
            shared_rows.append(tf.cast(occ.ids, tf.int64))
            continue
        if call.shared is None:
            occurrences.append(occ)
        blocks.append((_shared_block if call.shared is not None else _per_example_block)(occ, grad, dtype, dim))
        if call.shared is not None:
            shared_rows.append(blocks[-1][0])
    batch_size = tf.shape(factored[0][1].vectors, out_type=tf.int64)[1]
    rows, examples, contributions = _concat_blocks(blocks, dtype, dim)
    factored_ids = [tf.cast(occ.ids, tf.int64) for occ, _ in factored]
    unique_rows, row_index = sparse_rows.unique(tf.concat([rows] + factored_ids, 0))
    num_rows, num_other = tf.size(unique_rows), tf.size(rows)
    group_keys, group_index = sparse_rows.unique(tf.cast(row_index[:num_other], tf.int64) * batch_size + examples)
    groups = tf.math.unsorted_segment_sum(contributions, group_index, tf.size(group_keys))  # P [g, dim]
    group_rows, group_examples = group_keys // batch_size, group_keys % batch_size
    sums, vectors = _factored_row_sums(factored, row_index[num_other:], num_rows, dtype)  # S, u
    # Elementwise products, not einsums: F is 1 or 2, and the batched matmuls of F x F blocks cost more.
    row_gram = tf.reduce_sum(sums[:, :, :, None] * sums[:, :, None, :], axis=0)  # (S_fi . S_hi) [B, F, F]
    vector_gram = tf.reduce_sum(vectors[:, :, None, :] * vectors[:, None, :, :], axis=3)  # (u_fi . u_hi)
    squared = tf.reduce_sum(row_gram * vector_gram, axis=[1, 2])
    at_groups = tf.gather_nd(sums, tf.stack([group_rows, group_examples], 1))  # S_fi[r] per group, [g, F]
    dots = tf.reduce_sum(tf.gather(vectors, group_examples) * groups[:, None, :], axis=2)  # (u_fi . P_ri) [g, F]
    cross = tf.reduce_sum(at_groups * dots, 1)
    own = tf.reduce_sum(tf.square(groups), 1)
    squared += tf.math.unsorted_segment_sum(2.0 * cross + own, group_examples, batch_size)

    @tf.autograph.experimental.do_not_convert
    def clipped_sum(clip_factors: tf.Tensor) -> list:
        c = tf.cast(clip_factors, dtype)
        values = tf.matmul(tf.reshape(sums * c[None, :, None], [num_rows, -1]), tf.reshape(vectors, [-1, dim]))
        values += tf.math.unsorted_segment_sum(tf.gather(c, group_examples)[:, None] * groups, group_rows, num_rows)
        return [tf.IndexedSlices(values, unique_rows, dense_shape=tf.shape(table))]

    return _table_gradients(table, squared, clipped_sum, occurrences, shared_rows)


def _table_gradients(table, squared, clipped_sum, occurrences: list, shared_rows: list) -> LayerGradients:
    """The table's `LayerGradients`; `shared_rows`: the rows its shared calls score (each once), if any."""
    return LayerGradients(
        variables=[table],
        squared_norms=tf.cast(squared, tf.float32),
        clipped_sum=clipped_sum,
        occurrences=occurrences,
        shared_rows=sparse_rows.unique(tf.concat(shared_rows, 0))[0] if shared_rows else None,
        rows_from_lookups=True,
    )


def _concat_blocks(blocks: list, dtype, dim) -> tuple:
    """(rows, examples, contributions) of all `blocks` (empty ones when there are none)."""
    if not blocks:
        return tf.zeros([0], tf.int64), tf.zeros([0], tf.int64), tf.zeros([0, dim], dtype)
    return tuple(tf.concat([b[i] for b in blocks], 0) for i in range(3))


def _factored_row_sums(factored: list, row_index: tf.Tensor, num_rows, dtype) -> tuple:
    """(S `[rows, B, F]`: each row's sum of w_o G_f[:, k_o] over the calls' occurrences o, u `[B, F, dim]`).

    S_f^T = A G_f^T with A `[rows, K]` sparse (one entry w_o at (row_o, k_o) per
    occurrence; repeats add up): one sparse-dense product per factor, O(occurrences x B).
    """
    sums, vectors, start = [], [], 0
    for occ, grad in factored:
        n = tf.size(occ.ids)
        index = tf.cast(row_index[start : start + n], tf.int64)
        start += n
        coefficients = tf.cast(grad.coefficients, dtype)  # [F, B, K]
        occurrences = tf.SparseTensor(
            tf.stack([index, tf.cast(occ.segments, tf.int64)], 1),
            tf.cast(occ.weights, dtype),
            tf.stack([tf.cast(num_rows, tf.int64), tf.shape(coefficients, out_type=tf.int64)[2]]),
        )
        per_factor = [tf.sparse.sparse_dense_matmul(occurrences, g, adjoint_b=True) for g in tf.unstack(coefficients)]
        sums.append(tf.stack(per_factor, axis=2))  # [rows, B, F]
        vectors.append(tf.transpose(tf.cast(grad.vectors, dtype), [1, 0, 2]))
    return tf.concat(sums, 2), tf.concat(vectors, 1)


def _all_calls_blocks(layer, taps: LayerTaps, output_grads: Sequence[tf.Tensor], flatten, dtype) -> tuple:
    """Every call's occurrences as one block (rows, examples, contributions `[n, dim]`).

    Returns (the per-example calls' occurrences, the concatenated block, the shared
    calls' rows, the batch size as int64).
    """
    dim = layer.embeddings.shape[-1]
    occurrences, rows, examples, contributions, shared_rows = [], [], [], [], []
    batch_size = None
    for call, grad in zip(taps.calls, output_grads):
        # `call` already range-checked these ids in this step.
        occ = flatten(call_inputs(layer, call), check_range=False)
        if call.shared is not None:
            block = _shared_block(occ, grad, dtype, dim)
            shared_rows.append(block[0])
            batch_size = tf.shape(grad, out_type=tf.int64)[0]
        else:
            occurrences.append(occ)
            block = _per_example_block(occ, grad, dtype, dim)
            batch_size = tf.cast(occ.batch_size, tf.int64)
        rows.append(block[0])
        examples.append(block[1])
        contributions.append(block[2])
    block = (tf.concat(rows, 0), tf.concat(examples, 0), tf.concat(contributions, 0))
    return occurrences, block, shared_rows, batch_size


def _per_example_block(occ, grad, dtype, dim) -> tuple:
    """(rows, examples, contributions) of one per-example call: one per occurrence."""
    grad = tf.reshape(tf.cast(grad, dtype), [-1, dim])  # [num_segments, dim]
    segments = tf.cast(occ.segments, tf.int32)
    examples = tf.cast(tf.gather(occ.segment_examples, segments), tf.int64)
    weights = tf.cast(occ.weights, dtype)[:, None]
    return tf.cast(occ.ids, tf.int64), examples, weights * tf.gather(grad, segments)


def _shared_block(occ, grad, dtype, dim) -> tuple:
    """(rows, examples, contributions) of a shared call: each occurrence once per example.

    The call's ids are the same for every example (a candidate tower over the
    catalogue); `grad` `[B, *outputs.shape]` holds each example's own output
    gradient, so occurrence k contributes w_k * grad[i, segment_k] to example i.
    """
    batch = tf.shape(grad, out_type=tf.int64)[0]
    grad = tf.reshape(tf.cast(grad, dtype), [batch, -1, dim])  # [B, num_segments, dim]
    segments = tf.cast(occ.segments, tf.int32)
    weights = tf.cast(occ.weights, dtype)[None, :, None]
    contributions = tf.reshape(weights * tf.gather(grad, segments, axis=1), [-1, dim])
    ids = tf.cast(occ.ids, tf.int64)
    n = tf.size(ids, out_type=tf.int64)
    rows = tf.tile(ids, [batch])
    examples = tf.repeat(tf.range(batch), n)
    return rows, examples, contributions


def _occurrences_fn(layer, taps: LayerTaps):
    """How the tapped method's ids flatten: `DPEmbedding.occurrences` describes `lookup`."""
    if taps.method == "lookup":
        return functools.partial(EmbeddingLookup.occurrences, layer)
    return layer.occurrences


def _is_pooled(layer, call) -> bool:
    """One output row per example: a combiner (over ids `[batch, n]` or ragged), or a single id per example."""
    ids = call_inputs(layer, call)
    if isinstance(ids, tf.Tensor) and ids.shape.rank == 3:  # user units [batch, k, n]: one row per (unit, row)
        return False
    if isinstance(ids, tf.RaggedTensor) and ids.ragged_rank == 2:  # user units [batch, k, None]: the same
        return False
    return layer.combiner is not None or (isinstance(ids, tf.Tensor) and ids.shape.rank == 1)


def _has_distinct_rows(layer, taps: LayerTaps) -> bool:
    """A layer that vouches (and checks, `checked_distinct_rows`) that no example reads a row twice."""
    return taps.method == "lookup" and layer.combiner is None and hasattr(layer, "checked_distinct_rows")


def _distinct_rows_layer_gradients(layer, call, grad, flatten) -> LayerGradients:
    """One call in which each example reads each row at most once (`StackedEmbedding`: disjoint rows per feature).

    Example i's gradient rows are then its occurrences' own output gradients, no grouping by
    (example, row): ||grad_i||^2 = sum_{k in i} ||g_k||^2, and the clipped sum is one fused
    scaled segment sum into the unique rows. The layer's `checked_distinct_rows(ids)` asserts
    the premise on the recorded ids (each column in its feature's rows), so ids that break it fail.
    """
    table = layer.embeddings
    dtype = table.dtype.base_dtype
    occ = flatten(layer.checked_distinct_rows(call_inputs(layer, call)), check_range=False)
    grad = tf.reshape(tf.cast(grad, dtype), [-1, table.shape[-1]])  # [occurrences, dim]: no combiner
    segments = tf.cast(occ.segments, tf.int32)
    examples = tf.gather(tf.cast(occ.segment_examples, tf.int32), segments)
    squared = tf.math.unsorted_segment_sum(tf.reduce_sum(tf.square(grad), axis=1), examples, occ.batch_size)
    unique_rows, row_index = sparse_rows.unique(tf.cast(occ.ids, tf.int64))

    @tf.autograph.experimental.do_not_convert
    def clipped_sum(clip_factors: tf.Tensor) -> list:
        scales = tf.gather(tf.cast(clip_factors, dtype), examples)
        return _summed_rows(table, unique_rows, grad, segments, row_index, tf.cast(occ.weights, dtype), scales)

    return _lookup_gradients(table, squared, clipped_sum, occ)


def _pooled_layer_gradients(layer, call, grad, flatten) -> LayerGradients:
    """The one-call pooled case: every occurrence of example i shares g_i.

    ||grad_i||^2 = ||g_i||^2 * sum_r (sum_{k in i, id_k = r} w_k)^2, so the grouping
    by (example, row) works on scalar weights, not `[n, dim]` vectors. Both the
    weight squares and the clipped sum run as one fused op each
    (`tfdp_embed.ops.sparse_rows`; bit-identical TensorFlow fallback).
    """
    table = layer.embeddings
    dtype = table.dtype.base_dtype
    occ = flatten(call_inputs(layer, call), check_range=False)
    grad = tf.reshape(tf.cast(grad, dtype), [-1, table.shape[-1]])  # [batch, dim]
    examples = tf.cast(occ.segments, tf.int32)  # pooled: segment == example
    weights = tf.cast(occ.weights, dtype)
    unique_rows, row_index = sparse_rows.unique(tf.cast(occ.ids, tf.int64))
    if dtype == tf.float32:
        weight_sq = sparse_rows.pooled_weight_squares(row_index, examples, weights, occ.batch_size)
    else:
        weight_sq = sparse_rows.pooled_weight_squares_reference(row_index, examples, weights, occ.batch_size)
    squared = weight_sq * tf.reduce_sum(tf.square(grad), axis=1)

    @tf.autograph.experimental.do_not_convert
    def clipped_sum(clip_factors: tf.Tensor) -> list:
        return _summed_rows(table, unique_rows, grad, examples, row_index, weights, tf.cast(clip_factors, dtype))

    return _lookup_gradients(table, squared, clipped_sum, occ)


@tf.autograph.experimental.do_not_convert
def _summed_rows(table, unique_rows, *args) -> list:
    """The clipped sum into `unique_rows` by the fused op (float32) or its bit-identical TensorFlow reference."""
    if table.dtype.base_dtype == tf.float32:
        values = sparse_rows.scaled_segment_sum(*args, tf.size(unique_rows))
    else:
        values = sparse_rows.scaled_segment_sum_reference(*args, tf.size(unique_rows))
    return [tf.IndexedSlices(values, unique_rows, dense_shape=tf.shape(table))]


def _lookup_gradients(table, squared, clipped_sum, occ) -> LayerGradients:
    """One table's `LayerGradients` from its lookups: float32 squared norms, rows from the recorded ids."""
    return LayerGradients(
        variables=[table],
        squared_norms=tf.cast(squared, tf.float32),
        clipped_sum=clipped_sum,
        occurrences=[occ],
        rows_from_lookups=True,
    )


__all__ = ["embedding_layer_gradients"]
