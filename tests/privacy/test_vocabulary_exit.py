"""Attacks (issue 33, N4 and N7): read who is in the training data off a vocabulary the model ships.

N7: a `StringLookup` adapted on the training rows and a `Normalization`
adapted on them (the standard TFRS recipe) ship unnoised in a DP model: a
new user's id is in the vocabulary, and with the other rows known the
target's feature value is N mean(D) - sum(D without the target), exactly.
`DPModel` must refuse such layers unless their state is a DP release or
declared public; layers built from DP releases are accepted.

N4: the sequential pipeline numbered items 1..(largest id in the file), so
the table shapes and the serving's `known_ids` said whether the one user
holding the largest id was in the data, with certainty. The item ids are
now a DP vocabulary (Gaussian thresholding, unit = user): the key only
that user holds is released with probability <= delta_thr, and the shapes
of neighbouring datasets are the same unless that happens.
"""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed._keras import keras, tf
from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.layers.embedding import DPEmbedding
from tfdp_embed.mechanisms.dense import DenseDPSGD
from tfdp_embed.training import DPModel

N, DIM, BATCH = 40, 3, 8
TARGET_ID, TARGET_AGE = "user_target", 87.25


def _rows(with_target: bool) -> tuple:
    rng = np.random.default_rng(0)
    users = np.array([f"user_{i}" for i in range(N)])
    ages = np.round(rng.uniform(18, 70, N), 2)
    if with_target:
        users, ages = np.append(users, TARGET_ID), np.append(ages, TARGET_AGE)
    labels = rng.integers(0, 2, len(users)).astype(np.float32)
    return users, ages.astype(np.float32), labels


def _model(lookup: keras.layers.Layer, normalization: keras.layers.Layer) -> keras.Model:
    user = keras.Input((1,), dtype=tf.string, name="user")
    age = keras.Input((1,), dtype=tf.float32, name="age")
    ids = lookup(user)
    table = DPEmbedding(lookup.vocabulary_size(), DIM, combiner="mean", name="users")
    features = keras.layers.Concatenate()([table(ids), normalization(age)])
    out = keras.layers.Dense(1, name="out", kernel_initializer=keras.initializers.GlorotUniform(seed=1))(features)
    return keras.Model({"user": user, "age": age}, out)


def _fit(model: keras.Model, users, ages, labels) -> DPModel:
    dp = DPModel(model, mechanism=DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0, seed=3), expected_batch_size=BATCH)
    dp.compile(optimizer=keras.optimizers.legacy.SGD(0.1), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    data = tf.data.Dataset.from_tensor_slices(({"user": users[:, None], "age": ages[:, None]}, labels[:, None]))
    dp.fit(data.batch(BATCH), epochs=1, verbose=0)
    return dp


def test_adapted_lookup_and_normalization_are_refused():
    users, ages, labels = _rows(with_target=True)
    lookup, normalization = keras.layers.StringLookup(), keras.layers.Normalization()
    lookup.adapt(users)
    normalization.adapt(ages[:, None])
    model = _model(lookup, normalization)
    try:
        _fit(model, users, ages, labels)
    except PrivacyContractError as error:
        assert "StringLookup" in str(error) and "Normalization" in str(error) and "dp_vocabulary" in str(error)
        return
    # Accepted: the attack on what the model holds (the exported SavedModel holds the same state).
    others = ages[:-1].astype(np.float64)
    recovered = float(normalization.mean.numpy().ravel()[0]) * (N + 1) - others.sum()
    in_vocabulary = TARGET_ID in lookup.get_vocabulary()
    pytest.fail(
        f"DPModel trained with data-adapted preprocessing: target id in the vocabulary: {in_vocabulary}; "
        f"target's age recovered from the mean: {recovered:.3f} (true {TARGET_AGE}, error "
        f"{abs(recovered - TARGET_AGE):.2g})"
    )


def test_dp_built_and_declared_public_layers_are_accepted():
    from tfdp_embed.contract.preprocessing import declare_public
    from tfdp_embed.data.dp_preprocessing import dp_normalization_statistics, lookup_layer, normalization_layer
    from tfdp_embed.data.vocabulary import dp_vocabulary

    users, ages, labels = _rows(with_target=True)
    # Each user holds its own id; "user_0" is also held by 400 more units (a shared id). Only that one passes
    # the threshold (a one-holder key passes with probability <= delta_thr = 5e-7); the rest map to OOV.
    units = [[u] for u in users] + [["user_0"]] * 400
    vocab = dp_vocabulary(units, max_keys_per_unit=1, epsilon=1.0, delta=1e-6, seed=0)
    assert vocab.keys.tolist() == ["user_0"]
    stats = dp_normalization_statistics(ages, clip_range=(0.0, 100.0), epsilon=1.0, delta=1e-6, seed=0)
    recovered = float(stats.mean[0]) * (N + 1) - ages[:-1].astype(np.float64).sum()
    assert abs(recovered - TARGET_AGE) > 1.0, recovered  # noise std of the mean x (N + 1): tens of years
    catalogue = declare_public(keras.layers.StringLookup(vocabulary=["user_0", "user_1"]), source="a public list")
    _fit(_model(catalogue, normalization_layer(stats)), users, ages, labels)
    _fit(_model(lookup_layer(vocab), normalization_layer(stats)), users, ages, labels)


def test_declaring_needs_a_source():
    from tfdp_embed.contract.preprocessing import declare_public

    with pytest.raises(ValueError, match="`source`"):
        declare_public(keras.layers.StringLookup(vocabulary=["a"]), source=" ")
    with pytest.raises(TypeError, match="preprocessing layer"):
        declare_public(keras.layers.Dense(1), source="x")
