"""Brute-force per-example gradients, the reference the clipping rules must match.

`run_step` records one forward pass, runs `clipped_step` on it, and also
takes `tape.jacobian` of the per-example loss vector with respect to every
trainable variable (densified: `[batch, *v.shape]`). `check_against_brute_force`
then compares, layer by layer, the registry's squared norms with
sum_v ||J_i(v)||^2 and its clipped sums with sum_i c_i J_i(v) for random c.
Test models are float64 so that the reference itself is exact to ~1e-12.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tfdp_embed.clipping.taps import layers_owning_weights, record_taps
from tfdp_embed.keras2._keras import tf
from tfdp_embed.keras2.clipping import clipped_step, default_registry, vectorized_layer_gradients

RTOL = 1e-5


def per_example_loss(outputs: tf.Tensor) -> tf.Tensor:
    """A non-linear per-example loss: loss_i = sum_j w_j sin(y_ij) + 0.5 y_ij^2."""
    flat = tf.reshape(outputs, [tf.shape(outputs)[0], -1])
    width = flat.shape[1]
    weights = tf.cast(tf.range(1, width + 1), flat.dtype) / width
    return tf.reduce_sum(tf.sin(flat) * weights + 0.5 * tf.square(flat), axis=1)


@dataclasses.dataclass
class StepResult:
    step: object  # ClippedStep
    jacobians: dict  # v.ref() -> np.ndarray [batch, *v.shape]
    variables: list
    batch_size: int


def run_step(
    model, inputs, *, registry=None, l2_norm_clip: float = 1.0, loss_scale: float = 1.0, loss_fn=None
) -> StepResult:
    """One recorded forward pass: `clipped_step` plus the brute-force jacobians.

    `loss_fn(inputs)`, when given, returns the per-example losses instead of
    `per_example_loss(model(inputs))` (e.g. a `tfrs.Model`'s `compute_loss`).
    """
    registry = registry or default_registry()
    loss_fn = loss_fn or (lambda x: per_example_loss(model(x)))
    loss_fn(inputs)  # builds subclassed models, so that their layers own weights
    layers = layers_owning_weights(model)
    with tf.GradientTape(persistent=True) as tape:
        with record_taps(layers, registry) as taps:
            loss = loss_fn(inputs)
        loss32 = tf.cast(loss, tf.float32)
    step = clipped_step(
        taps,
        loss32,
        tape,
        registry=registry,
        fallback=vectorized_layer_gradients,
        l2_norm_clip=l2_norm_clip,
        loss_scale=loss_scale,
    )
    variables = model.trainable_variables
    jac = tape.jacobian(loss, variables)
    jacobians = {v.ref(): np.asarray(tf.convert_to_tensor(j)) for v, j in zip(variables, jac)}
    return StepResult(step, jacobians, variables, int(loss.shape[0]))


def check_against_brute_force(
    model,
    inputs,
    *,
    registry=None,
    seed: int = 0,
    rtol: float = RTOL,
    loss_scale: float = 1.0,
    loss_fn=None,
    atol: float = 0.0,
) -> StepResult:
    """Asserts exact per-example norms and clipped sums for every layer of `model` (see `run_step`).

    `atol` floors the clipped sums' absolute tolerance, for gradients that are
    exactly zero (float64 round-off around 0 is then all that is compared).
    """
    result = run_step(model, inputs, registry=registry, loss_scale=loss_scale, loss_fn=loss_fn)
    rng = np.random.default_rng(seed)
    covered, total = [], np.zeros(result.batch_size)
    for tap, info in result.step.layers:
        expected_sq = np.zeros(result.batch_size)
        for v in info.variables:
            j = result.jacobians[v.ref()]
            expected_sq += np.sum(np.square(j.reshape(result.batch_size, -1)), axis=1)
        np.testing.assert_allclose(
            info.squared_norms.numpy(), expected_sq, rtol=rtol, err_msg=f"layer {tap.layer.name}"
        )
        total += expected_sq
        c = rng.uniform(0.1, 1.0, result.batch_size).astype(np.float32)
        sums = info.clipped_sum(tf.constant(c))
        assert len(sums) == len(info.variables)
        for v, got in zip(info.variables, sums):
            expected = np.tensordot(c.astype(np.float64), result.jacobians[v.ref()], axes=1)
            got = np.asarray(tf.convert_to_tensor(got))
            assert got.shape == tuple(v.shape), (v.name, got.shape, v.shape)
            atol = max(rtol * max(np.abs(expected).max(), 1e-30), atol)
            np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol, err_msg=v.name)
        covered.extend(v.ref() for v in info.variables)
    # Every trainable variable is handled by exactly one layer.
    assert len(covered) == len(set(covered))
    assert set(covered) == {v.ref() for v in result.variables}
    np.testing.assert_allclose(np.square(result.step.norms.numpy()), total, rtol=rtol)
    return result


def infos_by_layer(result: StepResult) -> dict:
    """layer name -> LayerGradients."""
    return {tap.layer.name: info for tap, info in result.step.layers}
