"""Builds DPModels under MirroredStrategy on 2 logical CPUs; run in a subprocess by test_capabilities.py.

The logical-device split changes process-wide TensorFlow state, so it never
happens in the pytest process. For each case, builds the mechanism and a
`DPModel` inside the strategy's scope and records whether construction was
refused (and the message). Prints one JSON object as its last line.

    python tests/privacy/mirrored_capability_cases.py
"""

from __future__ import annotations

import json

from tfdp_embed.keras2._keras import keras, tf

_CPU = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(_CPU, [tf.config.LogicalDeviceConfiguration()] * 2)

import dp_accounting

from tfdp_embed.keras2.layers.embedding import DPEmbedding
from tfdp_embed.keras2.training import DPModel
from tfdp_embed.mechanisms import DenseDPSGD, LazyDP, NoiseMechanism


class MyLazy(LazyDP):
    """A renamed LazyDP: the same read hook, hence the same per-replica noise problem."""

    name = "my_lazy"


class BrandNew(NoiseMechanism):
    """A new mechanism that declares nothing (it may defer noise, draw per replica, ...)."""

    name = "brand_new"

    def update(self, clipped):
        out = self._dense_noised(clipped, self.noise_multiplier)
        for table in clipped.tables:
            out.append((table.averaged_gradient(clipped.expected_batch_size), table.variable))  # no noise!
        self.steps.assign_add(1)
        return out

    def step_event(self, sampling_probability):
        return dp_accounting.PoissonSampledDpEvent(sampling_probability, dp_accounting.GaussianDpEvent(1.0))


class SpoofsDense(BrandNew):
    """Copies dense DP-SGD's name, not its code."""

    name = "dense"


CASES = {
    "my_lazy": lambda: MyLazy(l2_norm_clip=1.0, noise_multiplier=1.0),
    "brand_new": lambda: BrandNew(l2_norm_clip=1.0, noise_multiplier=1.0),
    "spoofs_dense": lambda: SpoofsDense(l2_norm_clip=1.0, noise_multiplier=1.0),
    "dense": lambda: DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0),  # control: declared, accepted
}


def main() -> None:
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    out = {"replicas": strategy.num_replicas_in_sync}
    for case, make in CASES.items():
        with strategy.scope():
            inputs = keras.Input((2,), dtype="int32")
            model = keras.Model(inputs, keras.layers.Dense(1)(DPEmbedding(20, 3, combiner="mean")(inputs)))
            try:
                DPModel(model, mechanism=make(), expected_batch_size=4)
                out[case] = {"refused": False, "error": None}
            except Exception as error:  # noqa: BLE001 - the message is what the test checks
                out[case] = {"refused": True, "type": type(error).__name__, "error": str(error)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
