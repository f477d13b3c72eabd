"""Attack: read the noise generator's state out of a checkpoint of an unseeded mechanism.

From a Philox state (key and counter) every step's noise can be
regenerated (tests/privacy/test_weights_file.py does it), and restoring it
twice replays the noise (test_checkpoint_replay.py). The state of a
generator seeded from OS entropy is therefore never written: neither a raw
`tf.train.Checkpoint` of the mechanism nor the training-state checkpoint
(`TrainingCheckpoint`) holds it. With an explicit seed (tests) it is saved,
so that a resumed run reproduces an uninterrupted one.

Both front ends (the `fe` fixture of tests/conftest.py); `TrainingCheckpoint`
is the core's (`tfdp_embed.checkpointing`).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tfdp_embed.mechanisms import DenseDPSGD, LazyDP

RNG_NAMES = ("generator", "_state_var", "stream")


def _trained(fe, make_mechanism):
    keras = fe.keras
    keras.utils.set_random_seed(0)
    inputs = keras.Input((2,), dtype="int32")
    model = keras.Model(inputs, keras.layers.Dense(1)(fe.DPEmbedding(64, 4, combiner="mean")(inputs)))
    loss = keras.losses.MeanSquaredError(reduction="none")
    dp = fe.dp_model(model, make_mechanism(), batch=4, lr=0.1, loss=loss)
    ids = np.random.default_rng(0).integers(0, 64, (12, 2)).astype(np.int32)
    dp.fit(tf.data.Dataset.from_tensor_slices((ids, np.ones([12, 1], np.float32))).batch(4), epochs=1, verbose=0)
    return dp


def _rng_variables(prefix) -> list:
    return [name for name, _ in tf.train.list_variables(prefix) if any(word in name for word in RNG_NAMES)]


MECHANISMS = {
    "dense": lambda seed: DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0, seed=seed),
    "lazy": lambda seed: LazyDP(l2_norm_clip=1.0, noise_multiplier=1.0, seed=seed),
}


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_a_raw_checkpoint_of_an_unseeded_mechanism_holds_no_rng_state(fe, tmp_path, name):
    dp = _trained(fe, lambda: MECHANISMS[name](None))
    prefix = tf.train.Checkpoint(mechanism=dp.mechanism).save(str(tmp_path / "raw"))
    assert _rng_variables(prefix) == [], "the file holds the noise generator's state"


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_the_training_checkpoint_of_an_unseeded_run_holds_no_rng_state(fe, tmp_path, name):
    from tfdp_embed.checkpointing import DataPosition, TrainingCheckpoint

    dp = _trained(fe, lambda: MECHANISMS[name](None))
    prefix = TrainingCheckpoint(str(tmp_path / "run"), dp_model=dp).save(position=DataPosition(3, 1, 0, 3))
    assert _rng_variables(prefix) == [], "the training checkpoint holds the noise generator's state"
    restored = _trained(fe, lambda: MECHANISMS[name](None))
    TrainingCheckpoint(str(tmp_path / "run"), dp_model=restored).restore()  # loads without the RNG state
    assert int(restored.mechanism.steps.numpy()) == 3


def test_an_explicit_seed_keeps_the_state_for_reproducible_resumes(fe, tmp_path):
    dp = _trained(fe, lambda: MECHANISMS["lazy"](7))
    prefix = tf.train.Checkpoint(mechanism=dp.mechanism).save(str(tmp_path / "seeded"))
    assert _rng_variables(prefix), "a seeded mechanism's state is saved (control: the attack would find it)"
