"""The MovieLens two-tower model over user units: per-user clipping is exact (one tape per user as reference).

Contexts `[users, k, L]` (0 = padding id, a padding row all zeros with label 0) go through
`HistoryEmbedding` as ragged `[users, k, None]`, the full softmax scores `[users, k, d]`
queries, and a user's loss is the sum of their real rows' losses. One DP step with zero noise
and a binding clip must equal sum_u min(1, C / ||g_u||) g_u with g_u from a tape on user u's
rows alone. Hand-checkable sizes: 3 users with 1, 2 and 6 rows (k = 3: the last brings 3).
"""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed.data.user_batches import poisson_user_batches
from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.keras2 import DPModel
from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.models.two_tower import TwoTowerModel, two_tower_registry
from tfdp_embed.mechanisms import DenseDPSGD, NonPrivate

from .units import clipped_reference

K, ITEMS = 3, 12
# Contexts [rows, L = 3] (0-padded), labels in 1..12; users 7 (1 row), 9 (2 rows), 4 (6 rows).
CONTEXTS = np.array(
    [[1, 0, 0], [2, 3, 0], [2, 0, 0], [5, 6, 7], [5, 0, 0], [5, 6, 0], [5, 6, 7], [8, 9, 10], [11, 0, 0]], np.int32
)
LABELS = np.array([2, 4, 3, 8, 6, 7, 8, 11, 12], np.int32)
USERS = np.array([7, 9, 9, 4, 4, 4, 4, 4, 4], np.int64)


def _batch():
    batches, _ = poisson_user_batches(
        (CONTEXTS, LABELS), user_ids=USERS, max_examples_per_user=K, sampling_probability=1.0, seed=5
    )
    contexts, labels, weight = (t.numpy() for t in next(iter(batches)))
    assert contexts.shape == (3, K, 3) and np.all(labels[weight == 0] == 0)  # padding rows: label 0
    return contexts, labels


def _model():
    model = TwoTowerModel(num_items=ITEMS, embedding_dim=4, hidden_units=(5,))
    model.compute_loss((CONTEXTS[:2], LABELS[:2]))  # builds the weights
    rng = np.random.default_rng(0)
    model.set_weights([rng.normal(0, 0.7, w.shape).astype("float32") for w in model.get_weights()])
    return model


def _per_user_gradients(model, contexts, labels) -> list:
    out = []
    for c, y in zip(contexts, labels):
        real = y != 0
        with tf.GradientTape() as tape:  # the user's real rows alone, as plain examples
            loss = tf.reduce_sum(model.compute_loss((c[real], y[real])))
        grads = tape.gradient(loss, model.trainable_variables)
        out.append([tf.convert_to_tensor(g).numpy() for g in grads])
    return out


def _dp_step(model, batch, mechanism) -> list:
    before = [v.numpy().copy() for v in model.trainable_variables]
    dp = DPModel(model, mechanism=mechanism, expected_batch_size=1.0, registry=two_tower_registry())
    dp.compile(optimizer=keras.optimizers.legacy.SGD(1.0))
    dp.fit(tf.data.Dataset.from_tensors(batch), epochs=1, verbose=0)
    return [b - v.numpy() for b, v in zip(before, model.trainable_variables)]


def test_unit_loss_is_the_sum_of_the_users_real_rows():
    model = _model()
    contexts, labels = _batch()
    got = model.compute_loss((contexts, labels)).numpy()
    for u, (c, y) in enumerate(zip(contexts, labels)):
        real = y != 0
        np.testing.assert_allclose(got[u], model.compute_loss((c[real], y[real])).numpy().sum(), rtol=1e-5)


@pytest.mark.parametrize("clip", [0.05, 0.5, 1e6])
def test_dp_step_clips_each_users_summed_gradient(clip):
    model = _model()
    batch = _batch()
    expected = clipped_reference(_per_user_gradients(model, *batch), clip)
    got = _dp_step(model, batch, DenseDPSGD(l2_norm_clip=clip, noise_multiplier=0.0, seed=1))
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g, e, rtol=2e-4, atol=2e-6)


def test_the_item_rule_is_marked_exact_over_the_unit_axis_and_a_model_without_it_is_refused():
    from tfdp_embed.clipping.item_embedding import item_embedding_gradients

    assert item_embedding_gradients.handles_unit_axis
    batches, _ = poisson_user_batches(
        (CONTEXTS, LABELS), user_ids=USERS, max_examples_per_user=K, sampling_probability=1.0, seed=5
    )
    dp = DPModel(_model(), mechanism=NonPrivate(), expected_batch_size=1.0, registry=two_tower_registry())
    dp.compile(optimizer=keras.optimizers.legacy.SGD(1.0))
    dp.fit(batches.map(lambda c, y, w: (c, y)), epochs=1, verbose=0)  # trains: every rule is exact per user
    assert dp.batching.info.privacy_unit == "user"
    with pytest.raises((PrivacyContractError, ValueError)):
        TwoTowerModel(num_items=ITEMS).history_embedding(tf.zeros([2, 3, 4, 5], tf.int32))
