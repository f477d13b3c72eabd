"""Keras layers users subclass."""

from tfdp_embed.keras2.layers.embedding import DPEmbedding, EmbeddingOccurrences
from tfdp_embed.keras2.layers.shared_embedding import SharedEmbedding
from tfdp_embed.keras2.layers.stacked_embedding import StackedEmbedding, stacked_tables

__all__ = ["DPEmbedding", "EmbeddingOccurrences", "SharedEmbedding", "StackedEmbedding", "stacked_tables"]
