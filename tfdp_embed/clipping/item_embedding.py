"""Per-example clipping of an `ItemEmbedding`: label-tower lookups plus full-softmax scoring.

The item table V (row 0 = padding, rows 1..n = items) is read two ways:
looked up by int ids, and scored against float queries q (logits q V[1:]^T).
Per example i, with G_i = d loss_i / d logits_i and h_k the output gradient
of lookup occurrence k (weight w_k, row id_k):

    grad_i V = G_i^T q_i (rows 1..n) + sum_k w_k e_{id_k} h_k
    ||grad_i V||^2 = ||G_i||^2 ||q_i||^2 + 2 sum_k w_k G_i[id_k] (q_i . h_k) + ||lookup part||^2

a Dense-like ghost norm, the embedding rule, and their cross term; with
several scoring calls the first term is the Gram form
sum_{a,b} (G_a . G_b)(q_a . q_b). The default `DPEmbedding` rule only knows
lookups, so `tfdp_embed.keras2.models.two_tower.two_tower_registry()` registers
this rule for `ItemEmbedding`. The full softmax touches every item row, so
the clipped sum covers rows 1..n at every step; those rows are reported as
`shared_rows` (read by every example whatever the data), so that sparse
mechanisms do not mistake them for rows nobody contributed to.

References: Li et al. 2022 ghost clipping; Bu et al. 2022 book-keeping;
Berlowitz et al., "EANA", RecSys 2022, §4.1.2, Fig. 3.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tfdp_embed.clipping.embedding import embedding_layer_gradients
from tfdp_embed.clipping.registry import LayerGradients
from tfdp_embed.clipping.taps import LayerTaps, call_inputs
from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.layers.lookup import EmbeddingLookup as DPEmbedding


def _is_scoring_call(layer, call) -> bool:
    x = call.args[0] if call.args else call.kwargs.get("inputs")
    return isinstance(x, tf.Tensor) and x.dtype.is_floating


def item_embedding_gradients(layer: DPEmbedding, taps: LayerTaps, output_grads: Sequence[tf.Tensor]) -> LayerGradients:
    """Exact per-example norms and the clipped sum for an `ItemEmbedding` (lookups + full softmax).

    ||grad_i||^2 = sum_{a,b} (G_ia . G_ib)(q_ia . q_ib) + 2 sum_k w_k G_i[id_k] (q_i . h_k) + ||L_i||^2

    over scoring calls a, b (queries q, logit gradients G) and lookup occurrences k
    of example i (weights w, output gradients h; L_i the lookup part of the gradient).

    Args:
      layer: the `ItemEmbedding` (a `DPEmbedding` whose `call` also scores float
        queries against rows 1..n).
      taps: its recorded calls (lookups with int ids and/or scoring with float queries).
      output_grads: d(sum_i loss_i)/d(output) per call.

    Returns:
      `LayerGradients` over `[layer.embeddings]`; `clipped_sum` returns an
      `IndexedSlices` over rows 1..num_items (plus row 0 if a lookup read it).

    References: Li et al. 2022 ghost clipping; Bu et al. 2022 book-keeping; EANA §4.1.2.
    """
    scoring = [(c, g) for c, g in zip(taps.calls, output_grads) if _is_scoring_call(layer, c)]
    if not scoring:
        return embedding_layer_gradients(layer, taps, output_grads)
    _refuse_shared_calls(layer, taps)
    lookups = [(c, g) for c, g in zip(taps.calls, output_grads) if not _is_scoring_call(layer, c)]
    table, dim, rows = layer.embeddings, layer.output_dim, layer.vocabulary_size
    dtype = table.dtype.base_dtype
    # Queries [B, d]: one scoring row per example; user units [B, k, d]: k rows, summed in the Gram form.
    queries = tf.concat([_rows_of(tf.cast(call_inputs(layer, c), dtype)) for c, _ in scoring], 1)  # [B, A, d]
    logit_grads = tf.concat([_rows_of(tf.cast(g, dtype)) for _, g in scoring], 1)  # [B, A, n]
    squared = _scoring_squared_norms(queries, logit_grads)
    batch_size = tf.shape(queries, out_type=tf.int64)[0]
    occurrences, lookup_rows, lookup_examples, lookup_vectors = _lookup_block(layer, lookups, dtype)
    if lookups:
        squared = _add_lookup_squared_norms(
            squared, queries, logit_grads, lookup_rows, lookup_examples, lookup_vectors, batch_size
        )
    extra_rows = tf.unique(tf.boolean_mask(lookup_rows, tf.equal(lookup_rows, 0))).y  # [] or [0]
    indices = tf.concat([extra_rows, tf.range(1, rows, dtype=tf.int64)], 0)

    def clipped_sum(clip_factors: tf.Tensor) -> list:
        c = tf.cast(clip_factors, dtype)
        scaled = logit_grads * c[:, None, None]
        item_part = tf.einsum("ban,bad->nd", scaled, queries)  # [n, dim]
        full = tf.concat([tf.zeros([1, dim], dtype), item_part], 0)
        if lookups:
            full = tf.tensor_scatter_nd_add(
                full, lookup_rows[:, None], tf.gather(c, lookup_examples)[:, None] * lookup_vectors
            )
        return [tf.IndexedSlices(tf.gather(full, indices), indices, dense_shape=tf.shape(table, out_type=tf.int64))]

    return LayerGradients(
        variables=[table],
        squared_norms=tf.cast(squared, tf.float32),
        clipped_sum=clipped_sum,
        occurrences=occurrences,
        # Scoring reads every item row, for every example, whatever the data: a shared read.
        shared_rows=tf.range(1, rows, dtype=tf.int64),
        rows_from_lookups=True,  # rows 1..n are shared; row 0 only if a lookup read it
    )


def _rows_of(values: tf.Tensor) -> tf.Tensor:
    """`[B, d]` -> `[B, 1, d]`; user units `[B, k, d]` as they are."""
    return values[:, None, :] if values.shape.rank == 2 else values


def _refuse_shared_calls(layer: DPEmbedding, taps: LayerTaps) -> None:
    if any(c.shared is not None for c in taps.calls):
        raise PrivacyContractError(
            f"ItemEmbedding {layer.name!r} scores queries against all items and is also called inside "
            "a shared computation (a candidate tower): its rule covers one of the two per step. Use the "
            "table either as a full-softmax scorer or inside the candidate tower of "
            "`tfdp_embed.keras2.retrieval.Retrieval`, not both."
        )


def _scoring_squared_norms(queries: tf.Tensor, logit_grads: tf.Tensor) -> tf.Tensor:
    """||G_i^T q_i||^2 = sum_{a,b} (G_ia . G_ib)(q_ia . q_ib) per example, over the scoring calls a, b."""
    qq = tf.matmul(queries, queries, transpose_b=True)  # [B, A, A]
    gg = tf.matmul(logit_grads, logit_grads, transpose_b=True)
    return tf.reduce_sum(qq * gg, axis=[1, 2])


def _lookup_block(layer: DPEmbedding, lookups: list, dtype: tf.DType) -> tuple:
    """(occurrences per call, rows, examples, weighted output gradients `[k, dim]`), one per occurrence k."""
    dim = layer.output_dim
    lookup_rows = tf.zeros([0], tf.int64)
    lookup_examples = tf.zeros([0], tf.int64)
    lookup_vectors = tf.zeros([0, dim], dtype)
    occurrences = []
    for call, grad in lookups:
        occ = layer.occurrences(call_inputs(layer, call), check_range=False)
        occurrences.append(occ)
        grad = tf.reshape(tf.cast(grad, dtype), [-1, dim])
        segments = tf.cast(occ.segments, tf.int32)
        lookup_rows = tf.concat([lookup_rows, tf.cast(occ.ids, tf.int64)], 0)
        examples = tf.cast(tf.gather(occ.segment_examples, segments), tf.int64)
        lookup_examples = tf.concat([lookup_examples, examples], 0)
        vectors = tf.cast(occ.weights, dtype)[:, None] * tf.gather(grad, segments)
        lookup_vectors = tf.concat([lookup_vectors, vectors], 0)
    return occurrences, lookup_rows, lookup_examples, lookup_vectors


def _add_lookup_squared_norms(squared, queries, logit_grads, lookup_rows, lookup_examples, lookup_vectors, batch_size):
    """`squared` `[B]` plus the lookups' share of the squared norms: 2 <G_i^T q_i, L_i> + ||L_i||^2."""
    # Cross term 2 <G_i^T q_i, L_i>: occurrence k on row r >= 1 meets column r - 1 of every scoring call.
    is_item = lookup_rows > 0
    column = tf.maximum(lookup_rows - 1, 0)
    g_at = tf.gather_nd(tf.transpose(logit_grads, [0, 2, 1]), tf.stack([lookup_examples, column], 1))  # [k, A]
    q_at = tf.gather(queries, lookup_examples)  # [k, A, dim]
    cross = tf.reduce_sum(g_at[:, :, None] * q_at * lookup_vectors[:, None, :], axis=[1, 2])
    cross = tf.where(is_item, cross, tf.zeros_like(cross))
    squared += 2.0 * tf.math.unsorted_segment_sum(cross, lookup_examples, batch_size)
    # ||L_i||^2: group occurrences by (example, row) before squaring.
    _, row_index = tf.unique(lookup_rows)
    keys = tf.cast(row_index, tf.int64) * batch_size + lookup_examples
    group_keys, group_index = tf.unique(keys)
    per_group = tf.math.unsorted_segment_sum(lookup_vectors, group_index, tf.size(group_keys))
    return squared + tf.math.unsorted_segment_sum(
        tf.reduce_sum(tf.square(per_group), axis=1), group_keys % batch_size, batch_size
    )


# Lookups in a candidate tower; refused with scoring.
item_embedding_gradients.supports_shared_calls = True  # type: ignore[attr-defined]
item_embedding_gradients.shared_factored = "leaf"  # type: ignore[attr-defined]
# Exact over a unit axis (queries [users, k, d] are k scoring rows of one user): tests/user_level/test_two_tower_units.py.
item_embedding_gradients.handles_unit_axis = True  # type: ignore[attr-defined]


__all__ = ["item_embedding_gradients"]
