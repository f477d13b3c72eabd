"""`TpuDPStep`: an example with a NaN loss contributes zero and never stops the step (issue 33, N2 on the TPU path).

`DPModel` gives such an example clip factor 0 (`tfdp_embed.nonfinite`);
the TPU step halted on `assert_all_finite` instead, so whether training
went on depended on one example. Checked with the CPU engine: a batch whose
first example has a NaN label trains, and its tables and TensorCore weights
equal those of the same batch without that example (EANA, sigma 0, SGD:
rows with a zero gradient do not move).
"""

from __future__ import annotations

import numpy as np
from cpu_engine import CpuEngine

from tfdp_embed.keras2 import distribute
from tfdp_embed.keras2._keras import keras
from tfdp_embed.mechanisms import EANA

VOCAB, DIM, IDS = 20, 4, 3
BCE = keras.losses.BinaryCrossentropy(from_logits=True)


def _step_weights(ids, labels) -> list:
    keras.utils.set_random_seed(5)
    table = np.random.default_rng(0).uniform(-0.5, 0.5, (VOCAB, DIM)).astype("float32")
    engine = CpuEngine(
        {"t": table}, {"f": ("t", "mean"), distribute.noise_feature_name("t"): ("t", "sum")}, learning_rate=1.0
    )
    inp = keras.Input((DIM,), name="f")
    tower = keras.Model({"f": inp}, keras.layers.Dense(1)(inp))
    step = distribute.TpuDPStep(
        engine,
        model=tower,
        features=[distribute.TpuFeature("f", "t", "mean")],
        mechanism=EANA(l2_norm_clip=0.5, noise_multiplier=0.0, seed=1),
        loss=BCE,
        optimizer=keras.optimizers.legacy.SGD(1.0),
        expected_batch_size=4.0,
        table_sizes={"t": (VOCAB, DIM)},
        max_noise_rows=VOCAB,
    )
    logs = step({"f": ids}, labels)
    assert np.isfinite(float(logs["loss"]))
    return [engine.embedding_tables["t"].numpy(), *tower.get_weights()]


def test_a_nan_example_contributes_zero_instead_of_stopping_the_step():
    rng = np.random.default_rng(3)
    ids = rng.integers(0, VOCAB, (5, IDS)).astype("int32")
    labels = rng.integers(0, 2, (5, 1)).astype("float32")
    labels[0] = np.nan  # its loss is NaN
    got = _step_weights(ids, labels)  # old code: InvalidArgumentError "the per-example loss is NaN or Inf"
    want = _step_weights(ids[1:], labels[1:])
    for i, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6, err_msg=f"weight {i}")
