"""Attack (issue 33, M7): train a DPModel with a plain `tf.GradientTape` loop, outside its DP step.

A new user writes the textbook custom loop over the `DPModel` itself:
`loss = mse(y, dp(x)); grads = tape.gradient(loss, dp.trainable_variables)`.
Before the fix it trained, with no clipping, no noise and no warning: the
weights after one step equal the non-private update w - lr * grad(mean
loss) exactly (one example's gradient norm is ~300x the clip norm here).
Now the gradient through `dp(x)` is refused (`tfdp_embed.tape_guard`); the
named opt-out, differentiating `dp.inner`, still trains non-privately, by
choice.

Both front ends (the `fe` fixture of tests/conftest.py): the Keras 3
`DPModel` of 29202bd let the tape train it too (equal to the non-private
update to ~1e-7).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.mechanisms.dense import DenseDPSGD
from tfdp_embed.mechanisms.none import NonPrivate
from tfdp_embed.tape_guard import MESSAGE

LR, CLIP, SIGMA, BATCH = 0.1, 1.0, 1.0, 4


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH, 3)).astype("float32")
    y = rng.normal(size=(BATCH, 1)).astype("float32")
    y[0] = 100.0  # an outlier whose gradient is far beyond the clip norm
    return tf.constant(x), tf.constant(y)


def _dp(fe, mechanism=None):
    keras = fe.keras
    inputs = keras.Input((3,))
    dense = keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(seed=1))
    mechanism = mechanism or DenseDPSGD(l2_norm_clip=CLIP, noise_multiplier=SIGMA, seed=0)
    model = keras.Model(inputs, dense(inputs))
    return fe.dp_model(model, mechanism, batch=BATCH, lr=LR, loss=keras.losses.MeanSquaredError(reduction="none"))


def _tape_step(fe, model_to_call, variables, x, y):
    """The textbook custom training step."""
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(y - model_to_call(x, training=True)))
    grads = tape.gradient(loss, variables)
    fe.sgd(LR).apply_gradients(zip(grads, variables))


def _non_private_update(weights, x, y):
    """w - lr * grad of the mean squared error of Dense(1), by hand: grad_W = -2/B X^T (y - Xw - b)."""
    kernel, bias = weights
    residual = y.numpy() - x.numpy() @ kernel - bias
    return [kernel + LR * 2.0 / BATCH * x.numpy().T @ residual, bias + LR * 2.0 / BATCH * residual.sum(0)]


def test_a_gradient_tape_loop_through_the_dp_model_cannot_train_it(fe):
    dp = _dp(fe)
    x, y = _data()
    before = dp.inner.get_weights()
    try:
        _tape_step(fe, dp, dp.trainable_variables, x, y)
    except PrivacyContractError as error:
        assert str(error) == MESSAGE
        for got, want in zip(dp.inner.get_weights(), before):
            np.testing.assert_array_equal(got, want)  # nothing was applied
        return
    after = dp.inner.get_weights()
    moved = max(float(np.abs(a - b).max()) for a, b in zip(after, before))
    error = max(float(np.abs(a - b).max()) for a, b in zip(after, _non_private_update(before, x, y)))
    pytest.fail(
        f"a tape loop through the DPModel trained it (weights moved by {moved:.3g}) with no clipping and no "
        f"noise: the update equals the non-private one to {error:.2g}"
    )


def test_inside_a_tf_function_too(fe):
    dp = _dp(fe)
    x, y = _data()

    @tf.function
    def gradients():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(y - dp(x, training=True)))
        return tape.gradient(loss, dp.trainable_variables)

    with pytest.raises(Exception, match="Gradients through a DPModel outside its DP step") as raised:
        gradients()
    # AutoGraph re-raises errors from traced code as a StagingError carrying the message.
    assert isinstance(raised.value, PrivacyContractError) or "PrivacyContractError" in str(raised.value)


def test_an_outer_keras_model_holding_the_dp_model_cannot_fit_it(fe):
    dp = _dp(fe)
    x, y = _data()
    outer = fe.keras.Sequential([dp])
    outer.compile(optimizer=fe.sgd(LR), loss="mse")
    before = dp.inner.get_weights()
    with pytest.raises(Exception, match="Gradients through a DPModel outside its DP step"):
        outer.fit(x, y, epochs=1, verbose=0)
    for got, want in zip(dp.inner.get_weights(), before):
        np.testing.assert_array_equal(got, want)


def test_the_named_opt_out_and_the_dp_paths_still_work(fe):
    dp = _dp(fe)
    x, y = _data()
    before = dp.inner.get_weights()
    _tape_step(fe, dp.inner, dp.inner.trainable_variables, x, y)  # explicit: trains the wrapped model non-privately
    for got, want in zip(dp.inner.get_weights(), _non_private_update(before, x, y)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    forward = dp(x)  # a forward pass through the wrapper is fine
    np.testing.assert_allclose(forward.numpy(), dp.inner(x).numpy())
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(2)
    dp.fit(dataset, epochs=1, verbose=0)
    assert int(dp.mechanism.steps.numpy()) == 2
    dp.evaluate(dataset, verbose=0)
    assert dp.predict(dataset, verbose=0).shape == (BATCH, 1)


def test_non_private_models_keep_plain_gradients(fe):
    dp = _dp(fe, NonPrivate())
    x, y = _data()
    before = dp.inner.get_weights()
    _tape_step(fe, dp, dp.trainable_variables, x, y)  # no privacy claimed: nothing to refuse
    for got, want in zip(dp.inner.get_weights(), _non_private_update(before, x, y)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
