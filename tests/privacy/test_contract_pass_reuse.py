"""The contract check reuses its own passes and still refuses what it refused.

`check_model` runs the state check's training-mode pass recorded (tape and
taps) when the model has no stochastic layer, and the coverage check reads
that pass instead of running its own; the independence check compares the
subsets with the probe losses its reproducibility run computed. A table
read outside `lookup` must still be refused by the coverage check, with and
without a stochastic layer (its own pass then), and a model mixing examples
by the independence check.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tfdp_embed import contract
from tfdp_embed.clipping import vectorized_layer_gradients
from tfdp_embed.clipping.taps import layers_owning_weights
from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.keras2._keras import keras
from tfdp_embed.keras2.clipping import default_registry
from tfdp_embed.keras2.layers.embedding import DPEmbedding

VOCAB, DIM, IDS, N = 50, 4, 3, 16


class Leaky(DPEmbedding):
    def call(self, ids):  # the extra gather is a use of the table no rule sees
        return self.lookup(ids) + tf.gather(self.embeddings, ids[:, 0])


class CentreOverBatch(keras.layers.Layer):
    def call(self, x):
        return x - tf.reduce_mean(x, axis=0, keepdims=True)


def _model(table=DPEmbedding, *middle):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((IDS,), dtype="int32")
    x = table(VOCAB, DIM, combiner="mean")(inputs)
    for layer in middle:
        x = layer(x)
    return keras.Model(inputs, keras.layers.Dense(1)(x))


def _batch():
    rng = np.random.default_rng(0)
    x = tf.constant(rng.integers(0, VOCAB, (N, IDS)).astype("int32"))
    return x, tf.constant(rng.normal(size=(N, 1)).astype("float32")), None


def _check(model) -> list:
    """Runs `check_model` on one batch; returns the `training` flag of every forward pass it ran."""
    passes = []
    loss = keras.losses.MeanSquaredError(reduction="none")

    def forward(training, x, y, w):
        passes.append(training)
        return loss(y, model(x, training=training))

    model(_batch()[0])
    contract.check_model(
        model,
        _batch(),
        forward=forward,
        tapped_layers=layers_owning_weights(model),
        registry=default_registry(),
        fallback=vectorized_layer_gradients,
        loss_name="the loss",
        check_per_example=True,
    )
    return passes


def test_an_honest_model_passes_with_one_training_pass_for_the_state_and_coverage_checks():
    # state (shared with coverage) + independence: 2 reproducibility runs and 3 subsets.
    assert _check(_model()) == [True] * 6


def test_with_a_stochastic_layer_the_coverage_check_runs_its_own_pass():
    assert _check(_model(DPEmbedding, keras.layers.Dropout(0.5))) == [True] * 7


@pytest.mark.parametrize("middle", [(), (keras.layers.Dropout(0.5),)], ids=["shared pass", "own pass"])
def test_a_table_read_outside_lookup_is_still_refused(middle):
    with pytest.raises(PrivacyContractError, match=r"rules miss part of the gradient of .*embeddings"):
        _check(_model(Leaky, *middle))


def test_a_layer_mixing_examples_is_still_refused():
    with pytest.raises(PrivacyContractError, match="mixes examples"):
        _check(_model(DPEmbedding, CentreOverBatch(name="centre")))
