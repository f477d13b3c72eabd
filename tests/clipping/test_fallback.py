"""The vectorized per-example fallback for layers without a registry entry."""

from __future__ import annotations

import warnings

import numpy as np

from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.clipping import LayerRegistry, default_registry

from .brute_force import check_against_brute_force, infos_by_layer, run_step

F64 = "float64"


def _normal(*shape, seed=0):
    return tf.random.stateless_normal(shape, seed=[seed, 3], dtype=tf.float64)


def _fallback_warnings(caught, layer):
    return [w for w in caught if issubclass(w.category, RuntimeWarning) and repr(layer.name) in str(w.message)]


def test_conv1d_warns_once_per_layer():
    inputs = keras.Input((6, 3), dtype=F64)
    conv = keras.layers.Conv1D(2, 3, activation="relu", dtype=F64)
    flat = keras.layers.Flatten(dtype=F64)(conv(inputs))
    model = keras.Model(inputs, keras.layers.Dense(2, dtype=F64)(flat))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_against_brute_force(model, _normal(4, 6, 3))
        run_step(model, _normal(4, 6, 3, seed=1))
    assert len(_fallback_warnings(caught, conv)) == 1
    assert "Conv1D" in str(_fallback_warnings(caught, conv)[0].message)
    dense = model.layers[-1]
    assert not _fallback_warnings(caught, dense)


def test_plain_keras_embedding_warning_names_dp_embedding_as_the_drop_in():
    inputs = keras.Input((2,), dtype="int32")
    table = keras.layers.Embedding(10, 3, dtype=F64)
    flat = keras.layers.Flatten(dtype=F64)(table(inputs))
    model = keras.Model(inputs, keras.layers.Dense(1, dtype=F64)(flat))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_step(model, tf.constant([[1, 2], [2, 7], [0, 0]]))
    (warning,) = _fallback_warnings(caught, table)
    assert "Use tfdp_embed.DPEmbedding instead, the drop-in for keras.layers.Embedding" in str(warning.message)


class _ScaledDense(keras.layers.Layer):
    """Owns a `scale` weight and a Dense sub-layer: the fallback must handle only `scale`."""

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.inner = keras.layers.Dense(units, dtype=self.dtype)

    def build(self, input_shape):
        self.scale = self.add_weight(name="scale", shape=(self.inner.units,), initializer="ones")
        super().build(input_shape)

    def call(self, inputs, training=None, offset=0.0):
        return tf.sin(self.inner(inputs)) * self.scale + offset


def test_custom_layer_called_twice_with_kwargs():
    first, second = keras.Input((4,), dtype=F64), keras.Input((4,), dtype=F64)
    scaled = _ScaledDense(3, dtype=F64, name="scaled")
    out = scaled(first, training=True) + scaled(second, offset=tf.constant(0.5, tf.float64))
    model = keras.Model([first, second], out)
    scaled.scale.assign([0.5, -1.0, 2.0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = check_against_brute_force(model, [_normal(5, 4), _normal(5, 4, seed=1)])
    assert len(_fallback_warnings(caught, scaled)) == 1
    infos = infos_by_layer(result)
    assert [v.name for v in infos["scaled"].variables] == [scaled.scale.name]
    assert len(infos[scaled.inner.name].variables) == 2  # handled by the Dense entry


class _ModelWithOwnWeight(keras.Model):
    """A subclassed model that owns a weight itself (the model is a tapped layer too)."""

    def __init__(self):
        super().__init__(dtype=F64)
        self.encoder = keras.layers.Dense(3, "tanh", dtype=F64)
        self.temperature = self.add_weight(name="temperature", shape=(), initializer="ones")

    def call(self, inputs):
        return self.encoder(inputs) * self.temperature


def test_subclassed_model_owning_a_weight():
    model = _ModelWithOwnWeight()
    model(_normal(1, 4))
    model.temperature.assign(1.5)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        result = check_against_brute_force(model, _normal(4, 4, seed=2))
    assert [v.name for v in infos_by_layer(result)[model.name].variables] == [model.temperature.name]


def test_empty_registry_routes_everything_to_the_fallback():
    # With no rules at all the fallback alone must still give exact norms (Dense + LN).
    inputs = keras.Input((3, 4), dtype=F64)
    hidden = keras.layers.Dense(4, "relu", dtype=F64)(inputs)
    model = keras.Model(inputs, keras.layers.LayerNormalization(dtype=F64)(hidden))
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        fast = run_step(model, _normal(4, 3, 4), registry=default_registry())
        slow = check_against_brute_force(model, _normal(4, 3, 4), registry=LayerRegistry())
    np.testing.assert_allclose(slow.step.norms.numpy(), fast.step.norms.numpy(), rtol=1e-6)
