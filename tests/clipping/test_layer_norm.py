"""LayerNormalization per-example gradients against brute force."""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.clipping import layer_norm_layer_gradients, record_taps

from .brute_force import check_against_brute_force, infos_by_layer

F64 = "float64"


def _normal(*shape, seed=0):
    return tf.random.stateless_normal(shape, seed=[seed, 2], dtype=tf.float64)


def _randomised(layer_norm):
    """Non-trivial gamma/beta so that the test does not sit at gamma = 1, beta = 0."""
    for i, v in enumerate(layer_norm.trainable_weights):
        v.assign(1.0 + 0.3 * _normal(*v.shape, seed=10 + i))
    return layer_norm


@pytest.mark.parametrize("center,scale", [(True, True), (False, True), (True, False)])
def test_2d(center, scale):
    inputs = keras.Input((5,), dtype=F64)
    hidden = keras.layers.Dense(5, dtype=F64)(inputs)
    norm = keras.layers.LayerNormalization(center=center, scale=scale, dtype=F64, name="ln")
    model = keras.Model(inputs, norm(hidden))
    _randomised(norm)
    result = check_against_brute_force(model, _normal(4, 5))
    assert len(infos_by_layer(result)["ln"].variables) == int(center) + int(scale)


def test_3d_sequence_and_called_twice():
    inputs = keras.Input((3, 4), dtype=F64)
    norm = keras.layers.LayerNormalization(epsilon=1e-3, dtype=F64)
    hidden = keras.layers.Dense(4, "relu", dtype=F64)(norm(inputs))
    model = keras.Model(inputs, norm(hidden))
    _randomised(norm)
    check_against_brute_force(model, _normal(5, 3, 4, seed=1))


def test_normalising_two_axes():
    inputs = keras.Input((3, 4), dtype=F64)
    norm = keras.layers.LayerNormalization(axis=[1, 2], dtype=F64)
    model = keras.Model(inputs, norm(inputs))
    _randomised(norm)
    check_against_brute_force(model, _normal(4, 3, 4, seed=2))


def test_hand_computed_beta_gradient():
    # d beta_i = sum_t g_it: with g = ones on [1, 2, 3], d beta = [2, 2, 2], norm^2 = 12;
    # d gamma = sum_t x_hat_t = 0 here because the two steps are mirror images.
    norm = keras.layers.LayerNormalization(dtype=F64)
    x = tf.constant([[[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]]], tf.float64)
    with record_taps([norm]) as taps:
        norm(x)
    info = layer_norm_layer_gradients(norm, taps[0], [tf.ones_like(x)])
    np.testing.assert_allclose(info.squared_norms.numpy(), [12.0], rtol=1e-6)
    d_gamma, d_beta = info.clipped_sum(tf.constant([0.5]))
    np.testing.assert_allclose(d_gamma.numpy(), [0.0, 0.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(d_beta.numpy(), [1.0, 1.0, 1.0])
