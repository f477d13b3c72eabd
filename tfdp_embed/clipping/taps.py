"""Recording what each trainable layer saw and produced during one forward pass.

Per-example clipping without per-example gradients needs, for every layer
that owns trainable weights, its inputs and the gradient of the summed loss
with respect to its outputs ("ghost" norms; Goodfellow 2015, Li et al. 2022,
Bu et al. 2022). `record_taps` swaps each layer's `call` for a recording
wrapper for the duration of a `with` block (inside the traced train step)
and restores it afterwards; the layer classes are never modified.

The method recorded is the one the layer's registry rule reads
(`LayerRegistry.tapped_method`): `DPEmbedding.lookup` for embedding tables,
so that what a subclass's `call` does around the lookup (a scale, a
normalisation) is part of the output gradient the rule sees; `call` for
every other layer.

Calls made inside `tfdp_embed.clipping.shared_computation()` (a candidate
tower run over the catalogue, whose inputs do not depend on the batch) are
recorded with `LayerCall.shared` set: their outputs have no batch axis, and
`tfdp_embed.clipping.shared` turns the summed output gradient into one per
example before the rules run.

A sigmoid or softmax activation lets a Keras loss with `from_logits=False`
read the pre-activation logits directly, past the layer's output; the
rule, which back-propagates from the recorded output, would then see no
gradient at all. The output of such a layer is therefore recorded and
returned as a fresh tensor (`tf.identity`), so the loss is computed from
the output the rule sees (as for any other output of probabilities).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator, Sequence

import tensorflow as tf

from tfdp_embed.clipping import layer_kinds


@dataclasses.dataclass(frozen=True)
class LayerCall:
    """One call of a layer: what `call` received and returned.

    `shared` is the `SharedComputation` the call ran in (None for an
    ordinary per-example call, whose leading axis is the batch).
    """

    args: tuple
    kwargs: dict
    outputs: tf.Tensor
    shared: object = None


class Recording(list):
    """The `LayerTaps` of one `record_taps` block, plus the shared computations run inside it."""

    def __init__(self, taps):
        super().__init__(taps)
        self.shared_computations: list = []
        self.active_shared: list = []
        self.paused = 0  # > 0 inside `untapped()`


_RECORDINGS = threading.local()


def active_recording() -> Recording | None:
    """The innermost `record_taps` block of this thread (None outside any)."""
    stack = getattr(_RECORDINGS, "stack", None)
    return stack[-1] if stack else None


@contextlib.contextmanager
def untapped() -> Iterator[None]:
    """Layer calls inside the block are not recorded: for outputs kept out of the loss.

    For operator-only computations inside a training step (e.g. top-k metrics
    over the catalogue) whose outputs go through `tf.stop_gradient`: they
    contribute nothing to any gradient, and their calls, which have no batch
    axis, must not reach the clipping rules.
    """
    recording = active_recording()
    if recording is not None:
        recording.paused += 1
    try:
        yield
    finally:
        if recording is not None:
            recording.paused -= 1


@dataclasses.dataclass
class LayerTaps:
    """All calls of one layer's tapped method during the recorded forward pass.

    `call_fn` is the layer's original (un-recorded) tapped method, for
    registry functions that need to re-run the layer on one example (the
    fallback, whose layers are always tapped on `call`); `method` is its name.
    """

    layer: layer_kinds.Layer
    call_fn: object
    calls: list = dataclasses.field(default_factory=list)
    method: str = "call"


def call_inputs(layer, call: LayerCall):
    """The first argument of a recorded call (ids, hidden states or dense inputs)."""
    if call.args:
        return call.args[0]
    for name in ("ids", "inputs"):
        if name in call.kwargs:
            return call.kwargs[name]
    raise TypeError(
        f"Per-example clipping of {type(layer).__name__} {layer.name!r} could not find the call's "
        f"inputs among its arguments (keyword arguments: {sorted(call.kwargs)})."
    )


def dense_call_input(layer, call: LayerCall) -> tf.Tensor:
    """`call_inputs`, which must be a dense tensor (the Dense-like rules read its values)."""
    x = call_inputs(layer, call)
    if not isinstance(x, tf.Tensor):
        raise TypeError(
            f"Per-example clipping of {type(layer).__name__} {layer.name!r} needs dense tensor inputs; "
            f"received {type(x).__name__}. Densify the input or register a rule for it."
        )
    return x


def own_trainable_variables(layer) -> list:
    """Trainable variables of `layer` that none of its sub-layers owns."""
    sub: set = set()
    for other in submodules(layer):
        if other is not layer and layer_kinds.is_layer(other):
            sub.update(v.ref() for v in layer_kinds.trainable_tf_variables(other))
    return [v for v in layer_kinds.trainable_tf_variables(layer) if v.ref() not in sub]


def submodules(layer) -> list:
    """Every layer nested in `layer` (tf-keras: `submodules`; Keras 3 has no such attribute)."""
    if hasattr(layer, "submodules"):
        return list(layer.submodules)
    flatten = getattr(layer, "_flatten_layers", None)
    return list(flatten(include_self=False, recursive=True)) if flatten is not None else []


def layers_owning_weights(model) -> list:
    """Every layer (the model included) that owns at least one trainable variable."""
    candidates = [model] + [m for m in submodules(model) if layer_kinds.is_layer(m)]
    seen, out = set(), []
    for layer in candidates:
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        if own_trainable_variables(layer):
            out.append(layer)
    return out


@tf.autograph.experimental.do_not_convert
def _returns_logits_shortcut(layer) -> bool:
    """A sigmoid/softmax activation: Keras losses may read its logits instead of its output."""
    activation = getattr(layer, "activation", None)
    return activation is not None and layer_kinds.activation_name(activation) in ("sigmoid", "softmax")


@tf.autograph.experimental.do_not_convert
def _in_graph(outputs, graph) -> bool:
    """`outputs` were made in `graph` (eagerly when `graph` is None), not in a scratch graph."""
    if graph is None:
        return isinstance(outputs, tf.__internal__.EagerTensor)
    return getattr(outputs, "graph", None) is graph


def _recording_call(tap: LayerTaps, recording: Recording, graph):
    """`tap.call_fn`, recording each of its calls in `graph` into `tap` (and the active shared computation).

    Autograph converts the returned function where Keras converts the
    layer's `call` (a subclassed layer in a traced step): its body is one
    line, so the layer's own method is still converted as before, while the
    bookkeeping (`_record`, plain Python) is not (converting its branches
    took ~0.3 s of the first DP step's trace).
    """
    original = tap.call_fn

    def recording_call(*args, **kwargs):
        return _record(tap, recording, graph, args, kwargs, original(*args, **kwargs))

    return recording_call


@tf.autograph.experimental.do_not_convert
def _record(tap: LayerTaps, recording: Recording, graph, args: tuple, kwargs: dict, outputs):
    """Records one call of `tap`'s method that returned `outputs`; returns what the layer's caller gets."""
    if recording.paused or not _in_graph(outputs, graph):
        return outputs
    if not isinstance(outputs, tf.Tensor):
        raise TypeError(
            f"Per-example clipping needs `{tap.method}` of layer {tap.layer.name!r} "
            f"({type(tap.layer).__name__}) to return one dense tensor; it "
            f"returned {type(outputs).__name__}."
        )
    if _returns_logits_shortcut(tap.layer):
        outputs = tf.identity(outputs)  # the loss must go through the recorded output
    shared = recording.active_shared[-1] if recording.active_shared else None
    call = LayerCall(args=args, kwargs=kwargs, outputs=outputs, shared=shared)
    tap.calls.append(call)
    if shared is not None:
        shared.calls.append(call)
    return outputs


@contextlib.contextmanager
def record_taps(layers: Sequence[layer_kinds.Layer], registry) -> Iterator[list]:
    """Records every call of `layers` inside the block; yields a list of `LayerTaps`.

    Args:
      layers: the layers to record.
      registry: the `LayerRegistry` that will turn the taps into norms (it says
        which method of each layer to record): the front end's
        `clipping.default_registry()` or a registry of your own. Pass the same
        registry to `clipped_step`.

    Only tensor outputs can be tapped: a layer whose tapped method returns a
    nested structure raises `TypeError` naming the layer. The yielded list is a
    `Recording`: it also collects the shared computations of the block.
    """
    methods = [registry.tapped_method(layer) for layer in layers]
    taps = Recording(
        LayerTaps(layer=layer, call_fn=getattr(layer, method), method=method) for layer, method in zip(layers, methods)
    )
    # Keras sometimes runs layers symbolically in a scratch graph (e.g. a Sequential
    # model inferring its shape): only calls in the graph of this block are taps.
    graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
    stack = getattr(_RECORDINGS, "stack", None)
    if stack is None:
        stack = _RECORDINGS.stack = []
    try:
        for tap in taps:
            object.__setattr__(tap.layer, tap.method, _recording_call(tap, taps, graph))
        stack.append(taps)
        yield taps
    finally:
        if stack and stack[-1] is taps:
            stack.pop()
        for tap in taps:
            try:
                object.__delattr__(tap.layer, tap.method)
            except AttributeError:
                pass


__all__ = [
    "LayerCall",
    "LayerTaps",
    "Recording",
    "active_recording",
    "call_inputs",
    "dense_call_input",
    "layers_owning_weights",
    "own_trainable_variables",
    "submodules",
    "record_taps",
    "untapped",
]
