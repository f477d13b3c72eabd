"""Stage "per-example norms -> clip": from recorded taps to clipped gradient sums.

Given the taps of one forward pass and the tape that recorded it, one
backward pass gives the gradient of sum_i loss_i with respect to every
tapped layer output; each layer's registry function turns that into exact
per-example squared norms. The total norm of example i is
||g_i|| = sqrt(sum over layers of its squared norms); its clip factor is
c_i = C / max(||g_i||, C), and every layer builds sum_i c_i g_i directly.

Reduced precision (float16 or bfloat16 compute) changes two things, and
neither lets an example past its clip:

* Loss scaling (float16): the backward pass starts from S * 1 instead of
  1, so small output gradients do not underflow. The rules are linear in
  the output gradients, so their norms are divided by S and their sums
  built with c_i / S: the unscaled values, in float32. S must not depend
  on the data (a dynamic loss scale reacting to this batch's overflow
  would make every example's update depend on the one that overflowed).
* Non-finite values (a scaled gradient overflowing float16): every
  non-finite entry of a recorded input, output or output gradient is
  replaced by 0 before the rules run, an elementwise operation, so each
  example's gradient stays a function of that example alone; its norm is
  taken of what is summed, and an example whose norm is still not finite
  gets c_i = 0. A NaN or Inf can therefore neither skip the clip nor reach
  the other examples' sum.
* Non-finite losses (an input of 65504 or more in float16, a feature of
  1e30): the backward pass starts from 0 for that example instead of S,
  what still comes out non-finite (0 * Inf) is replaced by 0 as above, and
  its c_i = 0: it adds exactly 0 to every sum, and training goes on
  (`tfdp_embed.nonfinite`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import tensorflow as tf

from tfdp_embed.clipping.registry import LayerGradients, LayerRegistry
from tfdp_embed.clipping.shared_factored import TowerLayers, shared_call_grads
from tfdp_embed.clipping.taps import LayerTaps, own_trainable_variables
from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.traced_as_written import as_written, user_code


@dataclasses.dataclass
class ClippedStep:
    """Per-example norms, clip factors and per-layer gradient information."""

    norms: tf.Tensor
    clip_factors: tf.Tensor
    layers: list  # list[tuple[LayerTaps, LayerGradients]]


def layer_gradients(
    taps: Sequence[LayerTaps],
    per_example_loss: tf.Tensor,
    tape: tf.GradientTape,
    registry: LayerRegistry,
    fallback,
    *,
    loss_scale: float = 1.0,
) -> list:
    """Runs each tapped layer's registry function (or `fallback`) on finite, loss-scaled values.

    The backward pass starts from `loss_scale` per example; the returned
    norms and clipped sums are unscaled (see the module docstring), and
    every non-finite recorded value is replaced by 0 first.

    Calls inside a shared computation (`tfdp_embed.clipping.shared`) get
    per-example output gradients `[B, *outputs.shape]` instead of the summed
    one; only rules marked `supports_shared_calls` may receive them. When the
    tower ends in fixed row-wise linear maps they come factored
    (`tfdp_embed.clipping.shared_factored.FactoredGrads`), and only to
    rules marked `shared_factored`.

    A tapped layer whose tapped method was not called must not get a gradient
    by another way (a subclass reading its table with `tf.gather` itself, a
    parent model multiplying by its kernel): that use would be missing from
    every norm. The check asks the same backward pass for those layers'
    variables only, so it adds no op when all of them are unconnected.

    Raises:
      PrivacyContractError: a layer's weights get a gradient that its taps miss,
        or its registry entry refuses it (`LayerRegistry.lookup`).
      ValueError: taps recorded on another method than the registry's rule reads.
    """
    used = [t for t in taps if t.calls]
    unused = [t for t in taps if not t.calls and t.call_fn is not None]
    outputs = [[c.outputs for c in t.calls] for t in used]
    unused_vars = [own_trainable_variables(t.layer) for t in unused]
    shared = [s for s in getattr(taps, "shared_computations", ()) if s.calls]
    scores = [[s for _, s in computation.scorers] for computation in shared]
    # d(sum_i loss_i)/d outputs via output_gradients=1: no new op has to be on the
    # tape, so this is right whether or not the caller is still inside `with tape:`.
    scale = _check_loss_scale(loss_scale)
    grads, missed, score_grads = tape.gradient(
        per_example_loss,
        (outputs, unused_vars, scores),
        output_gradients=start_gradients(per_example_loss, scale),
    )
    for tap, variables, var_grads in zip(unused, unused_vars, missed):
        _check_not_reached(tap, variables, var_grads)
    per_example = shared_call_grads(
        shared, scores, score_grads, TowerLayers(used, lambda layer: registry.lookup(layer) or fallback)
    )
    batch_size = per_example_loss.shape[0] if per_example_loss.shape.rank == 1 else None
    for tap in used:
        _check_leading_axis(tap, batch_size)
    call_grads = _call_output_grads(used, grads, per_example)
    call_grads, call_values = _finite((call_grads, [[_call_values(c) for c in tap.calls] for tap in used]))
    return _run_rules(used, call_grads, call_values, registry, fallback, scale)


def _run_rules(used, call_grads, call_values, registry, fallback, scale: float) -> list:
    """(tap with its finite recorded values, the rule's unscaled `LayerGradients`) per used tap."""
    result = []
    for tap, output_grads, values in zip(used, call_grads, call_values):
        tap = _with_values(tap, values)
        info = user_code(_rule_for(tap, registry, fallback))(tap.layer, tap, output_grads)  # a user's rule: converted
        result.append((tap, info if scale == 1.0 else _unscaled(info, scale)))
    return result


@tf.autograph.experimental.do_not_convert
def _with_values(tap: LayerTaps, values: list) -> LayerTaps:
    """`tap` with each call's (args, kwargs, outputs) replaced by `values` (the finite ones)."""
    calls = [dataclasses.replace(c, args=a, kwargs=k, outputs=o) for c, (a, k, o) in zip(tap.calls, values)]
    return dataclasses.replace(tap, calls=calls)


@tf.autograph.experimental.do_not_convert
def _call_output_grads(used: list, grads: list, per_example: dict) -> list:
    """Per tap, per call: the output gradients (per example for shared calls, zeros where none)."""
    return [
        [
            per_example[id(c)] if id(c) in per_example else (tf.zeros_like(c.outputs) if g is None else g)
            for c, g in zip(tap.calls, tap_grads)
        ]
        for tap, tap_grads in zip(used, grads)
    ]


@tf.autograph.experimental.do_not_convert
def _rule_for(tap: LayerTaps, registry: LayerRegistry, fallback):
    """The registry's rule for `tap.layer` (or `fallback`), refused if it cannot read these taps."""
    fn = registry.lookup(tap.layer)
    expected = registry.tapped_method(tap.layer)
    if tap.method != expected:
        raise ValueError(
            f"Layer {tap.layer.name!r} was recorded on `{tap.method}`, but its registry rule "
            f"reads `{expected}`: pass the same registry to `record_taps` and `clipped_step`."
        )
    rule = fn or fallback
    if any(c.shared is not None for c in tap.calls) and not getattr(rule, "supports_shared_calls", False):
        raise PrivacyContractError(_no_shared_rule(tap, rule))
    return rule


@tf.autograph.experimental.do_not_convert
def _check_leading_axis(tap: LayerTaps, batch_size) -> None:
    """A per-example call's output starts with the batch axis; anything else is a shared computation."""
    for call in tap.calls:
        shape = call.outputs.shape
        if call.shared is None and batch_size is not None and shape.rank and shape[0] not in (None, batch_size):
            raise PrivacyContractError(
                f"Layer {tap.layer.name!r} ({type(tap.layer).__name__}) was called on something other than "
                f"the batch: its output has leading size {shape[0]}, the batch {batch_size} examples. A "
                "computation every example's loss depends on (e.g. a candidate tower run over the item "
                "catalogue) must run inside `with tfdp_embed.clipping.shared_computation() as shared:` "
                "(see `tfdp_embed.clipping.shared`), or use `tfdp_embed.keras2.retrieval.Retrieval`, which does; "
                "otherwise its rows would be clipped as if they were examples."
            )


def _no_shared_rule(tap: LayerTaps, rule) -> str:
    name = getattr(rule, "__name__", type(rule).__name__)
    return (
        f"Layer {tap.layer.name!r} ({type(tap.layer).__name__}) runs inside a shared computation (a "
        f"candidate tower over the catalogue), but its clipping rule `{name}` handles per-example "
        "calls only: it would read the candidates as if each were an example, and the per-example "
        "norms would be wrong. Use layers whose rules support shared calls there (DPEmbedding, "
        "Dense, LayerNormalization, or any layer without a rule: the exact vectorised fallback), "
        "or mark the rule with `supports_shared_calls = True` once it handles `LayerCall.shared`."
    )


@tf.autograph.experimental.do_not_convert
def start_gradients(per_example_loss: tf.Tensor, scale: float) -> tf.Tensor:
    """S for each example with a finite loss, 0 for the others: nothing of theirs is backpropagated.

    What still comes out non-finite (0 * Inf) is replaced by 0 in `_finite`, so such an
    example's per-example gradient is exactly 0 in every rule.
    """
    finite = tf.math.is_finite(per_example_loss)
    return tf.where(finite, tf.cast(scale, per_example_loss.dtype), tf.zeros_like(per_example_loss))


def _check_loss_scale(loss_scale) -> float:
    scale = float(loss_scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"`loss_scale` must be a finite number > 0; received {loss_scale!r}.")
    return scale


def _wide(tensor: tf.Tensor) -> tf.Tensor:
    """float16 as float32 (its sums overflow at 65,504); other dtypes as they are."""
    return tf.cast(tensor, tf.float32) if tensor.dtype == tf.float16 else tensor


def _call_values(call) -> tuple:
    """(args, kwargs, outputs) of a recorded call: the values `_finite` cleans."""
    return tuple(call.args), call.kwargs, call.outputs


@tf.autograph.experimental.do_not_convert
def _finite(structure):
    """`structure` with every non-finite entry of its float tensors replaced by 0 (other leaves as they are).

    One check of all of them (their sum is finite); the elementwise
    replacement runs only when it fails (a `tf.cond`): the usual step pays a
    sum per tensor, not an `IsFinite` and a `SelectV2` (~15 % of a small
    model's step; a boolean `All` costs as much). Either branch gives the
    same values when every entry is finite.
    """
    flat = tf.nest.flatten(structure)
    positions = [i for i, v in enumerate(flat) if isinstance(v, tf.Tensor) and v.dtype.is_floating]
    if not positions:
        return structure
    tensors = [flat[i] for i in positions]
    # A sum is finite only if every entry is (NaN and Inf propagate); a finite-valued sum that
    # overflows only sends the step down the cleaning branch, which changes nothing then.
    sums = [tf.reduce_sum(_wide(t)) for t in tensors]
    total = tf.add_n([s if s.dtype == tf.float32 else tf.cast(s, tf.float32) for s in sums])
    finite = tf.math.is_finite(total)
    cleaned = tf.cond(
        finite, lambda: tensors, lambda: [tf.where(tf.math.is_finite(t), t, tf.zeros_like(t)) for t in tensors]
    )
    for i, value in zip(positions, cleaned):
        flat[i] = value
    return tf.nest.pack_sequence_as(structure, flat)


def _unscaled(info: LayerGradients, scale: float) -> LayerGradients:
    """`info` of output gradients scaled by `scale`, as if they were not (the rules are linear)."""
    inner = info.clipped_sum
    return dataclasses.replace(
        info,
        squared_norms=info.squared_norms / (scale * scale),
        clipped_sum=lambda clip_factors: inner(clip_factors / scale),
    )


@tf.autograph.experimental.do_not_convert
def _check_not_reached(tap: LayerTaps, variables: list, grads: list) -> None:
    reached = [v.name for v, g in zip(variables, grads) if g is not None]
    if reached:
        raise PrivacyContractError(
            f"Weights {reached} of layer {tap.layer.name!r} ({type(tap.layer).__name__}) get a "
            f"gradient, but the layer's `{tap.method}` (the method its clipping rule records) was "
            "never called: something reads them another way (e.g. `tf.gather(layer.embeddings, "
            "ids)` in a subclass, or a parent model using the variable itself), so per-example "
            f"norms would miss that use. Read them only through `{tap.method}`, or register a "
            f"rule for {type(tap.layer).__name__} that covers that use (a model module may "
            "provide one, e.g. `two_tower_registry()` for ItemEmbedding)."
        )


@tf.autograph.experimental.do_not_convert
def clip_factors(squared_norms: tf.Tensor, l2_norm_clip: float) -> tuple:
    """Returns (norms, c) with c_i = C / max(norm_i, C), and c_i = 0 where norm_i is not finite."""
    norms = tf.sqrt(tf.maximum(squared_norms, 0.0))
    factors = l2_norm_clip / tf.maximum(norms, l2_norm_clip)
    return norms, tf.where(tf.math.is_finite(norms), factors, tf.zeros_like(factors))


@as_written
def clipped_step(
    taps: Sequence[LayerTaps],
    per_example_loss: tf.Tensor,
    tape: tf.GradientTape,
    *,
    registry: LayerRegistry,
    fallback,
    l2_norm_clip: float,
    loss_scale: float = 1.0,
) -> ClippedStep:
    """Per-example norms and clip factors for the whole model (`loss_scale`: see `layer_gradients`).

    An example whose loss is NaN or Inf gets clip factor 0 and a zero gradient: it adds exactly 0
    to every clipped sum (`tfdp_embed.nonfinite`).
    """
    layers = layer_gradients(taps, per_example_loss, tape, registry, fallback, loss_scale=loss_scale)
    squared = tf.zeros_like(per_example_loss)
    for _, info in layers:
        squared = squared + info.squared_norms
    norms, factors = clip_factors(squared, l2_norm_clip)
    factors = tf.where(tf.math.is_finite(per_example_loss), factors, tf.zeros_like(factors))
    return ClippedStep(norms=norms, clip_factors=factors, layers=layers)


__all__ = ["ClippedStep", "clip_factors", "clipped_step", "layer_gradients", "start_gradients"]
