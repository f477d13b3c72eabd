"""Dense ghost norms and book-keeping clipped sums against brute-force per-example gradients."""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed.clipping.dense import _pre_activation_grads
from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.clipping import dense_layer_gradients, record_taps

from .brute_force import check_against_brute_force, infos_by_layer

F64 = "float64"


def _dense(units, activation=None, **kwargs):
    return keras.layers.Dense(units, activation=activation, dtype=F64, **kwargs)


def _normal(*shape, seed=0):
    return tf.random.stateless_normal(shape, seed=[seed, 1], dtype=tf.float64)


@pytest.mark.parametrize("activation", ["relu", None, "sigmoid", "tanh", "gelu"])
def test_2d_functional(activation):
    inputs = keras.Input((4,), dtype=F64)
    hidden = _dense(5, activation)(inputs)
    model = keras.Model(inputs, _dense(3)(hidden))
    check_against_brute_force(model, _normal(6, 4))


def test_3d_sequence_gram_and_direct():
    # T(d+p) vs dp picks the form: [3, 4] -> 5 uses the Gram form (3*9 < 20) and
    # [3, 2] -> 2 the direct [B, d, p] form (3*4 >= 4); both must be exact.
    inputs = keras.Input((3, 4), dtype=F64)
    hidden = _dense(5, "relu")(inputs)
    hidden = _dense(2, "tanh", use_bias=False)(hidden)
    model = keras.Model(inputs, _dense(2)(hidden))
    check_against_brute_force(model, _normal(5, 3, 4, seed=1))


def test_rank_4_inputs():
    inputs = keras.Input((2, 3, 4), dtype=F64)
    model = keras.Model(inputs, _dense(3, "elu")(inputs))
    check_against_brute_force(model, _normal(4, 2, 3, 4, seed=2))


def test_layer_called_twice_adds_per_example():
    # The same kernel on two inputs (and on its own output): the per-example gradient is
    # the sum of both calls' contributions, ||x1 g1^T + x2 g2^T||, not the sum of norms.
    first, second = keras.Input((4,), dtype=F64), keras.Input((4,), dtype=F64)
    shared = _dense(4, "relu")
    merged = keras.layers.Concatenate(dtype=F64)([shared(first), shared(shared(second))])
    model = keras.Model([first, second], _dense(2)(merged))
    result = check_against_brute_force(model, [_normal(5, 4, seed=3), _normal(5, 4, seed=4)])
    taps = {tap.layer.name: tap for tap, _ in result.step.layers}
    assert len(taps[shared.name].calls) == 3


def test_mixed_2d_and_3d_calls():
    tokens, pooled = keras.Input((3, 4), dtype=F64), keras.Input((4,), dtype=F64)
    shared = _dense(3, "relu")
    out = shared(tokens) + shared(pooled)[:, None, :]
    model = keras.Model([tokens, pooled], out)
    check_against_brute_force(model, [_normal(4, 3, 4, seed=5), _normal(4, 4, seed=6)])


class _Tower(keras.Model):
    def __init__(self):
        super().__init__(dtype=F64)
        self.encoder = _dense(6, "relu")
        self.shared = _dense(6, "tanh")
        self.head = _dense(1)

    def call(self, inputs):
        hidden = self.encoder(inputs)
        return self.head(self.shared(self.shared(hidden)))


def test_subclassed_model_with_sequences():
    model = _Tower()
    check_against_brute_force(model, _normal(4, 3, 5, seed=7))


def test_unknown_time_steps_in_tf_function():
    layer = _dense(3, "relu")
    layer.build((None, None, 4))
    x = _normal(4, 5, 4, seed=8)
    y = layer(x)
    g = _normal(4, 5, 3, seed=9)

    signature = [
        tf.TensorSpec([None, None, 4], tf.float64),
        tf.TensorSpec([None, None, 3], tf.float64),
    ]

    @tf.function(input_signature=signature)
    def norms_and_sum(x, g):
        with record_taps([layer]) as taps:
            layer(x)
        info = dense_layer_gradients(layer, taps[0], [g])
        return info.squared_norms, info.clipped_sum(tf.ones([tf.shape(x)[0]]))

    squared, (kernel_sum, bias_sum) = norms_and_sum(x, g)
    gz = (g * tf.cast(y > 0, tf.float64)).numpy()
    per_example = np.einsum("btd,btp->bdp", x.numpy(), gz)
    np.testing.assert_allclose(
        squared.numpy(),
        np.sum(per_example**2, axis=(1, 2)) + np.sum(gz.sum(axis=1) ** 2, axis=1),
        rtol=1e-5,
    )
    np.testing.assert_allclose(kernel_sum.numpy(), per_example.sum(axis=0), rtol=1e-5)
    np.testing.assert_allclose(bias_sum.numpy(), gz.sum(axis=(0, 1)), rtol=1e-5)


def test_norm_is_zero_where_relu_is_dead():
    layer = _dense(2, "relu", kernel_initializer="zeros", bias_initializer="zeros")
    x, g = _normal(3, 4), _normal(3, 2, seed=1)
    layer.build((None, 4))
    np.testing.assert_array_equal(_pre_activation_grads(layer, x, layer(x), g).numpy(), 0.0)


def test_variables_and_norm_dtype():
    inputs = keras.Input((4,), dtype=F64)
    model = keras.Model(inputs, _dense(3, use_bias=False, name="no_bias")(inputs))
    result = check_against_brute_force(model, _normal(3, 4))
    info = infos_by_layer(result)["no_bias"]
    assert [v.name for v in info.variables] == [model.layers[-1].kernel.name]
    assert info.squared_norms.dtype == tf.float32
