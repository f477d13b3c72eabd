"""Per-example output gradients of a shared computation in factored form, when the tower ends linearly.

In a shared computation (a candidate tower over K catalogue items,
`tfdp_embed.clipping.shared`), example i's gradient with respect to
the tower's output C `[K, d]` is V_i = sum_s G^s_i (q^s_i)^T, one term per
scorer s (G^s_i: row i of d loss / d scores; q^s_i: the query). Pulled back
through maps that apply one fixed linear map to every candidate row (a Dense
layer without activation, a concatenation along the features, a sum of equal
shapes), it keeps that form at every recorded call output y `[K, w]`:

    d loss_i / d y[k] = sum_s G^s_ik u^s_i,    u^s_i = M^T q^s_i  (M: the map from y's row to C's row)

a coefficient per (example, candidate) times a vector per example: the
`FactoredGrads(coefficients [F, B, K], vectors [F, B, w])` of each call
(F = number of scorers). The rules then take exact norms without the
per-example `[B, K, w]` cotangents: a Dense kernel's gradient is
sum_s (X^T G^s_i) ⊗ u^s_i, an embedding table's is sum_s (A G^s_i) ⊗ u^s_i
with A `[rows, K]` summing each row's occurrences (repeated negatives added
before the square), so the norms are Gram forms of F + T terms per example:
O(B K width) work, no vectorised backward pass.

`factored_output_grads` proves the form from the traced graph: it walks from
C down to every recorded call and accepts only recorded Dense calls with a
linear activation (passed through: u_in = W u_out), leaf calls whose rule
reads factored gradients (`shared_factored = "leaf"`: the embedding tables),
and the ops `Identity`, `ConcatV2` along the last axis, `AddV2` of equal
static shapes and `Mul` by a scalar computed from no variable. A float
tensor reached any other way that depends on a variable (an activation, a
normalisation, a layer of another kind) makes it return None, and the
caller back-propagates every per-example cotangent as before (exact for
any tower). Eagerly (the contract check) it also returns None.

Example:
    >>> grads = factored_output_grads(computation, score_grads, TowerLayers(taps, registry.lookup))
    >>> grads[0].dense()  # [B, K, w]: what `computation.per_example_output_grads` would give

References: Goodfellow 2015 (rank-one per-example gradients); Li et al. 2022
(ghost norms as Gram forms); Bu et al. 2022 (book-keeping).
"""

from __future__ import annotations

import functools
import typing

import tensorflow as tf

from tfdp_embed.clipping import layer_kinds
from tfdp_embed.clipping.taps import dense_call_input


class FactoredGrads(typing.NamedTuple):
    """Per-example output gradients `[B, K, w]` of a shared call as sum_f coefficients[f, i, k] * vectors[f, i].

    A NamedTuple, so that `tf.nest` (the clipping stage's finite-value cleaning)
    reaches both tensors: replacing a non-finite coefficient or vector entry by 0
    zeroes the entries of the product it made non-finite, and example i's values
    stay a function of example i alone.
    """

    coefficients: tf.Tensor  # [F, B, K]
    vectors: tf.Tensor  # [F, B, w]

    def dense(self) -> tf.Tensor:
        """The `[B, K, w]` tensor it stands for (tests and rules that need it)."""
        return tf.einsum("fbk,fbw->bkw", self.coefficients, self.vectors)


def factored_kind(layer, rule) -> str | None:
    """How the walk treats `layer`'s shared calls under `rule`: "dense", "leaf", or None (not factored)."""
    kind = getattr(rule, "shared_factored", None)
    if kind == "dense":
        linear = layer_kinds.is_instance(layer, "Dense") and layer_kinds.activation_name(layer.activation) == "linear"
        return "dense" if linear else None
    return kind if kind == "leaf" else None


class TowerLayers:
    """The layer that made each recorded call, and how the walk treats it (`factored_kind` of its rule).

    Args:
      taps: the step's `LayerTaps` with calls.
      rule_of: layer -> the clipping rule that will read its calls.
    """

    def __init__(self, taps, rule_of):
        self._layers = {id(c): tap.layer for tap in taps for c in tap.calls}
        self._rule_of = rule_of
        self._kinds: dict = {}

    def layer(self, call):
        return self._layers[id(call)]

    def kind(self, call) -> str | None:
        if id(call) not in self._kinds:
            layer = self.layer(call)
            self._kinds[id(call)] = factored_kind(layer, self._rule_of(layer))
        return self._kinds[id(call)]


def factored_output_grads(computation, score_grads: list, layers: TowerLayers) -> list | None:
    """`FactoredGrads` for every call of `computation`, or None when the tower does not end linearly.

    Args:
      computation: a recorded `SharedComputation` with its output and scorers.
      score_grads: d(sum_i loss_i)/d scores for each scorer, `[B, K]` (row i: example i's).
      layers: the layer and `factored_kind` of each recorded call.

    Returns:
      One `FactoredGrads` per entry of `computation.calls`, or None (eagerly, or
      when a path from the output to a call is not a row-wise fixed linear map).
    """
    result = computation.result
    if tf.executing_eagerly() or not computation.scorers or result.shape.rank != 2:
        return None
    calls = {c.outputs.ref(): c for c in computation.calls}
    if any(layers.kind(c) is None or c.outputs.shape.rank != 2 for c in calls.values()):
        return None
    walked = _consumers_first(result, calls, layers)
    if walked is None:
        return None
    order, edges = walked
    dtype = result.dtype
    coefficients = tf.stack([tf.cast(g, dtype) for g in score_grads])
    vectors = {result.ref(): tf.stack([tf.cast(q, dtype) for q, _ in computation.scorers])}
    for tensor in order:  # every consumer of `tensor` came before it: its vector is complete
        vector = vectors.get(tensor.ref())
        for source, pull_back in edges[tensor.ref()] if vector is not None else ():
            part, key = pull_back(vector), source.ref()
            vectors[key] = part if key not in vectors else vectors[key] + part
    out = []
    for call in computation.calls:
        vector = vectors.get(call.outputs.ref())
        if vector is None:  # not on a path to the output: a zero gradient
            vector = tf.zeros(tf.concat([tf.shape(coefficients)[:2], tf.shape(call.outputs)[-1:]], 0), dtype)
        out.append(FactoredGrads(coefficients, tf.cast(vector, call.outputs.dtype)))
    return out


def _consumers_first(result, calls: dict, layers: TowerLayers) -> tuple | None:
    """(tensors from `result` down to the recorded calls, each after all its consumers; their `_edges`).

    None when a path is not a fixed row-wise linear map.
    """
    post_order, edges, stack = [], {}, [(result, False)]
    while stack:
        tensor, expanded = stack.pop()
        if expanded:
            post_order.append(tensor)
            continue
        if tensor.ref() in edges:
            continue
        found = _edges(tensor, calls.get(tensor.ref()), layers)
        if found is None:
            return None
        edges[tensor.ref()] = found
        stack.append((tensor, True))
        stack.extend((source, False) for source, _ in found if source.ref() not in edges)
    return post_order[::-1], edges


def _edges(tensor, call, layers: TowerLayers) -> list | None:
    """(source, pull-back of the per-example vectors) for each tensor `tensor` is a fixed row-wise linear map of.

    [] for a leaf (a recorded call whose rule reads factored gradients, or a
    tensor computed from no variable: the catalogue's features); None when the
    gradient flows through anything else.
    """
    if call is not None:
        return _dense_edges(layers.layer(call), call) if layers.kind(call) == "dense" else []
    if not tensor.dtype.is_floating:
        return []
    op, inputs = tensor.op, list(tensor.op.inputs)
    if op.type == "Identity":
        return [(inputs[0], lambda v: v)]
    if op.type == "ConcatV2" and tensor.shape.rank == 2 and tf.get_static_value(inputs[-1]) in (1, -1):
        parts = inputs[:-1]
        if not all(p.shape.rank == 2 for p in parts):
            return None
        # A ragged feature's pooled width may be unknown statically: then read at run time.
        widths = [p.shape[-1] if p.shape[-1] is not None else tf.shape(p)[-1] for p in parts]
        ends = [sum(widths[: j + 1]) for j in range(len(widths))]
        return [(p, functools.partial(_columns, start=end - w, stop=end)) for p, w, end in zip(parts, widths, ends)]
    if op.type in ("AddV2", "Add") and tensor.shape.is_fully_defined():
        if all(i.shape.is_fully_defined() and i.shape.as_list() == tensor.shape.as_list() for i in inputs):
            return [(i, lambda v: v) for i in inputs]
    if op.type == "Mul":  # by a scalar computed from no variable (a fixed scale)
        for scalar, other in (inputs, inputs[::-1]):
            if (
                scalar.shape.rank == 0
                and None not in (other.shape.rank, tensor.shape.rank)
                and other.shape.as_list() == tensor.shape.as_list()
            ):
                if not _depends_on_variables(scalar):
                    return [(other, functools.partial(_scaled, scalar=scalar))]
    return None if _depends_on_variables(tensor) else []


def _dense_edges(layer, call) -> list | None:
    """A Dense call z = x W + b without activation: d/dx = (d/dz) W^T, the same map for every row."""
    x = dense_call_input(layer, call)
    if x.shape.rank != 2 or not x.dtype.is_floating:
        return None

    def pull_back(vector):  # [F, B, p] -> [F, B, d], one matmul
        kernel = tf.cast(layer_kinds.tf_variable(layer.kernel), vector.dtype)
        flat = tf.matmul(tf.reshape(vector, [-1, kernel.shape[1]]), kernel, transpose_b=True)
        return tf.reshape(flat, tf.concat([tf.shape(vector)[:2], [kernel.shape[0]]], 0))

    return [(x, pull_back)]


def _columns(vector, *, start: int, stop: int):
    return vector[:, :, start:stop]


def _scaled(vector, *, scalar):
    return vector * tf.cast(scalar, vector.dtype)


def _depends_on_variables(tensor) -> bool:
    """Whether a float `tensor` is computed from any variable (a resource input upstream, through float tensors)."""
    stack, seen = [tensor], set()
    while stack:
        t = stack.pop()
        op = t.op
        if op.name in seen:
            continue
        seen.add(op.name)
        for i in op.inputs:
            if i.dtype == tf.resource:
                return True
            if i.dtype.is_floating:
                stack.append(i)
    return False


def shared_call_grads(shared: list, scores: list, score_grads: list, layers: TowerLayers) -> dict:
    """id(call) -> per-example output gradients of every shared call: factored when proven, else `[B, ...]`.

    Args:
      shared: the recorded `SharedComputation`s with calls.
      scores: per computation, its scorers' score tensors.
      score_grads: per computation, d(sum_i loss_i)/d scores (None where unconnected).
      layers: the layer and rule of each recorded call.
    """
    out = {}
    for computation, tensors, grads in zip(shared, scores, score_grads):
        grads = [tf.zeros_like(t) if g is None else g for t, g in zip(tensors, grads)]
        per_call = factored_output_grads(computation, grads, layers)
        if per_call is None:
            per_call = computation.per_example_output_grads(grads)
        for call, grad in zip(computation.calls, per_call):
            out[id(call)] = grad
    return out


__all__ = ["FactoredGrads", "TowerLayers", "factored_kind", "factored_output_grads", "shared_call_grads"]
