"""Stage "per-example norms -> clip": from recorded taps to clipped gradient sums.

Given the taps of one forward pass and the tape that recorded it, one
backward pass gives the gradient of sum_i loss_i with respect to every
tapped layer output; each layer's registry function turns that into exact
per-example squared norms. The total norm of example i is
||g_i|| = sqrt(sum over layers of its squared norms); its clip factor is
c_i = C / max(||g_i||, C), and every layer builds sum_i c_i g_i directly.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from tfdp_embed._keras import tf
from tfdp_embed.clipping.registry import LayerRegistry
from tfdp_embed.clipping.taps import LayerTaps


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
) -> list:
    """Runs each tapped layer's registry function (or `fallback`)."""
    used = [t for t in taps if t.calls]
    outputs = [[c.outputs for c in t.calls] for t in used]
    # d(sum_i loss_i)/d outputs via output_gradients=1: no new op has to be on the
    # tape, so this is right whether or not the caller is still inside `with tape:`.
    grads = tape.gradient(
        per_example_loss, outputs, output_gradients=tf.ones_like(per_example_loss)
    )
    result = []
    for tap, output_grads in zip(used, grads):
        output_grads = [
            tf.zeros_like(c.outputs) if g is None else g for c, g in zip(tap.calls, output_grads)
        ]
        fn = registry.lookup(tap.layer) or fallback
        result.append((tap, fn(tap.layer, tap, output_grads)))
    return result


def clip_factors(squared_norms: tf.Tensor, l2_norm_clip: float) -> tuple:
    """Returns (norms, c) with c_i = C / max(norm_i, C)."""
    norms = tf.sqrt(tf.maximum(squared_norms, 0.0))
    return norms, l2_norm_clip / tf.maximum(norms, l2_norm_clip)


def clipped_step(
    taps: Sequence[LayerTaps],
    per_example_loss: tf.Tensor,
    tape: tf.GradientTape,
    *,
    registry: LayerRegistry,
    fallback,
    l2_norm_clip: float,
) -> ClippedStep:
    """Per-example norms and clip factors for the whole model."""
    layers = layer_gradients(taps, per_example_loss, tape, registry, fallback)
    squared = tf.zeros_like(per_example_loss)
    for _, info in layers:
        squared = squared + info.squared_norms
    norms, factors = clip_factors(squared, l2_norm_clip)
    return ClippedStep(norms=norms, clip_factors=factors, layers=layers)
