"""Temporary, per-instance replacements of layers' `call`: deterministic runs and call recording.

Like the clipping taps, these set an instance attribute for the duration
of a `with` block and restore what was there before; no class is modified.
"""

from __future__ import annotations

import contextlib
import dataclasses

import tensorflow as tf

from tfdp_embed.clipping import layer_kinds
from tfdp_embed.clipping.taps import submodules

# Layers whose training-mode output is random and whose inference output is the identity (any Keras).
STOCHASTIC_LAYERS = ("Dropout", "GaussianNoise", "GaussianDropout", "AlphaDropout")  # SpatialDropout subclasses Dropout


def is_stochastic(layer) -> bool:
    """`layer` is one of `STOCHASTIC_LAYERS` of an imported Keras."""
    return any(layer_kinds.is_instance(layer, name) for name in STOCHASTIC_LAYERS)


@dataclasses.dataclass
class LayerCall:
    """One finished call: the layer, the layer whose call made it, flat inputs and outputs."""

    layer: object
    parent: object
    inputs: list
    outputs: list


def all_layers(model) -> list:
    """`model` and every layer under it, each once."""
    seen, out = set(), []
    for layer in [model, *submodules(model)]:
        if layer_kinds.is_layer(layer) and id(layer) not in seen:
            seen.add(id(layer))
            out.append(layer)
    return out


@contextlib.contextmanager
def replaced_calls(layers, make_call):
    """Sets `layer.call = make_call(layer, layer.call)` for each layer inside the block."""
    previous = []
    try:
        for layer in layers:
            previous.append((layer, layer.__dict__.get("call")))
            object.__setattr__(layer, "call", make_call(layer, layer.call))
        yield
    finally:
        for layer, old in reversed(previous):
            if old is None:
                object.__delattr__(layer, "call")
            else:
                object.__setattr__(layer, "call", old)


@contextlib.contextmanager
def deterministic(model, layers: list | None = None):
    """Inside the block, the known stochastic layers of `model` return their input (as in inference).

    Layers with a `frozen_randomness()` context manager (e.g. a retrieval task
    drawing one negative sample per training step) are entered too, so that
    re-running a step draws the same randomness. `layers`: `all_layers(model)`
    when the caller has it (walking a large model's layers takes a while).
    """
    layers = all_layers(model) if layers is None else layers
    stochastic = [layer for layer in layers if is_stochastic(layer)]

    def identity(layer, original):
        def call(inputs, *args, **kwargs):
            return tf.identity(inputs)

        return call

    with frozen_randomness(model, layers), replaced_calls(stochastic, identity):
        yield


@contextlib.contextmanager
def frozen_randomness(model, layers: list | None = None):
    """Inside the block, layers with a `frozen_randomness()` context manager keep their per-step randomness.

    A retrieval task draws one negative sample per training step from a step
    counter: a check's forward pass must not advance it, or the first
    training step would not use step 0's sample. `layers`: as `deterministic`.
    """
    with contextlib.ExitStack() as stack:
        for layer in all_layers(model) if layers is None else layers:
            freeze = getattr(layer, "frozen_randomness", None)
            if callable(freeze):
                stack.enter_context(freeze())
        yield


@contextlib.contextmanager
def recorded_calls(model):
    """Yields a list that collects a `LayerCall` per finished layer call, in completion order."""
    records, stack = [], []

    def recording(layer, original):
        def call(*args, **kwargs):
            parent = stack[-1] if stack else None
            stack.append(layer)
            try:
                outputs = original(*args, **kwargs)
            finally:
                stack.pop()
            records.append(LayerCall(layer, parent, tf.nest.flatten((args, kwargs)), tf.nest.flatten(outputs)))
            return outputs

        return call

    with replaced_calls(all_layers(model), recording):
        yield records


__all__ = [
    "STOCHASTIC_LAYERS",
    "LayerCall",
    "all_layers",
    "deterministic",
    "frozen_randomness",
    "recorded_calls",
    "replaced_calls",
]
