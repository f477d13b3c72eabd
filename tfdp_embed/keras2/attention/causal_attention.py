"""Causal scaled dot-product attention with no weights of its own (optionally Re-Attention).

    A = softmax(Q K^T / sqrt(d) - correction + mask),   out = A V

Queries, keys and values come from `keras.layers.Dense` projections that
the caller owns, so every trainable weight of a Transformer block sits in a
layer the clipping registry covers exactly (Dense, LayerNormalization,
DPEmbedding): this layer owns nothing and is never tapped. Key j is visible
to query i when j <= i and key j is not padding; a query that sees no key
(a padded position under left padding) gets uniform weights over masked
keys, finite, and its output is ignored by the masked loss.

With `correction` (`re_attention_correction`), the logits lose
C_i sigma_j^2 / 2: DPFormer's Re-Attention (Alg. 1 line 8).

Example:
    >>> attention = CausalSelfAttention(dropout=0.2)
    >>> out = attention(q, k, v, key_mask=ids > 0)     # [B, L, d]

References: Vaswani et al. 2017; Kang & McAuley 2018 (SASRec causal
attention); DPFormer §4 and Alg. 1.
"""

from __future__ import annotations

from tfdp_embed.keras2._keras import keras, tf

_MASKED = -1e9


class CausalSelfAttention(keras.layers.Layer):
    """Single-head causal attention over `[B, L, d]` projections; no trainable weights.

    Args:
      dropout: dropout rate on the attention weights (training only), in [0, 1).
      **kwargs: passed to `keras.layers.Layer`.

    Raises:
      ValueError: a dropout rate outside [0, 1); at call time, inputs that are
        not `[B, L, d]` with matching shapes.
    """

    def __init__(self, *, dropout: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        if not 0 <= dropout < 1:
            raise ValueError(f"`dropout` must lie in [0, 1); received {dropout!r}.")
        self.dropout = float(dropout)
        self._dropout = keras.layers.Dropout(self.dropout)

    def attention_weights(self, query, key, key_mask=None, correction=None):
        """A `[B, L, L]` (query i, key j): causal, padding-masked, optionally Re-Attention-corrected."""
        if query.shape.rank != 3 or key.shape.rank != 3:
            raise ValueError(
                f"CausalSelfAttention {self.name!r} takes [batch, length, dim] queries and keys; received "
                f"shapes {query.shape} and {key.shape}."
            )
        d = tf.cast(tf.shape(query)[-1], query.dtype)
        logits = tf.matmul(query, key, transpose_b=True) / tf.sqrt(d)
        if correction is not None:
            logits = logits - tf.cast(correction, logits.dtype)
        length = tf.shape(query)[1]
        visible = tf.linalg.band_part(tf.ones([length, length], tf.bool), -1, 0)[None]  # j <= i
        if key_mask is not None:
            visible = tf.logical_and(visible, tf.cast(key_mask, tf.bool)[:, None, :])
        logits = tf.where(visible, logits, tf.cast(_MASKED, logits.dtype))
        return tf.nn.softmax(logits, axis=-1)

    def call(self, query, key, value, key_mask=None, correction=None, training=None, return_weights=False):
        """Returns A V `[B, L, d_v]` (and A if `return_weights`)."""
        weights = self.attention_weights(query, key, key_mask, correction)
        out = tf.matmul(self._dropout(weights, training=training), value)
        return (out, weights) if return_weights else out

    def get_config(self):
        return {**super().get_config(), "dropout": self.dropout}


__all__ = ["CausalSelfAttention"]
