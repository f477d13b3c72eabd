"""SharedEmbedding: lookup and logits modes, padding, read hook, config, bad input."""

import numpy as np
import pytest

from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.layers.embedding import DPEmbedding
from tfdp_embed.keras2.layers.shared_embedding import SharedEmbedding


def _layer(**kwargs):
    layer = SharedEmbedding(7, 3, embeddings_initializer="glorot_uniform", **kwargs)
    layer.build(None)
    return layer


def test_is_a_dp_embedding():
    assert isinstance(_layer(), DPEmbedding)


def test_embed_mode_looks_rows_up_unpooled():
    layer = _layer()
    table = layer.embeddings.numpy()
    ids = [[1, 2, 2], [6, 0, 3]]
    np.testing.assert_allclose(layer(tf.constant(ids)), table[ids])
    np.testing.assert_allclose(layer(tf.constant([4, 5]), mode="embed"), table[[4, 5]])


def test_logits_mode_scores_against_all_rows():
    layer = _layer()
    table = layer.embeddings.numpy()
    rng = np.random.default_rng(0)
    hidden_seq = rng.normal(size=(2, 4, 3)).astype(np.float32)
    hidden_last = hidden_seq[:, -1]
    got_seq = layer(tf.constant(hidden_seq), mode="logits")
    got_last = layer(tf.constant(hidden_last), mode="logits")
    assert got_seq.shape == (2, 4, 7) and got_last.shape == (2, 7)
    np.testing.assert_allclose(got_seq, hidden_seq @ table.T, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_last, hidden_last @ table.T, rtol=1e-5, atol=1e-6)


def test_padding_reads_zeros_and_gets_no_lookup_gradient():
    layer = _layer(padding_id=0)
    table = layer.embeddings.numpy()
    ids = tf.constant([[0, 0, 2], [0, 5, 5]])
    with tf.GradientTape() as tape:
        rows = layer(ids)
        loss = tf.reduce_sum(rows)
    np.testing.assert_array_equal(rows.numpy()[0, :2], 0.0)
    np.testing.assert_allclose(rows.numpy()[1, 1:], table[[5, 5]])
    grad = tf.convert_to_tensor(tape.gradient(loss, layer.embeddings)).numpy()
    np.testing.assert_array_equal(grad[0], 0.0)  # padding row untouched by lookups
    np.testing.assert_allclose(grad[5], 2.0)  # id 5 twice
    occ = layer.occurrences(ids)
    np.testing.assert_array_equal(occ.ids.numpy(), [2, 5, 5])
    np.testing.assert_array_equal(occ.segments.numpy(), [2, 4, 5])


def test_padding_row_still_scores_in_logits_mode():
    layer = _layer(padding_id=0)
    logits = layer(tf.ones([1, 3]), mode="logits").numpy()
    np.testing.assert_allclose(logits[0, 0], layer.embeddings.numpy()[0].sum(), rtol=1e-6)


def test_read_hook_sees_looked_up_ids_and_every_row_for_logits():
    layer = _layer()
    seen = []
    layer.set_read_hook(lambda ids: seen.append(np.asarray(ids)))
    layer(tf.constant([[3, 1]]))
    layer(tf.ones([1, 3]), mode="logits")
    np.testing.assert_array_equal(seen[0], [3, 1])
    np.testing.assert_array_equal(seen[1], np.arange(7))


def test_functional_model_with_both_modes_and_config_round_trip():
    layer = SharedEmbedding(11, 4, padding_id=0, name="items")
    inputs = keras.Input((5,), dtype="int32")
    hidden = keras.layers.Dense(4)(layer(inputs))
    model = keras.Model(inputs, layer(hidden, mode="logits"))
    assert model.output_shape == (None, 5, 11)
    clone = SharedEmbedding.from_config(layer.get_config())
    assert (clone.vocabulary_size, clone.output_dim, clone.padding_id) == (11, 4, 0)
    assert clone.combiner is None and not clone.hash_ids


@pytest.mark.parametrize(
    "call, error, match",
    [
        (
            lambda layer: layer(tf.constant([[1]]), mode="score"),
            ValueError,
            "`mode` must be one of",
        ),
        (
            lambda layer: layer(tf.constant([[1]]), mode=None),
            ValueError,
            "`mode` must be one of",
        ),
        (lambda layer: layer(tf.constant([[1.0, 2.0]])), TypeError, "needs integer ids"),
        (
            lambda layer: layer(tf.constant([[1, 2, 3]]), mode="logits"),
            TypeError,
            "needs float hidden",
        ),
        (
            lambda layer: layer(tf.zeros([2, 5]), mode="logits"),
            ValueError,
            "must equal `output_dim`=3",
        ),
        (
            lambda layer: layer(tf.zeros([3]), mode="logits"),
            ValueError,
            "hidden states of shape",
        ),
        (lambda layer: layer(tf.ragged.constant([[1, 2], [3]])), TypeError, "dense ids"),
        (
            lambda layer: layer(tf.constant([[1, 7]])),
            tf.errors.InvalidArgumentError,
            r"\[0, 7\)",
        ),
    ],
)
def test_bad_input_is_rejected_clearly(call, error, match):
    with pytest.raises(error, match=match):
        call(_layer())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"combiner": "mean"}, "does not take `combiner`"),
        ({"hash_ids": True}, "does not take `hash_ids`"),
        ({"padding_id": 7}, r"`padding_id` must be None or an int in \[0, 7\)"),
        ({"padding_id": 1.0}, "`padding_id`"),
    ],
)
def test_bad_arguments_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SharedEmbedding(7, 3, **kwargs)
