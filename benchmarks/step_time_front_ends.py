"""The Keras front ends `benchmarks.step_time_worker` times the reference workload under (`--front-end`).

`keras2` is tf-keras with `keras.optimizers.legacy.SGD` (the front end every
earlier step_time run used); `keras3` is Keras 3 (`import keras`, TensorFlow
backend) with `keras.optimizers.SGD` (momentum 0, which LazyDP needs under
Keras 3). The worker builds its model, optimizer and `DPModel` through a
`FrontEnd`, so the same workload runs under either with no copied code. A
keras3 worker imports tf-keras too (the worker's module imports set
`TF_USE_LEGACY_KERAS=1`); Keras 3 never goes through `tf.keras`.
"""

from __future__ import annotations

import dataclasses

from tfdp_embed.clipping.layer_kinds import tf_variable

NAMES = ("keras2", "keras3")
LABELS = {"keras2": "tf-keras", "keras3": "Keras 3"}
# Benchmark rows a front end cannot run, with the reason recorded as "not measured".
UNSUPPORTED = {
    "keras3": {
        "tfp_keras_sgd": "tensorflow-privacy's DPKerasSGDOptimizer is a tf-keras optimizer (keras2 only)",
        "lazy_lookahead": "tfdp_embed.keras3.DPModel has no lookahead yet (keras2 only)",
    },
}


@dataclasses.dataclass(frozen=True)
class FrontEnd:
    """One Keras: its module, DPEmbedding, DPModel and the SGD the benchmark steps with."""

    name: str
    keras: object
    DPEmbedding: type
    DPModel: type

    @property
    def label(self) -> str:
        return LABELS[self.name]

    def sgd(self, learning_rate: float):
        """Plain SGD without momentum: tf-keras's legacy SGD, or Keras 3's SGD."""
        if self.name == "keras2":
            return self.keras.optimizers.legacy.SGD(learning_rate)
        return self.keras.optimizers.SGD(learning_rate)

    def built_sgd(self, learning_rate: float, model):
        """`sgd`, with Keras 3's slots created before the first trace (tf-keras creates them in it)."""
        optimizer = self.sgd(learning_rate)
        if self.name == "keras3":
            optimizer.build(model.trainable_variables)
        return optimizer

    def unsupported(self, mechanism: str) -> str | None:
        """Why `mechanism` is not measured under this front end (None when it runs)."""
        return UNSUPPORTED.get(self.name, {}).get(mechanism)

    def dp_model(self, model, mechanism, *, batch: int, lookahead: bool):
        """`DPModel(model, ...)`; `lookahead` only for tf-keras (Keras 3 refuses it in `unsupported`)."""
        extra = {"lookahead": lookahead} if self.name == "keras2" else {}
        return self.DPModel(model, mechanism=mechanism, expected_batch_size=batch, **extra)

    @staticmethod
    def table(layer):
        """The layer's table as a `tf.Variable` (a Keras 3 layer's `keras.Variable` wraps one)."""
        return tf_variable(layer.embeddings)


def front_end(name: str) -> FrontEnd:
    """The `FrontEnd` called `name` ("keras2" or "keras3"); imports only that front end's Keras."""
    if name == "keras2":
        from tfdp_embed.keras2 import DPModel, keras
        from tfdp_embed.keras2.layers.embedding import DPEmbedding

        return FrontEnd(name, keras, DPEmbedding, DPModel)
    if name == "keras3":
        from tfdp_embed.keras3 import DPEmbedding, DPModel, keras

        return FrontEnd(name, keras, DPEmbedding, DPModel)
    raise ValueError(f"front end must be one of {', '.join(NAMES)}; received {name!r}.")


__all__ = ["LABELS", "NAMES", "UNSUPPORTED", "FrontEnd", "front_end"]
