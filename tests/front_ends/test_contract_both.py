"""The per-example contract attacks, once per front end: what would let one example move the sum by more than C.

Each model below trains without complaint unless the contract check runs
(the Keras 3 front end of ca59a97 accepted all three): a loss centred on the
batch, a layer centring on the batch, and a table read outside `lookup`.
Each is refused before any step, with the culprit named.
"""

from __future__ import annotations

import pytest
import tensorflow as tf

from tfdp_embed import mechanisms
from tfdp_embed.errors import PrivacyContractError

from .front_ends import ctr_batches


def _dp(fe, model, loss=None):
    return fe.dp_model(
        model, mechanisms.DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0), batch=64, loss=loss
    )


def test_a_loss_centred_on_the_batch_is_refused(fe):
    def centred(y_true, y_pred):  # one value per example, but each depends on the whole batch
        p = tf.reshape(y_pred, [-1])
        return tf.square(p - tf.reduce_mean(p))

    with pytest.raises(PrivacyContractError):
        _dp(fe, fe.ctr_model(), loss=centred).fit(ctr_batches(n=64, batch=64), epochs=1, verbose=0)


def test_a_layer_centring_on_the_batch_is_refused(fe):
    keras = fe.keras

    class Centre(keras.layers.Layer):
        def call(self, x):
            return x - tf.reduce_mean(x, axis=0, keepdims=True)

    inputs = keras.Input((4,), dtype="int32")
    x = Centre()(fe.DPEmbedding(1000, 8, combiner="mean")(inputs))
    model = keras.Model(inputs, keras.layers.Dense(1)(x))
    with pytest.raises(PrivacyContractError):
        _dp(fe, model).fit(ctr_batches(n=64, batch=64), epochs=1, verbose=0)


def test_a_table_read_outside_lookup_is_refused(fe):
    keras = fe.keras

    class Leaky(fe.DPEmbedding):
        def call(self, ids):  # the extra gather is a use of the table no rule sees
            return self.lookup(ids) + tf.gather(self.embeddings, ids[:, 0])

    inputs = keras.Input((4,), dtype="int32")
    model = keras.Model(inputs, keras.layers.Dense(1)(Leaky(1000, 8, combiner="mean")(inputs)))
    with pytest.raises(PrivacyContractError):
        _dp(fe, model).fit(ctr_batches(n=64, batch=64), epochs=1, verbose=0)
