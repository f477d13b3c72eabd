"""Factored per-example gradients of a candidate tower that ends linearly (`clipping.shared_factored`).

The item tower a TFRS user writes (an item-id `DPEmbedding` subclass, a
multi-valued genre table with a mean combiner, concatenated, one Dense
without activation) is a fixed linear map of each candidate's rows, so the
traced step takes its norms from `FactoredGrads` and never back-propagates
the `[B, K, d]` per-example cotangents. Those norms and clipped sums must
equal brute-force per-example gradients (`tape.jacobian`, one row per
example) on a sample with repeated negatives (K = 20 draws from 12 items),
with and without the same tables read per example for the positive, in
float64 and in float32, and with two query towers scoring the same shared
tower (two factored terms per example). A tower with a non-linear layer is
not factored and keeps the vectorised path.
"""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed import DPEmbedding, keras, tf
from tfdp_embed.clipping.shared import SharedComputation
from tfdp_embed.clipping.shared_factored import FactoredGrads
from tfdp_embed.clipping.taps import layers_owning_weights, record_taps
from tfdp_embed.keras2.clipping import clipped_step, default_registry, shared_computation, vectorized_layer_gradients
from tfdp_embed.keras2.retrieval import FullSoftmax, Retrieval, SampledSoftmax

tfrs = pytest.importorskip("tensorflow_recommenders")

NUM_ITEMS, NUM_GENRES, NUM_USERS, DIM = 12, 4, 7, 3
# Repeated users and items; item 5's genres overlap item 7's.
BATCH = {"user_id": np.array([0, 1, 2, 3, 1, 6]), "item": np.array([3, 3, 5, 0, 11, 7])}


class ItemIdEmbedding(DPEmbedding):
    """A user's subclass that scales what `lookup` returns (a fixed scalar: still linear per row)."""

    def call(self, ids):
        return 2.0 * self.lookup(ids)


class ItemTower(keras.Model):
    def __init__(self, dtype, hidden_activation=None):
        super().__init__()
        self.item_id = ItemIdEmbedding(NUM_ITEMS, DIM, dtype=dtype)
        self.genres = DPEmbedding(NUM_GENRES, DIM, combiner="mean", dtype=dtype)
        self.hidden = keras.layers.Dense(4, activation=hidden_activation, dtype=dtype) if hidden_activation else None
        self.out = keras.layers.Dense(DIM, dtype=dtype)

    def call(self, features):
        x = tf.concat([self.item_id(features["item_id"]), self.genres(features["genres"])], axis=1)
        return self.out(x if self.hidden is None else self.hidden(x))


def _catalogue():
    genres = [[i % NUM_GENRES, (3 * i + 1) % NUM_GENRES] if i % 3 else [i % NUM_GENRES] for i in range(NUM_ITEMS)]
    return {"item_id": np.arange(NUM_ITEMS), "genres": tf.ragged.constant(genres, dtype=tf.int64)}


class TwoTower(tfrs.Model):
    def __init__(self, negatives, dtype, *, positives_from_user=False, hidden_activation=None):
        super().__init__()
        self.user_model = keras.Sequential(
            [DPEmbedding(NUM_USERS, DIM, dtype=dtype), keras.layers.Dense(DIM, dtype=dtype)]
        )
        self.item_model = ItemTower(dtype, hidden_activation)
        self.positives_from_user = positives_from_user
        self.task = Retrieval(self.item_model, _catalogue(), negatives=negatives, ks=(1, 5))

    def compute_loss(self, features, training=False):
        positives = None
        if self.positives_from_user:  # TFRS style: the same tables embed the positive per example
            positives = self.item_model(self.task.catalogue.gather(features["item"]))
        return self.task(
            self.user_model(features["user_id"]), positives, candidate_ids=features["item"], training=training
        )


def _model(negatives, dtype="float64", **kwargs):
    keras.utils.set_random_seed(0)
    model = TwoTower(negatives, dtype, **kwargs)
    model.compute_loss(BATCH)
    rng = np.random.default_rng(1)
    for v in model.trainable_variables:  # weights large enough that every term matters
        v.assign(rng.normal(0.0, 0.7, v.shape))
    return model


def _traced_step(model, c):
    """Per-layer squared norms and per-variable clipped sums of one traced (`tf.function`) step."""
    registry = default_registry()
    layers = layers_owning_weights(model)

    @tf.function
    def traced(batch):
        with tf.GradientTape() as tape, record_taps(layers, registry) as taps:
            loss = tf.cast(model.compute_loss(batch, training=True), tf.float32)
        step = clipped_step(taps, loss, tape, registry=registry, fallback=vectorized_layer_gradients, l2_norm_clip=1.0)
        norms = {tap.layer.name: info.squared_norms for tap, info in step.layers}
        sums = {v.name: tf.convert_to_tensor(g) for _, i in step.layers for v, g in zip(i.variables, i.clipped_sum(c))}
        return norms, sums

    return traced(BATCH)


def _brute_force(model):
    """Per-example gradients `[B, *v.shape]` of every variable, one jacobian row per example."""
    with tf.GradientTape(persistent=True) as tape:
        loss = model.compute_loss(BATCH, training=True)
    jacobians = tape.jacobian(loss, model.trainable_variables, experimental_use_pfor=False)
    return {
        v.name: tf.convert_to_tensor(j).numpy().astype(np.float64) for v, j in zip(model.trainable_variables, jacobians)
    }


def _no_vectorised_backprop(*args, **kwargs):
    raise AssertionError("the vectorised per-example backward pass ran: the tower was not factored")


# atol: the output bias's gradient is 0 up to round-off whenever every logit of an example moves by q . b
# (the positive scored by the same tower), so only round-off around 0 is compared there.
@pytest.mark.parametrize("dtype, rtol, atol", [("float64", 1e-6, 1e-12), ("float32", 2e-4, 1e-6)])
@pytest.mark.parametrize("positives_from_user", [False, True])
@pytest.mark.parametrize("negatives", [SampledSoftmax(20, seed=3), FullSoftmax()], ids=["sampled_repeats", "full"])
def test_factored_norms_and_sums_match_per_example_gradients(
    monkeypatch, negatives, positives_from_user, dtype, rtol, atol
):
    monkeypatch.setattr(SharedComputation, "per_example_output_grads", _no_vectorised_backprop)
    model = _model(negatives, dtype, positives_from_user=positives_from_user)
    if not negatives.full:  # 20 draws from 12 items: some negatives repeat
        sample = negatives.sample(tf.constant(0, tf.int64), NUM_ITEMS).numpy()
        assert len(set(sample.tolist())) < len(sample)
    c = tf.constant(np.linspace(0.2, 1.0, 6), tf.float32)
    with model.task.frozen_randomness():  # one sample for the traced step and the reference
        norms, sums = _traced_step(model, c)
        jacobians = _brute_force(model)
    per_variable = {name: np.sum(np.square(j.reshape(6, -1)), axis=1) for name, j in jacobians.items()}
    for layer in layers_owning_weights(model):
        expected = sum(per_variable[v.name] for v in layer.trainable_weights)
        np.testing.assert_allclose(norms[layer.name].numpy(), expected, rtol=rtol, err_msg=layer.name)
    for name, j in jacobians.items():
        want = np.tensordot(c.numpy().astype(np.float64), j, axes=1)
        got = sums[name].numpy()
        np.testing.assert_allclose(got, want, rtol=rtol, atol=max(rtol * np.abs(want).max(), atol), err_msg=name)


def test_a_non_linear_tower_is_not_factored_and_stays_exact():
    """A tanh layer below the output: the walk refuses, the vectorised backward pass runs instead."""
    model = _model(SampledSoftmax(20, seed=3), hidden_activation="tanh", positives_from_user=True)
    calls = []
    original = SharedComputation.per_example_output_grads

    def spy(self, score_grads):
        calls.append(1)
        return original(self, score_grads)

    c = tf.constant(np.linspace(0.2, 1.0, 6), tf.float32)
    with pytest.MonkeyPatch.context() as patch, model.task.frozen_randomness():
        patch.setattr(SharedComputation, "per_example_output_grads", spy)
        norms, _ = _traced_step(model, c)
        jacobians = _brute_force(model)
    assert calls, "a tower with tanh was factored"
    total = sum(np.sum(np.square(j.reshape(6, -1)), axis=1) for j in jacobians.values())
    np.testing.assert_allclose(sum(n.numpy().astype(np.float64) for n in norms.values()), total, rtol=1e-5)


def test_factored_grads_stand_for_the_outer_products():
    coefficients = tf.constant(np.arange(12.0).reshape(2, 3, 2))  # F=2, B=3, K=2
    vectors = tf.constant(np.arange(24.0).reshape(2, 3, 4))  # w=4
    dense = FactoredGrads(coefficients, vectors).dense().numpy()
    # Example 1, candidate 0: 2 * [4, 5, 6, 7] + 8 * [16, 17, 18, 19] = [136, 146, 156, 166]
    np.testing.assert_array_equal(dense[1, 0], [136.0, 146.0, 156.0, 166.0])
    assert dense.shape == (3, 2, 4)


class TwoScorers(tfrs.Model):
    """A user's own loss over a shared tower scored by two query towers (F = 2 factored terms)."""

    def __init__(self):
        super().__init__()
        self.first = keras.Sequential([DPEmbedding(NUM_USERS, DIM, dtype="float64")])
        self.second = keras.Sequential(
            [DPEmbedding(NUM_USERS, DIM, dtype="float64"), keras.layers.Dense(DIM, dtype="float64")]
        )
        self.item_model = ItemTower("float64")

    def compute_loss(self, features, training=False):
        with shared_computation() as shared:
            candidates = shared.output(self.item_model(_catalogue()))
        scores = []
        for tower in (self.first, self.second):
            q = tower(features["user_id"])
            scores.append(shared.scored_by(q, tf.matmul(q, candidates, transpose_b=True)))
        logits = tf.concat([scores[0], 0.5 * scores[1]], axis=1)
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=features["item"], logits=logits)


def test_two_scorers_give_two_factored_terms_and_stay_exact(monkeypatch):
    monkeypatch.setattr(SharedComputation, "per_example_output_grads", _no_vectorised_backprop)
    keras.utils.set_random_seed(0)
    model = TwoScorers()
    model.compute_loss(BATCH)
    rng = np.random.default_rng(2)
    for v in model.trainable_variables:
        v.assign(rng.normal(0.0, 0.7, v.shape))
    c = tf.constant(np.linspace(0.2, 1.0, 6), tf.float32)
    norms, sums = _traced_step(model, c)
    jacobians = _brute_force(model)
    per_variable = {name: np.sum(np.square(j.reshape(6, -1)), axis=1) for name, j in jacobians.items()}
    for layer in layers_owning_weights(model):
        expected = sum(per_variable[v.name] for v in layer.trainable_weights)
        np.testing.assert_allclose(norms[layer.name].numpy(), expected, rtol=1e-6, err_msg=layer.name)
    for name, j in jacobians.items():
        want = np.tensordot(c.numpy().astype(np.float64), j, axes=1)
        np.testing.assert_allclose(sums[name].numpy(), want, rtol=1e-6, atol=1e-12, err_msg=name)
