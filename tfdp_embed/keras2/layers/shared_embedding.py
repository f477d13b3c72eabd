"""`SharedEmbedding` for tf-keras: one table used as the input embedding and the output projection.

The math and the modes are in `tfdp_embed.layers.shared_lookup`; the per-example
clipping rule is Phantom Clipping (`tfdp_embed.clipping.phantom`).

Example:
    >>> items = SharedEmbedding(vocabulary_size=1000, output_dim=64, padding_id=0)
    >>> seq = items(tf.constant([[0, 0, 5, 7]]))        # [1, 4, 64]
    >>> logits = items(seq[:, -1], mode="logits")       # [1, 1000]
"""

from __future__ import annotations

from tfdp_embed.keras2._keras import keras
from tfdp_embed.keras2.layers.embedding import DPEmbedding
from tfdp_embed.layers.shared_lookup import MODES, SharedLookup, check_shared_arguments


@keras.saving.register_keras_serializable(package="tfdp_embed")
class SharedEmbedding(SharedLookup, DPEmbedding):
    """An item table that embeds ids and scores hidden states against all items.

    `layer(ids)` looks rows up (no combiner: one output row per id);
    `layer(hidden, mode="logits")` returns `hidden @ table^T` over all
    `vocabulary_size` rows.

    Args:
      vocabulary_size: number of table rows (items, padding included).
      output_dim: embedding dimension d.
      padding_id: optional id that reads zeros and receives no lookup gradient
        (keyword-only; None: every id is a real item).
      embeddings_initializer: Keras initializer for the table.
      **kwargs: passed to `keras.layers.Layer`.

    Raises:
      ValueError: on bad arguments (also `combiner` or `hash_ids`, which a table
        scored over all rows cannot have); at call time, `ValueError` for an
        unknown `mode` or a hidden width other than `output_dim`, `TypeError` for
        float ids or integer hidden states, `tf.errors.InvalidArgumentError` for
        an id outside `[0, vocabulary_size)`.

    References: DPFormer §3 and App. A.2 (Phantom Clipping of the shared table).
    """

    def __init__(
        self,
        vocabulary_size: int,
        output_dim: int,
        *,
        padding_id: int | None = None,
        embeddings_initializer="uniform",
        **kwargs,
    ):
        check_shared_arguments(vocabulary_size, padding_id, kwargs)
        super().__init__(vocabulary_size, output_dim, embeddings_initializer=embeddings_initializer, **kwargs)
        self.padding_id = padding_id

    def get_config(self):
        return self._shared_config(super().get_config())


__all__ = ["MODES", "SharedEmbedding"]
