"""The rule-coverage check under `mixed_bfloat16` at realistic batch sizes (issue 34).

Under bfloat16 compute (8-bit mantissa) the true gradient of a Dense layer
sums the batch's per-example terms in bfloat16, while the rules sum them in
float32: at batch 256 or 512 the two differ by far more than float32's
tolerance, and the check refused a plain Dense model on float features at
batch 4096 ("clipping rules miss part of the gradient" of a bias whose
per-example terms cancel). It must accept it, and still refuse a weight used
outside its layer (a table read outside `lookup`, a kernel read by the model)
under bfloat16.
"""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.layers.embedding import DPEmbedding
from tfdp_embed.keras2.training import DPModel
from tfdp_embed.mechanisms import DenseDPSGD

VOCAB, DIM, IDS, HIDDEN = 50, 16, 3, 64
BCE = keras.losses.BinaryCrossentropy(from_logits=True)


@pytest.fixture
def bfloat16():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    yield
    keras.mixed_precision.set_global_policy("float32")


class ReadsTableItself(DPEmbedding):
    def call(self, ids):
        rows = tf.cast(tf.gather(self.embeddings, ids), self.compute_dtype)
        return self.lookup(ids) + 0.1 * tf.reduce_mean(rows, axis=1)


class ReadsKernel(keras.Model):
    """ids -> table -> Dense -> head, plus a term that reads the Dense kernel outside the layer."""

    def __init__(self):
        super().__init__()
        self.table = DPEmbedding(VOCAB, DIM, combiner="mean", name="items")
        self.hidden = keras.layers.Dense(HIDDEN, activation="relu", name="hidden")
        self.head = keras.layers.Dense(1, dtype="float32", name="out")

    def call(self, ids):
        x = self.table(ids)
        h = self.hidden(x)
        leak = tf.reduce_sum(x * tf.cast(self.hidden.kernel[:, :1], x.dtype)[:, 0], axis=1, keepdims=True)
        return self.head(h) + 0.1 * tf.cast(leak, tf.float32)


def _model(table=DPEmbedding):
    keras.utils.set_random_seed(0)
    ids = keras.Input((IDS,), dtype="int32")
    x = table(VOCAB, DIM, combiner="mean", name="items")(ids)
    x = keras.layers.Dense(HIDDEN, activation="relu", name="hidden")(x)
    return keras.Model(ids, keras.layers.Dense(1, dtype="float32", name="out")(x))


def _dense_model(features=32, width=64):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((features,))
    x = keras.layers.Dense(width, activation="relu", name="hidden")(inputs)
    x = keras.layers.Dense(width, activation="relu", name="hidden2")(x)
    return keras.Model(inputs, keras.layers.Dense(1, dtype="float32", name="out")(x))


def _prepare(model, batch):
    rng = np.random.default_rng(0)
    floats = model.inputs and model.inputs[0].dtype == tf.float32  # _dense_model's features, else ids
    if floats:
        ids = rng.normal(size=(batch, model.inputs[0].shape[-1])).astype("float32")
    else:
        ids = rng.integers(0, VOCAB, (batch, IDS)).astype("int32")
    labels = rng.integers(0, 2, (batch, 1)).astype("float32")
    dp = DPModel(model, mechanism=DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0), expected_batch_size=batch)
    dp.compile(optimizer=keras.optimizers.legacy.SGD(0.1), loss=BCE)
    dp.prepare(tf.data.Dataset.from_tensors((ids, labels)))
    return dp


@pytest.mark.parametrize("batch", [256, 512])
def test_a_plain_dense_model_passes_the_coverage_check_under_bfloat16(bfloat16, batch):
    model = _model()
    assert model.get_layer("hidden").compute_dtype == "bfloat16"
    _prepare(model, batch)


@pytest.mark.parametrize("width", [64, 512])
def test_a_plain_dense_model_on_float_features_passes_at_batch_4096(bfloat16, width):
    # Refused before: the bias gradients' bfloat16 sums were off by ~0.65 round-offs of sum_i ||g_i||.
    _prepare(_dense_model(width=width), 4096)


def test_a_table_read_outside_lookup_is_still_refused_under_bfloat16(bfloat16):
    with pytest.raises(PrivacyContractError, match=r"rules miss part of the gradient of .*embeddings"):
        _prepare(_model(ReadsTableItself), 512)


def test_a_kernel_read_by_the_model_is_still_refused_under_bfloat16(bfloat16):
    model = ReadsKernel()
    model(np.zeros((2, IDS), "int32"))
    with pytest.raises(PrivacyContractError, match=r"rules miss part of the gradient of .*hidden/kernel"):
        _prepare(model, 512)
