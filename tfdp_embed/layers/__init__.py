"""Keras layers users subclass."""

from tfdp_embed.layers.embedding import DPEmbedding, EmbeddingOccurrences
from tfdp_embed.layers.shared_embedding import SharedEmbedding

__all__ = ["DPEmbedding", "EmbeddingOccurrences", "SharedEmbedding"]
