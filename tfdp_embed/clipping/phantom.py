"""Phantom Clipping: exact per-example norms of a table shared by input and output.

A `SharedEmbedding` E `[V, d]` is read twice per example i: as a lookup of
its ids x_p (output gradient a_p `[d]` at each looked-up position p) and
as the output projection r_q = h_q E^T of its hidden states h_q `[d]`
(logits gradient z_q `[V]` at each scored position q). Its gradient is

    G_i = sum_p e_{x_p} a_p^T  +  sum_q z_q h_q^T          (lookup + projection, eq. 17)

and, without building any `[V, d]` per-example gradient (eq. 18-22),

    ||G_i||^2 = sum_{p,p'} [x_p = x_p'] <a_p, a_p'>        (lookup, eq. 19; repeated ids add up)
              + sum_{q,q'} <z_q, z_q'> <h_q, h_q'>          (projection, eq. 20-21, Gram form)
              + 2 sum_{p,q} z_q[x_p] <a_p, h_q>             (cross term, eq. 22: an index, no matmul)

over every embed call (positions p) and logits call (positions q) of the
layer. Extra memory is O(B (P^2 + Q^2 + PQ)) — O(B L^2) for sequences of
length L — never O(B V d); the projection Gram costs O(B Q^2 V) flops, as
much as one more logits product when Q ~ d. The paper's ||grad e_c||^2 with
grad e_{i,c} = sum_q z_q h_q^T `[V, d]` is computed here in Gram form, so
that it is not materialised per example.

Padded positions (`padding_id`) have a_p = 0 (the layer zeroes them), so
they drop out of the lookup and cross terms. Scoring `[B, d]` (one
position per example) and `[B, L, d]` (every position) both work.

The clipped sum sum_i c_i G_i is dense, since the softmax over all items
touches every row: sum_i Z_i^T (c_i H_i) plus the lookup rows scattered
in, returned as a `tf.IndexedSlices` over all rows (indices 0..V-1,
unique) so that every mechanism's table path handles it. When the layer
was only used for lookups in a step the sparse `DPEmbedding` rule is used.
`occurrences` list the lookups only: mechanisms that choose rows from them
(DP-AdaFEST's contribution map) see the rows that were looked up, while the
gradient covers every row.

Example:
    >>> registry = LayerRegistry([(SharedEmbedding, phantom_layer_gradients)])

References: DPFormer (Zhao et al.) §3.2 Claim 3.1, App. A.2 eq. (16)-(22);
Li et al. 2022 ghost clipping; Bu et al. 2022 book-keeping.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tfdp_embed.clipping.embedding import embedding_layer_gradients
from tfdp_embed.clipping.registry import LayerGradients
from tfdp_embed.clipping.taps import LayerCall, LayerTaps, call_inputs
from tfdp_embed.layers.shared_lookup import MODES
from tfdp_embed.layers.shared_lookup import SharedLookup as SharedEmbedding


def phantom_layer_gradients(
    layer: SharedEmbedding, taps: LayerTaps, output_grads: Sequence[tf.Tensor]
) -> LayerGradients:
    """Exact per-example squared norms and the clipped sum of a shared table.

    ||G_i||^2 = lookup Gram + projection Gram + 2 * cross term (module docstring, eq. 16).

    Args:
      layer: a `SharedEmbedding` (or subclass).
      taps: the layer's recorded calls, each `mode="embed"` (int ids `[B]` or
        `[B, L]`) or `mode="logits"` (float hidden `[B, d]` or `[B, L, d]`).
      output_grads: d(sum_i loss_i)/d(output) of each call (`[B, (L,) d]` for
        lookups, `[B, (L,) V]` for logits).

    Returns:
      `LayerGradients` over `[layer.embeddings]`; `clipped_sum` returns a
      `tf.IndexedSlices` over all V rows when a logits call was made (over the
      touched rows otherwise); `occurrences` holds one `EmbeddingOccurrences`
      per embed call.

    Raises:
      ValueError: if a recorded call has a mode other than "embed" / "logits".
      TypeError: if a call's ids or hidden states cannot be found among its arguments.

    References: DPFormer App. A.2 eq. (16)-(22); Bu et al. 2022 book-keeping.
    """
    modes = [_mode_of(layer, call) for call in taps.calls]
    if "logits" not in modes:
        return embedding_layer_gradients(layer, taps, output_grads)
    table = layer.embeddings
    dtype = table.dtype.base_dtype
    vocab, dim = int(table.shape[0]), int(table.shape[1])
    occurrences, ids, lookup_grads, h, z = _split_calls(layer, taps, modes, output_grads, dtype)
    # Projection term (eq. 20-21): sum_{q,q'} <z_q, z_q'> <h_q, h_q'>, a [B, Q, Q] Gram.
    squared = _gram_product(z, h)
    if ids:
        x = tf.concat(ids, axis=1)  # [B, P]
        a = tf.concat(lookup_grads, axis=1)  # [B, P, d], zero at padding
        squared = _add_lookup_and_cross_terms(squared, x, a, z, h)
    else:
        x = a = None

    def clipped_sum(clip_factors: tf.Tensor) -> list:
        c = tf.cast(clip_factors, dtype)[:, None, None]
        # sum_i Z_i^T (c_i H_i): [V, d], scaling the small factor, not the [B, Q, V] one.
        values = tf.matmul(tf.reshape(z, [-1, vocab]), tf.reshape(h * c, [-1, dim]), transpose_a=True)
        if x is not None:
            values = tf.tensor_scatter_nd_add(values, tf.reshape(x, [-1, 1]), tf.reshape(a * c, [-1, dim]))
        rows = tf.range(vocab, dtype=tf.int64)
        return [tf.IndexedSlices(values, rows, dense_shape=tf.shape(table, out_type=tf.int64))]

    return LayerGradients(
        variables=[table],
        squared_norms=tf.cast(squared, tf.float32),
        clipped_sum=clipped_sum,
        occurrences=occurrences,
    )


def _split_calls(layer: SharedEmbedding, taps: LayerTaps, modes: list, output_grads: Sequence[tf.Tensor], dtype):
    """(occurrences, ids `[B, P_k]` and lookup gradients `[B, P_k, d]` per embed call, h `[B, Q, d]`, z `[B, Q, V]`).

    The lookup gradients are zero at padding; h and z concatenate the logits calls' positions.
    """
    vocab, dim = int(layer.embeddings.shape[0]), int(layer.embeddings.shape[1])
    batch_size = tf.shape(output_grads[0])[0]
    ids, lookup_grads, hidden, logit_grads, occurrences = [], [], [], [], []
    for call, mode, grad in zip(taps.calls, modes, output_grads):
        inputs = call_inputs(layer, call)
        if mode == "embed":
            occurrences.append(layer.occurrences(inputs, check_range=False))
            x = tf.reshape(tf.cast(inputs, tf.int64), [batch_size, -1])  # [B, P_k]
            a = tf.reshape(tf.cast(grad, dtype), [batch_size, -1, dim])
            ids.append(x)
            lookup_grads.append(a * layer.padding_weights(x, dtype)[..., None])
        else:
            hidden.append(tf.reshape(tf.cast(inputs, dtype), [batch_size, -1, dim]))
            logit_grads.append(tf.reshape(tf.cast(grad, dtype), [batch_size, -1, vocab]))
    return occurrences, ids, lookup_grads, tf.concat(hidden, axis=1), tf.concat(logit_grads, axis=1)


def _add_lookup_and_cross_terms(squared: tf.Tensor, x: tf.Tensor, a: tf.Tensor, z: tf.Tensor, h: tf.Tensor):
    """`squared` plus the lookup term (eq. 19) and twice the cross term (eq. 22), per example."""
    # Lookup term (eq. 19): sum_{p,p'} [x_p = x_p'] <a_p, a_p'>.
    same_id = tf.cast(tf.equal(x[:, :, None], x[:, None, :]), a.dtype)
    squared += tf.reduce_sum(same_id * tf.matmul(a, a, transpose_b=True), axis=[1, 2])
    # Cross term (eq. 22): sum_{p,q} z_q[x_p] <a_p, h_q>; z_q[x_p] is a gather.
    z_at_ids = tf.gather(z, x, axis=2, batch_dims=1)  # [B, Q, P]
    return squared + 2.0 * tf.reduce_sum(z_at_ids * tf.matmul(h, a, transpose_b=True), axis=[1, 2])


def _gram_product(z: tf.Tensor, h: tf.Tensor) -> tf.Tensor:
    """||Z_i^T H_i||_F^2 per example without the [V, d] product: sum(Z Z^T * H H^T)."""
    if z.shape[1] == 1:  # one scored position: ||z||^2 ||h||^2
        return tf.reduce_sum(tf.square(z), axis=[1, 2]) * tf.reduce_sum(tf.square(h), axis=[1, 2])
    zz = tf.matmul(z, z, transpose_b=True)  # [B, Q, Q]
    hh = tf.matmul(h, h, transpose_b=True)
    return tf.reduce_sum(zz * hh, axis=[1, 2])


def _mode_of(layer, call: LayerCall) -> str:
    mode = call.args[1] if len(call.args) > 1 else call.kwargs.get("mode", "embed")
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(
            f"Phantom Clipping of SharedEmbedding {layer.name!r}: a call used `mode`={mode!r}; allowed: {MODES}."
        )
    return mode


__all__ = ["phantom_layer_gradients"]
