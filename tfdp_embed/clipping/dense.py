"""Ghost norms and book-keeping clipped sums for `keras.layers.Dense`.

For a Dense layer y = act(x W + b) the gradient of example i with respect
to the kernel is X_i^T G_i, where X_i `[T, d]` stacks the example's inputs
and G_i `[T, p]` the gradients of its loss with respect to the
pre-activation outputs, over every time step of every call of the layer
(calls of one layer add up per example, so the norm of the *sum* is what
counts). A call inside a shared computation (a candidate tower over the
catalogue, `tfdp_embed.clipping.shared`) has the same inputs X `[K, d]` for
every example and per-example output gradients `[B, K, p]`: it is one more
block of K time steps of every example. Its squared norm needs no per-example gradient:

    ||X_i^T G_i||_F^2 = sum_{t,s} (x_t . x_s)(g_t . g_s)   (= ||x_i||^2 ||g_i||^2 when T = 1),

and the bias gradient is sum_t g_t. The clipped sum sum_i c_i X_i^T G_i is
one matmul of the flattened inputs with the clip-scaled output gradients.
When a shared call has no activation and its per-example output gradients
come factored, g_ik = sum_f G_fik u_fi (`shared_factored.FactoredGrads`),
its K time steps collapse to F: sum_k x_k ⊗ g_ik = sum_f (X^T G_fi) ⊗ u_fi,
so the step is x = G_f X `[B, F, d]`, g = u_f, with bias (sum_k G_fik) u_fi.

Example:
    >>> registry = LayerRegistry([(keras.layers.Dense, dense_layer_gradients)])

References: Goodfellow 2015 (rank-one trick); Li et al. 2022 ghost clipping
(Gram form for sequences); Bu et al. 2022 book-keeping (clipped sum without a
second backward pass).
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tfdp_embed.clipping import layer_kinds
from tfdp_embed.clipping.registry import LayerGradients
from tfdp_embed.clipping.shared_factored import FactoredGrads, factored_kind
from tfdp_embed.clipping.taps import LayerTaps, dense_call_input
from tfdp_embed.ops import sparse_rows


@tf.autograph.experimental.do_not_convert
def dense_layer_gradients(
    layer: layer_kinds.Layer, taps: LayerTaps, output_grads: Sequence[tf.Tensor]
) -> LayerGradients:
    """Exact per-example squared norms and clipped sums for a Dense layer.

    ||grad_i||^2 = sum_{t,s} (x_t . x_s)(g_t . g_s) + ||sum_t g_t||^2, with g the
    pre-activation output gradient of example i over all its time steps and calls.

    Args:
      layer: the `keras.layers.Dense` (or subclass with the same `call` math).
      taps: the layer's recorded calls; inputs `[B, d]` or `[B, ..., d]`.
      output_grads: d(sum_i loss_i)/d(output) for each call, same shapes as the outputs
        (post-activation; the activation is back-propagated here).

    Returns:
      `LayerGradients` over `[kernel, bias]` (bias only with `use_bias=True`).

    Raises:
      TypeError: if a call's input is not a dense tensor (sparse or ragged inputs).

    References: Li et al. 2022 ghost clipping; Bu et al. 2022 book-keeping.
    """
    kernel = layer_kinds.tf_variable(layer.kernel)
    dtype = kernel.dtype.base_dtype
    d_in, d_out = kernel.shape
    xs, gs, bias_gs = _inputs_and_pre_activation_grads(layer, taps, output_grads, dtype)
    if len(xs) == 1 and xs[0].shape.rank == 2 and bias_gs[0] is None:
        x, g = xs[0], gs[0]
        squared = sparse_rows.dense_ghost_norms(x, g, use_bias=layer.use_bias)  # one op
        x_flat, g_per_example, b_per_example = x, g, g
    else:
        # [B, T, d] and [B, T, p] over the concatenated time steps of all calls (and factored terms).
        x_seq = tf.concat([_as_sequence(x, d_in) for x in xs], axis=1)
        g_seq = tf.concat([_as_sequence(g, d_out) for g in gs], axis=1)
        b_seq = g_seq
        if any(b is not None for b in bias_gs):
            b_seq = tf.concat([_as_sequence(g if b is None else b, d_out) for g, b in zip(gs, bias_gs)], axis=1)
        kernel_sq = _sequence_kernel_sq_norms(x_seq, g_seq)
        g_sq = tf.reduce_sum(tf.square(tf.reduce_sum(b_seq, axis=1)), axis=1)
        x_flat, g_per_example, b_per_example = tf.reshape(x_seq, [-1, d_in]), g_seq, b_seq
        squared = kernel_sq + g_sq if layer.use_bias else kernel_sq
    variables = [kernel, layer_kinds.tf_variable(layer.bias)] if layer.use_bias else [kernel]

    @tf.autograph.experimental.do_not_convert
    def clipped_sum(clip_factors: tf.Tensor) -> list:
        c = tf.cast(clip_factors, dtype)
        c = tf.reshape(c, [-1] + [1] * (g_per_example.shape.rank - 1))
        g_flat = tf.reshape(g_per_example * c, [-1, d_out])
        grads = [tf.matmul(x_flat, g_flat, transpose_a=True)]
        if layer.use_bias:
            grads.append(tf.reduce_sum(tf.reshape(b_per_example * c, [-1, d_out]), axis=0))
        return grads

    return LayerGradients(
        variables=variables,
        squared_norms=tf.cast(squared, tf.float32),
        clipped_sum=clipped_sum,
    )


dense_layer_gradients.supports_shared_calls = True  # type: ignore[attr-defined]
# Exact over a unit axis [users, k, ...] (user-level batches), as over a sequence axis: tests/user_level.
dense_layer_gradients.handles_unit_axis = True  # type: ignore[attr-defined]
# Shared calls without activation pass factored gradients through (`shared_factored`).
dense_layer_gradients.shared_factored = "dense"  # type: ignore[attr-defined]


def _inputs_and_pre_activation_grads(
    layer: layer_kinds.Layer, taps: LayerTaps, output_grads: Sequence[tf.Tensor], dtype: tf.DType
) -> tuple[list, list, list]:
    """Per call: inputs x, pre-activation output gradients g and bias gradients (None: g), per example, in `dtype`.

    A shared call with `FactoredGrads` (no activation) gives F terms per example instead:
    x = G_f X `[B, F, d]`, g = u_f `[B, F, p]`, whose outer products add up to its kernel
    gradient, and bias terms (sum_k G_fk) u_f.
    """
    xs, gs, bias_gs = [], [], []
    for call, grad in zip(taps.calls, output_grads):
        x, y = dense_call_input(layer, call), call.outputs
        if isinstance(grad, FactoredGrads):
            x, g, b = _factored_terms(layer, x, grad, dtype)
            xs.append(x)
            gs.append(g)
            bias_gs.append(b)
            continue
        if call.shared is not None:  # the same input for every example; per-example grads [B, ...]
            x, y = _broadcast_to_batch(x, grad), _broadcast_to_batch(y, grad)
        g = _pre_activation_grads(layer, x, y, grad)
        xs.append(tf.cast(x, dtype))
        gs.append(tf.cast(g, dtype))
        bias_gs.append(None)
    return xs, gs, bias_gs


def _factored_terms(layer, x: tf.Tensor, grad: FactoredGrads, dtype: tf.DType) -> tuple:
    """(G_f X `[B, F, d]`, u_f `[B, F, p]`, (sum_k G_fk) u_f `[B, F, p]`) of a factored shared call."""
    if factored_kind(layer, dense_layer_gradients) != "dense":
        raise ValueError(f"Dense layer {layer.name!r} has an activation: its shared calls cannot be factored.")
    coefficients = tf.cast(grad.coefficients, dtype)  # [F, B, K]
    factors = coefficients.shape[0]  # static: one per scorer
    d_in, d_out = layer_kinds.tf_variable(layer.kernel).shape
    vectors = tf.transpose(tf.reshape(tf.cast(grad.vectors, dtype), [factors, -1, d_out]), [1, 0, 2])  # [B, F, p]
    inputs = tf.matmul(tf.reshape(coefficients, [-1, tf.shape(coefficients)[2]]), tf.cast(x, dtype))  # [F * B, d]
    inputs = tf.transpose(tf.reshape(inputs, [factors, -1, d_in]), [1, 0, 2])  # [B, F, d]
    totals = tf.transpose(tf.reduce_sum(coefficients, axis=2))  # [B, F]
    return inputs, vectors, totals[:, :, None] * vectors


def _broadcast_to_batch(t: tf.Tensor, per_example: tf.Tensor) -> tf.Tensor:
    """`t` `[K, ...]` repeated for each example of `per_example` `[B, K, ...]`: `[B, K, ...]`."""
    return tf.broadcast_to(t[None], tf.concat([tf.shape(per_example)[:1], tf.shape(t)], 0))


def _pre_activation_grads(layer, x: tf.Tensor, y: tf.Tensor, grad: tf.Tensor) -> tf.Tensor:
    """d loss / d z from d loss / d y, y = act(z), z = x W + b: exact, no re-run when possible."""
    act = layer.activation
    name = layer_kinds.activation_name(act)
    if name == "linear":
        return grad
    grad = tf.cast(grad, y.dtype)
    # The same formulas as TensorFlow's ReluGrad / SigmoidGrad / TanhGrad, from the output.
    if name == "relu":
        return tf.raw_ops.ReluGrad(gradients=grad, features=y)  # grad where y > 0: one op, not three
    if name == "sigmoid":
        return grad * y * (1 - y)
    if name == "tanh":
        return grad * (1 - tf.square(y))
    # Any other activation: recompute z and back-propagate through act only.
    x = tf.cast(x, layer.compute_dtype)
    kernel = tf.cast(layer_kinds.tf_variable(layer.kernel), x.dtype)
    z = tf.tensordot(x, kernel, [[x.shape.rank - 1], [0]])
    if layer.use_bias:
        z = z + tf.cast(layer_kinds.tf_variable(layer.bias), x.dtype)
    with tf.GradientTape() as tape:
        tape.watch(z)
        out = act(z)
    return tape.gradient(out, z, output_gradients=tf.cast(grad, out.dtype))


def _as_sequence(t: tf.Tensor, width: int) -> tf.Tensor:
    """[B, d] -> [B, 1, d]; [B, T1, ..., d] -> [B, T1*..., d] (the number of steps static when known)."""
    if t.shape.rank == 2:
        return t[:, None, :]
    if t.shape.rank == 3:
        return t
    return tf.reshape(t, [tf.shape(t)[0], -1, width])


def _sequence_kernel_sq_norms(x: tf.Tensor, g: tf.Tensor) -> tf.Tensor:
    """||X_i^T G_i||_F^2 per example: Gram form when T(d+p) < dp, else the [B, d, p] product."""
    steps, d, p = x.shape[1], x.shape[2], g.shape[2]

    def gram():
        if steps is not None and steps <= 4:  # a few steps (a call plus factored terms): elementwise, no batched matmul
            xx = tf.reduce_sum(x[:, :, None, :] * x[:, None, :, :], axis=3)
            gg = tf.reduce_sum(g[:, :, None, :] * g[:, None, :, :], axis=3)
        else:
            xx = tf.matmul(x, x, transpose_b=True)  # [B, T, T]
            gg = tf.matmul(g, g, transpose_b=True)
        return tf.reduce_sum(xx * gg, axis=[1, 2])

    def direct():
        return tf.reduce_sum(tf.square(tf.matmul(x, g, transpose_a=True)), axis=[1, 2])

    if steps is not None:
        return gram() if steps * (d + p) < d * p else direct()
    return tf.cond(tf.shape(x)[1] * (d + p) < d * p, gram, direct)


__all__ = ["dense_layer_gradients"]
