"""Phantom Clipping of a SharedEmbedding against brute force, and inside DPModel."""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed.clipping.registry import LayerRegistry
from tfdp_embed.clipping.taps import LayerCall, LayerTaps
from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.clipping import (
    default_registry,
    embedding_layer_gradients,
    phantom_layer_gradients,
    record_taps,
)
from tfdp_embed.keras2.layers.shared_embedding import SharedEmbedding
from tfdp_embed.keras2.training import DPModel
from tfdp_embed.mechanisms import MECHANISMS
from tfdp_embed.mechanisms.none import NonPrivate

from .brute_force import check_against_brute_force, infos_by_layer

F64 = "float64"
VOCAB, DIM = 9, 4
# Repeated items inside one sequence (5 twice, 3 three times) and left padding (0).
SEQUENCES = [[0, 0, 5, 2, 5], [3, 3, 1, 3, 7], [0, 8, 8, 8, 8], [4, 6, 2, 1, 5]]


def _table(padding_id=0, seed=0):
    keras.utils.set_random_seed(seed)
    return SharedEmbedding(
        VOCAB,
        DIM,
        padding_id=padding_id,
        embeddings_initializer="glorot_uniform",
        dtype=F64,
        name="items",
    )


def _sasrec_like(table, *, last_only=False, length=5):
    """Lookup -> Dense -> LayerNorm -> shared-table logits ([B, L, V] or [B, V])."""
    ids = keras.Input((length,), dtype="int64")
    hidden = keras.layers.Dense(DIM, activation="tanh", dtype=F64)(table(ids))
    hidden = keras.layers.LayerNormalization(dtype=F64)(hidden)
    if last_only:
        hidden = hidden[:, -1]
    return keras.Model(ids, table(hidden, mode="logits"))


def _full_slices(result, table):
    info = infos_by_layer(result)[table.name]
    (grad,) = info.clipped_sum(tf.ones([result.batch_size]))
    assert isinstance(grad, tf.IndexedSlices)
    np.testing.assert_array_equal(grad.indices.numpy(), np.arange(VOCAB))
    assert tuple(grad.dense_shape.numpy()) == (VOCAB, DIM)
    return info


@pytest.mark.parametrize("padding_id", [0, None])
def test_sequence_logits_with_repeats_and_padding(padding_id):
    table = _table(padding_id)
    model = _sasrec_like(table)
    result = check_against_brute_force(model, tf.constant(SEQUENCES, tf.int64))
    info = _full_slices(result, table)
    # Lookups only, padding dropped: 3 + 5 + 4 + 5 real ids (17), all 20 without padding.
    assert int(tf.size(info.occurrences[0].ids)) == (17 if padding_id == 0 else 20)


def test_last_position_logits_b_by_d():
    table = _table()
    model = _sasrec_like(table, last_only=True)
    result = check_against_brute_force(model, tf.constant(SEQUENCES, tf.int64))
    _full_slices(result, table)


def test_several_calls_of_each_mode():
    table = _table(seed=1)
    history = keras.Input((5,), dtype="int64")
    query = keras.Input((), dtype="int64")  # one id per example: [B]
    dense = keras.layers.Dense(DIM, activation="tanh", dtype=F64)
    seq_hidden = dense(table(history))
    query_hidden = dense(table(query, mode="embed"))
    logits_seq = table(seq_hidden, mode="logits")  # [B, 5, V]
    logits_query = table(query_hidden, mode="logits")  # [B, V]
    outputs = tf.concat([tf.reshape(logits_seq, [-1, 5 * VOCAB]), logits_query], axis=1)
    model = keras.Model([history, query], outputs)
    inputs = [tf.constant(SEQUENCES, tf.int64), tf.constant([5, 0, 8, 3], tf.int64)]
    result = check_against_brute_force(model, inputs)
    info = _full_slices(result, table)
    assert len(info.occurrences) == 2


def test_logits_only_no_lookup():
    table = _table()
    features = keras.Input((3, 6), dtype=F64)
    hidden = keras.layers.Dense(DIM, dtype=F64)(features)
    model = keras.Model(features, table(hidden, mode="logits"))
    x = tf.random.stateless_normal([4, 3, 6], seed=[1, 2], dtype=tf.float64)
    result = check_against_brute_force(model, x)
    assert _full_slices(result, table).occurrences == []


def test_lookup_only_stays_sparse():
    table = _table()
    ids = keras.Input((5,), dtype="int64")
    model = keras.Model(ids, keras.layers.Dense(2, "tanh", dtype=F64)(table(ids)))
    result = check_against_brute_force(model, tf.constant(SEQUENCES, tf.int64))
    (grad,) = infos_by_layer(result)[table.name].clipped_sum(tf.ones([4]))
    assert sorted(grad.indices.numpy()) == [
        1,
        2,
        3,
        4,
        5,
        6,
        7,
        8,
    ]  # touched, padding 0 not


def test_hand_computed_cross_term():
    # One example, ids [2, 2], lookup grads a_1 = a_2 = (1, 0), one logits call on h = (0, 1)
    # with logits grad z = e_2 (only row 2 scored): G = row 2 gets (2, 0) + (0, 1) = (2, 1),
    # ||G||^2 = 5 = lookup 4 + projection 1 + 2 * cross 0. With h = (1, 0): (3, 0), 9 =
    # 4 + 1 + 2 * 2 (cross = sum_p z[x_p] <a_p, h> = 1 + 1).
    table = SharedEmbedding(3, 2, dtype=F64)
    table.build(None)
    for h, expected in (([[0.0, 1.0]], 5.0), ([[1.0, 0.0]], 9.0)):
        with record_taps([table]) as taps:
            table(tf.constant([[2, 2]]))
            table(tf.constant(h, tf.float64), mode="logits")
        grads = [
            tf.constant([[[1.0, 0.0], [1.0, 0.0]]], tf.float64),
            tf.constant([[0.0, 0.0, 1.0]], tf.float64),
        ]
        info = phantom_layer_gradients(table, taps[0], grads)
        np.testing.assert_allclose(info.squared_norms.numpy(), [expected])


def test_no_per_example_table_sized_tensor_is_built():
    batch, length, vocab, dim = 16, 6, 500, 8
    table = SharedEmbedding(vocab, dim)
    table.build(None)

    @tf.function
    def step(ids, hidden, lookup_grads, logit_grads):
        with record_taps([table]) as taps:
            table(ids)
            table(hidden, mode="logits")
        info = phantom_layer_gradients(table, taps[0], [lookup_grads, logit_grads])
        return info.squared_norms, info.clipped_sum(tf.ones([batch]))[0].values

    graph = step.get_concrete_function(
        tf.TensorSpec([batch, length], tf.int32),
        tf.TensorSpec([batch, length, dim]),
        tf.TensorSpec([batch, length, dim]),
        tf.TensorSpec([batch, length, vocab]),
    ).graph
    largest = max(out.shape.num_elements() or 0 for op in graph.get_operations() for out in op.outputs)
    # The logits gradient [B, L, V] (48,000) is the largest; B * V * d would be 64,000.
    assert largest <= batch * length * vocab < batch * vocab * dim


def test_registry_routes_shared_embedding_before_dp_embedding():
    registry = default_registry()
    assert registry.lookup(_table()) is phantom_layer_gradients
    assert registry.lookup(keras.layers.Dense(1)) is not phantom_layer_gradients
    from tfdp_embed.keras2.layers.embedding import DPEmbedding

    assert registry.lookup(DPEmbedding(3, 2)) is embedding_layer_gradients


def test_bad_mode_in_a_recorded_call_is_rejected():
    table = _table()
    table.build(None)
    call = LayerCall(args=(tf.zeros([1, DIM], tf.float64),), kwargs={"mode": "score"}, outputs=None)
    with pytest.raises(ValueError, match=r"`mode`='score'; allowed: \('embed', 'logits'\)"):
        phantom_layer_gradients(table, LayerTaps(table, table.call, [call]), [tf.zeros([1, VOCAB])])


# -- inside DPModel ------------------------------------------------------------------
B, L = 8, 5
SCCE = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _next_item_data(n=32, seed=0):
    """Sequences over items 1..V-1 where the next item is (item + 1), wrapping to 1."""
    rng = np.random.default_rng(seed)
    start = rng.integers(1, VOCAB, (n, 1))
    seq = (start + np.arange(L + 1)[None, :] - 1) % (VOCAB - 1) + 1
    seq[: n // 4, :2] = 0  # some left padding
    labels = seq[:, 1:].copy()
    return seq[:, :-1].astype("int32"), labels.astype("int32")


def _sasrec32(seed=3):
    keras.utils.set_random_seed(seed)
    table = SharedEmbedding(VOCAB, DIM, padding_id=0, name="items")
    ids = keras.Input((L,), dtype="int32")
    hidden = keras.layers.Dense(DIM, activation="relu")(table(ids))
    hidden = keras.layers.LayerNormalization()(hidden)
    return keras.Model(ids, table(hidden, mode="logits")), table


def _fit(mechanism, *, epochs=1, lr=0.5, n=B, seed=3, registry=None):
    model, table = _sasrec32(seed)
    dp = DPModel(model, mechanism=mechanism, expected_batch_size=B, registry=registry)
    dp.compile(optimizer=keras.optimizers.legacy.SGD(lr), loss=SCCE)
    ds = tf.data.Dataset.from_tensor_slices(_next_item_data(n)).batch(B)
    history = dp.fit(ds, epochs=epochs, verbose=0)
    return model, table, history


def _weights(model):
    return np.concatenate([w.ravel() for w in model.get_weights()])


def test_dpmodel_routes_the_table_to_phantom_clipping():
    calls = []

    def spy(layer, taps, grads):
        calls.append(layer.name)
        return phantom_layer_gradients(layer, taps, grads)

    registry = LayerRegistry([(SharedEmbedding, spy), *default_registry()])
    dense = MECHANISMS["dense"](l2_norm_clip=1.0, noise_multiplier=0.0, seed=0)
    _fit(dense, registry=registry)
    assert calls and set(calls) == {"items"}  # at trace time (Keras may trace twice)
    model, _ = _sasrec32()
    assert (
        DPModel(model, mechanism=dense, expected_batch_size=B).registry.lookup(model.get_layer("items"))
        is phantom_layer_gradients
    )


def test_zero_noise_huge_clip_reproduces_non_private_sgd():
    reference, _, _ = _fit(NonPrivate(), epochs=2, n=2 * B)
    private, _, history = _fit(
        MECHANISMS["dense"](l2_norm_clip=1e6, noise_multiplier=0.0, seed=0),
        epochs=2,
        n=2 * B,
    )
    untrained, _ = _sasrec32()
    np.testing.assert_allclose(_weights(private), _weights(reference), atol=1e-5)
    assert np.abs(_weights(private) - _weights(untrained)).max() > 1e-3
    assert np.isfinite(history.history["loss"]).all()


def test_noise_reaches_every_row_of_the_shared_table_with_the_formula_std():
    # One step, lr 1: table(sigma) - table(0) = -noise / B on every row, looked up or not.
    sigma, clip = 2.0, 0.5
    tables = []
    for noise_multiplier in (sigma, 0.0):
        dense = MECHANISMS["dense"](l2_norm_clip=clip, noise_multiplier=noise_multiplier, seed=7)
        _, table, _ = _fit(dense, lr=1.0)
        tables.append(table.embeddings.numpy())
    noise = (tables[1] - tables[0]) * B
    n = noise.size  # 9 * 4 = 36 coordinates
    expected = sigma * clip
    assert np.all(np.abs(noise).max(axis=1) > 0)  # every row noised
    assert abs(noise.std() - expected) < 4 * expected / np.sqrt(2 * n)


def test_clipping_is_active_and_bounds_the_update():
    # Tiny clip, no noise: the table moves by at most lr * C per step (sum of B clipped / B).
    clip, lr = 1e-3, 1.0
    _, table, _ = _fit(MECHANISMS["dense"](l2_norm_clip=clip, noise_multiplier=0.0, seed=0), lr=lr)
    before, _ = _sasrec32()
    moved = np.linalg.norm(table.embeddings.numpy() - before.get_layer("items").embeddings.numpy())
    assert 0 < moved <= lr * clip * (1 + 1e-5)


def test_lazy_dp_on_the_shared_table_replays_dense_dp_sgd():
    # Logits read every row, so the read hook brings the whole table up to date each step;
    # with per-step stateless row noise LazyDP must reproduce dense DP-SGD exactly.
    from tfdp_embed.data import with_lookahead

    kwargs = {
        "l2_norm_clip": 1.0,
        "noise_multiplier": 1.0,
        "seed": 5,
        "row_noise": "stateless",
    }
    tables = []
    for name, lookahead in (("dense", False), ("lazy", True)):
        extra = {"aggregate": False} if name == "lazy" else {}
        model, table = _sasrec32()
        dp = DPModel(
            model,
            mechanism=MECHANISMS[name](**kwargs, **extra),
            expected_batch_size=B,
            lookahead=lookahead,
        )
        dp.compile(optimizer=keras.optimizers.legacy.SGD(0.5), loss=SCCE)
        ds = tf.data.Dataset.from_tensor_slices(_next_item_data(2 * B)).batch(B)
        dp.fit(
            with_lookahead(ds, lambda x: {"items": x}) if lookahead else ds,
            epochs=2,
            verbose=0,
        )
        dp.flush()
        tables.append(table.embeddings.numpy())
    untrained = _sasrec32()[1].embeddings.numpy()
    np.testing.assert_allclose(tables[1], tables[0], rtol=1e-5, atol=1e-6)
    assert np.abs(tables[0] - untrained).max() > 1e-2


def test_sasrec_like_model_trains_with_dp_sgd():
    dense = MECHANISMS["dense"](l2_norm_clip=1.0, noise_multiplier=0.3, seed=0)
    _, _, history = _fit(dense, epochs=6, lr=2.0, n=64)
    losses = history.history["loss"]
    assert losses[-1] < 0.8 * losses[0], losses


class _FloatIdsModel(keras.Model):
    """Passes its (float) input straight to the table, as a buggy subclassed model would."""

    def __init__(self):
        super().__init__()
        self.table = SharedEmbedding(VOCAB, DIM)

    def call(self, x):
        return self.table(self.table(x), mode="logits")


def test_float_ids_through_dpmodel_fail_clearly():
    dp = DPModel(
        _FloatIdsModel(),
        mechanism=MECHANISMS["dense"](l2_norm_clip=1.0, noise_multiplier=1.0),
        expected_batch_size=B,
    )
    dp.compile(optimizer=keras.optimizers.legacy.SGD(0.1), loss=SCCE)
    x, y = _next_item_data(B)
    ds = tf.data.Dataset.from_tensor_slices((x.astype("float32"), y)).batch(B)
    with pytest.raises(TypeError, match="needs integer ids"):
        dp.fit(ds, epochs=1, verbose=0)
