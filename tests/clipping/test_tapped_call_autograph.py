"""A tapped layer's own `call` is still converted by autograph in a traced DP step.

`record_taps` replaces the layer's `call` with a recording wrapper whose
bookkeeping is plain Python (`do_not_convert`); the layer's method inside it
must still go through autograph where Keras converts it (a subclassed layer
in a traced step): a Python `if` on a tensor in it works, and the recorded
output is the one the loss uses.
"""

import numpy as np

from tfdp_embed.clipping import LayerRegistry, dense_layer_gradients
from tfdp_embed.clipping.taps import record_taps
from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.clipping import default_registry
from tfdp_embed.keras2.training import DPModel
from tfdp_embed.mechanisms.dense import DenseDPSGD

BATCH = 8


class FlippingDense(keras.layers.Dense):
    """A tapped (weight-owning) Dense subclass whose `call` needs autograph: a Python `if` on a tensor."""

    def call(self, inputs):
        outputs = super().call(inputs)
        if tf.reduce_sum(inputs) > 1e9:  # never on this data
            return -outputs
        return outputs


def _model():
    inputs = keras.Input((3,))
    return keras.Model(inputs, keras.layers.Dense(1)(FlippingDense(4)(inputs)))


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 3)).astype(np.float32)
    y = rng.normal(size=(32, 1)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)


def test_tapped_subclass_needing_autograph_records_in_a_traced_function():
    model = _model()
    layer = model.layers[1]
    registry = default_registry()

    @tf.function  # autograph on
    def forward(x):
        with record_taps([layer], registry) as taps:
            outputs = model(x, training=True)
        assert len(taps[0].calls) == 1
        return outputs, taps[0].calls[0].outputs

    outputs, recorded = forward(tf.ones([BATCH, 3]))
    assert outputs.shape == (BATCH, 1) and recorded.shape == (BATCH, 4)


def test_dp_step_trains_a_tapped_subclass_needing_autograph():
    registry = LayerRegistry([(FlippingDense, dense_layer_gradients), *default_registry()._entries])
    mechanism = DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=0.5, seed=0)
    dp = DPModel(_model(), mechanism=mechanism, expected_batch_size=BATCH, registry=registry)
    dp.compile(optimizer=keras.optimizers.legacy.SGD(0.1), loss=keras.losses.MeanSquaredError(reduction="none"))
    dp.prepare(_data())
    step = tf.function(dp.train_step)
    for batch in _data():
        assert np.isfinite(step(batch)["loss"].numpy())
