"""Tests of DP-FEST (tfdp_embed/mechanisms/fest.py).

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
from tfdp_embed.mechanisms.fest import DPFEST
from tfdp_embed.mechanisms.topk_selection import bucket_counts


def table_step(layer, rows, values, *, variable=None, expected_batch_size=4.0, dense=()):
    vocab, dim = layer.vocabulary_size, layer.output_dim
    if variable is None:
        variable = tf.Variable(np.random.default_rng(0).normal(size=(vocab, dim)).astype(np.float32))
    grad = tf.IndexedSlices(
        tf.constant(values, tf.float32), tf.constant(rows, tf.int64), tf.constant([vocab, dim], tf.int64)
    )
    table = TableGradient(layer=layer, variable=variable, gradient=grad, occurrences=[], clip_factors=tf.ones([4]))
    step = ClippedGradients(
        tables=[table], dense=list(dense), expected_batch_size=expected_batch_size, batch_size=tf.constant(4)
    )
    return variable, step


def make(layers, counts=None, dense_variables=(), **kwargs):
    args = dict(l2_norm_clip=1.0, noise_multiplier=0.0, selection_epsilon=1e9, top_k=3, seed=0)
    args.update(kwargs)
    mechanism = DPFEST(counts=counts, **args)
    mechanism.init(tables=list(layers), dense_variables=list(dense_variables), optimizer=None)
    return mechanism


def test_all_rows_selected_zero_noise_is_sgd():
    layer = DPEmbedding(10, 4, name="all")
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    dense_var = tf.Variable(tf.ones([2]))
    variable, step = table_step(layer, [1, 5, 7], values, dense=[(dense_var, tf.constant([2.0, 4.0]))])
    mechanism = make([layer], counts={"all": np.zeros(10)}, dense_variables=[dense_var], top_fraction=1.0, top_k=None)
    assert mechanism.selections[0].epsilons == {"all": 0.0}  # keeping every row costs nothing
    (dense_grad, _), (table_grad, tv) = mechanism.update(step)
    np.testing.assert_allclose(dense_grad.numpy(), [0.5, 1.0])
    np.testing.assert_array_equal(table_grad.indices.numpy(), [1, 5, 7])
    np.testing.assert_allclose(table_grad.values.numpy(), values / 4.0)
    before = variable.numpy()
    keras.optimizers.legacy.SGD(0.1).apply_gradients([(table_grad, tv)])
    expected = before.copy()
    expected[[1, 5, 7]] -= 0.1 * values / 4.0
    np.testing.assert_allclose(variable.numpy(), expected, rtol=1e-6)


def test_huge_selection_epsilon_picks_true_top_k():
    layer = DPEmbedding(100, 2, name="t")
    counts = np.random.default_rng(3).permutation(100)
    mechanism = make([layer], counts={"t": counts}, top_k={"t": 7})
    np.testing.assert_array_equal(mechanism.selected_rows("t"), np.sort(np.argsort(-counts)[:7]))


def test_small_selection_epsilon_is_noisy():
    layer = DPEmbedding(300, 2, name="t")
    counts = np.arange(300) * 2
    true = set(range(290, 300))
    overlaps = []
    for seed in range(5):
        m = make([layer], counts={"t": counts}, top_k={"t": 10}, selection_epsilon=0.05, seed=seed)
        overlaps.append(len(true & set(m.selected_rows("t").tolist())))
    assert max(overlaps) < 10


def test_noise_on_every_selected_row_zero_change_elsewhere():
    # sigma = 2, C = 0.5 -> std 1.0 per coordinate of every selected row, touched or not.
    # 800 rows x 32 dims = 25,600 draws: sd of the sample std ~ 0.45%; tolerance 3%.
    vocab, dim, k = 4_000, 32, 800
    layer = DPEmbedding(vocab, dim, name="t")
    counts = np.zeros(vocab)
    counts[:k] = np.arange(k) + 10  # rows 0..799 are the top-k
    mechanism = make([layer], counts={"t": counts}, top_k=k, l2_norm_clip=0.5, noise_multiplier=2.0)
    selected = mechanism.selected_rows("t")
    np.testing.assert_array_equal(selected, np.arange(k))
    touched = np.array([3, 10, 799, 1_000, 3_999])  # 3 selected, 2 not
    grads = np.full((len(touched), dim), 100.0, np.float32)
    variable, step = table_step(layer, touched, grads, expected_batch_size=1.0)
    ((table_grad, tv),) = mechanism.update(step)
    assert table_grad.values.shape == (k, dim)  # O(k x dim): all selected rows
    np.testing.assert_array_equal(table_grad.indices.numpy(), selected)
    values = table_grad.values.numpy()
    pure_noise = np.delete(values, [3, 10, 799], axis=0)
    assert np.std(pure_noise) == pytest.approx(1.0, rel=0.03)
    assert np.mean(pure_noise) == pytest.approx(0.0, abs=0.03)
    np.testing.assert_allclose(values[[3, 10, 799]].mean(), 100.0, atol=1.0)  # signal + noise
    before = variable.numpy()
    keras.optimizers.legacy.SGD(1.0).apply_gradients([(table_grad, tv)])
    after = variable.numpy()
    np.testing.assert_array_equal(after[k:], before[k:])  # unselected (incl. touched 1000, 3999): frozen
    assert np.all(np.any(after[:k] != before[:k], axis=1))


def test_noisy_update_prefetches_the_selected_rows():
    """Every selected row is written each step, few were read: the update warms them for the scatter."""
    from tfdp_embed.ops import sparse_rows

    if not sparse_rows.available():
        pytest.skip("fused ops not built: nothing to prefetch with")
    layer = DPEmbedding(50, 4, name="t")
    ops = {}
    for sigma in (1.0, 0.0):
        mechanism = make([layer], counts={"t": np.arange(50)}, top_k=5, noise_multiplier=sigma)
        _, step = table_step(layer, [1, 49], np.ones((2, 4)))
        graph = tf.function(lambda: mechanism.update(step)).get_concrete_function().graph  # noqa: B023
        ops[sigma] = [node for node in graph.get_operations() if node.type == "TfdpEmbedPrefetchRows"]
    assert len(ops[1.0]) == 1 and not ops[0.0]  # sigma = 0 writes only the touched rows


def test_reselect_streaming_records_each_selection():
    layer = DPEmbedding(50, 2, name="t")
    first = np.arange(50) * 1e6  # gaps of 1e6 >> Gumbel scale 5 / 0.5 = 10: selection is exact
    mechanism = make([layer], counts={"t": first}, top_k=5, selection_epsilon=0.5, noise_multiplier=1.0)
    np.testing.assert_array_equal(mechanism.selected_rows("t"), np.arange(45, 50))
    with pytest.raises(ValueError, match="shape"):
        mechanism.reselect({"t": np.arange(10)})
    mechanism.reselect({"t": first[::-1]})  # the new period favours low rows
    np.testing.assert_array_equal(mechanism.selected_rows("t"), np.arange(5))
    events = mechanism.selection_events
    assert len(events) == 2 and mechanism.setup_event() == events[0]
    assert all(isinstance(e, dp_accounting.GaussianDpEvent) and e.noise_multiplier > 0 for e in events)
    report = mechanism.report()
    assert report["is_dp"] is True and report["selection_epsilon_spent"] == pytest.approx(1.0)
    assert len(report["selections"]) == 2
    # The ledger can compose both selections with the steps, under PLD and RDP.
    for accountant in (dp_accounting.pld.PLDAccountant(), dp_accounting.rdp.RdpAccountant()):
        accountant.compose(dp_accounting.ComposedDpEvent(events))
        accountant.compose(mechanism.step_event(0.01), 100)
        assert 0 < accountant.get_epsilon(1e-5) < np.inf


def test_selection_state_is_checkpointed(tmp_path):
    layer = DPEmbedding(30, 2, name="t")
    mechanism = make([layer], counts={"t": np.arange(30) * 1e6}, top_k=4, selection_epsilon=1.0)
    path = tf.train.Checkpoint(mechanism=mechanism).write(str(tmp_path / "ckpt"))
    fresh = make([layer], top_k=4, selection_epsilon=1.0)
    tf.train.Checkpoint(mechanism=fresh).read(path).assert_existing_objects_matched()
    np.testing.assert_array_equal(fresh.selected_rows("t"), [26, 27, 28, 29])
    assert int(fresh.selection_count.numpy()) == 1
    _, step = table_step(layer, [27, 3], np.ones((2, 2)))
    ((grad, _),) = fresh.update(step)  # restored selection is usable
    np.testing.assert_array_equal(grad.indices.numpy(), [27])


def test_reselect_before_select_and_update_before_select_raise():
    layer = DPEmbedding(20, 2, name="t")
    mechanism = make([layer], top_k=3)
    assert mechanism.setup_event() is None
    with pytest.raises(RuntimeError, match="select"):
        mechanism.reselect({"t": np.arange(20)})
    _, step = table_step(layer, [1], np.ones((1, 2)))
    with pytest.raises(tf.errors.InvalidArgumentError, match="select"):
        mechanism.update(step)
    with pytest.raises(RuntimeError, match="init"):
        DPFEST(l2_norm_clip=1.0, noise_multiplier=1.0, selection_epsilon=0.1, top_k=2).select({"t": np.arange(20)})


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(top_k=0), "top_k"),
        (dict(top_k=-3), "top_k"),
        (dict(top_k=None, top_fraction=0.0), "top_fraction"),
        (dict(top_k=None, top_fraction=1.5), "top_fraction"),
        (dict(top_k=2, top_fraction=0.5), "exactly one"),
        (dict(top_k=None), "exactly one"),
        (dict(selection_epsilon=0.0), "selection_epsilon"),
        (dict(selection_epsilon=-1.0), "selection_epsilon"),
        (dict(noise_multiplier=-1.0), "noise_multiplier"),
        (dict(l2_norm_clip=0.0), "l2_norm_clip"),
    ],
)
def test_bad_hyperparameters(kwargs, match):
    args = dict(l2_norm_clip=1.0, noise_multiplier=1.0, selection_epsilon=0.1, top_k=2)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        DPFEST(**args)


def test_k_larger_than_vocabulary_and_missing_table():
    layer = DPEmbedding(10, 2, name="t")
    with pytest.raises(ValueError, match="more than its vocabulary of 10"):
        make([layer], top_k=11)
    with pytest.raises(ValueError, match="top_k"):
        make([layer], top_k={"other": 2})
    with pytest.raises(ValueError, match="counts"):
        make([layer], counts={"other": np.arange(10)}, top_k=2)


def test_registered():
    assert MECHANISMS["fest"] is DPFEST


# -- end to end -------------------------------------------------------------------------
def tiny_model(seed):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((3,), dtype="int32", name="ids")
    x = DPEmbedding(40, 4, combiner="mean", name="emb")(inputs)
    return keras.Model(inputs, keras.layers.Dense(1)(x))


def tiny_data():
    rng = np.random.default_rng(0)
    ids = (rng.zipf(1.6, size=(32, 3)) % 30).astype(np.int32)
    labels = rng.integers(0, 2, size=(32, 1)).astype(np.float32)
    return ids, tf.data.Dataset.from_tensor_slices((ids, labels)).batch(8)


def test_end_to_end_dpmodel():
    ids, ds = tiny_data()
    loss = keras.losses.BinaryCrossentropy(from_logits=True)
    reference = tiny_model(2)
    reference.compile(optimizer=keras.optimizers.legacy.SGD(0.5), loss=loss)
    reference.fit(ds, epochs=2, shuffle=False, verbose=0)
    counts = bucket_counts(ds.map(lambda x, y: ({"emb": x}, y)), vocabulary_sizes={"emb": 40})
    # All rows kept, sigma = 0, huge clip: exactly non-private SGD.
    model = tiny_model(2)
    mech = DPFEST(
        l2_norm_clip=1e6, noise_multiplier=0.0, selection_epsilon=0.1, top_fraction=1.0, counts=counts, seed=0
    )
    dp = DPModel(model, mechanism=mech, expected_batch_size=8)
    dp.compile(optimizer=keras.optimizers.legacy.SGD(0.5), loss=loss)
    dp.fit(ds, epochs=2, shuffle=False, verbose=0)
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # k = 5 of 40 with noise: only the selected rows move (all of them, touched or not).
    model = tiny_model(2)
    initial = model.get_layer("emb").embeddings.numpy()
    mech = DPFEST(l2_norm_clip=1.0, noise_multiplier=1.0, selection_epsilon=1e6, top_k=5, counts=counts, seed=0)
    dp = DPModel(model, mechanism=mech, expected_batch_size=8)
    dp.compile(optimizer=keras.optimizers.legacy.SGD(0.5), loss=loss)
    dp.fit(ds, epochs=1, shuffle=False, verbose=0)
    selected = mech.selected_rows("emb")
    frozen = np.setdiff1d(np.arange(40), selected)
    assert counts["emb"][selected].min() >= counts["emb"][frozen].max()  # the true top-5, up to ties
    after = model.get_layer("emb").embeddings.numpy()
    np.testing.assert_array_equal(after[frozen], initial[frozen])
    assert np.all(np.any(after[selected] != initial[selected], axis=1))
