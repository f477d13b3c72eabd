"""Attack: roll back the spent privacy budget by restoring "weights".

`EarlyStopping(restore_best_weights=True)` snapshots `model.get_weights()`
each epoch and writes the best snapshot back with `set_weights` at the end.
When a DPModel's weights included the mechanism's variables, that write set
`mechanism.steps` back to the best epoch's count: the report recipe
(`privacy_report(..., steps=mechanism.steps, ledger=budget.ledger)`) then
fails, and reporting from `mechanism.steps` alone understates epsilon for a
model that saw every step. The steps run, the mechanism's count and the
ledger must agree, and epsilon must be that of all steps run.

Writing weights must also leave LazyDP consistent: values written over a
table that still owed noise must not receive that noise on top later.

Both front ends (the `fe` fixture of tests/conftest.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tiny_model import embedding_dense_model

from tfdp_embed.accounting import privacy_report
from tfdp_embed.mechanisms.dense import DenseDPSGD
from tfdp_embed.mechanisms.lazy import LazyDP

N, VOCAB, DIM, BATCH, EPOCHS = 32, 20, 3, 4, 3
Q, DELTA = BATCH / N, 1e-5
MECHANISMS = {"dense": DenseDPSGD, "lazy": LazyDP}


def _dp(fe, name: str):
    mechanism = MECHANISMS[name](l2_norm_clip=1.0, noise_multiplier=1.0, seed=3)
    return fe.dp_model(
        embedding_dense_model(VOCAB, DIM, table_seed=1, dense_seed=2, fe=fe), mechanism, batch=BATCH, lr=0.3
    )


def _dataset(seed: int = 0) -> tf.data.Dataset:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, VOCAB, (N, 2)).astype(np.int32)
    y = rng.integers(0, 2, (N, 1)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)


def _first_epoch_is_best(fe):
    """A callback scoring epoch e as -e (so EarlyStopping restores epoch 1) and keeping epoch 1's weights."""

    class FirstEpochIsBest(fe.keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.first_epoch_weights = None
            self.steps_run = 0

        def on_train_batch_end(self, batch, logs=None):
            self.steps_run += 1

        def on_epoch_end(self, epoch, logs=None):
            logs["score"] = -float(epoch)
            if epoch == 0:
                self.first_epoch_weights = [w.copy() for w in self.model.inner.get_weights()]

    return FirstEpochIsBest()


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_restore_best_weights_never_rolls_back_the_spent_budget(fe, name):
    dp = _dp(fe, name)
    mechanism = dp.mechanism
    budget = fe.PrivacyBudget(
        mechanism,
        sampling_probability=Q,
        target_epsilon=30.0,
        target_delta=DELTA,
        accountant="rdp",
    )
    probe = _first_epoch_is_best(fe)
    stop = fe.keras.callbacks.EarlyStopping(monitor="score", mode="max", patience=EPOCHS, restore_best_weights=True)
    dp.fit(_dataset(), epochs=EPOCHS, verbose=0, callbacks=[budget, probe, stop])
    assert stop.best_epoch == 0 and probe.steps_run == EPOCHS * N // BATCH

    steps = int(mechanism.steps.numpy())
    assert steps == probe.steps_run == budget.ledger.steps, (
        steps,
        probe.steps_run,
        budget.ledger.steps,
    )
    # The README's recipe works and charges every step that was run.
    report = privacy_report(
        mechanism=mechanism,
        delta=DELTA,
        sampling_probability=Q,
        dataset_size=N,
        steps=steps,
        ledger=budget.ledger,
        accountant="rdp",
        batching=dp.batching,
    )
    all_steps = privacy_report(
        mechanism=mechanism,
        delta=DELTA,
        sampling_probability=Q,
        dataset_size=N,
        steps=probe.steps_run,
        accountant="rdp",
        batching=dp.batching,
    )
    assert report["epsilon"] == pytest.approx(all_steps["epsilon"], rel=1e-9)
    # The weights are epoch 1's (released) weights, exactly: nothing owed is added on top.
    for got, want in zip(dp.inner.get_weights(), probe.first_epoch_weights):
        np.testing.assert_array_equal(got, want)


def test_load_weights_over_an_unflushed_table_gets_no_stale_noise(fe, tmp_path):
    dp = _dp(fe, "lazy")
    dp.fit(_dataset(), epochs=1, verbose=0)
    path = str(tmp_path / ("weights" if fe.name == "keras2" else "weights.weights.h5"))
    dp.save_weights(path)
    saved = dp.inner.get_weights()
    dp.fit(_dataset(seed=1), epochs=1, verbose=0)  # rows left behind again
    assert dp.mechanism.owes_noise()
    steps = int(dp.mechanism.steps.numpy())
    dp.load_weights(path)
    assert int(dp.mechanism.steps.numpy()) == steps  # mechanism state is not in a weights file
    for got, want in zip(dp.inner.get_weights(), saved):
        np.testing.assert_array_equal(got, want)
