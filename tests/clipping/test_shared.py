"""Shared computations: a TFRS two-tower whose item tower (DPEmbedding subclasses + Dense) runs over the catalogue.

Written as the user's code: a `tfrs.Model` with a query tower and an item
tower with features (item id table, a multi-valued genre table with a
mean combiner, Dense layers, LayerNormalization, a custom layer with no
rule), trained with `tfdp_embed.keras2.retrieval.Retrieval`. The per-example
squared norms and the clipped sums of every layer must equal the
brute-force jacobian (float64) for the full softmax, the sampled softmax,
and with the positive's embedding computed per example by the user (the
same tables read per example and inside the shared tower: cross terms).
"""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed import DPEmbedding, keras, tf
from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.keras2.clipping import shared_computation
from tfdp_embed.keras2.retrieval import FullSoftmax, Retrieval, SampledSoftmax

from .brute_force import check_against_brute_force, infos_by_layer

tfrs = pytest.importorskip("tensorflow_recommenders")

pytestmark = pytest.mark.filterwarnings("ignore:No per-example clipping rule for layer 'scale")

NUM_ITEMS, NUM_GENRES, NUM_USERS, DIM = 12, 4, 7, 3
F64 = "float64"


class ItemIdEmbedding(DPEmbedding):
    """A user's table subclass: scales what `lookup` returns (the rule sees it through `call`)."""

    def call(self, ids):
        return 2.0 * self.lookup(ids)


class Scale(keras.layers.Layer):
    """A custom layer without a clipping rule: the exact vectorised fallback handles it."""

    def build(self, input_shape):
        self.scale = self.add_weight("scale", shape=(input_shape[-1],), initializer="ones", dtype=F64)

    def call(self, x):
        return x * self.scale


class ItemTower(keras.Model):
    def __init__(self):
        super().__init__()
        self.item_id = ItemIdEmbedding(NUM_ITEMS, DIM, dtype=F64)
        self.genres = DPEmbedding(NUM_GENRES, DIM, combiner="mean", dtype=F64)
        self.hidden = keras.layers.Dense(5, activation="tanh", dtype=F64)
        self.norm = keras.layers.LayerNormalization(dtype=F64)
        self.scale = Scale(dtype=F64)
        self.out = keras.layers.Dense(DIM, dtype=F64)

    def call(self, features):
        x = tf.concat([self.item_id(features["item_id"]), self.genres(features["genres"])], axis=1)
        return self.out(self.scale(self.norm(self.hidden(x))))


def _catalogue():
    genres = [[i % NUM_GENRES, (3 * i + 1) % NUM_GENRES] if i % 3 else [i % NUM_GENRES] for i in range(NUM_ITEMS)]
    return {"item_id": np.arange(NUM_ITEMS), "genres": tf.ragged.constant(genres, dtype=tf.int64)}


class TwoTower(tfrs.Model):
    def __init__(self, negatives, *, positives_from_user=False):
        super().__init__()
        self.user_model = keras.Sequential([DPEmbedding(NUM_USERS, DIM, dtype=F64), keras.layers.Dense(DIM, dtype=F64)])
        self.item_model = ItemTower()
        self.positives_from_user = positives_from_user
        self.task = Retrieval(self.item_model, _catalogue(), negatives=negatives, ks=(1, 5))

    def compute_loss(self, features, training=False):
        queries = self.user_model(features["user_id"])
        positives = None
        if self.positives_from_user:  # TFRS style: the user's tower embeds the positive per example
            positives = self.item_model(self.task.catalogue.gather(features["item"]))
        return self.task(queries, positives, candidate_ids=features["item"], training=training)


# Repeated users and items, an item whose genres repeat a genre of another example's item.
BATCH = {"user_id": np.array([0, 1, 2, 3, 1, 6]), "item": np.array([3, 3, 5, 0, 11, 7])}


def _model(negatives, **kwargs):
    keras.utils.set_random_seed(0)
    model = TwoTower(negatives, **kwargs)
    model.compute_loss(BATCH)
    rng = np.random.default_rng(1)
    for v in model.trainable_variables:  # weights large enough that every term matters
        v.assign(rng.normal(0.0, 0.7, v.shape))
    return model


@pytest.mark.parametrize("positives_from_user", [False, True])
@pytest.mark.parametrize(
    "negatives",
    [
        FullSoftmax(),
        SampledSoftmax(5, seed=3),
        SampledSoftmax(8, proposal=np.full(12, 1 / 12), proposal_provenance="public", seed=4),
    ],
    ids=["full", "sampled_uniform", "sampled_given"],
)
def test_item_tower_norms_and_clipped_sums_match_brute_force(negatives, positives_from_user):
    model = _model(negatives, positives_from_user=positives_from_user)
    with model.task.frozen_randomness():  # one sample for the build and the recorded pass
        # atol: the output bias's gradient is exactly 0 under the full softmax (a shift of every
        # candidate moves every logit by q . b), so only float64 round-off around 0 is compared there.
        result = check_against_brute_force(
            model, BATCH, loss_fn=lambda x: model.compute_loss(x, training=True), atol=1e-12
        )
    infos = infos_by_layer(result)
    # The catalogue rows the shared tower read are reported as shared rows of both tables.
    item_rows = infos[model.item_model.item_id.name].shared_rows.numpy()
    if negatives.full:
        assert sorted(item_rows) == list(range(NUM_ITEMS))
    assert sorted(infos[model.item_model.genres.name].shared_rows.numpy()) == sorted(
        set(np.concatenate([_catalogue()["genres"][int(i)].numpy() for i in item_rows]).tolist())
    )
    # The batch's own lookups of the item table appear as occurrences only when made per example.
    occurrences = infos[model.item_model.item_id.name].occurrences
    assert len(occurrences) == (0 if negatives.full and not positives_from_user else 1)


def test_traced_step_matches_brute_force():
    """Inside `tf.function` (as in `DPModel`) the per-example cotangents come from one vectorised pass."""
    from tfdp_embed.clipping.taps import layers_owning_weights, record_taps
    from tfdp_embed.keras2.clipping import clipped_step, default_registry, vectorized_layer_gradients

    model = _model(SampledSoftmax(5, seed=3), positives_from_user=True)
    registry = default_registry()
    layers = layers_owning_weights(model)
    c = tf.constant(np.linspace(0.2, 1.0, 6), tf.float32)

    @tf.function
    def traced(batch):
        with tf.GradientTape() as tape, record_taps(layers, registry) as taps:
            loss = tf.cast(model.compute_loss(batch, training=True), tf.float32)
        step = clipped_step(taps, loss, tape, registry=registry, fallback=vectorized_layer_gradients, l2_norm_clip=1.0)
        sums = {
            v.name: tf.convert_to_tensor(g)
            for _, info in step.layers
            for v, g in zip(info.variables, info.clipped_sum(c))
        }
        return tf.square(step.norms), sums

    with model.task.frozen_randomness():
        squared, sums = traced(BATCH)
        with tf.GradientTape(persistent=True) as tape:
            loss = model.compute_loss(BATCH, training=True)
        jacobians = tape.jacobian(loss, model.trainable_variables, experimental_use_pfor=False)
    expected = sum(np.sum(np.square(tf.convert_to_tensor(j).numpy().reshape(6, -1)), axis=1) for j in jacobians)
    np.testing.assert_allclose(squared.numpy(), expected, rtol=1e-5)
    for v, j in zip(model.trainable_variables, jacobians):
        want = np.tensordot(c.numpy().astype(np.float64), tf.convert_to_tensor(j).numpy(), axes=1)
        np.testing.assert_allclose(sums[v.name].numpy(), want, rtol=1e-6, atol=1e-12, err_msg=v.name)


def test_shared_computation_outside_training_is_inert():
    layer = keras.layers.Dense(2)
    with shared_computation() as shared:
        out = shared.output(layer(tf.ones([4, 3])))
    scores = shared.scored_by(tf.ones([5, 2]), tf.matmul(tf.ones([5, 2]), out, transpose_b=True))
    assert scores.shape == (5, 4) and shared.scorers == [] and shared.tape is None


def test_catalogue_tower_outside_a_shared_computation_is_refused_with_the_way_out():
    """The issue's natural attempt: an item tower over the catalogue inside `compute_loss`, by hand."""

    class ByHand(tfrs.Model):
        def __init__(self):
            super().__init__()
            self.user_model = DPEmbedding(NUM_USERS, DIM)
            self.item_model = keras.Sequential([DPEmbedding(NUM_ITEMS, DIM), keras.layers.Dense(DIM)])

        def compute_loss(self, features, training=False):
            candidates = self.item_model(tf.range(NUM_ITEMS))  # [num_items, d]: not per example
            logits = tf.matmul(self.user_model(features["user_id"]), candidates, transpose_b=True)
            return tf.nn.sparse_softmax_cross_entropy_with_logits(features["item"], logits)

    model = ByHand()
    batch = {k: v.astype("int32") for k, v in BATCH.items()}
    with pytest.raises(PrivacyContractError, match=r"leading size 12, the batch 6.*shared_computation"):
        check_against_brute_force(model, batch, loss_fn=lambda x: model.compute_loss(x))


def test_a_rule_without_shared_support_is_refused():
    from tfdp_embed.keras2.clipping import default_registry, dense_layer_gradients

    def my_dense_rule(layer, taps, output_grads):  # a user's rule, unaware of shared calls
        return dense_layer_gradients(layer, taps, output_grads)

    registry = default_registry()
    registry = type(registry)([(keras.layers.Dense, my_dense_rule), *registry])
    model = _model(FullSoftmax())
    with pytest.raises(PrivacyContractError, match=r"my_dense_rule.*per-example calls only"):
        check_against_brute_force(model, BATCH, registry=registry, loss_fn=lambda x: model.compute_loss(x))
