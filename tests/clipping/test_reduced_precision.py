"""The clipping rules under mixed precision: float32 norms and sums, exact up to the compute dtype's round-off.

Under `mixed_float16` / `mixed_bfloat16` the layers compute in 16 bits and
keep float32 weights. The rules read the recorded 16-bit inputs and output
gradients and work in the weights' dtype, so their norms and clipped sums
are float32 and match the brute-force per-example jacobian of the same
16-bit forward pass to a few of its rounding errors; a loss scale S
(float16) changes nothing but the range the backward pass runs in.
"""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.layers.embedding import DPEmbedding
from tfdp_embed.keras2.layers.shared_embedding import SharedEmbedding

from .brute_force import check_against_brute_force, run_step

# Relative tolerance: 8 unit round-offs of the compute dtype (2^-11, 2^-8).
RTOL = {"mixed_float16": 4e-3, "mixed_bfloat16": 3e-2}
VOCAB, DIM = 9, 4


@pytest.fixture
def policy(request):
    keras.mixed_precision.set_global_policy(request.param)
    yield request.param
    keras.mixed_precision.set_global_policy("float32")


def ctr_model():
    """Table (mean of 3 ids, one repeated) -> Dense(tanh) -> LayerNorm -> Dense(relu) -> Dense."""
    keras.utils.set_random_seed(0)
    ids = keras.Input((3,), dtype="int32")
    x = DPEmbedding(VOCAB, DIM, combiner="mean", embeddings_initializer="glorot_uniform")(ids)
    x = keras.layers.Dense(6, activation="tanh")(x)
    x = keras.layers.LayerNormalization()(x)
    x = keras.layers.Dense(5, activation="relu")(x)
    return keras.Model(ids, keras.layers.Dense(2)(x))


def sasrec_like():
    """Shared table looked up and scoring every position (Phantom Clipping), with padding."""
    keras.utils.set_random_seed(0)
    table = SharedEmbedding(VOCAB, DIM, padding_id=0, embeddings_initializer="glorot_uniform", name="items")
    ids = keras.Input((5,), dtype="int32")
    hidden = keras.layers.Dense(DIM, activation="tanh")(table(ids))
    hidden = keras.layers.LayerNormalization()(hidden)
    return keras.Model(ids, table(hidden, mode="logits"))


CTR_IDS = np.array([[1, 1, 4], [2, 7, 8], [3, 3, 3], [0, 5, 6]], "int32")
SEQUENCES = np.array([[0, 0, 5, 2, 5], [3, 3, 1, 3, 7], [0, 8, 8, 8, 8], [4, 6, 2, 1, 5]], "int32")


@pytest.mark.parametrize("policy", list(RTOL), indirect=True)
@pytest.mark.parametrize("build, inputs", [(ctr_model, CTR_IDS), (sasrec_like, SEQUENCES)])
def test_rules_match_the_brute_force_jacobian_in_float32(policy, build, inputs):
    model = build()
    assert {layer.compute_dtype for layer in model.layers[1:]} == {policy.split("_")[1]}
    scale = 2.0**8 if policy == "mixed_float16" else 1.0
    result = check_against_brute_force(model, inputs, rtol=RTOL[policy], loss_scale=scale)
    assert result.step.norms.dtype == tf.float32
    for _, info in result.step.layers:
        assert info.squared_norms.dtype == tf.float32
        for variable, grad in zip(info.variables, info.clipped_sum(result.step.clip_factors)):
            assert variable.dtype == tf.float32 and grad.dtype == tf.float32, variable.name


@pytest.mark.parametrize("build, inputs", [(ctr_model, CTR_IDS), (sasrec_like, SEQUENCES)])
def test_a_loss_scale_changes_nothing_in_float32(build, inputs):
    plain = run_step(build(), inputs)
    scaled = run_step(build(), inputs, loss_scale=2.0**8)
    np.testing.assert_allclose(scaled.step.norms.numpy(), plain.step.norms.numpy(), rtol=1e-6)
    for (_, a), (_, b) in zip(plain.step.layers, scaled.step.layers):
        for x, y in zip(a.clipped_sum(plain.step.clip_factors), b.clipped_sum(scaled.step.clip_factors)):
            np.testing.assert_allclose(
                tf.convert_to_tensor(y).numpy(), tf.convert_to_tensor(x).numpy(), rtol=1e-6, atol=1e-8
            )


@pytest.mark.parametrize("loss_scale", [0.0, -1.0, float("inf"), float("nan")])
def test_a_loss_scale_must_be_finite_and_positive(loss_scale):
    with pytest.raises(ValueError, match="`loss_scale` must be a finite number > 0"):
        run_step(ctr_model(), CTR_IDS, loss_scale=loss_scale)
