"""DPEmbedding per-example norms (repeated ids included) and sparse clipped sums."""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.clipping import default_registry, embedding_layer_gradients, record_taps
from tfdp_embed.keras2.layers.embedding import DPEmbedding

from .brute_force import check_against_brute_force, infos_by_layer

F64 = "float64"
# Repeated ids inside one example: [1, 1, 2] and [3, 3, 3] make a row's
# contributions add up before the square (||2g||^2 = 4||g||^2, not 2||g||^2).
REPEATED = [[1, 1, 2], [3, 3, 3], [0, 5, 4], [2, 2, 1], [5, 0, 5]]


def _embedding(vocab=6, dim=3, **kwargs):
    return DPEmbedding(vocab, dim, dtype=F64, **kwargs)


def _model(embedding, ids_spec, *, head=True):
    inputs = keras.Input(**ids_spec)
    outputs = embedding(inputs)
    if head:
        outputs = keras.layers.Dense(2, activation="tanh", dtype=F64)(outputs)
    return keras.Model(inputs, outputs)


def _assert_unique_slices(result, layer):
    info = infos_by_layer(result)[layer.name]
    (grad,) = info.clipped_sum(tf.ones([result.batch_size]))
    assert isinstance(grad, tf.IndexedSlices)
    indices = grad.indices.numpy()
    assert len(np.unique(indices)) == len(indices)
    assert tuple(grad.dense_shape.numpy()) == tuple(layer.embeddings.shape)
    return info


def test_single_id():
    layer = _embedding()
    model = _model(layer, {"shape": (), "dtype": "int64"})
    result = check_against_brute_force(model, tf.constant([1, 4, 1, 0, 5], tf.int64))
    info = _assert_unique_slices(result, layer)
    assert len(info.occurrences) == 1


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_pooled_with_repeated_ids(combiner):
    layer = _embedding(combiner=combiner)
    model = _model(layer, {"shape": (3,), "dtype": "int64"})
    result = check_against_brute_force(model, tf.constant(REPEATED, tf.int64))
    _assert_unique_slices(result, layer)


def test_pooled_repeated_id_is_not_a_sum_of_occurrence_norms():
    # Example [3, 3, 3] with combiner "sum" and dL/dy = g: grad row 3 = 3g, norm^2 = 9||g||^2.
    layer = _embedding(combiner="sum")
    layer.build(None)
    ids = tf.constant([[3, 3, 3]], tf.int64)
    with record_taps([layer]) as taps:
        layer(ids)
    g = tf.constant([[1.0, 2.0, 2.0]], tf.float64)  # ||g||^2 = 9
    info = embedding_layer_gradients(layer, taps[0], [g])
    np.testing.assert_allclose(info.squared_norms.numpy(), [81.0])
    (grad,) = info.clipped_sum(tf.constant([0.5]))
    np.testing.assert_array_equal(grad.indices.numpy(), [3])
    np.testing.assert_allclose(grad.values.numpy(), [[1.5, 3.0, 3.0]])


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_ragged_with_repeated_ids(combiner):
    layer = _embedding(combiner=combiner)
    model = _model(layer, {"shape": (None,), "dtype": "int64", "ragged": True})
    ids = tf.ragged.constant([[1, 1, 2, 1], [3], [0, 5, 0], [2, 2], [4, 1, 4, 4, 4]], tf.int64)
    result = check_against_brute_force(model, ids)
    _assert_unique_slices(result, layer)


def test_sparse_ids():
    layer = _embedding(combiner="mean")
    model = _model(layer, {"shape": (None,), "dtype": "int64", "sparse": True})
    ids = tf.sparse.from_dense(tf.constant([[1, 1, 0], [2, 0, 0], [5, 5, 3], [4, 0, 0]], tf.int64))
    # from_dense drops the zeros, so examples have 2, 1, 3, 1 ids.
    result = check_against_brute_force(model, ids)
    _assert_unique_slices(result, layer)


def test_unpooled_sequence_with_repeated_ids():
    # Output [B, n, dim]: each position has its own output gradient, and the rows of
    # repeated ids add the gradients of their positions.
    layer = _embedding(combiner=None)
    model = _model(layer, {"shape": (3,), "dtype": "int64"})
    result = check_against_brute_force(model, tf.constant(REPEATED, tf.int64))
    _assert_unique_slices(result, layer)


def test_hashed_strings_with_collisions():
    layer = _embedding(vocab=3, hash_ids=True, combiner="sum")
    model = _model(layer, {"shape": (4,), "dtype": "string"})
    words = [["a", "b", "c", "d"], ["e", "e", "f", "a"], ["x", "y", "z", "w"]]
    result = check_against_brute_force(model, tf.constant(words))
    _assert_unique_slices(result, layer)


def test_table_shared_by_two_features():
    # One table read by two calls: an example's rows add across calls before the square.
    user, item = keras.Input((2,), dtype="int64"), keras.Input((), dtype="int64")
    layer = _embedding(combiner="mean")
    unpooled = _embedding(vocab=6, combiner=None, name="shared_unpooled")
    merged = keras.layers.Concatenate(dtype=F64)([layer(user), layer(item[:, None])])
    seq = keras.layers.Flatten(dtype=F64)(unpooled(user) + unpooled(user[:, ::-1]))
    model = keras.Model([user, item], keras.layers.Concatenate(dtype=F64)([merged, seq]))
    users = tf.constant([[1, 2], [3, 3], [0, 4], [2, 5]], tf.int64)
    items = tf.constant([2, 3, 1, 2], tf.int64)
    result = check_against_brute_force(model, [users, items])
    info = _assert_unique_slices(result, layer)
    assert len(info.occurrences) == 2
    _assert_unique_slices(result, unpooled)


class _TaggedEmbedding(DPEmbedding):
    """A user's subclass: must be handled by the DPEmbedding entry (isinstance)."""

    def describe(self):
        return f"table {self.name}"


class _TwoTower(keras.Model):
    def __init__(self):
        super().__init__(dtype=F64)
        self.query = _TaggedEmbedding(7, 4, combiner="sqrtn", dtype=F64)
        self.candidate = DPEmbedding(5, 4, dtype=F64)
        self.projection = keras.layers.Dense(4, dtype=F64)

    def call(self, inputs):
        history, candidate = inputs
        return self.projection(self.query(history)) * self.candidate(candidate)


def test_subclass_in_subclassed_two_tower_model():
    model = _TwoTower()
    history = tf.ragged.constant([[1, 6, 6], [2], [3, 3, 0, 3]], tf.int64)
    candidate = tf.constant([4, 0, 4], tf.int64)
    assert default_registry().lookup(model.query) is embedding_layer_gradients
    result = check_against_brute_force(model, (history, candidate))
    _assert_unique_slices(result, model.query)
    _assert_unique_slices(result, model.candidate)


def test_ragged_in_tf_function():
    layer = _embedding(combiner="sum")
    layer.build(None)
    spec = tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1)

    @tf.function(input_signature=[spec, tf.TensorSpec([None, 3], tf.float64)])
    def norms(ids, g):
        with record_taps([layer]) as taps:
            layer(ids)
        info = embedding_layer_gradients(layer, taps[0], [g])
        (grad,) = info.clipped_sum(tf.ones([ids.nrows()]))
        return info.squared_norms, tf.convert_to_tensor(grad)

    g = tf.constant([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]], tf.float64)
    squared, dense = norms(tf.ragged.constant([[1, 1, 4], [2]], tf.int64), g)
    # Example 0: row 1 gets 2g_0 (norm^2 4), row 4 gets g_0 (1); example 1: row 2 gets g_1 (4).
    np.testing.assert_allclose(squared.numpy(), [5.0, 4.0])
    expected = np.zeros((6, 3))
    expected[1, 0], expected[4, 0], expected[2, 1] = 2.0, 1.0, 2.0
    np.testing.assert_allclose(dense.numpy(), expected)


def test_float32_model_end_to_end():
    # The production dtype: float32 table, Dense and LayerNorm; float32 round-off only.
    ids = keras.Input((None,), dtype="int64", ragged=True)
    hidden = DPEmbedding(8, 4, combiner="mean")(ids)
    hidden = keras.layers.Dense(4, "relu")(hidden)
    model = keras.Model(ids, keras.layers.LayerNormalization()(hidden))
    batch = tf.ragged.constant([[1, 1, 7], [2], [3, 3, 0, 3], [6, 5]], tf.int64)
    check_against_brute_force(model, batch, rtol=1e-4)
