"""Keras layers users subclass."""

from tfdp_embed.layers.embedding import DPEmbedding, EmbeddingOccurrences

__all__ = ["DPEmbedding", "EmbeddingOccurrences"]
