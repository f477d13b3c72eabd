"""Per-user norms over the unit axis [users, k, ...] are exact: ghost norms against brute force.

A user's gradient is the gradient of their summed loss over their <= k rows; the
rules take the unit axis as they take a sequence axis. Two references:
`tape.jacobian` of the per-user losses (tf-keras, float64, every layer's norms and
clipped sums), and one tape per user on that user's rows alone through `DPModel`'s
whole step for both front ends (a binding clip, zero noise).
"""

from __future__ import annotations

import numpy as np
import pytest
from clipping.brute_force import check_against_brute_force
from front_ends.front_ends import mechanism

from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.layers.embedding import DPEmbedding

from .units import clipped_reference, dp_step_sum, first_batch, per_user_gradients, skewed_rows, unit_model

F64 = "float64"
# 3 users, k = 3 rows of 2 ids; user 0 reads id 1 in two rows (its row-1 gradients add before the square),
# user 2 has one real row and two padding rows of id 0.
UNIT_IDS = [[[1, 2], [1, 3], [4, 4]], [[5, 0], [2, 2], [3, 1]], [[4, 5], [0, 0], [0, 0]]]


def _unit_model(ids_shape, *, combiner, layer_norm=False, two_tables=False):
    inputs = keras.Input(ids_shape, dtype="int64")
    x = DPEmbedding(6, 3, combiner=combiner, dtype=F64, name="items")(inputs)
    if two_tables:  # a second table over the same ids, added row by row
        x = x + DPEmbedding(6, 3, combiner=combiner, dtype=F64, name="genres")(inputs)
    if layer_norm:
        x = keras.layers.LayerNormalization(dtype=F64)(x)
    x = keras.layers.Dense(4, activation="tanh", dtype=F64)(x)
    return keras.Model(inputs, keras.layers.Dense(2, dtype=F64)(x))


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_pooled_rows_of_units(combiner):
    model = _unit_model((3, 2), combiner=combiner)
    check_against_brute_force(model, tf.constant(UNIT_IDS, tf.int64))


def test_single_id_rows_of_units_with_layer_norm_and_two_tables():
    # ids [users, k]: one id per row, no combiner; output [users, k, dim].
    model = _unit_model((3,), combiner=None, layer_norm=True, two_tables=True)
    check_against_brute_force(model, tf.constant([[1, 1, 2], [3, 0, 0], [5, 4, 1]], tf.int64))


def test_pooled_units_with_layer_norm_and_two_tables():
    model = _unit_model((3, 2), combiner="mean", layer_norm=True, two_tables=True)
    check_against_brute_force(model, tf.constant(UNIT_IDS, tf.int64))


def test_unit_occurrences_name_the_user_of_every_id():
    layer = DPEmbedding(6, 3, combiner="mean")
    occ = layer.occurrences(tf.constant(UNIT_IDS))
    users = tf.gather(occ.segment_examples, occ.segments).numpy()
    assert users.tolist() == [0] * 6 + [1] * 6 + [2] * 6
    assert int(occ.num_segments) == 9 and int(occ.batch_size) == 3
    np.testing.assert_allclose(occ.weights.numpy(), 0.5)


@pytest.mark.parametrize("clip", [0.05, 0.5, 1e6])
def test_dp_step_clips_each_users_summed_gradient(fe, clip):
    # The heavy user brings k = 4 of its 40 rows; each user's gradient (one tape per user) is clipped to C.
    examples, users = skewed_rows()
    batch = first_batch(examples, users)
    model = unit_model(fe)
    expected = clipped_reference(per_user_gradients(model, batch), clip)
    got = dp_step_sum(fe, model, batch, mechanism("DenseDPSGD", clip=clip, sigma=0.0))
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g, e, rtol=2e-4, atol=2e-6)


def test_keras3_weights_each_row_of_a_unit_before_the_mean():
    # Keras 3's per-example loss: weights [users, k] weight each row, then the mean over k (x k = the sum).
    from tfdp_embed.keras3.per_example_loss import per_example_loss_fn

    loss = per_example_loss_fn(lambda y, p: tf.square(y - p)[..., 0])  # [users, k]
    y, p = tf.zeros([2, 3, 1]), tf.constant([[[1.0], [2.0], [3.0]], [[1.0], [1.0], [1.0]]])
    weight = tf.constant([[3.0, 3.0, 0.0], [3.0, 0.0, 0.0]])
    np.testing.assert_allclose(loss(y, p, weight).numpy(), [1.0 + 4.0, 1.0])  # padding (weight 0) adds nothing
    np.testing.assert_allclose(loss(y, p, tf.constant([1.0, 2.0])).numpy(), [14.0 / 3, 2.0])  # one per example
    reduced = per_example_loss_fn(lambda y, p: tf.reduce_sum(tf.square(y - p), [1, 2]))  # [users]: no rows left
    with pytest.raises(ValueError, match="need a loss with a value per position"):
        reduced(y, p, weight)
