"""Per-example gradients of `keras.layers.LayerNormalization` (gamma, beta).

y = gamma * x_hat + beta with x_hat = (x - mean) / sqrt(var + eps) over the
normalised axes. The per-example gradients are as small as the parameters,
so they are computed directly: d gamma_i = sum_t g_t * x_hat_t and
d beta_i = sum_t g_t, summed over every non-normalised, non-batch position
t of every call of the layer.

Example:
    >>> registry = LayerRegistry([(keras.layers.LayerNormalization, layer_norm_layer_gradients)])

References: Li et al. 2022 (per-example LayerNorm gradients, App.); Bu et al. 2022 book-keeping.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tfdp_embed.clipping import layer_kinds
from tfdp_embed.clipping.registry import LayerGradients
from tfdp_embed.clipping.taps import LayerTaps, dense_call_input


def layer_norm_layer_gradients(
    layer: layer_kinds.Layer, taps: LayerTaps, output_grads: Sequence[tf.Tensor]
) -> LayerGradients:
    """Exact per-example squared norms and clipped sums for LayerNormalization.

    ||grad_i||^2 = ||sum_t g_t * x_hat_t||^2 + ||sum_t g_t||^2 (gamma and beta parts).

    Args:
      layer: the `keras.layers.LayerNormalization`; any `axis` not containing 0.
      taps: the layer's recorded calls, inputs `[B, d]`, `[B, T, d]`, ...
      output_grads: d(sum_i loss_i)/d(output) for each call.

    Returns:
      `LayerGradients` over `[gamma, beta]`, each present only with `scale` / `center`.

    Raises:
      ValueError: if the layer normalises over the batch axis.
      TypeError: if a call's input is not a dense tensor.

    References: Li et al. 2022 ghost clipping; Bu et al. 2022 book-keeping.
    """
    if getattr(layer, "rms_scaling", False):  # Keras 3's RMS variant: other math, the exact fallback
        from tfdp_embed.clipping.fallback import vectorized_layer_gradients

        return vectorized_layer_gradients(layer, taps, output_grads)
    rank = dense_call_input(layer, taps.calls[0]).shape.rank
    axis = layer.axis if isinstance(layer.axis, (list, tuple)) else [layer.axis]
    axes = sorted(int(a) % rank for a in axis)  # Keras 3 keeps negative axes (tf-keras made them positive)
    if 0 in axes:
        raise ValueError(
            f"Per-example clipping of LayerNormalization {layer.name!r} needs `axis` to "
            f"exclude the batch axis 0; received axis={layer.axis}."
        )
    params = [v for v in (layer_kinds.tf_variable(layer.gamma), layer_kinds.tf_variable(layer.beta)) if v is not None]
    dtype = params[0].dtype.base_dtype if params else tf.float32
    variables, per_example = _per_example_grads(layer, taps, output_grads, axes, dtype)
    squared = 0.0
    for grads in per_example:
        squared += tf.reduce_sum(tf.square(grads), axis=list(range(1, grads.shape.rank)))

    def clipped_sum(clip_factors: tf.Tensor) -> list:
        c = tf.cast(clip_factors, dtype)
        return [tf.tensordot(c, grads, axes=1) for grads in per_example]

    return LayerGradients(
        variables=variables,
        squared_norms=tf.cast(squared, tf.float32) if per_example else _zeros(output_grads),
        clipped_sum=clipped_sum,
    )


layer_norm_layer_gradients.supports_shared_calls = True  # type: ignore[attr-defined]
# Exact over a unit axis [users, k, ...] (user-level batches), as over a sequence axis: tests/user_level.
layer_norm_layer_gradients.handles_unit_axis = True  # type: ignore[attr-defined]


def _per_example_grads(
    layer: layer_kinds.Layer,
    taps: LayerTaps,
    output_grads: Sequence[tf.Tensor],
    axes: list,
    dtype: tf.DType,
) -> tuple[list, list]:
    """The present ones of gamma and beta, and their per-example gradients `[B, *variable.shape]`."""
    gamma_grads, beta_grads = 0.0, 0.0
    for call, grad in zip(taps.calls, output_grads):
        x = tf.cast(dense_call_input(layer, call), dtype)
        grad = tf.cast(grad, dtype)
        # A shared call: x [K, ...] is every example's input; grad [B, K, ...] is per example.
        shared = call.shared is not None
        first = 0 if shared else 1
        reduce_axes = [a + (1 if shared else 0) for a in range(first, x.shape.rank) if a not in axes]
        if layer.scale:
            mean, variance = tf.nn.moments(x, axes, keepdims=True)
            x_hat = (x - mean) * tf.math.rsqrt(variance + layer.epsilon)
            gamma_grads += tf.reduce_sum(grad * (x_hat[None] if shared else x_hat), axis=reduce_axes)
        if layer.center:
            beta_grads += tf.reduce_sum(grad, axis=reduce_axes)
    variables: list = []
    per_example: list = []
    if layer.scale:
        variables.append(layer_kinds.tf_variable(layer.gamma))
        per_example.append(gamma_grads)
    if layer.center:
        variables.append(layer_kinds.tf_variable(layer.beta))
        per_example.append(beta_grads)
    return variables, per_example


def _zeros(output_grads: Sequence[tf.Tensor]) -> tf.Tensor:
    return tf.zeros(tf.shape(output_grads[0])[:1], tf.float32)


__all__ = ["layer_norm_layer_gradients"]
