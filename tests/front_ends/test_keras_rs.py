"""keras-rs models under the Keras 3 front end: a DCN ranking model (keras_rs FeatureCross, DotInteraction).

FeatureCross holds Dense layers and calls them (`x0 * dense(x) + x`): the Dense
rules see every use of their weights, so the contract check passes and the
ghost norms are exact; with zero noise and a huge clip every mechanism trains
the model as the non-private step does, and a binding clip matches brute-force
per-example clipping.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tfdp_embed import mechanisms

from .front_ends import ctr_batches, front_end, mechanism

keras_rs = pytest.importorskip("keras_rs", reason="keras-rs is installed by `make install` (constraints/ci.txt)")


def _ranking_model(k3, seed=0):
    keras = k3.keras
    inputs = keras.Input((4,), dtype="int32")
    fields = k3.DPEmbedding(1000, 8, name="table")(inputs)  # [B, 4, 8]
    x0 = keras.layers.Flatten()(fields)
    crossed = keras_rs.layers.FeatureCross(projection_dim=4, name="cross")(x0, x0)
    dots = keras_rs.layers.DotInteraction()([fields[:, i] for i in range(4)])
    x = keras.layers.Concatenate()([crossed, dots])
    model = keras.Model(inputs, keras.layers.Dense(1, name="logit")(keras.layers.Dense(8, activation="relu")(x)))
    rng = np.random.default_rng(seed)
    model.set_weights([rng.normal(0, 0.1, w.shape).astype("float32") for w in model.get_weights()])
    return model


@pytest.mark.parametrize("name", ["DenseDPSGD", "LazyDP"])
def test_a_keras_rs_ranking_model_trains_as_the_non_private_step_at_zero_noise(name):
    k3 = front_end("keras3")
    weights = []
    for mech in (mechanism(name, clip=1e6, sigma=0.0), mechanisms.NonPrivate(seed=0)):
        dp = k3.dp_model(_ranking_model(k3), mech, batch=128)
        dp.fit(ctr_batches(), epochs=1, verbose=0)  # prepare ran the contract check on the first batch
        weights.append(dp.get_weights())
    for got, want in zip(*weights):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_a_keras_rs_ranking_model_clips_each_example_exactly():
    """One DP step with a binding clip and no noise against per-example gradients clipped one by one."""
    k3 = front_end("keras3")
    model, clip, lr = _ranking_model(k3), 0.05, 0.5
    batch = next(iter(ctr_batches(n=16, batch=16)))
    before = [w.copy() for w in model.get_weights()]
    loss = k3.keras.losses.BinaryCrossentropy(from_logits=True)
    expected = [np.zeros_like(w) for w in before]
    for x, y in zip(*[t.numpy() for t in batch]):
        with tf.GradientTape() as tape:
            value = loss.call(y[None], model(x[None], training=True))
        grads = [tf.convert_to_tensor(g).numpy() for g in tape.gradient(value, model.trainable_variables)]
        norm = np.sqrt(sum(np.sum(g * g) for g in grads))
        for total, g in zip(expected, grads):
            total += g * min(1.0, clip / norm)
    dp = k3.dp_model(model, mechanisms.DenseDPSGD(l2_norm_clip=clip, noise_multiplier=0.0), batch=16, lr=lr)
    dp.fit(tf.data.Dataset.from_tensors(batch), epochs=1, verbose=0)
    order = [v.path for v in model.trainable_variables]
    got = {v.path: w for v, w in zip(model.weights, model.get_weights())}
    start = {v.path: w for v, w in zip(model.weights, before)}
    for path, total in zip(order, expected):
        np.testing.assert_allclose(got[path], start[path] - lr * total / 16, rtol=1e-4, atol=1e-6, err_msg=path)
