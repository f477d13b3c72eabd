"""Two-tower model: exact per-example norms (vs brute-force jacobians), shapes, errors, DP training."""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed import DPModel, keras, mechanisms, tf
from tfdp_embed.clipping.taps import layers_owning_weights, record_taps
from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.keras2.clipping import (
    clipped_step,
    default_registry,
    vectorized_layer_gradients,
)
from tfdp_embed.keras2.models.two_tower import (
    ItemEmbedding,
    TwoTowerModel,
    two_tower_registry,
)

NUM_ITEMS, DIM, L = 7, 3, 4


def _batch():
    # Padding (0) anywhere, repeated ids inside one history, one label also in its own context.
    contexts = np.array([[1, 2, 2, 0], [3, 0, 0, 0], [7, 6, 5, 4], [0, 2, 0, 6], [5, 5, 5, 5]], np.int32)
    labels = np.array([3, 3, 1, 2, 5], np.int32)
    return contexts, labels


class _LookupAndSoftmax(TwoTowerModel):
    """Adds a label-tower lookup to the loss, so the item table is read both ways in one step."""

    def compute_loss(self, inputs, training=False):
        contexts, labels = inputs
        return super().compute_loss(inputs, training) + 0.3 * tf.reduce_sum(
            tf.sin(self.score(contexts, labels)[:, None] * tf.ones([1, 2])), axis=1
        )


def _registry_vs_jacobian(model, contexts, labels, *, registry):
    model(contexts)
    layers = layers_owning_weights(model)
    with tf.GradientTape(persistent=True) as tape, record_taps(layers, registry) as taps:
        loss = model.compute_loss((contexts, labels))
    step = clipped_step(
        taps,
        loss,
        tape,
        registry=registry,
        fallback=vectorized_layer_gradients,
        l2_norm_clip=0.05,
    )
    variables = model.trainable_variables
    jac = tape.jacobian(loss, variables, experimental_use_pfor=False)
    jac = [np.asarray(tf.convert_to_tensor(j)) for j in jac]
    batch = contexts.shape[0]
    expected = sum(np.sum(np.square(j.reshape(batch, -1)), axis=1) for j in jac)
    np.testing.assert_allclose(step.norms.numpy() ** 2, expected, rtol=2e-4)
    # Clipped sums: sum_i c_i J_i for every variable (tables as IndexedSlices over their rows).
    c = step.clip_factors.numpy()
    grads = {}
    for _, info in step.layers:
        for v, g in zip(info.variables, info.clipped_sum(step.clip_factors)):
            grads[v.ref()] = tf.convert_to_tensor(g).numpy()
    assert set(grads) == {v.ref() for v in variables}, "every trainable variable must be covered"
    for v, j in zip(variables, jac):
        np.testing.assert_allclose(
            grads[v.ref()],
            np.tensordot(c, j, axes=1),
            rtol=2e-4,
            atol=1e-7,
            err_msg=v.name,
        )
    return step


@pytest.mark.parametrize("model_class", [TwoTowerModel, _LookupAndSoftmax])
def test_per_example_norms_and_clipped_sums_match_brute_force(model_class):
    keras.utils.set_random_seed(1)
    model = model_class(num_items=NUM_ITEMS, embedding_dim=DIM, hidden_units=(5,))
    contexts, labels = _batch()
    model(contexts)
    # Larger weights so that every term (softmax, lookup, cross) matters.
    for v in model.trainable_variables:
        v.assign(tf.random.normal(v.shape, stddev=0.7, seed=3))
    _registry_vs_jacobian(model, contexts, labels, registry=two_tower_registry())


def test_default_registry_refuses_full_softmax_with_a_clear_error():
    model = TwoTowerModel(num_items=NUM_ITEMS, embedding_dim=DIM, hidden_units=())
    contexts, labels = _batch()
    # The default rule records ItemEmbedding's `lookup`; scoring reads the table another way.
    with pytest.raises(PrivacyContractError, match="two_tower_registry"):
        _registry_vs_jacobian(model, contexts, labels, registry=default_registry())


def test_shapes_log_probs_and_padding():
    model = TwoTowerModel(num_items=NUM_ITEMS, embedding_dim=DIM, hidden_units=(5,))
    contexts, labels = _batch()
    logits = model(contexts)
    assert logits.shape == (5, NUM_ITEMS)
    log_p = model.log_probs(contexts, labels).numpy()
    expected = tf.nn.log_softmax(logits).numpy()[np.arange(5), labels - 1]
    np.testing.assert_allclose(log_p, expected, rtol=1e-6)
    np.testing.assert_allclose(np.exp(tf.nn.log_softmax(logits).numpy()).sum(1), 1.0, rtol=1e-5)
    # Padding is ignored: [1, 2, 2, 0] pools like the mean of rows 1, 2, 2.
    table = model.history_embedding.embeddings.numpy()
    pooled = model.history_embedding(contexts[:1]).numpy()
    np.testing.assert_allclose(pooled[0], table[[1, 2, 2]].mean(0), rtol=1e-6)
    # Score = dot product of the towers = the logit of that item.
    np.testing.assert_allclose(
        model.score(contexts, labels).numpy(),
        logits.numpy()[np.arange(5), labels - 1],
        rtol=1e-5,
    )


def test_bad_inputs_are_rejected_with_messages():
    model = TwoTowerModel(num_items=NUM_ITEMS, embedding_dim=DIM, hidden_units=())
    with pytest.raises(tf.errors.InvalidArgumentError, match="at least one id other than the padding"):
        model(np.array([[1, 2], [0, 0]], np.int32))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"ids must lie in \[0, 8\)"):
        model(np.array([[1, 9]], np.int32))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"labels must be item ids in \[1, 7\]"):
        model.compute_loss((np.array([[1, 2]], np.int32), np.array([0], np.int32)))
    with pytest.raises(ValueError, match="padded histories of shape"):
        model(np.array([1, 2], np.int32))
    with pytest.raises(ValueError, match="embedding_dim"):
        TwoTowerModel(num_items=3, embedding_dim=0)
    with pytest.raises(ValueError, match="num_items"):
        ItemEmbedding(0, 2)


def _fit(mechanism, *, contexts, labels, lr=0.5, steps=4):
    keras.utils.set_random_seed(0)
    model = TwoTowerModel(num_items=NUM_ITEMS, embedding_dim=DIM, hidden_units=(4,))
    dp = DPModel(
        model,
        mechanism=mechanism,
        expected_batch_size=len(labels),
        registry=two_tower_registry(),
    )
    dp.compile(optimizer=keras.optimizers.legacy.SGD(lr))
    ds = tf.data.Dataset.from_tensors((contexts, labels)).repeat(steps)
    dp.fit(ds, epochs=1, verbose=0)
    return model


def test_zero_noise_huge_clip_equals_non_private_training():
    contexts, labels = _batch()
    private = _fit(
        mechanisms.DenseDPSGD(l2_norm_clip=1e6, noise_multiplier=0.0, seed=0),
        contexts=contexts,
        labels=labels,
    )
    baseline = _fit(mechanisms.NonPrivate(), contexts=contexts, labels=labels)
    for a, b in zip(private.trainable_variables, baseline.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-6, err_msg=a.name)


def test_eana_noises_every_item_row_but_only_touched_history_rows():
    """Full softmax touches every item row; the history table keeps EANA's sparsity."""
    contexts = np.array([[1, 2, 0, 0]], np.int32)
    labels = np.array([3], np.int32)
    keras.utils.set_random_seed(0)
    model = TwoTowerModel(num_items=NUM_ITEMS, embedding_dim=DIM, hidden_units=())
    model(contexts)
    before = {v.name: v.numpy().copy() for v in model.trainable_variables}
    sigma, clip = 100.0, 1.0
    dp = DPModel(
        model,
        mechanism=mechanisms.EANA(l2_norm_clip=clip, noise_multiplier=sigma, seed=1),
        expected_batch_size=1.0,
        registry=two_tower_registry(),
    )
    dp.compile(optimizer=keras.optimizers.legacy.SGD(1.0))
    dp.fit(tf.data.Dataset.from_tensors((contexts, labels)), epochs=1, verbose=0)
    history = model.history_embedding.embeddings.numpy() - before[model.history_embedding.embeddings.name]
    items = model.item_embedding.embeddings.numpy() - before[model.item_embedding.embeddings.name]
    untouched = [0, 3, 4, 5, 6, 7]
    assert np.all(history[untouched] == 0)
    assert np.all(np.abs(history[[1, 2]]) > 0)
    assert np.all(items[0] == 0)  # padding row: never a candidate
    # Every item row moved by ~ N(0, (sigma C)^2) (signal <= C is negligible at sigma = 100).
    moved = items[1:].reshape(-1)
    assert np.all(moved != 0)
    assert 0.6 * sigma * clip < moved.std() < 1.4 * sigma * clip
