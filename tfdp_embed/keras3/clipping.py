"""Per-example clipping for Keras 3 models: the Keras-free engine (`tfdp_embed.clipping`) with Keras 3's layers.

`default_registry()` adds Keras 3's Dense and LayerNormalization (the
embedding rules match this front end's `DPEmbedding` / `SharedEmbedding`
through `tfdp_embed.layers`), and EinsumDense whose kernel acts on the last
input axis like a Dense (`"...b,bc->...c"`, bias on the output axis or none);
any other layer with weights gets the exact per-example fallback.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence

from tfdp_embed import clipping as _engine
from tfdp_embed.clipping import LayerRegistry, dense_layer_gradients, vectorized_layer_gradients
from tfdp_embed.keras3._keras import keras

_DENSE_LIKE = re.compile(r"^(\.\.\.|[a-z]*)([a-z]),\2([a-z])->\1\3$")


class _AsDense:
    """An `EinsumDense` seen as the Dense it computes (kernel `[d_in, d_out]` on the last axis)."""

    def __init__(self, layer):
        self._layer = layer
        self.kernel, self.activation = layer.kernel, layer.activation
        self.bias = getattr(layer, "bias", None)
        self.use_bias = self.bias is not None

    def __getattr__(self, name):
        return getattr(self._layer, name)


def is_dense_like(layer) -> bool:
    """An EinsumDense whose equation is a Dense on the last axis, with a bias on the output axis or none."""
    equation = getattr(layer, "equation", "").replace(" ", "")
    match = _DENSE_LIKE.match(equation)
    if match is None or len(layer.kernel.shape) != 2:
        return False
    bias = getattr(layer, "bias", None)
    return bias is None or (len(bias.shape) == 1 and bias.shape[0] == layer.kernel.shape[1])


def einsum_dense_layer_gradients(layer, taps, output_grads):
    """Dense ghost norms for a Dense-like `EinsumDense`; the exact fallback for any other equation."""
    if is_dense_like(layer):
        return dense_layer_gradients(_AsDense(layer), taps, output_grads)
    return vectorized_layer_gradients(layer, taps, output_grads)


def default_registry() -> LayerRegistry:
    """The built-in rules for Keras 3 models (see `tfdp_embed.clipping.default_registry`), plus EinsumDense."""
    registry = _engine.default_registry(keras.layers)
    registry.register(keras.layers.EinsumDense, einsum_dense_layer_gradients)
    return registry


@contextlib.contextmanager
def record_taps(layers: Sequence, registry: LayerRegistry | None = None) -> Iterator[list]:
    """`tfdp_embed.clipping.record_taps`, with Keras 3's `default_registry()` when `registry` is None."""
    with _engine.record_taps(layers, registry if registry is not None else default_registry()) as taps:
        yield taps


__all__ = ["default_registry", "einsum_dense_layer_gradients", "is_dense_like", "record_taps"]
