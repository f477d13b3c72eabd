"""Per-example clipping for tf-keras models: the Keras-free engine (`tfdp_embed.clipping`) with tf-keras' layers.

Everything of `tfdp_embed.clipping` is here, plus `default_registry()` with
tf-keras' Dense and LayerNormalization, and `record_taps` defaulting to it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from tfdp_embed import clipping as _engine
from tfdp_embed.clipping import (
    LayerGradients,
    LayerRegistry,
    RegistryEntry,
    SharedComputation,
    clipped_step,
    dense_layer_gradients,
    embedding_layer_gradients,
    item_embedding_gradients,
    layer_norm_layer_gradients,
    phantom_layer_gradients,
    shared_computation,
    untapped,
    vectorized_layer_gradients,
)
from tfdp_embed.keras2._keras import keras


def default_registry() -> LayerRegistry:
    """The built-in rules for tf-keras models (see `tfdp_embed.clipping.default_registry`)."""
    return _engine.default_registry(keras.layers)


@contextlib.contextmanager
def record_taps(layers: Sequence, registry: LayerRegistry | None = None) -> Iterator[list]:
    """`tfdp_embed.clipping.record_taps`, with tf-keras' `default_registry()` when `registry` is None."""
    with _engine.record_taps(layers, registry if registry is not None else default_registry()) as taps:
        yield taps


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
