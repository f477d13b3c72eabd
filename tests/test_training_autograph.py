"""The library's own step code is plain Python under autograph; the user's code in the step is still converted.

`tf.function(dp.train_step)` (a custom loop, `benchmarks.step_time`) traces with
autograph on: the library's stages run as written (`do_not_convert`, or
`tfdp_embed.traced_as_written.as_written`; converting them took most of that
first trace), while a user's layer, loss (a function, a `Loss` subclass or
`compute_loss`) or clipping rule that needs autograph (a Python `if` on a
tensor) is still converted as before.
"""

import dataclasses

import numpy as np

from tfdp_embed.clipping import LayerRegistry
from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.clipping import default_registry
from tfdp_embed.keras2.layers.embedding import DPEmbedding
from tfdp_embed.keras2.training import DPModel
from tfdp_embed.mechanisms.eana import EANA
from tfdp_embed.mechanisms.lazy import LazyDP

VOCAB, DIM, BATCH = 20, 4, 8


class SignFlip(keras.layers.Layer):
    """Needs autograph: a Python `if` on a tensor."""

    def call(self, x):
        if tf.reduce_sum(x) > 1e9:
            return -x
        return x


class Scaled(keras.layers.Dense):
    """A Dense subclass with a user's rule (`scaled_rule`), registered before the built-in ones."""


def scaled_rule(layer, taps, output_grads):
    """A user's rule needing autograph (wraps the Dense rule)."""
    from tfdp_embed.clipping import dense_layer_gradients

    info = dense_layer_gradients(layer, taps, output_grads)
    squared = info.squared_norms
    if tf.reduce_sum(squared) < 0:  # never: norms are >= 0
        squared = tf.zeros_like(squared)
    return dataclasses.replace(info, squared_norms=squared)


def user_loss(y, p):
    if tf.reduce_mean(p) > 1e9:
        return tf.zeros_like(p[:, 0])
    return tf.square(y[:, 0] - p[:, 0])


class GuardedSquare(keras.losses.Loss):
    """A user's Loss subclass needing autograph."""

    def call(self, y, p):
        if tf.reduce_mean(p) > 1e9:
            return tf.zeros_like(p[:, 0])
        return tf.square(y[:, 0] - p[:, 0])


class OwnLoss(keras.Model):
    """A model whose `compute_loss` (one value per example) needs autograph."""

    def __init__(self):
        super().__init__()
        self.inner = _model()

    def call(self, x, training=None):
        return self.inner(x, training=training)

    def compute_loss(self, data, training=None):
        x, y = data
        p = self(x, training=training)
        if tf.reduce_mean(p) > 1e9:
            return tf.zeros_like(p[:, 0])
        return tf.square(y[:, 0] - p[:, 0])


def _model():
    ids = keras.Input((3,), dtype="int64")
    x = DPEmbedding(VOCAB, DIM, combiner="mean")(ids)
    x = SignFlip()(x)
    x = Scaled(4, activation="relu")(x)
    return keras.Model(ids, keras.layers.Dense(1)(x))


def _data():
    rng = np.random.default_rng(0)
    x = rng.integers(0, VOCAB, (32, 3)).astype(np.int64)
    y = rng.normal(size=(32, 1)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)


def test_user_layers_losses_and_rules_needing_autograph_still_train():
    for mechanism in (
        EANA(l2_norm_clip=1.0, noise_multiplier=0.5, seed=0),
        LazyDP(l2_norm_clip=1.0, noise_multiplier=0.5, seed=0),
    ):
        registry = LayerRegistry([(Scaled, scaled_rule), *default_registry()._entries])
        dp = DPModel(_model(), mechanism=mechanism, expected_batch_size=BATCH, registry=registry)
        dp.compile(optimizer=keras.optimizers.legacy.SGD(0.1), loss=user_loss)
        dp.prepare(_data())
        step = tf.function(dp.train_step)  # autograph on, as a custom loop or the benchmarks trace it
        for batch in _data():
            assert np.isfinite(step(batch)["loss"].numpy())


def test_user_loss_subclass_and_compute_loss_needing_autograph_still_train():
    for model, loss in ((_model(), GuardedSquare()), (OwnLoss(), None)):
        if loss is None:
            model(next(iter(_data()))[0])  # build: `prepare` without a compiled loss needs a built model
        dp = DPModel(model, mechanism=EANA(l2_norm_clip=1.0, noise_multiplier=0.5, seed=0), expected_batch_size=BATCH)
        dp.compile(optimizer=keras.optimizers.legacy.SGD(0.1), loss=loss)
        dp.prepare(_data())
        step = tf.function(dp.train_step)
        for batch in _data().take(2):
            assert np.isfinite(step(batch)["loss"].numpy())


def test_library_stages_are_not_converted():
    from tfdp_embed.clipping import assemble, per_example
    from tfdp_embed.keras2 import training, training_losses
    from tfdp_embed.ops import sparse_rows

    for fn in (sparse_rows.noised_values_many, sparse_rows.unique, per_example.clip_factors, EANA.update):
        assert fn.__wrapped__ is not None  # do_not_convert's wrapper around the library function
    for fn in (
        DPModel.train_step,
        training._noise_and_apply,
        per_example.clipped_step,
        assemble.assemble,
        training_losses.per_example_losses,
        DPModel._update_metrics,
        DPEmbedding.bucket_ids,
        DPEmbedding._pooled_rows,
    ):
        assert fn.__code__ is not fn.__wrapped__.__code__  # as_written's wrapper around the library function
