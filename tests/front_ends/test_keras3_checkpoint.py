"""Checkpoint and resume under Keras 3: the core's `TrainingCheckpoint` with the Keras 3 `DPCheckpoint`.

A run interrupted after its first epoch and resumed by fresh objects from the
checkpoint ends where the uninterrupted run ends (seeded, so the noise
matches), and its ledger counts each step once.
"""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed import mechanisms, read_guard

from .front_ends import ctr_batches, front_end

BATCHES, BATCH = 4, 64


def _run(k3, directory, *, epochs, initial_epoch=0, restore=False):
    from tfdp_embed.keras3 import PrivacyBudget
    from tfdp_embed.keras3.checkpointing import DPCheckpoint

    mech = mechanisms.LazyDP(l2_norm_clip=1.0, noise_multiplier=1.0, seed=5)
    dp = k3.DPModel(k3.ctr_model(), mechanism=mech, expected_batch_size=BATCH)
    dp.compile(optimizer=k3.keras.optimizers.SGD(0.3, momentum=0.9), loss=k3.keras.losses.BinaryCrossentropy(True))
    budget = PrivacyBudget(mech, sampling_probability=1 / BATCHES, target_epsilon=100.0, target_delta=1e-5)
    ckpt = DPCheckpoint(str(directory), dp_model=dp, budget=budget, every_n_steps=BATCHES, batches_per_epoch=BATCHES)
    data = ctr_batches(n=BATCH * BATCHES, batch=BATCH)
    info = ckpt.restore_or_initialize(data) if restore else None
    dp.fit(data, epochs=epochs, initial_epoch=initial_epoch, callbacks=[budget, ckpt], verbose=0)
    return dp, budget, info


def _raw(dp):
    with read_guard.unguarded():  # training state, as the checkpoint holds it
        return [w.copy() for w in dp.inner.get_weights()]


@pytest.fixture
def k3():
    return front_end("keras3")


def test_an_interrupted_run_resumes_to_the_uninterrupted_one_and_accounts_each_step_once(k3, tmp_path):
    whole, whole_budget, _ = _run(k3, tmp_path / "whole", epochs=2)
    _run(k3, tmp_path / "cut", epochs=1)  # "killed" after epoch 1: its checkpoint is what survives
    resumed, budget, info = _run(k3, tmp_path / "cut", epochs=2, initial_epoch=1, restore=True)
    assert info is not None and info.step == BATCHES and info.ledger.steps == BATCHES
    assert budget.ledger.steps == whole_budget.ledger.steps == 2 * BATCHES  # not 3 x 4: no step counted twice
    assert int(resumed.mechanism.steps.numpy()) == 2 * BATCHES
    for got, want in zip(_raw(resumed), _raw(whole)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for got, want in zip(resumed.get_weights(), whole.get_weights()):  # flushed: the released weights
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
