"""One worker of a 2-process MultiWorkerMirroredStrategy run (TF_CONFIG from the environment).

Started twice by test_multi_worker.py on loopback ports. Trains the same
small model twice under the strategy (EANA with zero noise and a huge clip;
DP-FEST with noise and selection from OS entropy, `seed=None`) and, on one
device, the non-private reference on the global batches; then checks that a
DP-AdaFEST+ selection drawn per worker is refused. Prints one JSON line: the
final weights of each run, so the test can check that both workers agree
and that the zero-noise run equals one-device SGD.
"""

from __future__ import annotations

import json

from tfdp_embed.keras2._keras import keras, tf

# Must exist before any other TensorFlow op runs in this process.
STRATEGY = tf.distribute.MultiWorkerMirroredStrategy()

import numpy as np

from tfdp_embed.keras2 import distribute
from tfdp_embed.keras2.layers.embedding import DPEmbedding
from tfdp_embed.keras2.training import DPModel
from tfdp_embed.mechanisms import DPFEST, EANA, DPAdaFESTPlus, NonPrivate

VOCAB, DIM, IDS, BATCH, STEPS = 30, 4, 3, 8, 3
BCE = keras.losses.BinaryCrossentropy(from_logits=True)


def _dataset():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, (STEPS * BATCH, IDS)).astype("int32")
    y = rng.integers(0, 2, (STEPS * BATCH, 1)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((ids, y)).batch(BATCH)


def _model():
    keras.utils.set_random_seed(3)
    inp = keras.Input((IDS,), dtype="int32")
    x = DPEmbedding(VOCAB, DIM, combiner="mean", name="table")(inp)
    x = keras.layers.Dense(4, activation="tanh")(x)
    return keras.Model(inp, keras.layers.Dense(1)(x))


def _train(mechanism, strategy=None):
    scope = strategy.scope() if strategy is not None else tf.distribute.get_strategy().scope()
    with scope:
        dp = DPModel(_model(), mechanism=mechanism, expected_batch_size=BATCH)
        dp.compile(optimizer=keras.optimizers.legacy.SGD(0.5), loss=BCE)
    dp.fit(_dataset(), epochs=1, verbose=0)
    return [w.tolist() for w in dp.inner.get_weights()], int(mechanism.steps.numpy())


def main():
    exact, exact_steps = _train(EANA(l2_norm_clip=1e6, noise_multiplier=0.0, seed=1), STRATEGY)
    reference, _ = _train(NonPrivate())
    # Noise from OS entropy (seed=None); DP-FEST also selects its rows in init with the
    # (synchronised) generator.
    noisy, noisy_steps = _train(
        DPFEST(
            l2_norm_clip=1.0, noise_multiplier=1.0, selection_epsilon=1.0, top_k=8, counts={"table": np.arange(VOCAB)}
        ),
        STRATEGY,
    )
    # A DP-AdaFEST+ selection drawn with OS entropy on each worker differs: refused at prepare.
    plus = DPAdaFESTPlus.from_counts(
        {"table": np.arange(VOCAB)},
        top_k={"table": 8},
        selection_epsilon=0.5,
        l2_norm_clip=1.0,
        noise_multiplier=1.0,
        contribution_clip=1.0,
        contribution_noise_multiplier=1.0,
        threshold=3.0,
    )
    try:
        _train(plus, STRATEGY)
        mismatch = "accepted"
    except distribute.DistributionNotSupportedError as error:
        mismatch = f"{type(error).__name__}: {error}"
    print(
        json.dumps(
            {
                "replicas": STRATEGY.num_replicas_in_sync,
                "exact": exact,
                "exact_steps": exact_steps,
                "noisy": noisy,
                "noisy_steps": noisy_steps,
                "reference": reference,
                "adafest_plus_os_entropy_selection": mismatch,
            }
        )
    )


if __name__ == "__main__":
    main()
