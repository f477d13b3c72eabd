"""Attack: get a model that mixes examples or stores training data past DPModel's first-batch check.

The check (tfdp_embed.contract, through each front end's DPModel) must hold for
every way data reaches `fit` (datasets whose first batch has one example,
numpy arrays, ragged and sparse features), must not be fooled into refusing
honest models with dropout, must leave every variable as it was, and the
per-example fallback must never write layer state (it re-runs `call` one
example at a time, which stored single training rows in batch
normalisation's moving mean).

Both front ends (the `fe` fixture of tests/conftest.py) where Keras 3 behaves
as tf-keras; the cases marked `KERAS2` run on tf-keras alone, each with why.
"""

from __future__ import annotations

import importlib
import warnings

import numpy as np
import pytest
import tensorflow as tf

from tfdp_embed.clipping import clipped_step, vectorized_layer_gradients
from tfdp_embed.clipping.taps import layers_owning_weights
from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.mechanisms.dense import DenseDPSGD

VOCAB, DIM, IDS, N = 12, 4, 3, 6
KERAS2 = pytest.mark.parametrize("fe", ["keras2"], indirect=True)


def _centre(fe, name="centre"):
    """x - the batch mean: no weights, no state, mixes examples (a layer of `fe`'s Keras)."""

    class CentreOverBatch(fe.keras.layers.Layer):
        def call(self, x):
            return x - tf.reduce_mean(x, axis=0, keepdims=True)

    return CentreOverBatch(name=name)


def _model(fe, *middle, ragged=False, sparse=False, seed=3):
    keras = fe.keras
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((None,) if ragged or sparse else (IDS,), dtype="int32", ragged=ragged, sparse=sparse)
    x = fe.DPEmbedding(VOCAB, DIM, combiner="mean", embeddings_initializer="normal")(inputs)
    x = keras.layers.Dense(6, activation="tanh")(x)
    for layer in middle:
        x = layer(x)
    return keras.Model(inputs, keras.layers.Dense(1)(x))


def _data(n=N, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, VOCAB, (n, IDS)).astype("int32"), rng.integers(0, 2, (n, 1)).astype("float32")


def _dp(fe, model, **kwargs):
    dp = fe.DPModel(
        model, mechanism=DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0), expected_batch_size=N, **kwargs
    )
    dp.compile(optimizer=fe.sgd(0.1), loss=fe.keras.losses.BinaryCrossentropy(from_logits=True))
    return dp


def _no_warnings(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        return fn()


def test_mixing_layer_behind_a_first_batch_of_one_example_is_refused(fe):
    # A one-example first batch cannot show mixing; the check must look at the next batch.
    ids, labels = _data()
    ds = (
        tf.data.Dataset.from_tensor_slices((ids, labels))
        .batch(1)
        .take(1)
        .concatenate(tf.data.Dataset.from_tensor_slices((ids, labels)).batch(N))
    )
    with pytest.raises(PrivacyContractError, match="'centre'"):
        _dp(fe, _model(fe, _centre(fe))).fit(ds, epochs=1, verbose=0)


def test_only_one_example_batches_warn_that_independence_was_not_checked(fe):
    ids, labels = _data()
    ds = tf.data.Dataset.from_tensor_slices((ids, labels)).batch(1)
    with pytest.warns(RuntimeWarning, match="could not check that each example's loss"):
        _dp(fe, _model(fe)).fit(ds, epochs=1, verbose=0)


@pytest.mark.parametrize("feed", ["dataset", "arrays"])
def test_mixing_layer_after_prepare_without_data_is_refused_at_fit(fe, feed):
    # `prepare()` on a built model has no batch to check: fit's data must still be checked (Keras 3 used to
    # mark the model ready and train the mixing model with only a "no data" warning).
    ids, labels = _data()
    dp = _dp(fe, _model(fe, _centre(fe)))
    dp.prepare()
    with pytest.raises(PrivacyContractError, match="'centre'"):
        if feed == "dataset":
            dp.fit(tf.data.Dataset.from_tensor_slices((ids, labels)).batch(N), epochs=1, verbose=0)
        else:
            dp.fit(ids, labels, batch_size=N, epochs=1, verbose=0)


def test_mixing_layer_fed_numpy_arrays_is_refused(fe):
    ids, labels = _data()
    with pytest.raises(PrivacyContractError, match="'centre'"):
        _dp(fe, _model(fe, _centre(fe))).fit(ids, labels, batch_size=N, epochs=1, verbose=0)


def test_an_honest_model_fed_numpy_arrays_is_checked_without_warnings(fe):
    # Keras 3 used to skip arrays with a "could not check" warning (issue 29); both now check their first batch.
    ids, labels = _data()
    _no_warnings(lambda: _dp(fe, _model(fe)).fit(ids, labels, batch_size=N, epochs=1, verbose=0))


@pytest.mark.parametrize("kind", ["ragged", "sparse"])
def test_ragged_and_sparse_features_are_checked(fe, kind):
    ids = tf.ragged.constant([[1, 2], [3], [4, 5, 6], [7], [8, 9], [10, 11, 1]], tf.int32)
    if kind == "sparse":
        ids = ids.to_sparse()
    labels = np.array([[0], [1], [0], [1], [1], [0]], "float32")
    ds = tf.data.Dataset.from_tensors((ids, labels))
    flags = {kind: True}
    _no_warnings(lambda: _dp(fe, _model(fe, **flags)).fit(ds, epochs=1, verbose=0))  # honest: accepted
    with pytest.raises(PrivacyContractError, match="'centre'"):
        _dp(fe, _model(fe, _centre(fe), **flags)).fit(ds, epochs=1, verbose=0)


def test_dropout_does_not_trip_the_training_mode_check(fe):
    keras = fe.keras
    ids, labels = _data()
    ds = tf.data.Dataset.from_tensors((ids, labels))
    model = _model(fe, keras.layers.Dropout(0.5), keras.layers.GaussianNoise(1.0))
    _no_warnings(lambda: _dp(fe, model).fit(ds, epochs=1, verbose=0))
    with pytest.raises(PrivacyContractError, match="'centre'"):  # and still sees mixing behind it
        _dp(fe, _model(fe, keras.layers.Dropout(0.5), _centre(fe))).fit(ds, epochs=1, verbose=0)


def test_a_layer_random_in_training_is_checked_in_inference_mode_with_a_warning(fe):
    class Jitter(fe.keras.layers.Layer):
        def call(self, x, training=None):
            return x + tf.random.normal(tf.shape(x)) if training else x

    ids, labels = _data()
    with pytest.warns(RuntimeWarning, match="checked inference mode instead"):
        _dp(fe, _model(fe, Jitter())).fit(tf.data.Dataset.from_tensors((ids, labels)), epochs=1, verbose=0)


@KERAS2  # `check_per_example=False`: tf-keras's DPModel alone has the switch
def test_turning_the_check_off_warns(fe):
    ids, labels = _data()
    dp = _dp(fe, _model(fe, _centre(fe)), check_per_example=False)
    with pytest.warns(RuntimeWarning, match="check_per_example=False"):
        dp.fit(tf.data.Dataset.from_tensors((ids, labels)), epochs=1, verbose=0)


@KERAS2  # `check_per_example=False`: tf-keras's DPModel alone has the switch
def test_with_the_check_off_a_table_read_outside_lookup_is_still_refused_in_the_step(fe):
    class ReadsTableItself(fe.DPEmbedding):
        def call(self, ids):
            return tf.reduce_sum(tf.gather(self.embeddings, ids), axis=1)

    keras = fe.keras
    keras.utils.set_random_seed(3)
    inputs = keras.Input((IDS,), dtype="int32")
    x = ReadsTableItself(VOCAB, DIM, combiner="mean", name="itself")(inputs)
    dp = _dp(fe, keras.Model(inputs, keras.layers.Dense(1)(x)), check_per_example=False)
    ids, labels = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(PrivacyContractError, match="'itself'.*`lookup`.*never called"):
            dp.fit(tf.data.Dataset.from_tensors((ids, labels)), epochs=1, verbose=0)


def test_the_check_changes_no_variable(fe):
    # Old code, Keras 3: the check's training-mode passes advanced Dropout's SeedGenerator state.
    model = _model(fe, fe.keras.layers.Dropout(0.3), fe.keras.layers.LayerNormalization())
    before = [v.numpy().copy() for v in model.variables]
    ids, labels = _data()
    _dp(fe, model).prepare(tf.data.Dataset.from_tensors((ids, labels)))
    for v, b in zip(model.variables, before):
        np.testing.assert_array_equal(v.numpy(), b, err_msg=v.name)


def _stateful_scale(fe):
    """A trainable scale that also records the last input it saw (state written in `call`)."""

    class StatefulScale(fe.keras.layers.Layer):
        def build(self, input_shape):
            self.scale = self.add_weight(name="scale", shape=input_shape[1:], initializer="ones")
            self.last_input = self.add_weight(
                name="last_input", shape=input_shape[1:], trainable=False, initializer="zeros"
            )

        def call(self, x):
            self.last_input.assign(x[0])
            return x * self.scale

    return StatefulScale(name="stateful_scale")


def test_the_per_example_fallback_never_writes_layer_state(fe):
    # Old code: the fallback re-ran `call` one example at a time and the writes went through,
    # leaving a single raw training example in the layer's state.
    clipping = importlib.import_module(f"tfdp_embed.{fe.name}.clipping")
    layer = _stateful_scale(fe)
    inputs = fe.keras.Input((DIM,))
    model = fe.keras.Model(inputs, layer(inputs))
    x = tf.constant(np.random.default_rng(0).normal(size=(N, DIM)), tf.float32)
    model(x)
    layer.last_input.assign(tf.zeros([DIM]))

    @tf.function(autograph=False)  # the error reaches the test as raised
    def step(x):
        layers = layers_owning_weights(model)
        registry = clipping.default_registry()
        with tf.GradientTape() as tape, clipping.record_taps(layers, registry) as taps:
            loss = tf.reduce_sum(tf.square(model(x)), axis=1)
        with tf.control_dependencies([loss]):  # the forward pass's own write happens first
            zero = layer.last_input.assign(tf.zeros([DIM]))
        with tf.control_dependencies([zero]):
            result = clipped_step(
                taps, loss, tape, registry=registry, fallback=vectorized_layer_gradients, l2_norm_clip=1.0
            )
        return result.norms

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            step(x)
        except PrivacyContractError as error:
            assert "stateful_scale" in str(error) and "writes" in str(error)
            return
    leaked = np.asarray(layer.last_input.numpy())
    rows = [i for i in range(N) if np.allclose(leaked, x.numpy()[i])]
    pytest.fail(f"the fallback ran and wrote training example(s) {rows} into the layer's state: {leaked}")
