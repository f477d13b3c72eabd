"""The coverage check: the clipping rules must account for the whole gradient.

Each registry rule describes how its layer uses its weights (a Dense
matmul, a table lookup). A layer that also uses them another way (a
`DPEmbedding` subclass that reads `self.embeddings` with `tf.gather`
itself, a parent model multiplying by a layer's kernel) gets norms and a
clipped sum that miss that use. With every clip factor 1 the rules' clipped
sums are sum_i g_i, which must equal the gradient of sum_i loss_i; on one
batch, before training, every trainable variable is compared, and a
mismatch names the layer that owns the variable.

Under float16 or bfloat16 compute the true gradient is rounded to that
precision while the rules work in float32, so the comparison is split in
two. The true gradient is compared with the gradient that flows through
the recorded outputs of the variable's layer alone (the same ops in the
same precision: a use the taps miss shows, at float32's tolerance); the
rules' sums are compared with that, at a tolerance of a few rounding
errors of the compute dtype (`rtol`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from tfdp_embed.clipping import layer_kinds
from tfdp_embed.clipping.per_example import layer_gradients, start_gradients
from tfdp_embed.clipping.taps import own_trainable_variables, record_taps
from tfdp_embed.errors import PrivacyContractError

RTOL = 1e-4  # of the variable's largest gradient entry: float32 round-off passes, a missed use does not
ATOL = 1e-6  # of the model's largest gradient entry: for gradients that cancel to ~0 (a key's bias)
# Of sum_i ||g_i|| over the owning layer's weights: the round-off of per-example gradients that cancel
# (a candidate tower's output bias under a full softmax: each example's gradient is a sum over the K
# candidates that is exactly 0, computed as ~0 ± float32 round-off growing with K), where both scales
# above are ~0. The tolerance is the larger of NORM_SUM_RTOL and float32 epsilon x K.
NORM_SUM_RTOL = 1e-5
FLOAT32_EPS = 2.0**-23
REDUCED_NORM_SUM_SHARE = 8  # rtol (64 round-offs) / 8: 8 round-offs of sum_i ||g_i|| under reduced precision


@dataclasses.dataclass(frozen=True)
class RecordedForward:
    """One forward pass recorded for the coverage check: its per-example losses, the tape and the taps."""

    loss: tf.Tensor
    tape: tf.GradientTape
    taps: list


def record_forward(layers: list, registry, forward: Callable[[], tf.Tensor]) -> RecordedForward:
    """Runs `forward()` under a persistent tape with `layers` tapped (as `check_rules_cover_gradients` does)."""
    with tf.GradientTape(persistent=True) as tape, record_taps(layers, registry) as taps:
        loss = forward()
    return RecordedForward(loss, tape, taps)


def check_rules_cover_gradients(
    model,
    layers: list,
    *,
    registry,
    fallback,
    forward: Callable[[], tf.Tensor] | None = None,
    rtol: float = RTOL,
    loss_scale: float = 1.0,
    recorded_pass: RecordedForward | None = None,
) -> None:
    """Refuses the model if some variable's rule-built gradient sum differs from its true gradient.

    Args:
      model: the model being trained.
      layers: its layers owning trainable weights (the tapped layers).
      registry: the `LayerRegistry` DPModel uses.
      fallback: the per-example fallback DPModel uses.
      forward: runs one forward pass and returns the per-example losses `[n]`.
      recorded_pass: instead, that forward pass already recorded (`record_forward`).
      rtol: the largest difference taken for round-off, relative to the
        variable's largest gradient entry (larger for float16/bfloat16 compute).
      loss_scale: the fixed loss scale of DPModel's backward pass (float16),
        so that the check sees the gradients training computes.

    Raises:
      PrivacyContractError: naming the layer whose weights the rules miss.
    """
    if recorded_pass is None:
        assert forward is not None, "check_rules_cover_gradients needs `forward` or `recorded_pass`"
        recorded_pass = record_forward(layers, registry, forward)
    loss, tape, taps = recorded_pass.loss, recorded_pass.tape, recorded_pass.taps
    infos = layer_gradients(taps, loss, tape, registry, fallback, loss_scale=loss_scale)
    variables = [layer_kinds.tf_variable(v) for v in model.trainable_weights]  # Keras 3: the tf.Variables
    start = start_gradients(loss, loss_scale)  # as DPModel's backward pass (0 for a non-finite loss)
    true = [_unscaled(g, loss_scale) for g in tape.gradient(loss, variables, output_gradients=start)]
    recorded = _through_recorded_outputs(tape, loss, start, loss_scale, taps, infos) if rtol > RTOL else None
    del tape
    ones = tf.ones_like(loss)
    built, round_offs = {}, {}
    for tap, info in infos:
        norm_sum = float(tf.reduce_sum(tf.sqrt(tf.cast(info.squared_norms, tf.float64))))
        round_off = _round_off_rtol(tap, reduced=recorded is not None, rtol=rtol) * norm_sum
        for variable, grad in zip(info.variables, info.clipped_sum(ones)):
            built[variable.ref()] = grad
            round_offs[variable.ref()] = round_off
    comparisons = [(built, true, RTOL)]  # (what is checked, against what, tolerance)
    if recorded is not None:  # reduced precision: recorded vs true tightly, the rules vs recorded loosely
        comparisons = [(recorded, true, RTOL), (built, [recorded.get(v.ref()) for v in variables], rtol)]
    for got, expected_grads, tolerance in comparisons:
        compared = [(v, _difference(got.get(v.ref()), expected)) for v, expected in zip(variables, expected_grads)]
        largest = max((scale for _, (_, scale) in compared), default=0.0)
        for variable, (difference, scale) in compared:
            round_off = round_offs.get(variable.ref(), 0.0) if got is built else 0.0
            if difference > tolerance * scale + ATOL * largest + round_off:
                owner = next((layer for layer in layers if _owns(layer, variable)), None)
                raise PrivacyContractError(_message(owner, variable, difference, scale))


def _through_recorded_outputs(tape, loss, start, loss_scale, taps, infos) -> dict:
    """variable ref -> the gradient of sum_i loss_i that reaches it through its layer's recorded outputs."""
    recorded_taps = {id(tap.layer): tap for tap in taps}  # `infos` holds copies made finite, off the tape
    out: dict = {}
    for used, info in infos:
        tap = recorded_taps[id(used.layer)]
        outputs = [call.outputs for call in tap.calls]
        output_grads = tape.gradient(loss, outputs, output_gradients=start)
        output_grads = [tf.zeros_like(o) if g is None else g for o, g in zip(outputs, output_grads)]
        grads = tape.gradient(outputs, info.variables, output_gradients=output_grads)
        out.update((v.ref(), _unscaled(g, loss_scale)) for v, g in zip(info.variables, grads))
    return out


def _unscaled(grad, scale):
    """`grad` / `scale` (dense or IndexedSlices; None stays None)."""
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values / tf.cast(scale, grad.values.dtype), grad.indices, grad.dense_shape)
    return grad / tf.cast(scale, grad.dtype)


def _round_off_rtol(tap, *, reduced: bool = False, rtol: float = RTOL) -> float:
    """Of sum_i ||g_i||: NORM_SUM_RTOL, float32 epsilon x the most candidates a shared call of the layer
    ran over, and under reduced precision `rtol` / REDUCED_NORM_SUM_SHARE (the true gradient's
    per-example terms are rounded to the compute dtype before they are summed: a bias's sum over a
    batch of 4096 that cancels is off by ~0.65 bfloat16 round-offs of sum_i ||g_i||)."""
    candidates = [c.outputs.shape[0] for c in tap.calls if c.shared is not None and c.outputs.shape.rank]
    reduced_rtol = [rtol / REDUCED_NORM_SUM_SHARE] if reduced else []
    return max([NORM_SUM_RTOL, *reduced_rtol] + [FLOAT32_EPS * int(n) for n in candidates if n is not None])


def _owns(layer, variable) -> bool:
    return any(v is variable for v in own_trainable_variables(layer))


def _rows(grad):
    """(int64 row ids, rows as float64 `[n, -1]`) of a gradient (IndexedSlices or dense)."""
    if isinstance(grad, tf.IndexedSlices):
        indices, values = tf.cast(grad.indices, tf.int64), grad.values
    else:
        values = tf.convert_to_tensor(grad)
        values = tf.reshape(values, [1]) if values.shape.rank == 0 else values
        indices = tf.range(tf.shape(values, out_type=tf.int64)[0])
    return indices, tf.reshape(tf.cast(values, tf.float64), [tf.shape(indices)[0], -1])


def _largest_row_sum(indices, values) -> float:
    """max |entry| of the rows summed by index (repeated indices add up)."""
    unique, index = tf.unique(indices)
    summed = tf.math.unsorted_segment_sum(values, index, tf.size(unique))
    return float(tf.reduce_max(tf.abs(summed))) if int(tf.size(summed)) else 0.0


def _difference(got, expected) -> tuple:
    """(max |got - expected|, max |expected| or |got|) over the variable's entries; None is zero."""
    present = [g for g in (got, expected) if g is not None]
    if not present:
        return 0.0, 0.0
    if not any(isinstance(g, tf.IndexedSlices) for g in present):
        return _dense_difference(got, expected)
    parts = [(_rows(g), sign) for g, sign in ((got, 1.0), (expected, -1.0)) if g is not None]
    scale = max(_largest_row_sum(*rows) for rows, _ in parts)
    indices = tf.concat([rows[0] for rows, _ in parts], 0)
    values = tf.concat([sign * rows[1] for rows, sign in parts], 0)
    return _largest_row_sum(indices, values), scale


def _dense_difference(got, expected) -> tuple:
    """`_difference` of dense gradients, in NumPy (the same float64 values: each row is summed once, or twice)."""
    got64, expected64 = (None if g is None else np.asarray(g, np.float64) for g in (got, expected))
    scale = max((float(np.abs(g).max(initial=0.0)) for g in (got64, expected64) if g is not None), default=0.0)
    if got64 is None or expected64 is None:
        return (scale, scale)
    return float(np.abs(got64 - expected64).max(initial=0.0)), scale


def _message(layer, variable, difference: float, scale: float) -> str:
    where = f"layer {layer.name!r} ({type(layer).__name__})" if layer is not None else "no layer"
    return (
        f"The per-example clipping rules miss part of the gradient of {variable.name!r}, owned by "
        f"{where}: the sum of the per-example gradients they build differs from the gradient of "
        f"the summed loss by {difference:.3g} (largest entry {scale:.3g}). The weights are used "
        "in a way the layer's rule does not record (e.g. a DPEmbedding subclass reading "
        "`self.embeddings` itself instead of through `self.lookup(ids)`, or another layer or "
        "model using the variable directly), so per-example norms and the applied gradient would "
        "be wrong. Read the weights only through the layer (`lookup` for tables), or register a "
        "rule for that layer in the LayerRegistry."
    )


__all__ = [
    "ATOL",
    "FLOAT32_EPS",
    "NORM_SUM_RTOL",
    "RTOL",
    "RecordedForward",
    "check_rules_cover_gradients",
    "record_forward",
]
