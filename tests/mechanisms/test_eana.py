"""Tests of EANA (tfdp_embed/mechanisms/eana.py).

Unit tests drive the mechanism with hand-built `ClippedGradients` and apply
its output with the legacy Keras SGD optimizer the train step uses; one
end-to-end test trains through `tfdp_embed.keras2.training.DPModel`.
"""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest

from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.layers.embedding import DPEmbedding
from tfdp_embed.keras2.training import DPModel
from tfdp_embed.mechanisms import MECHANISMS
from tfdp_embed.mechanisms.base import ClippedGradients, TableGradient
from tfdp_embed.mechanisms.eana import EANA


def table_step(vocab, dim, rows, values, *, expected_batch_size=4.0, dense=()):
    """A table variable plus a ClippedGradients whose table gradient touches `rows`."""
    layer = DPEmbedding(vocab, dim, name=f"t{vocab}x{dim}")
    variable = tf.Variable(np.random.default_rng(0).normal(size=(vocab, dim)).astype(np.float32))
    grad = tf.IndexedSlices(
        tf.constant(values, tf.float32), tf.constant(rows, tf.int64), tf.constant([vocab, dim], tf.int64)
    )
    table = TableGradient(layer=layer, variable=variable, gradient=grad, occurrences=[], clip_factors=tf.ones([4]))
    step = ClippedGradients(
        tables=[table], dense=list(dense), expected_batch_size=expected_batch_size, batch_size=tf.constant(4)
    )
    return layer, variable, step


def make(layer, dense_variables=(), **kwargs):
    mechanism = EANA(**{"l2_norm_clip": 1.0, "noise_multiplier": 0.0, "seed": 0, **kwargs})
    mechanism.init(tables=[layer], dense_variables=list(dense_variables), optimizer=None)
    return mechanism


def test_zero_noise_is_clipped_sgd():
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    dense_var = tf.Variable(tf.ones([2]))
    layer, variable, step = table_step(10, 4, [1, 5, 7], values, dense=[(dense_var, tf.constant([2.0, 4.0]))])
    pairs = make(layer, [dense_var]).update(step)
    (dense_grad, dv), (table_grad, tv) = pairs
    assert dv is dense_var and tv is variable
    np.testing.assert_allclose(dense_grad.numpy(), [0.5, 1.0])  # / expected batch 4
    assert isinstance(table_grad, tf.IndexedSlices)
    np.testing.assert_array_equal(table_grad.indices.numpy(), [1, 5, 7])
    np.testing.assert_allclose(table_grad.values.numpy(), values / 4.0)
    before = variable.numpy()
    keras.optimizers.legacy.SGD(0.1).apply_gradients([(table_grad, variable)])
    expected = before.copy()
    expected[[1, 5, 7]] -= 0.1 * values / 4.0
    np.testing.assert_allclose(variable.numpy(), expected, rtol=1e-6)


def test_noise_std_on_touched_rows_and_untouched_rows_unchanged():
    # sigma = 2, C = 0.5 -> std 1.0 per coordinate of a touched row (and of dense variables).
    # 1,000 touched rows x 32 dims = 32,000 draws: sd of the sample std ~ 1/sqrt(64,000) = 0.4%;
    # tolerance 3%.
    vocab, dim = 5_000, 32
    rows = np.arange(0, 2_000, 2)  # every other row of the first 2,000
    dense_var = tf.Variable(tf.zeros([40_000]))
    layer, variable, step = table_step(
        vocab,
        dim,
        rows,
        np.zeros((len(rows), dim)),
        expected_batch_size=1.0,
        dense=[(dense_var, tf.zeros([40_000]))],
    )
    mechanism = make(layer, [dense_var], l2_norm_clip=0.5, noise_multiplier=2.0)
    (dense_grad, _), (table_grad, _) = mechanism.update(step)
    assert table_grad.values.shape == (len(rows), dim)  # sparse: touched rows only
    assert np.std(table_grad.values.numpy()) == pytest.approx(1.0, rel=0.03)
    assert np.mean(table_grad.values.numpy()) == pytest.approx(0.0, abs=0.03)
    assert np.std(dense_grad.numpy()) == pytest.approx(1.0, rel=0.03)
    before = variable.numpy()
    keras.optimizers.legacy.SGD(1.0).apply_gradients([(table_grad, variable)])
    after = variable.numpy()
    untouched = np.setdiff1d(np.arange(vocab), rows)
    np.testing.assert_array_equal(after[untouched], before[untouched])  # exactly zero change
    assert np.all(np.any(after[rows] != before[rows], axis=1))
    assert int(mechanism.steps.numpy()) == 1


def test_seeded_noise_reproducible():
    outs = []
    for _ in range(2):
        layer, _, step = table_step(10, 4, [2, 3], np.zeros((2, 4)))
        outs.append(make(layer, noise_multiplier=1.0, seed=5).update(step)[0][0].values.numpy())
    np.testing.assert_array_equal(outs[0], outs[1])


def test_step_event_cannot_be_accounted_as_dp():
    mechanism = EANA(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0)
    event = mechanism.step_event(0.01)
    assert isinstance(event, dp_accounting.UnsupportedDpEvent)
    for accountant in (dp_accounting.pld.PLDAccountant(), dp_accounting.rdp.RdpAccountant()):
        with pytest.raises(dp_accounting.UnsupportedEventError):
            accountant.compose(dp_accounting.SelfComposedDpEvent(event, 100))
    assert mechanism.setup_event() is None


def test_report_says_not_dp():
    report = EANA(l2_norm_clip=1.0, noise_multiplier=0.01, seed=0).report()
    assert report["is_dp"] is False and EANA.is_dp is False
    assert report["mechanism"] == "eana"
    assert "NOT differentially private" in report["caveats"][0]
    assert "touched" in report["caveats"][0]
    assert not any(key.startswith("epsilon") for key in report)


def test_registered():
    assert MECHANISMS["eana"] is EANA


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(l2_norm_clip=0.0, noise_multiplier=1.0), "l2_norm_clip"),
        (dict(l2_norm_clip=1.0, noise_multiplier=-0.1), "noise_multiplier"),
        (dict(l2_norm_clip=1.0, noise_multiplier=float("nan")), "noise_multiplier"),
    ],
)
def test_bad_hyperparameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EANA(**kwargs)


def test_privacy_args_are_keyword_only():
    with pytest.raises(TypeError):
        EANA(1.0, 1.0)


# -- end to end -------------------------------------------------------------------------
def tiny_model(seed):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((3,), dtype="int32")
    x = DPEmbedding(40, 4, combiner="mean", name="emb")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(1)(x))
    return model


def tiny_data():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 20, size=(32, 3)).astype(np.int32)  # rows 20..39 never used
    labels = rng.integers(0, 2, size=(32, 1)).astype(np.float32)
    return ids, tf.data.Dataset.from_tensor_slices((ids, labels)).batch(8)


def test_end_to_end_dpmodel_matches_sgd_and_leaves_untouched_rows():
    ids, ds = tiny_data()
    loss = keras.losses.BinaryCrossentropy(from_logits=True)
    # Non-private reference: plain Keras SGD on the mean loss, same initial weights.
    reference = tiny_model(1)
    reference.compile(optimizer=keras.optimizers.legacy.SGD(0.5), loss=loss)
    reference.fit(ds, epochs=2, shuffle=False, verbose=0)
    # EANA with sigma = 0 and a huge clip is exactly that.
    model = tiny_model(1)
    initial = model.get_layer("emb").embeddings.numpy()
    dp = DPModel(model, mechanism=EANA(l2_norm_clip=1e6, noise_multiplier=0.0, seed=0), expected_batch_size=8)
    dp.compile(optimizer=keras.optimizers.legacy.SGD(0.5), loss=loss)
    dp.fit(ds, epochs=2, shuffle=False, verbose=0)
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # With noise: never-touched rows are bit-for-bit unchanged, touched rows moved.
    noisy = tiny_model(1)
    dp = DPModel(noisy, mechanism=EANA(l2_norm_clip=1.0, noise_multiplier=1.0, seed=3), expected_batch_size=8)
    dp.compile(optimizer=keras.optimizers.legacy.SGD(0.5), loss=loss)
    dp.fit(ds, epochs=1, shuffle=False, verbose=0)
    after = noisy.get_layer("emb").embeddings.numpy()
    used = np.unique(ids)
    unused = np.setdiff1d(np.arange(40), used)
    np.testing.assert_array_equal(after[unused], initial[unused])
    assert np.all(np.any(after[used] != initial[used], axis=1))
