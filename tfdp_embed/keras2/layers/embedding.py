"""`DPEmbedding` for tf-keras: the lookup of `tfdp_embed.layers.EmbeddingLookup` on a tf-keras layer.

The layer looks rows up with `tf.gather`, so the table's gradient is a
`tf.IndexedSlices` over the rows a batch touches, and exposes the lookup as
data (`occurrences`) for the clipping rules (`tfdp_embed.clipping`). What it
does and how to subclass it: `tfdp_embed.layers.lookup`.

Example:
    >>> layer = DPEmbedding(vocabulary_size=1000, output_dim=8, combiner="mean")
    >>> pooled = layer(tf.ragged.constant([[1, 2, 2], [7]]))  # shape [2, 8]
"""

from __future__ import annotations

from tfdp_embed.keras2._keras import keras
from tfdp_embed.layers.lookup import EmbeddingLookup, EmbeddingOccurrences, read_hooks_removed


@keras.saving.register_keras_serializable(package="tfdp_embed")
class DPEmbedding(EmbeddingLookup, keras.layers.Layer):
    """Embedding table for DP training; subclass it freely.

    Accepts, per example, one id (`[batch]`), a fixed number of ids
    (`[batch, n]`, returning `[batch, n, dim]` without a combiner), or a
    variable number of ids (`tf.RaggedTensor` / `tf.SparseTensor`, which need
    a combiner). Ids are ints in `[0, vocabulary_size)`; with
    `hash_ids=True`, strings or ints of any range are hashed into
    `vocabulary_size` buckets instead.

    Args:
      vocabulary_size: number of table rows.
      output_dim: embedding dimension.
      combiner: None (no pooling), "sum", "mean" or "sqrtn" over each example's ids.
      hash_ids: hash raw ids (strings or ints) into `vocabulary_size` buckets.
      embeddings_initializer: Keras initializer for the table.
      **kwargs: passed to `keras.layers.Layer`.

    Raises:
      ValueError: on bad arguments; `tf.errors.InvalidArgumentError` at call
        time for an id outside `[0, vocabulary_size)` when not hashing.

    References: LazyDP §5 (read hook), DP-FEST §3 (sparse row gradients).
    """

    def __init__(
        self,
        vocabulary_size: int,
        output_dim: int,
        *,
        combiner: str | None = None,
        hash_ids: bool = False,
        embeddings_initializer="uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self._init_lookup(vocabulary_size, output_dim, combiner=combiner, hash_ids=hash_ids)
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)

    def build(self, input_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.vocabulary_size, self.output_dim),
            initializer=self.embeddings_initializer,
            trainable=True,
            # As keras.layers.Embedding: the table stays a plain float32 variable under
            # mixed precision (rows are read in float32, the output cast to the compute dtype).
            experimental_autocast=False,
        )
        super().build(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            self._lookup_config(),
            embeddings_initializer=keras.initializers.serialize(self.embeddings_initializer),
        )
        return config


__all__ = ["DPEmbedding", "EmbeddingOccurrences", "read_hooks_removed"]
