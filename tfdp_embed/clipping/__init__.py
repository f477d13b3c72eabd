"""Per-example clipping without per-example gradients.

`record_taps` records each layer's inputs and outputs, `clipped_step` turns
one backward pass into exact per-example norms and clip factors, and a
`LayerRegistry` maps layer classes to the functions that do it per layer
family (ghost norms for Dense and DPEmbedding, Phantom Clipping for a
`SharedEmbedding` used as input and output embedding, ghost norms with a
cross term for the two-tower `ItemEmbedding`'s lookups plus full softmax,
direct for LayerNorm);
`vectorized_layer_gradients` is the slow exact fallback for anything else.
`shared_computation` marks a data-independent computation every example's
loss depends on (a candidate tower over the catalogue): the rules then get
per-example output gradients for its calls (`tfdp_embed.clipping.shared`).

The engine is Keras-free: it serves the tf-keras and the Keras 3 front end
alike (`layer_kinds`), and each front end's `clipping` module adds its
layers to `default_registry`.

Example:
    >>> registry = default_registry()
    >>> step = clipped_step(taps, loss, tape, registry=registry,
    ...                     fallback=vectorized_layer_gradients, l2_norm_clip=1.0)

References: Li et al. 2022 ghost clipping; Bu et al. 2022 book-keeping.
"""

from __future__ import annotations

from tfdp_embed.clipping.dense import dense_layer_gradients
from tfdp_embed.clipping.embedding import embedding_layer_gradients
from tfdp_embed.clipping.fallback import vectorized_layer_gradients
from tfdp_embed.clipping.item_embedding import item_embedding_gradients
from tfdp_embed.clipping.layer_norm import layer_norm_layer_gradients
from tfdp_embed.clipping.per_example import clipped_step
from tfdp_embed.clipping.phantom import phantom_layer_gradients
from tfdp_embed.clipping.registry import LayerGradients, LayerRegistry, RegistryEntry
from tfdp_embed.clipping.shared import SharedComputation, shared_computation
from tfdp_embed.clipping.taps import record_taps, untapped
from tfdp_embed.layers import EmbeddingLookup, SharedLookup


def default_registry(keras_layers) -> LayerRegistry:
    """A new registry with the built-in rules: SharedEmbedding, DPEmbedding, Dense, LayerNormalization.

    `keras_layers` is the front end's `keras.layers` module (tf-keras' or Keras 3's):
    its Dense and LayerNormalization get the rules. The embedding rules match every
    front end's `DPEmbedding` / `SharedEmbedding` through the Keras-free lookups they
    share (`tfdp_embed.layers`). Each front end's `clipping.default_registry()` calls this.

    SharedEmbedding comes before its base class DPEmbedding so that it wins the lookup.
    DPEmbedding's rule records `lookup` (subclasses override `call` freely); the
    table rules refuse a subclass that overrides what they describe, while a Dense
    or LayerNormalization subclass overriding `call` gets the exact fallback.
    """
    registry = LayerRegistry()
    registry.register(SharedLookup, phantom_layer_gradients, described=("lookup",), if_overridden="refuse")
    registry.register(EmbeddingLookup, embedding_layer_gradients, tapped_method="lookup", if_overridden="refuse")
    registry.register(keras_layers.Dense, dense_layer_gradients)
    registry.register(keras_layers.LayerNormalization, layer_norm_layer_gradients)
    return registry


__all__ = [
    "LayerGradients",
    "LayerRegistry",
    "RegistryEntry",
    "SharedComputation",
    "clipped_step",
    "default_registry",
    "dense_layer_gradients",
    "embedding_layer_gradients",
    "item_embedding_gradients",
    "layer_norm_layer_gradients",
    "phantom_layer_gradients",
    "record_taps",
    "shared_computation",
    "untapped",
    "vectorized_layer_gradients",
]
