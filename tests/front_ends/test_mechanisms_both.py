"""The mechanism tests, once per front end (tf-keras and Keras 3): same engine, same guarantees.

(a) zero noise and a huge clip reduce every mechanism (six) to the non-private
step; (b) the noise std on the weights matches eta * sigma * C / B; LazyDP,
flushed, matches dense DP-SGD in distribution; (c) bad input is refused
with a one-line error, and a model of the other front end is refused with
the name of the one to use.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import tensorflow as tf

from tfdp_embed import mechanisms

from .front_ends import ctr_batches, front_end, mechanism

MECHANISMS = ["DenseDPSGD", "LazyDP", "EANA", "DPFEST", "DPAdaFEST", "DPAdaFESTPlus"]


def _train(fe, mech, *, steps_data, lr=0.5, loss=None, batch=128):
    model = fe.ctr_model()
    dp = fe.dp_model(model, mech, batch=batch, lr=lr, loss=loss)
    dp.fit(steps_data, epochs=1, verbose=0)
    return dp


@pytest.mark.parametrize("name", MECHANISMS)
def test_zero_noise_and_huge_clip_is_the_non_private_step(fe, name):
    data = ctr_batches()
    private = _train(fe, mechanism(name, clip=1e6, sigma=0.0), steps_data=data)
    plain = _train(fe, mechanisms.NonPrivate(seed=0), steps_data=data)
    for got, want in zip(private.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def _zero_loss(y_true, y_pred):
    """One value per example whose gradient is 0: the update is the noise alone."""
    return tf.reduce_sum(y_pred, axis=-1) * 0.0


@pytest.mark.parametrize("name", ["DenseDPSGD", "LazyDP"])
def test_noise_std_on_the_table_matches_the_formula(fe, name):
    lr, clip, sigma, batch, steps = 0.5, 2.0, 1.5, 128, 4
    model_data = ctr_batches(n=batch * steps, batch=batch)
    dp = _train(fe, mechanism(name, clip=clip, sigma=sigma), steps_data=model_data, lr=lr, loss=_zero_loss)
    before = fe.ctr_model().get_weights()[0]
    table = dp.get_weights()[0]  # flushed: LazyDP adds every row's owed noise first
    delta = (table - before).ravel()
    want = lr * sigma * clip / batch * np.sqrt(steps)
    assert abs(delta.mean()) < 4 * want / np.sqrt(delta.size)
    assert delta.std() == pytest.approx(want, rel=0.05)


def test_lazy_and_dense_agree_in_distribution_on_both_front_ends(fe):
    """Untouched and touched rows alike: LazyDP's flushed table has dense DP-SGD's noise law (KS test)."""
    from scipy import stats

    data = ctr_batches(n=128 * 3, batch=128)
    deltas = []
    for name in ("DenseDPSGD", "LazyDP"):
        dp = _train(fe, mechanism(name, clip=1.0, sigma=1.0, seed=7), steps_data=data, loss=_zero_loss)
        deltas.append((dp.get_weights()[0] - fe.ctr_model().get_weights()[0]).ravel())
    assert stats.ks_2samp(*deltas).pvalue > 1e-3


def test_bad_input_is_refused_in_one_line(fe):
    model = fe.ctr_model()
    with pytest.raises(ValueError, match="expected_batch_size"):
        fe.DPModel(model, mechanism=mechanisms.DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0))
    with pytest.raises(TypeError, match="NoiseMechanism"):
        fe.DPModel(model, mechanism="dense", expected_batch_size=8)


def test_a_model_of_the_other_front_end_is_refused_with_the_one_to_use(fe):
    other = front_end("keras3" if fe.name == "keras2" else "keras2")
    with pytest.raises(TypeError, match=f"tfdp_embed.{other.name}"):
        fe.DPModel(
            other.ctr_model(),
            mechanism=mechanisms.DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0),
            expected_batch_size=8,
        )


@pytest.mark.parametrize("optimizer", ["Adam", "Adagrad"])
def test_lazy_dp_refuses_another_optimizer_naming_the_front_ends_sgd(fe, optimizer):
    # Keras 3 used to be told to use tf-keras' `keras.optimizers.legacy.SGD` (issue 29).
    sgd = {"keras2": "keras.optimizers.legacy.SGD", "keras3": "keras.optimizers.SGD"}[fe.name]
    optimizers = fe.keras.optimizers.legacy if fe.name == "keras2" else fe.keras.optimizers
    lazy = mechanisms.LazyDP(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0)
    dp = fe.DPModel(fe.ctr_model(), mechanism=lazy, expected_batch_size=128)
    dp.compile(
        optimizer=getattr(optimizers, optimizer)(0.01), loss=fe.keras.losses.BinaryCrossentropy(from_logits=True)
    )
    with pytest.raises(
        ValueError, match=rf"^LazyDP supports only SGD \({re.escape(sgd)}, .* received optimizer {optimizer}\."
    ):
        dp.fit(ctr_batches(n=128), epochs=1, verbose=0)


@pytest.mark.parametrize("name", ["DenseDPSGD", "LazyDP"])
def test_noise_std_under_a_learning_rate_schedule_matches_the_formula(fe, name):
    """LazyDP's catch-up replays the schedule's rates: the table's noise std is sqrt(sum eta_t^2) * sigma * C / B."""
    lr, decay, clip, sigma, batch, steps = 0.5, 0.7, 2.0, 1.5, 128, 4
    schedule = fe.keras.optimizers.schedules.ExponentialDecay(lr, decay_steps=1, decay_rate=decay)
    dp = fe.DPModel(fe.ctr_model(), mechanism=mechanism(name, clip=clip, sigma=sigma), expected_batch_size=batch)
    dp.compile(optimizer=fe.sgd(schedule), loss=_zero_loss)
    dp.fit(ctr_batches(n=batch * steps, batch=batch), epochs=1, verbose=0)
    delta = (dp.get_weights()[0] - fe.ctr_model().get_weights()[0]).ravel()  # flushed
    rates = lr * decay ** np.arange(steps)
    want = np.sqrt(np.sum(rates**2)) * sigma * clip / batch
    assert delta.std() == pytest.approx(want, rel=0.05)
