"""Both front ends behind one interface, so a test is written once and runs for tf-keras and Keras 3.

The test process runs tf-keras as `tf.keras` (tests/conftest.py); Keras 3
(`import keras`) lives beside it in the same process: the Keras 3 front end
never goes through `tf.keras`.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from tfdp_embed import mechanisms


@dataclasses.dataclass
class FrontEnd:
    name: str
    keras: object
    DPEmbedding: type
    DPModel: type
    sgd: object  # lr -> the SGD LazyDP takes
    PrivacyBudget: type  # the front end's budget callback

    def ctr_model(self, vocabulary: int = 1000, dim: int = 8, seed: int = 0):
        """ids [B, 4] -> DPEmbedding (mean) -> Dense(8, relu) -> Dense(1): the same weights for both front ends."""
        keras = self.keras
        inputs = keras.Input((4,), dtype="int32")
        table = self.DPEmbedding(vocabulary, dim, combiner="mean", name="table")
        hidden = keras.layers.Dense(8, activation="relu", name="hidden")(table(inputs))
        model = keras.Model(inputs, keras.layers.Dense(1, name="logit")(hidden))
        rng = np.random.default_rng(seed)
        model.set_weights([rng.normal(0, 0.1, w.shape).astype("float32") for w in model.get_weights()])
        return model

    def dp_model(self, model, mechanism, *, batch: int, lr: float = 0.5, loss=None):
        dp = self.DPModel(model, mechanism=mechanism, expected_batch_size=batch)
        loss = loss if loss is not None else self.keras.losses.BinaryCrossentropy(from_logits=True)
        dp.compile(optimizer=self.sgd(lr), loss=loss)
        return dp


def front_end(name: str) -> FrontEnd:
    if name == "keras2":
        from tfdp_embed.keras2 import DPEmbedding, DPModel, keras
        from tfdp_embed.keras2.callbacks import PrivacyBudget

        return FrontEnd(name, keras, DPEmbedding, DPModel, lambda lr: keras.optimizers.legacy.SGD(lr), PrivacyBudget)
    from tfdp_embed.keras3 import DPEmbedding, DPModel, PrivacyBudget, keras

    return FrontEnd(name, keras, DPEmbedding, DPModel, lambda lr: keras.optimizers.SGD(lr), PrivacyBudget)


def ctr_batches(n: int = 512, batch: int = 128, vocabulary: int = 1000, seed: int = 0) -> tf.data.Dataset:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocabulary, size=(n, 4)).astype("int32")
    labels = ((ids % 2).sum(1) >= 2).astype("float32")[:, None]
    return tf.data.Dataset.from_tensor_slices((ids, labels)).batch(batch)


def mechanism(name: str, *, clip: float, sigma: float, seed: int = 1, vocabulary: int = 1000):
    """Every mechanism, built the same way for both front ends (FEST selects every row at top_k = vocabulary)."""
    common = dict(l2_norm_clip=clip, noise_multiplier=sigma, seed=seed)
    if name == "DPFEST":
        counts = {"table": np.ones(vocabulary)}
        return mechanisms.DPFEST(**common, selection_epsilon=1.0, top_k=vocabulary, counts=counts)
    if name == "DPAdaFESTPlus":  # every row selected (a stand-in selection event), as DP-AdaFEST below
        import dp_accounting

        return mechanisms.DPAdaFESTPlus(
            **common,
            selected_rows={"table": range(vocabulary)},
            selection_event=dp_accounting.LaplaceDpEvent(100.0),
            contribution_clip=1.0,
            contribution_noise_multiplier=1e-3,
            threshold=0.1,
        )
    if name == "DPAdaFEST":
        return mechanisms.DPAdaFEST(**common, contribution_clip=1.0, contribution_noise_multiplier=1e-3, threshold=0.1)
    return getattr(mechanisms, name)(**common)


__all__ = ["FrontEnd", "ctr_batches", "front_end", "mechanism"]
