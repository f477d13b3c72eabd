"""Attack: one example whose gradient is not finite must move the clipped sum by at most C.

A finite loss can have a NaN or Inf gradient (a square root at 0 in a
custom loss; under `mixed_float16` an output gradient beyond float16's
range, 65504). Its norm is then NaN or Inf, its clip factor
C / max(norm, C) is 0 or NaN, and 0 * Inf = NaN: the whole clipped sum,
every other example's contribution included, becomes NaN when that one
example is in the batch. Whether it was in the batch is then plain in the
update. S is read through DPModel (DenseDPSGD, no noise, SGD with
learning rate 1: the weights move by S / B); the attack measures
max_j ||S(B) - S(B minus j)||, which DP-SGD bounds by C.

An example whose loss itself is not finite contributes exactly 0 and does
not stop training: `test_nonfinite_example.py` (N2).

Both front ends (the `fe` fixture of tests/conftest.py), except the
`mixed_float16` case: the Keras 3 front end refuses reduced precision.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tiny_model import embedding_dense_model

from tfdp_embed.mechanisms.dense import DenseDPSGD

VOCAB, DIM, N, C = 12, 4, 6, 0.02  # C small: every finite example is clipped
B = float(N)


@pytest.fixture
def policy(request, fe):
    fe.keras.mixed_precision.set_global_policy(request.param)
    yield request.param
    fe.keras.mixed_precision.set_global_policy("float32")


def root_loss(y_true, y_pred):
    """sqrt(|logit| * (1 - y)): 0 with a NaN gradient (0.5 / sqrt(0) * 0) for label-1 examples."""
    return tf.reduce_mean(tf.sqrt(tf.abs(y_pred) * (1.0 - y_true)), axis=-1)


def _batch(odd_label: float):
    """Ids and labels 0, except example 0, whose label is `odd_label`."""
    rng = np.random.default_rng(1)
    ids = rng.integers(0, VOCAB, (N, 2)).astype("int32")
    labels = np.zeros((N, 1), "float32")
    labels[0] = odd_label
    return ids, labels


def _clipped_sum(dp, batch) -> np.ndarray:
    variables = dp.inner.trainable_variables
    before = [v.numpy().copy() for v in variables]
    dp.fit(tf.data.Dataset.from_tensors(batch), epochs=1, verbose=0)
    step = np.concatenate([(b - v.numpy()).ravel() for v, b in zip(variables, before)])
    for v, b in zip(variables, before):
        v.assign(b)
    return step * B


def _moves(fe, loss, batch) -> list:
    """||S(B) - S(B minus j)|| for every j."""
    model = embedding_dense_model(VOCAB, DIM, table_seed=0, dense_seed=1, fe=fe)
    dp = fe.dp_model(model, DenseDPSGD(l2_norm_clip=C, noise_multiplier=0.0, seed=0), batch=B, lr=1.0, loss=loss)
    dp.prepare(tf.data.Dataset.from_tensors(batch))
    whole = _clipped_sum(dp, batch)
    assert np.isfinite(whole).all(), "one example made the whole clipped sum non-finite"
    return [
        float(np.linalg.norm(whole - _clipped_sum(dp, tuple(np.delete(p, j, axis=0) for p in batch)))) for j in range(N)
    ]


def test_a_nan_gradient_of_a_finite_loss_does_not_reach_the_other_examples(fe):
    moves = _moves(fe, root_loss, _batch(odd_label=1.0))
    assert max(moves) <= C * (1 + 1e-5), moves
    assert moves[0] < 1e-5  # the example with no finite gradient adds nothing (up to float32 round-off)
    assert min(moves[1:]) > 0.9 * C  # the others are clipped as usual


@pytest.mark.parametrize("fe", ["keras2"], indirect=True)  # the Keras 3 front end refuses mixed precision
@pytest.mark.parametrize("policy", ["mixed_float16"], indirect=True)
def test_a_float16_overflow_does_not_reach_the_other_examples(fe, policy):
    # Squared error against a label of 1e5: d loss / d logit ~ -2e5, beyond float16's 65504.
    moves = _moves(fe, fe.keras.losses.MeanSquaredError(), _batch(odd_label=1e5))
    assert max(moves) <= C * (1 + 1e-4), moves
    assert min(moves[1:]) > 0.9 * C
