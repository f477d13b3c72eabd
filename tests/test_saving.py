"""Saving as a Keras user does it: `dp.save(...)`, the default `ModelCheckpoint`, loading without custom_objects.

What is saved is the released model: the wrapped model with every noise
the mechanism owes added (LazyDP flushed), no mechanism, optimizer or
training metric. Training state that must resume goes through
`tfdp_embed.keras2.checkpointing.DPCheckpoint` (tests/test_checkpoint.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.layers.embedding import DPEmbedding
from tfdp_embed.keras2.training import DPModel
from tfdp_embed.mechanisms import create

VOCAB, DIM, IDS, B = 50, 4, 3, 8


def _model():
    keras.utils.set_random_seed(0)
    ids = keras.Input((IDS,), dtype="int32", name="ids")
    x = DPEmbedding(VOCAB, DIM, combiner="mean", name="items")(ids)
    x = keras.layers.Dense(8, activation="relu")(x)
    return keras.Model(ids, keras.layers.Dense(1, name="click")(x))


def _data():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, (4 * B, IDS)).astype("int32")
    return ids, rng.integers(0, 2, (4 * B, 1)).astype("float32")


def _trained_dp(mechanism="lazy", callbacks=()):
    dp = DPModel(
        _model(), mechanism=create(mechanism, l2_norm_clip=1.0, noise_multiplier=1.0, seed=0), expected_batch_size=B
    )
    dp.compile(optimizer=keras.optimizers.legacy.SGD(0.1), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    ids, labels = _data()
    dp.fit(tf.data.Dataset.from_tensor_slices((ids, labels)).batch(B), epochs=2, verbose=0, callbacks=list(callbacks))
    return dp


@pytest.mark.parametrize("filename", ["saved_model_dir", "model.keras"])
def test_dp_save_writes_the_flushed_model_that_loads_without_custom_objects(tmp_path, filename):
    dp = _trained_dp()
    path = str(tmp_path / filename)
    dp.save(path)
    loaded = keras.models.load_model(path)  # no custom_objects: DPEmbedding is registered
    ids, _ = _data()
    np.testing.assert_allclose(loaded.predict(ids, verbose=0), dp.inner.predict(ids, verbose=0), rtol=1e-6)
    assert not dp.mechanism.owes_noise()  # saving flushed LazyDP's owed noise first
    assert [w.shape for w in loaded.get_weights()] == [w.shape for w in dp.inner.get_weights()]


@pytest.mark.parametrize("filepath", ["ckpt_{epoch}", "ckpt_{epoch}.keras"])
def test_the_default_model_checkpoint_saves_the_released_model_each_epoch(tmp_path, filepath):
    callback = keras.callbacks.ModelCheckpoint(str(tmp_path / filepath))
    dp = _trained_dp(callbacks=[callback])
    last = keras.models.load_model(str(tmp_path / filepath.format(epoch=2)))
    for got, want in zip(last.get_weights(), dp.inner.get_weights()):
        np.testing.assert_array_equal(got, want)
    assert (tmp_path / filepath.format(epoch=1)).exists()
