"""On a real GPU: tables placed there train through the stock TensorFlow ops (marked `gpu`).

Skipped where TensorFlow sees no GPU (tests/conftest.py). Run with
`pytest -m gpu tests/ops/test_gpu.py` on a machine with a GPU build of TensorFlow.
"""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed import DPEmbedding, DPModel
from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.mechanisms import EANA, LazyDP, create

pytestmark = pytest.mark.gpu


def _model(mechanism):
    keras.utils.set_random_seed(0)
    ids = keras.Input((3,), dtype="int64")
    x = DPEmbedding(1000, 8, combiner="sum", name="t")(ids)
    model = keras.Model(ids, keras.layers.Dense(1)(x))
    dp = DPModel(model, mechanism=mechanism, expected_batch_size=64)
    dp.compile(optimizer=keras.optimizers.legacy.SGD(0.05), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    return model, dp


def _data():
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 1000, (512, 3)), rng.integers(0, 2, (512, 1)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(64)


def _train(mechanism, device: str):
    with tf.device(device):
        model, dp = _model(mechanism)
        dp.fit(_data(), epochs=1, verbose=0)
        dp.flush()
    return model


@pytest.mark.parametrize(
    "make",
    [
        lambda s: LazyDP(l2_norm_clip=1e6, noise_multiplier=s, seed=0),
        lambda s: EANA(l2_norm_clip=1e6, noise_multiplier=s, seed=0),
    ],
)
def test_gpu_table_without_noise_matches_the_cpu_run(make):
    on_gpu = _train(make(0.0), "/GPU:0")
    assert "GPU" in on_gpu.get_layer("t").embeddings.device.upper()
    on_cpu = _train(make(0.0), "/CPU:0")
    for g, c in zip(on_gpu.get_weights(), on_cpu.get_weights()):
        np.testing.assert_allclose(g, c, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["dense", "lazy", "eana", "fest", "adafest"])
def test_every_mechanism_trains_with_noise_on_the_gpu(name):
    extra = {
        "fest": {"top_k": {"t": 100}, "selection_epsilon": 1.0, "counts": {"t": np.ones(1000)}},
        "adafest": {"contribution_clip": 1.0, "contribution_noise_multiplier": 1.0, "threshold": 1.0},
    }
    mechanism = create(name, l2_norm_clip=1.0, noise_multiplier=1.0, seed=0, **extra.get(name, {}))
    model = _train(mechanism, "/GPU:0")
    table = model.get_layer("t").embeddings
    assert "GPU" in table.device.upper() and np.isfinite(table.numpy()).all()
