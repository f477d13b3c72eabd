"""Keras layers users subclass."""

from tfdp_embed.keras2.layers.embedding import DPEmbedding, EmbeddingOccurrences
from tfdp_embed.keras2.layers.shared_embedding import SharedEmbedding

__all__ = ["DPEmbedding", "EmbeddingOccurrences", "SharedEmbedding"]
