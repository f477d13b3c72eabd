"""The registry of per-example gradient-norm functions, matched with `isinstance`.

A registry function receives one layer's recorded calls and the gradient of
the summed per-example loss with respect to each call's outputs, and
returns a `LayerGradients`: exact per-example squared gradient norms over
the layer's own trainable weights, and a function that builds the clipped
sum of per-example gradients, sum_i c_i * grad_i, from clip factors c
("book-keeping", Bu et al. 2022: no second backward pass).

Registries are passed explicitly; lookup walks the entries in order and
takes the first whose class the layer is an instance of, so a user's
subclass of `DPEmbedding` is handled like the base class.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from tfdp_embed._keras import tf


@dataclasses.dataclass
class LayerGradients:
    """Per-example gradient information of one layer.

    Attributes:
      variables: the layer's own trainable variables, in the order that
        `clipped_sum` returns gradients for them.
      squared_norms: float32 `[batch]`, sum over `variables` of
        ||d loss_i / d v||^2 for each example i.
      clipped_sum: maps clip factors `[batch]` to a list of gradients,
        sum_i c_i * d loss_i / d v for each v: a dense tensor, or for
        embedding tables a `tf.IndexedSlices` with unique row indices.
    """

    variables: list
    squared_norms: tf.Tensor
    clipped_sum: Callable[[tf.Tensor], list]
    occurrences: list | None = None  # embedding layers: one EmbeddingOccurrences per call


RegistryFunction = Callable  # (layer, taps: LayerTaps, output_grads: list[Tensor]) -> LayerGradients


class LayerRegistry:
    """An ordered mapping from layer classes to registry functions."""

    def __init__(self, entries: Sequence[tuple[type, RegistryFunction]] = ()):
        self._entries: list[tuple[type, RegistryFunction]] = []
        for layer_class, fn in entries:
            self.register(layer_class, fn)

    def register(self, layer_class: type, fn: RegistryFunction) -> None:
        """Adds an entry; later entries for subclasses should come first to win."""
        if not isinstance(layer_class, type):
            raise TypeError(f"`layer_class` must be a class; received {layer_class!r}.")
        if not callable(fn):
            raise TypeError(f"`fn` must be callable; received {fn!r}.")
        self._entries.append((layer_class, fn))

    def lookup(self, layer) -> RegistryFunction | None:
        """The first registered function whose class `layer` is an instance of."""
        for layer_class, fn in self._entries:
            if isinstance(layer, layer_class):
                return fn
        return None

    def copy(self) -> "LayerRegistry":
        return LayerRegistry(self._entries)

    def __iter__(self):
        return iter(self._entries)
