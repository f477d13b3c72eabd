"""The Keras-free part of `SharedEmbedding` (both front ends): one table used as the input embedding and the output projection.

Sequential recommenders (SASRec, DPFormer) tie the item embedding that
reads the history to the output layer that scores the next item over the
whole catalogue:

    embed:  e_l = E[x_l]                       ids [B, L] -> [B, L, d]
    logits: r   = h E^T                        hidden [B, (L,) d] -> [B, (L,) V]

Both uses go through Keras `__call__` and `call(inputs, mode=...)`, so the
per-example clipping taps (`tfdp_embed.clipping.taps`) record each call
with its mode, and the Phantom Clipping rule
(`tfdp_embed.clipping.phantom`) computes the exact per-example gradient
norm of the shared table from them. The table's gradient is dense (the
softmax over all items touches every row).

With `padding_id` set, that id reads a zero vector and the table gets no
gradient from it (SASRec multiplies padded positions by a 0 mask); its row
still scores like any other in logits mode.

Example:
    >>> items = SharedEmbedding(vocabulary_size=1000, output_dim=64, padding_id=0)
    >>> seq = items(tf.constant([[0, 0, 5, 7]]))        # [1, 4, 64]
    >>> logits = items(seq[:, -1], mode="logits")       # [1, 1000]

References: DPFormer (Zhao et al.) §3.1 (parameter sharing), App. A.2;
Kang & McAuley 2018 (SASRec, shared item embedding).
"""

from __future__ import annotations

import tensorflow as tf

from tfdp_embed.layers.lookup import EmbeddingLookup, EmbeddingOccurrences

MODES = ("embed", "logits")


def check_shared_arguments(vocabulary_size: int, padding_id, kwargs: dict) -> None:
    """Refuses `combiner`/`hash_ids` (popped from `kwargs`) and a `padding_id` outside the table."""
    for name, allowed in (("combiner", None), ("hash_ids", False)):
        if name in kwargs and kwargs.pop(name) != allowed:
            raise ValueError(
                f"SharedEmbedding does not take `{name}`: its rows are both looked up "
                "one id at a time and scored as the output layer over all items. Use "
                "DPEmbedding for pooled or hashed inputs."
            )
    if padding_id is not None and (
        isinstance(padding_id, bool) or not isinstance(padding_id, int) or not 0 <= padding_id < vocabulary_size
    ):
        raise ValueError(f"`padding_id` must be None or an int in [0, {vocabulary_size}); received {padding_id!r}.")


class SharedLookup(EmbeddingLookup):
    """The lookup and the output projection of a `SharedEmbedding`; the layer sets `padding_id`."""

    padding_id: int | None = None

    # -- ids ----------------------------------------------------------------
    def occurrences(self, ids, *, check_range: bool = True) -> EmbeddingOccurrences:
        """Like `DPEmbedding.occurrences`, without the padding occurrences.

        Padded positions read zeros, so they add nothing to any row's gradient
        and touch no row (the segments of the other positions are unchanged).
        """
        self._check_ids(ids)
        occ = super().occurrences(ids, check_range=check_range)
        if self.padding_id is None:
            return occ
        keep = tf.not_equal(occ.ids, tf.cast(self.padding_id, occ.ids.dtype))
        return EmbeddingOccurrences(
            ids=tf.boolean_mask(occ.ids, keep),
            segments=tf.boolean_mask(occ.segments, keep),
            weights=tf.boolean_mask(occ.weights, keep),
            num_segments=occ.num_segments,
            segment_examples=occ.segment_examples,
            batch_size=occ.batch_size,
        )

    def padding_weights(self, ids: tf.Tensor, dtype) -> tf.Tensor:
        """1 for real ids, 0 for `padding_id` (all ones without padding); shape of `ids`."""
        if self.padding_id is None:
            return tf.ones(tf.shape(ids), dtype)
        return tf.cast(tf.not_equal(ids, tf.cast(self.padding_id, ids.dtype)), dtype)

    def _check_ids(self, ids) -> None:
        if isinstance(ids, (tf.RaggedTensor, tf.SparseTensor)):
            raise TypeError(
                f"SharedEmbedding {self.name!r} takes dense ids of shape [batch] or "
                f"[batch, length] (pad sequences, e.g. with `padding_id`); received a "
                f"{type(ids).__name__}."
            )
        dtype = tf.as_dtype(getattr(ids, "dtype", tf.convert_to_tensor(ids).dtype))
        if not dtype.is_integer:
            raise TypeError(
                f"SharedEmbedding {self.name!r} in mode 'embed' needs integer ids; received "
                f"dtype {dtype.name}. To score hidden states against all items call it "
                'with `mode="logits"`.'
            )

    # -- forward ------------------------------------------------------------
    def call(self, inputs, mode: str = "embed"):
        """Looks ids up (`mode="embed"`) or scores hidden states against all rows (`"logits"`).

        Args:
          inputs: int ids `[B]` / `[B, L]` for "embed"; float hidden states
            `[..., output_dim]` for "logits".
          mode: "embed" or "logits".

        Returns:
          "embed": `[B, (L,) output_dim]` rows (zeros at `padding_id`);
          "logits": `[..., vocabulary_size]` scores `inputs @ table^T`.
        """
        if not isinstance(mode, str) or mode not in MODES:
            raise ValueError(f"SharedEmbedding {self.name!r}: `mode` must be one of {MODES}; received {mode!r}.")
        if mode == "logits":
            return self._logits(inputs)
        self._check_ids(inputs)
        rows = super().call(inputs)
        if self.padding_id is None:
            return rows
        ids = tf.convert_to_tensor(inputs)
        return rows * self.padding_weights(ids, rows.dtype)[..., None]

    def _logits(self, hidden):
        if isinstance(hidden, (tf.RaggedTensor, tf.SparseTensor)):
            raise TypeError(
                f"SharedEmbedding {self.name!r} in mode 'logits' takes a dense float tensor "
                f"[..., {self.output_dim}]; received a {type(hidden).__name__}."
            )
        hidden = tf.convert_to_tensor(hidden)
        if not hidden.dtype.is_floating:
            raise TypeError(
                f"SharedEmbedding {self.name!r} in mode 'logits' needs float hidden states "
                f"[..., {self.output_dim}]; received dtype {hidden.dtype.name}. To look ids "
                'up call it with `mode="embed"` (the default).'
            )
        if hidden.shape.rank is not None and hidden.shape.rank < 2:
            raise ValueError(
                f"SharedEmbedding {self.name!r} in mode 'logits' takes hidden states of shape "
                f"[batch, {self.output_dim}] or [batch, length, {self.output_dim}]; received "
                f"shape {hidden.shape}."
            )
        if hidden.shape[-1] is not None and hidden.shape[-1] != self.output_dim:
            raise ValueError(
                f"SharedEmbedding {self.name!r} in mode 'logits': the last dimension of the "
                f"hidden states must equal `output_dim`={self.output_dim}; received shape "
                f"{hidden.shape}."
            )
        hook = self._active_read_hook()
        if hook is not None:
            # The output projection reads every row.
            hook(tf.range(self.vocabulary_size, dtype=tf.int64))
        with self._own_read():
            table = tf.cast(self.embeddings, self.compute_dtype)
        hidden = tf.cast(hidden, self.compute_dtype)
        flat = tf.reshape(hidden, [-1, self.output_dim])
        logits = tf.matmul(flat, table, transpose_b=True)
        out_shape = tf.concat([tf.shape(hidden)[:-1], [self.vocabulary_size]], 0)
        logits = tf.reshape(logits, out_shape)
        logits.set_shape(hidden.shape[:-1].concatenate([self.vocabulary_size]))
        return logits

    def _shared_config(self, config: dict) -> dict:
        config.pop("combiner", None)
        config.pop("hash_ids", None)
        config["padding_id"] = self.padding_id
        return config


__all__ = ["MODES", "SharedLookup", "check_shared_arguments"]
