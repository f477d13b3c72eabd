"""A DLRM-style CTR model as a user writes it (issue 34): dict inputs, a bottom MLP, tables, dot interactions, two heads.

Dense features go through a bottom MLP; three categorical features are looked up in `DPEmbedding`
tables; the pairwise dot products of the four vectors (tf ops on Keras tensors) and the bottom
output feed a top MLP with two heads, `click` and `conversion`, compiled with a dict of losses and
`loss_weights`. The oracle: with zero noise and a huge clip one DP epoch equals Keras' own `fit`
of the same model; under LazyDP at epsilon 8 (noise calibrated by `plan_run` for the run's Poisson
batches) the model learns both heads (each loss below its base rate's) and the budget reports
epsilon in the epoch logs.
"""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed import DPEmbedding, DPModel, data, keras, plan_run, tf
from tfdp_embed.mechanisms import create

VOCABS, DIM, DENSE, N = {"site": 40, "ad": 60, "device": 5}, 4, 3, 2048
BCE = keras.losses.BinaryCrossentropy(from_logits=True)
WEIGHTS = {"click": 1.0, "conversion": 0.5}


def dlrm(seed=0):
    keras.utils.set_random_seed(seed)
    inputs = {"dense": keras.Input((DENSE,), name="dense")}
    inputs.update({name: keras.Input((1,), dtype="int32", name=name) for name in VOCABS})
    bottom = keras.layers.Dense(8, activation="relu", name="bottom_1")(inputs["dense"])
    bottom = keras.layers.Dense(DIM, name="bottom_2")(bottom)
    tables = [
        DPEmbedding(size, DIM, combiner="sum", name=f"{name}_table")(inputs[name]) for name, size in VOCABS.items()
    ]
    vectors = tf.stack([bottom, *tables], axis=1)  # [B, 4, DIM]
    dots = tf.matmul(vectors, vectors, transpose_b=True)  # [B, 4, 4]
    upper = tf.reshape(tf.gather(tf.reshape(dots, [-1, 16]), [1, 2, 3, 6, 7, 11], axis=1), [-1, 6])
    top = keras.layers.Dense(16, activation="relu", name="top")(tf.concat([bottom, upper], axis=1))
    heads = {name: keras.layers.Dense(1, name=name)(top) for name in WEIGHTS}
    return keras.Model(inputs, heads)


def examples(n=N, seed=0):
    rng = np.random.default_rng(seed)
    features = {"dense": rng.normal(size=(n, DENSE)).astype("float32")}
    features.update({name: rng.integers(0, size, (n, 1)).astype("int32") for name, size in VOCABS.items()})
    click = (features["ad"][:, 0] < 30).astype("float32")  # a table's rows decide the click
    conversion = (click * (features["dense"][:, 0] > 0)).astype("float32")  # and the dense features the conversion
    return features, {"click": click[:, None], "conversion": conversion[:, None]}


def _compile(model):
    model.compile(
        optimizer=keras.optimizers.legacy.SGD(0.5), loss={"click": BCE, "conversion": BCE}, loss_weights=WEIGHTS
    )
    return model


def test_zero_noise_and_a_huge_clip_train_like_keras():
    features, labels = examples(256)
    batches = tf.data.Dataset.from_tensor_slices((features, labels)).batch(32)
    plain = _compile(dlrm())
    plain.fit(batches, epochs=1, verbose=0, shuffle=False)
    model = dlrm()
    dp = DPModel(
        model, mechanism=create("lazy", l2_norm_clip=1e6, noise_multiplier=0.0, seed=0), expected_batch_size=32
    )
    _compile(dp)
    dp.fit(batches, epochs=1, verbose=0)
    dp.flush()
    for a, b in zip(model.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_lazydp_learns_both_heads_at_epsilon_8():
    features, labels = examples()
    q, epochs = 128 / N, 6
    per_epoch = round(1 / q)
    plan = plan_run(
        "lazy",
        target_epsilon=8.0,
        target_delta=1e-4,
        sampling_probability=q,
        steps=epochs * per_epoch,
        l2_norm_clip=1.0,
        accountant="rdp",
        seed=0,
    )
    dataset = tf.data.Dataset.from_tensor_slices((features, labels))
    batches, _ = data.poisson_batches(dataset, sampling_probability=q, num_examples=N, seed=0)
    dp = DPModel(dlrm(), mechanism=plan.mechanism, expected_batch_size=q * N)
    _compile(dp)
    history = dp.fit(batches, epochs=epochs, steps_per_epoch=per_epoch, callbacks=[plan.budget()], verbose=0)
    assert history.history["epsilon"][-1] == pytest.approx(8.0, abs=0.05)
    result = dp.evaluate(*examples(1024, seed=1), batch_size=256, verbose=0, return_dict=True)
    # measured (seeded): click 0.24 and conversion 0.70 of the base rate's log loss
    for name, bound in (("click", 0.5), ("conversion", 0.85)):
        rate = float(examples(1024, seed=1)[1][name].mean())
        base = -(rate * np.log(rate) + (1 - rate) * np.log(1 - rate))
        assert result[f"{name}_loss"] < bound * base, (name, result, base)
