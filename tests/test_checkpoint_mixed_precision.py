"""Checkpoint and resume under `mixed_float16` with SGD momentum (issue 34, bug A).

Keras wraps the optimizer in a `LossScaleOptimizer`; the mechanism is given
its inner SGD. Both used to be nodes of the checkpoint's object graph, so
the momentum slots were listed twice and the first save raised
`NotImplementedError: A slot variable was re-used as a dependency`.

The user's run: the tiny model of tests/checkpoint_worker.py (DPEmbedding
-> Dense, legacy SGD momentum 0.9, a PrivacyBudget) trains 2 steps with
`DPCheckpoint`, a fresh model resumes from the checkpoint and trains one
more step. The resumed state (weights, momentum, iterations, ledger) is the
saved one, the ledger counts each step once, and the result equals an
uninterrupted 3-step run (seeded noise).
"""

from __future__ import annotations

import os

import checkpoint_worker as worker
import numpy as np
import pytest

from tfdp_embed import keras, read_guard
from tfdp_embed.keras2.checkpointing import DPCheckpoint, rest_of_epoch


@pytest.fixture
def mixed_float16():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy("float32")


class _StopAt(keras.callbacks.Callback):
    def __init__(self, dp, steps):
        super().__init__()
        self.dp, self.steps = dp, steps

    def on_train_batch_end(self, batch, logs=None):
        if int(self.dp.mechanism.steps.numpy()) >= self.steps:
            self.model.stop_training = True


def _raw_state(dp):
    """Weights (un-flushed), momentum slots and the optimizer's iteration count."""
    with read_guard.unguarded():
        weights = [w.numpy().copy() for w in dp.inner.weights]
        slots = [dp.optimizer.get_slot(v, "momentum").numpy().copy() for v in dp.inner.trainable_variables]
    return weights, slots, int(dp.optimizer.iterations.numpy())


def _run(name, steps, directory=None, resume=False):
    """Trains `name` until step `steps` (resuming from `directory` first if asked); returns (dp, budget, ckpt, info)."""
    dp, batches, budget, wrap, info = worker.build(name)
    assert isinstance(dp.optimizer, keras.mixed_precision.LossScaleOptimizer)
    callbacks = [budget, _StopAt(dp, steps)]
    ckpt = resumed = None
    if directory is not None:
        ckpt = DPCheckpoint(
            str(directory),
            dp_model=dp,
            budget=budget,
            every_n_steps=1,
            batches_per_epoch=info.batches_per_epoch,
            sampler_seed=worker.SAMPLER_SEED,
        )
        callbacks.append(ckpt)
    if resume:
        resumed = ckpt.restore_or_initialize()
        batches = rest_of_epoch(batches, resumed.position)
    dp.fit(wrap(batches), epochs=1, callbacks=callbacks, verbose=0)
    return dp, budget, ckpt, resumed


@pytest.mark.parametrize("name", ["dense", "lazy"])
def test_mixed_float16_momentum_checkpoint_resumes_like_an_uninterrupted_run(mixed_float16, tmp_path, name):
    trained, _, ckpt, _ = _run(name, 2, tmp_path)  # used to raise at the first save
    assert os.path.basename(ckpt.last_saved) == "ckpt-2"
    saved = _raw_state(trained)
    assert saved[2] == 2 and np.abs(saved[1][0]).max() > 0  # the table's momentum is in use

    dp, batches, budget, wrap, info = worker.build(name)
    fresh = DPCheckpoint(
        str(tmp_path),
        dp_model=dp,
        budget=budget,
        every_n_steps=1,
        batches_per_epoch=info.batches_per_epoch,
        sampler_seed=worker.SAMPLER_SEED,
    )
    resumed = fresh.restore_or_initialize()
    assert resumed.step == 2 and resumed.position.batches_consumed == 2
    restored = _raw_state(dp)
    for before, after in zip(saved[0] + saved[1], restored[0] + restored[1]):
        np.testing.assert_array_equal(after, before)
    assert restored[2] == 2 and budget.ledger.steps == 2

    # One more step after the resume: accounted once, checkpointed, equal to 3 uninterrupted steps.
    dp.fit(
        wrap(rest_of_epoch(batches, resumed.position)),
        epochs=1,
        callbacks=[budget, fresh, _StopAt(dp, 3)],
        verbose=0,
    )
    assert int(dp.mechanism.steps.numpy()) == budget.ledger.steps == 3 and len(budget.ledger) == 1
    assert int(dp.optimizer.iterations.numpy()) == 3
    assert os.path.basename(fresh.last_saved) == "ckpt-3"
    uninterrupted, full_budget, _, _ = _run(name, 3)
    assert full_budget.ledger == budget.ledger
    dp.flush()
    uninterrupted.flush()
    for a, b in zip(dp.inner.get_weights(), uninterrupted.inner.get_weights()):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
