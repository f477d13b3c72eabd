"""A non-legacy optimizer on a sparse table is warned about once, naming the legacy one (tfdp_embed/keras2/optimizer_check.py).

Written as the user who compiles with `keras.optimizers.SGD` (tf-keras' new-style
optimizer) and sees a step as slow as the table is large.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from tfdp_embed import DPEmbedding, DPModel, data, keras, mechanisms, tf

N, VOCAB, Q = 64, 500, 0.25


def _fit(optimizer, mechanism_name, epochs=1):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, (N, 3)).astype("int32")
    labels = rng.integers(0, 2, (N, 1)).astype("float32")
    batches, _ = data.poisson_batches(
        tf.data.Dataset.from_tensor_slices((ids, labels)), sampling_probability=Q, num_examples=N, seed=0
    )
    inputs = keras.Input((3,), dtype="int32")
    model = keras.Model(inputs, keras.layers.Dense(1)(DPEmbedding(VOCAB, 4, combiner="mean")(inputs)))
    mechanism = mechanisms.create(mechanism_name, l2_norm_clip=1.0, noise_multiplier=1.0, seed=0)
    dp = DPModel(model, mechanism=mechanism, expected_batch_size=Q * N)
    dp.compile(optimizer=optimizer, loss=keras.losses.BinaryCrossentropy(from_logits=True))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dp.fit(batches, epochs=epochs, verbose=0)
        dp.fit(batches, epochs=1, verbose=0)  # a second fit: no second warning
    return [w for w in caught if "legacy" in str(w.message)]


def test_new_style_sgd_on_a_sparse_table_warns_once_naming_legacy_sgd():
    found = _fit(keras.optimizers.SGD(0.1), "eana", epochs=2)
    assert len(found) == 1
    message = str(found[0].message)
    assert "`keras.optimizers.legacy.SGD`" in message and "rewriting each whole table" in message
    assert "embeddings" in message  # names the table


def test_new_style_adam_names_legacy_adam():
    found = _fit(keras.optimizers.Adam(0.01), "eana")
    assert len(found) == 1 and "`keras.optimizers.legacy.Adam`" in str(found[0].message)


@pytest.mark.parametrize(
    "optimizer, mechanism_name",
    [
        (lambda: keras.optimizers.legacy.SGD(0.1), "eana"),  # sparse, applied sparsely
        (lambda: keras.optimizers.SGD(0.1), "dense"),  # dense DP-SGD: a dense gradient costs the same either way
    ],
    ids=["legacy_sgd_eana", "new_sgd_dense"],
)
def test_no_warning_when_nothing_is_lost(optimizer, mechanism_name):
    assert _fit(optimizer(), mechanism_name) == []
