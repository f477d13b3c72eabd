"""SASRec / DPFormer model: exact per-example clipping (no fallback), loss, Re-Attention, serving."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from tfdp_embed import DPModel, keras, tf
from tfdp_embed.clipping.taps import layers_owning_weights
from tfdp_embed.keras2.clipping import (
    clipped_step,
    default_registry,
    record_taps,
    vectorized_layer_gradients,
)
from tfdp_embed.keras2.models.sasrec import SASRec, SASRecConfig, SASRecServing
from tfdp_embed.mechanisms import MECHANISMS

V, L, D = 12, 5, 8
IDS = np.array([[0, 0, 3, 5, 3], [1, 2, 3, 4, 5], [0, 0, 0, 0, 7], [0, 0, 0, 0, 0], [9, 9, 9, 9, 9]], np.int32)
TARGETS = np.array([[0, 0, 5, 3, 6], [2, 3, 4, 5, 6], [0, 0, 0, 0, 8], [0, 0, 0, 0, 0], [9, 9, 9, 9, 1]], np.int32)


def _model(re_attention=False, dropout=0.0, seed=0):
    keras.utils.set_random_seed(seed)
    model = SASRec(SASRecConfig(num_items=V, max_len=L, dim=D, blocks=2, dropout=dropout, re_attention=re_attention))
    model(IDS)
    if re_attention:
        errors = np.linspace(0.0, 0.5, V + 1).astype(np.float32)
        model.set_effective_errors(errors, 0.05)
    return model


@pytest.mark.parametrize("re_attention", [False, True])
def test_per_example_norms_are_exact_and_no_layer_falls_back(re_attention):
    model = _model(re_attention)
    layers = layers_owning_weights(model)
    covered = default_registry()
    assert all(covered.lookup(layer) is not None for layer in layers), [
        layer.name for layer in layers if covered.lookup(layer) is None
    ]
    with tf.GradientTape(persistent=True) as tape, record_taps(layers) as taps:
        loss = model.compute_loss((IDS, TARGETS), training=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the vectorized fallback warns
        step = clipped_step(
            taps, loss, tape, registry=default_registry(), fallback=vectorized_layer_gradients, l2_norm_clip=1.0
        )
    jac = tape.jacobian(loss, model.trainable_variables, experimental_use_pfor=False)
    brute = sum(np.sum(np.square(np.reshape(tf.convert_to_tensor(j), [len(IDS), -1])), axis=1) for j in jac)
    norms = step.norms.numpy() ** 2
    np.testing.assert_allclose(norms, brute, rtol=2e-4, atol=1e-9)
    assert norms[3] == 0.0  # the user with no target has no gradient


def test_loss_is_one_mean_cross_entropy_per_user():
    model = _model()
    loss = model.compute_loss((IDS, TARGETS)).numpy()
    logits = model.logits(model(IDS)).numpy()
    log_softmax = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    user0 = -np.mean([log_softmax[0, t, TARGETS[0, t]] for t in (2, 3, 4)])
    assert loss.shape == (5,) and loss[0] == pytest.approx(user0, rel=1e-5)
    assert logits.shape == (5, L, V + 1) and loss[3] == 0.0


def test_re_attention_with_zero_errors_equals_vanilla():
    vanilla, corrected = _model(False), _model(True)
    corrected.set_effective_errors(np.zeros(V + 1), 0.0)
    np.testing.assert_allclose(corrected(IDS).numpy(), vanilla(IDS).numpy(), rtol=1e-6, atol=1e-7)
    corrected.set_effective_errors(np.full(V + 1, 3.0), 0.1)
    assert not np.allclose(corrected(IDS).numpy(), vanilla(IDS).numpy(), atol=1e-4)


def test_dp_fit_zero_noise_huge_clip_equals_non_private():
    """DenseDPSGD with sigma = 0 and a huge clip takes the non-private step."""
    ds = tf.data.Dataset.from_tensor_slices((IDS, TARGETS)).batch(5)
    weights = []
    for name, kwargs in (("dense", dict(l2_norm_clip=1e6, noise_multiplier=0.0, seed=0)), ("none", dict(seed=0))):
        model = _model()
        dp = DPModel(model, mechanism=MECHANISMS[name](**kwargs), expected_batch_size=5)
        dp.compile(optimizer=keras.optimizers.legacy.SGD(0.5))
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            dp.fit(ds, epochs=1, verbose=0)
        weights.append([v.numpy() for v in model.trainable_variables])
    for a, b in zip(*weights):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_serving_top_k_and_bad_input(tmp_path):
    model = _model()
    serving = SASRecServing(model, k=3)
    out = serving.serve(tf.constant(IDS[:2]))
    assert out["items"].shape == (2, 3) and np.all(out["items"].numpy() >= 1)  # padding id never returned
    expected = np.argsort(-model.scores(IDS[:2]).numpy()[:, 1:], axis=1)[:, :3] + 1
    np.testing.assert_array_equal(out["items"].numpy(), expected)
    with pytest.raises(ValueError, match=r"shape \[batch, 5\]"):
        model(np.zeros((2, 4), np.int32))
    with pytest.raises(ValueError, match="`k` must be"):
        SASRecServing(model, k=0)
    with pytest.raises(ValueError, match="`dropout`"):
        SASRecConfig(num_items=3, dropout=1.0)
    with pytest.raises(ValueError, match="`item_errors`"):
        model.set_effective_errors(np.zeros(3), 0.0)


def test_popularity_prior_adds_log_frequencies_and_keeps_norms_exact():
    keras.utils.set_random_seed(0)
    config = SASRecConfig(num_items=V, max_len=L, dim=D, blocks=1, dropout=0.0, popularity_prior=True)
    model, plain = SASRec(config), _model()
    model(IDS)
    freq = np.linspace(0.0, 0.6, V + 1)  # item 1 has frequency 0.05; item 0 pads
    model.set_item_prior(freq, min_frequency=0.01)
    hidden = model(IDS)
    expected = model.items(hidden, mode="logits").numpy() + np.log(np.maximum(freq, 0.01))[None, None, :] * (
        np.arange(V + 1) > 0
    )
    np.testing.assert_allclose(model.logits(hidden).numpy(), expected, rtol=1e-6, atol=1e-6)
    # Only the table's own logits reach its gradient: per-example norms stay exact with the prior.
    with tf.GradientTape(persistent=True) as tape, record_taps(layers_owning_weights(model)) as taps:
        loss = model.compute_loss((IDS, TARGETS), training=False)
    step = clipped_step(
        taps, loss, tape, registry=default_registry(), fallback=vectorized_layer_gradients, l2_norm_clip=1.0
    )
    jac = tape.jacobian(loss, model.trainable_variables, experimental_use_pfor=False)
    brute = sum(np.sum(np.square(np.reshape(tf.convert_to_tensor(j), [len(IDS), -1])), axis=1) for j in jac)
    np.testing.assert_allclose(step.norms.numpy() ** 2, brute, rtol=2e-4, atol=1e-9)
    assert "item_log_prior" not in [v.name.split("/")[-1].split(":")[0] for v in model.trainable_variables]
    # Served scores include the prior: with a zero table every hidden state scores 0, so the
    # top items are the most frequent ones.
    model.items.embeddings.assign(tf.zeros_like(model.items.embeddings))
    served = SASRecServing(model, k=3).serve(tf.constant(IDS[:1]))["items"].numpy()
    np.testing.assert_array_equal(served, [[V, V - 1, V - 2]])
    with pytest.raises(ValueError, match="popularity_prior=True"):
        plain.set_item_prior(freq, min_frequency=0.01)
    with pytest.raises(ValueError, match="`item_frequencies`"):
        model.set_item_prior(freq[:3], min_frequency=0.01)
    with pytest.raises(ValueError, match="`min_frequency`"):
        model.set_item_prior(freq, min_frequency=0.0)


def _head_model(k, *, re_attention=False, popularity_prior=False, seed=0):
    keras.utils.set_random_seed(seed)
    config = SASRecConfig(
        num_items=V,
        max_len=L,
        dim=D,
        blocks=2,
        dropout=0.0,
        re_attention=re_attention,
        popularity_prior=popularity_prior,
        head_items=k,
    )
    model = SASRec(config)
    model(IDS)
    return model


FREQ = np.array([0.0, 0.1, 0.3, 0.5, 0.05, 0.4, 0.2, 0.05, 0.01, 0.6, 0.02, 0.03, 0.3])  # [V + 1]


def test_head_items_rows_follow_frequencies_and_the_tail_shares_one_row():
    model = _head_model(4)
    assert model.items.embeddings.shape == (6, D)  # padding, 4 head rows, 1 tail row
    model.set_item_rows(FREQ)
    rows = model.item_rows.numpy()
    # Most frequent first: 9 (0.6), 3 (0.5), 5 (0.4), then 2 and 12 tie at 0.3 -> the smaller id, 2.
    assert [rows[i] for i in (9, 3, 5, 2)] == [1, 2, 3, 4]
    assert rows[0] == 0 and all(rows[i] == 5 for i in (1, 4, 6, 7, 8, 10, 11, 12))
    freq_rows = model.row_frequencies(FREQ)
    np.testing.assert_allclose(freq_rows[:5], [0.0, 0.6, 0.5, 0.4, 0.3])
    assert freq_rows[5] == pytest.approx(min(1.0, FREQ.sum() - 0.6 - 0.5 - 0.4 - 0.3))
    # Every item is scored by its row: item i's logit is column rows[i] of the table's logits.
    hidden = model(IDS)
    table_logits = model.items(hidden, mode="logits").numpy()
    np.testing.assert_allclose(model.logits(hidden).numpy(), table_logits[..., rows], rtol=1e-6)
    # Lookups read the rows too: two tail items give the same input.
    a, b = IDS.copy(), IDS.copy()
    a[1, 0], b[1, 0] = 1, 4
    np.testing.assert_allclose(model(a).numpy(), model(b).numpy(), rtol=1e-6)


def test_head_items_all_items_equals_the_full_table():
    """head_items = V with rows in id order is the plain model (plus an unused tail row)."""
    plain, head = _model(), _head_model(V)
    head.set_item_rows(np.linspace(1.0, 0.1, V + 1))  # decreasing: item i -> row i
    np.testing.assert_array_equal(head.item_rows.numpy(), np.arange(V + 1))
    for src, dst in zip(plain.trainable_variables, head.trainable_variables):
        value = src.numpy()
        if dst.shape != value.shape:  # the item table: one extra (tail) row
            value = np.concatenate([value, np.zeros((1, D), value.dtype)])
        dst.assign(value)
    np.testing.assert_allclose(
        head.compute_loss((IDS, TARGETS)).numpy(), plain.compute_loss((IDS, TARGETS)).numpy(), rtol=1e-6
    )


@pytest.mark.parametrize("re_attention", [False, True])
def test_head_items_per_example_norms_are_exact(re_attention):
    model = _head_model(4, re_attention=re_attention, popularity_prior=True)
    model.set_item_rows(FREQ)
    model.set_item_prior(FREQ, min_frequency=0.01)
    if re_attention:
        model.set_effective_errors(np.linspace(0.0, 0.5, 6).astype(np.float32), 0.05)
    with tf.GradientTape(persistent=True) as tape, record_taps(layers_owning_weights(model)) as taps:
        loss = model.compute_loss((IDS, TARGETS), training=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        step = clipped_step(
            taps, loss, tape, registry=default_registry(), fallback=vectorized_layer_gradients, l2_norm_clip=1.0
        )
    jac = tape.jacobian(loss, model.trainable_variables, experimental_use_pfor=False)
    brute = sum(np.sum(np.square(np.reshape(tf.convert_to_tensor(j), [len(IDS), -1])), axis=1) for j in jac)
    np.testing.assert_allclose(step.norms.numpy() ** 2, brute, rtol=2e-4, atol=1e-9)


def test_head_items_bad_input():
    for k in (0, V + 1, True, 2.0):
        with pytest.raises(ValueError, match="`head_items` must be"):
            SASRecConfig(num_items=V, head_items=k)
    model = _head_model(4)
    with pytest.raises(ValueError, match="`item_frequencies`"):
        model.set_item_rows(FREQ[:5])
    with pytest.raises(ValueError, match="`item_frequencies`"):
        model.set_item_rows(np.where(np.arange(V + 1) == 2, np.nan, FREQ))
    with pytest.raises(ValueError, match=r"one per table row"):
        model.set_effective_errors(np.zeros(V + 1), 0.0)
    with pytest.raises(ValueError, match="head_items=k"):
        _model().set_item_rows(FREQ)


@pytest.mark.parametrize("popularity_prior", [False, True])
def test_head_items_loss_is_the_full_softmax_over_all_items(popularity_prior):
    """The loss summed over rows equals the cross-entropy of `logits` (all V + 1 items)."""
    model = _head_model(4, popularity_prior=popularity_prior)
    model.set_item_rows(FREQ)
    if popularity_prior:
        model.set_item_prior(FREQ, min_frequency=0.01)
    logits = model.logits(model(IDS)).numpy().astype(np.float64)
    log_softmax = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    weight = TARGETS > 0
    ce = -np.take_along_axis(log_softmax, TARGETS[..., None], axis=-1)[..., 0]
    expected = (ce * weight).sum(1) / np.maximum(weight.sum(1), 1)
    np.testing.assert_allclose(model.compute_loss((IDS, TARGETS)).numpy(), expected, rtol=1e-5, atol=1e-6)
