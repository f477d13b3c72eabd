"""Keras-style losses in DPModel, written as a CTR user would: dict/list outputs, loss_weights, label ranks.

The oracles: a per-example loss written out by hand (BCE with logits,
weighted by output and by example), the DP update it implies (each
example's gradient of that loss clipped to C, averaged over B), and, with
sigma = 0 and a huge clip, the non-private Keras model compiled the same way.
"""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.layers.embedding import DPEmbedding
from tfdp_embed.keras2.training import DPModel
from tfdp_embed.mechanisms import DenseDPSGD, create

VOCAB, DIM, IDS, N, B = 40, 4, 3, 32, 8
BCE = keras.losses.BinaryCrossentropy(from_logits=True)
WEIGHTS = {"click": 1.0, "conversion": 0.5}


def ctr_model(seed=3, outputs="dict"):
    """Shared bottom, two heads: click and conversion logits."""
    keras.utils.set_random_seed(seed)
    ids = keras.Input((IDS,), dtype="int32", name="ids")
    x = DPEmbedding(VOCAB, DIM, combiner="mean", name="items")(ids)
    x = keras.layers.Dense(8, activation="tanh", name="hidden")(x)
    click = keras.layers.Dense(1, name="click")(x)
    conversion = keras.layers.Dense(1, name="conversion")(x)
    heads = {"click": click, "conversion": conversion} if outputs == "dict" else [click, conversion]
    return keras.Model(ids, heads)


def _data(n=N, seed=0, label_rank=2):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, (n, IDS)).astype("int32")
    shape = (n, 1) if label_rank == 2 else (n,)
    labels = {
        "click": rng.integers(0, 2, shape).astype("float32"),
        "conversion": rng.integers(0, 2, shape).astype("float32"),
    }
    sample_weight = rng.uniform(0.5, 2.0, n).astype("float32")
    return ids, labels, sample_weight


def _dataset(ids, labels, sample_weight=None, batch=B):
    parts = (ids, labels) if sample_weight is None else (ids, labels, sample_weight)
    return tf.data.Dataset.from_tensor_slices(parts).batch(batch)


def _dp(model, *, clip=1e6, mechanism="dense", **compile_kwargs):
    noise = create(mechanism, l2_norm_clip=clip, noise_multiplier=0.0, seed=0)
    dp = DPModel(model, mechanism=noise, expected_batch_size=B)
    dp.compile(optimizer=keras.optimizers.legacy.SGD(0.5), **compile_kwargs)
    return dp


def _keras(model, **compile_kwargs):
    model.compile(optimizer=keras.optimizers.legacy.SGD(0.5), **compile_kwargs)
    return model


def _max_diff(a, b):
    return max(float(np.abs(x - y).max()) for x, y in zip(a.get_weights(), b.get_weights()))


def _hand_loss(outputs, labels, sample_weight):
    """loss_i = sw_i * (1.0 * bce(click) + 0.5 * bce(conversion)), bce(z, y) = max(z, 0) - z y + log(1 + e^-|z|)."""
    total = 0.0
    for name, weight in WEIGHTS.items():
        z, y = tf.reshape(outputs[name], [-1]), tf.reshape(tf.cast(labels[name], tf.float32), [-1])
        total += weight * (tf.maximum(z, 0.0) - z * y + tf.math.log1p(tf.exp(-tf.abs(z))))
    return sample_weight * total


def test_dict_losses_and_loss_weights_give_the_hand_written_per_example_loss():
    ids, labels, sw = _data(B)
    model = ctr_model()
    dp = _dp(model, loss={"click": BCE, "conversion": BCE}, loss_weights=WEIGHTS)
    results = dp.evaluate(_dataset(ids, labels, sw), return_dict=True, verbose=0)
    per_example = _hand_loss(model(ids), labels, sw).numpy()
    assert results["loss"] == pytest.approx(per_example.mean(), rel=1e-5)
    # Per-output losses as Keras reports them: unweighted by loss_weights, weighted by sample_weight.
    for name in WEIGHTS:
        z, y = model(ids)[name].numpy().ravel(), labels[name].ravel()
        bce = np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z)))
        assert results[f"{name}_loss"] == pytest.approx((sw * bce).mean(), rel=1e-5)


def test_each_example_is_clipped_on_its_weighted_sum_of_output_losses():
    # One step, lr 0.5, clip 0.05 (every example clipped): the update is
    # -0.5 * sum_i clip_C(grad_i hand_loss_i) / B, with the per-example gradients by brute force.
    ids, labels, sw = _data(B)
    clip = 0.05
    reference = ctr_model()
    with tf.GradientTape() as tape:
        losses = _hand_loss(reference(ids), labels, sw)
    jacobians = tape.jacobian(losses, reference.trainable_variables)
    flat = np.concatenate([np.reshape(j.numpy(), [B, -1]) for j in jacobians], axis=1)
    norms = np.linalg.norm(flat, axis=1)
    assert (norms > clip).all()  # every example is clipped: a wrong per-example loss shows
    factors = clip / np.maximum(norms, clip)
    expected = [
        w - 0.5 * np.tensordot(factors, j.numpy(), axes=1) / B for w, j in zip(reference.get_weights(), jacobians)
    ]

    model = ctr_model()
    dp = _dp(model, clip=clip, loss={"click": BCE, "conversion": BCE}, loss_weights=WEIGHTS)
    dp.fit(_dataset(ids, labels, sw), epochs=1, verbose=0)
    for got, want in zip(model.get_weights(), expected):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("mechanism", ["dense", "lazy"])
def test_dict_losses_with_zero_noise_and_huge_clip_train_like_keras(mechanism):
    ids, labels, sw = _data()
    compile_kwargs = dict(loss={"click": BCE, "conversion": "binary_crossentropy"}, loss_weights=WEIGHTS)
    keras_model = _keras(ctr_model(), **compile_kwargs)
    keras_model.fit(_dataset(ids, labels, sw), epochs=2, verbose=0, shuffle=False)
    model = ctr_model()
    dp = _dp(model, mechanism=mechanism, **compile_kwargs)
    history = dp.fit(_dataset(ids, labels, sw), epochs=2, verbose=0)
    dp.flush()  # LazyDP: the (zero) noise it owes
    assert _max_diff(keras_model, model) < 1e-5
    assert _max_diff(ctr_model(), model) > 1e-3  # it trained
    assert {"loss", "click_loss", "conversion_loss"} <= set(history.history)


def test_one_loss_applies_to_every_dict_output_as_in_keras():
    ids, labels, _ = _data()
    keras_model = _keras(ctr_model(), loss=BCE, loss_weights=WEIGHTS)
    keras_model.fit(_dataset(ids, labels), epochs=1, verbose=0, shuffle=False)
    model = ctr_model()
    _dp(model, loss=BCE, loss_weights=WEIGHTS).fit(_dataset(ids, labels), epochs=1, verbose=0)
    assert _max_diff(keras_model, model) < 1e-5


@pytest.mark.parametrize("mechanism", ["dense", "lazy"])
def test_list_outputs_take_losses_and_weights_by_position(mechanism):
    ids, labels, sw = _data()
    targets = (labels["click"], labels["conversion"])
    compile_kwargs = dict(loss=[BCE, "mse"], loss_weights=[1.0, 0.25])
    keras_model = _keras(ctr_model(outputs="list"), **compile_kwargs)
    keras_model.fit(_dataset(ids, targets, sw), epochs=1, verbose=0, shuffle=False)
    model = ctr_model(outputs="list")
    dp = _dp(model, mechanism=mechanism, **compile_kwargs)
    history = dp.fit(_dataset(ids, targets, sw), epochs=1, verbose=0)
    dp.flush()
    assert _max_diff(keras_model, model) < 1e-5
    assert {"click_loss", "conversion_loss"} <= set(history.history)  # named after the output layers


def test_dict_losses_name_the_outputs_of_a_list_model():
    ids, labels, _ = _data()
    targets = (labels["click"], labels["conversion"])
    keras_model = _keras(ctr_model(outputs="list"), loss={"click": BCE, "conversion": "mse"})
    keras_model.fit(_dataset(ids, targets), epochs=1, verbose=0, shuffle=False)
    model = ctr_model(outputs="list")
    _dp(model, loss={"click": BCE, "conversion": "mse"}).fit(_dataset(ids, targets), epochs=1, verbose=0)
    assert _max_diff(keras_model, model) < 1e-5


@pytest.mark.parametrize(
    "loss, mechanism",
    [(BCE, "dense"), ("binary_crossentropy", "dense"), (keras.losses.binary_crossentropy, "dense"), (BCE, "lazy")],
)
def test_one_dimensional_labels_against_b_by_1_logits_train_like_keras(loss, mechanism):
    ids, labels, _ = _data(label_rank=1)
    labels_2d = {k: v[:, None] for k, v in labels.items()}
    keras_model = _keras(ctr_model(), loss=loss)
    keras_model.fit(_dataset(ids, labels), epochs=1, verbose=0, shuffle=False)
    trained = []
    for targets in (labels, labels_2d):
        model = ctr_model()
        dp = _dp(model, mechanism=mechanism, loss=loss)
        dp.fit(_dataset(ids, targets), epochs=1, verbose=0)
        dp.flush()
        trained.append(model)
    assert _max_diff(trained[0], trained[1]) < 1e-6
    assert _max_diff(keras_model, trained[0]) < 1e-5


def test_single_output_model_with_one_dimensional_labels():
    keras.utils.set_random_seed(1)
    ids = keras.Input((IDS,), dtype="int32")
    model = keras.Model(ids, keras.layers.Dense(1)(DPEmbedding(VOCAB, DIM, combiner="mean")(ids)))
    data, labels, _ = _data(label_rank=1)
    history = _dp(model, loss=BCE).fit(_dataset(data, labels["click"]), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all()


@pytest.mark.parametrize(
    "compile_kwargs, match",
    [
        (dict(loss={"click": BCE, "clicks": BCE}), r"`loss` has keys \['clicks'\] that name no model output"),
        (dict(loss=[BCE, BCE]), r"`loss` is a list but the model returns a dict of outputs \['click', 'conversion'\]"),
        (dict(loss=BCE, loss_weights={"click": 1.0, "cvr": 2.0}), r"`loss_weights` has keys \['cvr'\]"),
        (dict(loss=BCE, loss_weights={"click": "high"}), r"`loss_weights` must be numbers"),
        (dict(loss={"click": None, "conversion": None}), r"`loss` gives no loss for any model output"),
        (dict(loss={"click": "no_such_loss"}), r"`loss` entry 'no_such_loss' is not a Keras loss"),
    ],
)
def test_bad_loss_configurations_name_what_is_wrong(compile_kwargs, match):
    ids, labels, _ = _data(B)
    dp = _dp(ctr_model(), **compile_kwargs)
    with pytest.raises(ValueError, match=match):
        dp.fit(_dataset(ids, labels), epochs=1, verbose=0)


def test_list_of_wrong_length_is_an_error():
    ids, labels, _ = _data(B)
    dp = _dp(ctr_model(outputs="list"), loss=[BCE, BCE, BCE])
    with pytest.raises(ValueError, match=r"`loss` must give one entry per model output \(2, in order\)"):
        dp.fit(_dataset(ids, (labels["click"], labels["conversion"])), epochs=1, verbose=0)


def test_an_output_with_a_loss_but_no_labels_is_an_error():
    ids, labels, _ = _data(B)
    dp = _dp(ctr_model(), loss={"click": BCE, "conversion": BCE})
    with pytest.raises(ValueError, match="Output 'conversion' has a loss but the data has no labels for it"):
        dp.fit(_dataset(ids, {"click": labels["click"]}), epochs=1, verbose=0)


def test_loss_weights_without_a_loss_is_an_error():
    class Ranker(keras.Model):
        def compute_loss(self, data, training=False):  # pragma: no cover - never called
            raise AssertionError

    dp = DPModel(Ranker(), mechanism=DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=0.0, seed=0), expected_batch_size=B)
    with pytest.raises(ValueError, match="`loss_weights` weighs the losses given in `loss`"):
        dp.compile(optimizer=keras.optimizers.legacy.SGD(0.1), loss_weights={"click": 1.0})


def test_a_loss_function_that_averages_over_the_batch_is_refused():
    def batch_mean_bce(y_true, y_pred):
        return tf.reduce_mean(keras.losses.binary_crossentropy(y_true, y_pred, from_logits=True))

    ids, labels, _ = _data(B)
    dp = _dp(ctr_model(), loss={"click": batch_mean_bce})
    with pytest.raises(PrivacyContractError, match="loss of output 'click' .* returned one value for the whole batch"):
        dp.fit(_dataset(ids, labels), epochs=1, verbose=0)
