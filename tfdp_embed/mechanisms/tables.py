"""What a mechanism needs of an embedding table: the front end's embedding layer provides it.

The core never imports a Keras layer: `tfdp_embed.keras2.DPEmbedding` (and a
Keras 3 layer alike) satisfies this protocol.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import tensorflow as tf


@runtime_checkable
class EmbeddingTable(Protocol):
    """An embedding table a mechanism noises.

    Attributes:
      name: unique within the model (mechanism options such as per-table
        thresholds are keyed by it).
      embeddings: the `[vocabulary_size, output_dim]` variable.
      vocabulary_size: rows.
      output_dim: columns.
    """

    name: str
    embeddings: tf.Variable
    vocabulary_size: int
    output_dim: int

    def set_read_hook(self, hook) -> None:
        """Routes every lookup through `hook.gather` (None: plain reads); LazyDP's catch-up uses it."""


__all__ = ["EmbeddingTable"]
