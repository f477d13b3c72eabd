"""Per-example gradients for layers without a registry entry (slow but exact).

For a layer with no ghost-norm rule, the layer's original `call` is re-run
on each example alone inside `tf.vectorized_map`, and that example's output
gradient is back-propagated to the layer's *own* trainable variables:

    grad_i = sum_k d/dv <call_k(x_{k,i}), g_{k,i}>  over the layer's calls k,

which materialises `[batch, *v.shape]` for every own variable v. This is
fine for small layers (a convolution, a custom scale) and a warning, once
per layer, says which layer took this path so that a rule can be
registered. The re-run must reproduce the recorded forward pass: layers
that draw randomness in `call` (dropout inside the layer) are not exact.
The re-run must not write state either (a batch-normalisation layer in
training mode would fold single training examples into its moving
statistics): a re-run that would assign to any variable raises
`PrivacyContractError` at trace time, before it runs.

Example:
    >>> info = vectorized_layer_gradients(layer, taps, output_grads)

References: Goodfellow 2015 (per-example gradients); Agarwal et al. 2019
(vectorized per-example gradients via pfor); Bu et al. 2022 book-keeping.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Sequence

import tensorflow as tf

from tfdp_embed.clipping import layer_kinds
from tfdp_embed.clipping.registry import LayerGradients
from tfdp_embed.clipping.taps import LayerTaps, own_trainable_variables
from tfdp_embed.errors import PrivacyContractError

_WARNED: weakref.WeakSet = weakref.WeakSet()


def vectorized_layer_gradients(
    layer: layer_kinds.Layer, taps: LayerTaps, output_grads: Sequence[tf.Tensor]
) -> LayerGradients:
    """Per-example gradients of a layer's own variables by `tf.vectorized_map`.

    grad_i = d/dv sum_k <call_k(x_{k,i}), g_{k,i}>, one example at a time (vectorised).

    Every tensor argument of rank >= 1 of a recorded call is treated as batched
    (sliced per example); other arguments (Python values, scalars) are passed as
    they were. A call inside a shared computation (`tfdp_embed.clipping.shared`)
    is re-run whole for each example, with that example's output gradient.

    Args:
      layer: any layer; only the variables it owns itself (not its sub-layers') count.
      taps: the layer's recorded calls; `taps.call_fn` is re-run per example.
      output_grads: d(sum_i loss_i)/d(output) for each call.

    Returns:
      `LayerGradients` over the layer's own trainable variables.

    Raises:
      TypeError: if a call received a ragged or sparse tensor (it cannot be sliced).

    References: Agarwal et al. 2019 (pfor per-example gradients); Bu et al. 2022 book-keeping.
    """
    _warn_once(layer)
    variables = own_trainable_variables(layer)
    batch_size = tf.shape(output_grads[0])[0]
    if not variables:
        return LayerGradients([], tf.zeros([batch_size], tf.float32), lambda c: [])

    plans, elems = _slicing_plans(layer, taps, output_grads)

    def one_example(example_elems):
        it = iter(example_elems)
        with tf.GradientTape() as tape:
            tape.watch(variables)
            terms = []
            for structure, flat, batched, shared in plans:
                leaves = [next(it)[None] if b else leaf for leaf, b in zip(flat, batched)]
                args, kwargs = tf.nest.pack_sequence_as(structure, leaves)
                outputs = _run_without_writes(layer, taps.call_fn, args, kwargs)
                grad = next(it)
                grad = tf.stop_gradient(tf.cast(grad if shared else grad[None], outputs.dtype))
                terms.append(tf.reduce_sum(outputs * grad))
        return tape.gradient(terms, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO)

    per_example = tf.vectorized_map(one_example, elems)  # [B, *v.shape] per variable
    squared = 0.0
    for grads in per_example:
        flat_grads = tf.reshape(grads, [batch_size, -1])
        squared += tf.cast(tf.reduce_sum(tf.square(flat_grads), axis=1), tf.float32)

    def clipped_sum(clip_factors: tf.Tensor) -> list:
        return [tf.tensordot(tf.cast(clip_factors, grads.dtype), grads, axes=1) for grads in per_example]

    return LayerGradients(variables=variables, squared_norms=squared, clipped_sum=clipped_sum)


vectorized_layer_gradients.supports_shared_calls = True  # type: ignore[attr-defined]


def _slicing_plans(layer: layer_kinds.Layer, taps: LayerTaps, output_grads: Sequence[tf.Tensor]) -> tuple:
    """Per call (structure, flat leaves, which leaves are batched, shared?), and the tensors to map over.

    The tensors to map over are, call after call, its batched leaves then its output gradient.
    """
    plans, elems = [], []
    for call, grad in zip(taps.calls, output_grads):
        structure = (call.args, call.kwargs)
        flat = tf.nest.flatten(structure)
        batched = []
        shared = call.shared is not None  # inputs alike for every example; `grad` is per example
        for leaf in flat:
            if shared:
                batched.append(False)
                continue
            if isinstance(leaf, (tf.RaggedTensor, tf.SparseTensor)):
                raise TypeError(
                    f"The per-example fallback cannot slice the {type(leaf).__name__} input "
                    f"of layer {layer.name!r} ({type(layer).__name__}); register a rule for "
                    "this layer in the LayerRegistry."
                )
            is_batched = isinstance(leaf, tf.Tensor) and leaf.shape.rank != 0
            batched.append(is_batched)
            if is_batched:
                elems.append(leaf)
        elems.append(grad)
        plans.append((structure, flat, batched, shared))
    return plans, elems


# Ops that write a variable (resource or reference), and ops that call a function body.
_WRITE_OPS = frozenset(
    {"Assign", "AssignAdd", "AssignSub", "AssignVariableOp", "AssignAddVariableOp",
     "AssignSubVariableOp", "ResourceStridedSliceAssign", "StridedSliceAssign"}
    | {f"Scatter{kind}" for kind in ("Update", "Add", "Sub", "Mul", "Div", "Min", "Max")}
    | {f"ScatterNd{kind}" for kind in ("Update", "Add", "Sub", "Min", "Max")}
)  # fmt: skip
_WRITE_PREFIXES = ("ResourceScatter", "ResourceApply", "ResourceSparseApply")
_FUNCTION_ATTRS = ("f", "then_branch", "else_branch", "body", "cond", "branches")


def _run_without_writes(layer, fn, args, kwargs):
    """Builds `fn(*args, **kwargs)` in the current graph; refuses it if it writes a variable."""
    graph = tf.compat.v1.get_default_graph()
    before = len(graph.get_operations())
    outputs = fn(*args, **kwargs)
    written = _writing_ops(graph, graph.get_operations()[before:])
    if written:
        raise PrivacyContractError(
            f"The per-example re-run of layer {layer.name!r} ({type(layer).__name__}) writes "
            f"variables (ops {written[:3]}): re-running it one example at a time would store "
            "single training examples in its state (e.g. moving statistics). Layers that update "
            "state in training cannot be trained with per-example clipping; freeze them "
            "(trainable=False) or use a stateless layer."
        )
    return outputs


def _writing_ops(graph, ops) -> list:
    """Names of the ops in `ops` (and the function bodies they call) that write a variable."""
    found, library = [], None
    pending = [(op.name, op.type, op.node_def.attr) for op in ops]
    seen = set()
    while pending:
        name, op_type, attrs = pending.pop()
        if op_type in _WRITE_OPS or op_type.startswith(_WRITE_PREFIXES):
            found.append(name)
        for key in _FUNCTION_ATTRS:
            if key not in attrs:
                continue
            value = attrs[key]
            names = [f.name for f in value.list.func] if value.list.func else [value.func.name]
            for fname in names:
                if not fname or fname in seen:
                    continue
                seen.add(fname)
                if library is None:
                    library = {f.signature.name: f for f in graph.as_graph_def().library.function}
                body = library.get(fname)
                if body is not None:
                    pending.extend((f"{fname}/{n.name}", n.op, n.attr) for n in body.node_def)
    return found


def _warn_once(layer: layer_kinds.Layer) -> None:
    if layer in _WARNED:
        return
    _WARNED.add(layer)
    remedy = "Register a rule in the LayerRegistry to make it fast."
    if layer_kinds.is_instance(layer, "Embedding"):
        remedy = (
            "For an embedding table that is [batch, vocabulary, dim], and the sparse mechanisms (LazyDP, "
            "DP-FEST, DP-AdaFEST) see a dense variable, not a table. Use tfdp_embed.DPEmbedding instead, the "
            "drop-in for keras.layers.Embedding (`DPEmbedding(input_dim, output_dim)`, the same positional "
            "arguments; `combiner=` pools several ids per example): its per-example norms come from the rows "
            "each example looks up."
        )
    warnings.warn(
        f"No per-example clipping rule for layer {layer.name!r} ({type(layer).__name__}); "
        "computing its per-example gradients with tf.vectorized_map, which is slower and "
        f"holds [batch, *weight.shape] per weight. {remedy}",
        RuntimeWarning,
        stacklevel=3,
    )


__all__ = ["vectorized_layer_gradients"]
