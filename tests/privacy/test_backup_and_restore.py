"""Attack (issue 33, M1): resume a DP run with Keras' `BackupAndRestore` and read the report.

`BackupAndRestore` checkpoints the model and the epoch, not the noise
mechanism, the optimizer or the privacy ledger. A run killed after two of
four epochs and restarted the Keras way (a new process: new model, new
mechanism, new `PrivacyBudget`, the same backup directory) continues from
epoch 2 with the restored weights, and its budget counts the last two
epochs only: the weights have seen every step, the ledger half of them, and
epsilon is under-reported. Now `DPModel.fit` refuses `BackupAndRestore` and
names `tfdp_embed.keras2.checkpointing.DPCheckpoint`, which resumes the ledger.

Both front ends (the `fe` fixture of tests/conftest.py): the refusal is the
core's and recognises Keras 3's `keras.callbacks.BackupAndRestore` too.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tfdp_embed.accounting import privacy_report
from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.mechanisms.dense import DenseDPSGD
from tfdp_embed.mechanisms.none import NonPrivate

N, BATCH, EPOCHS, KILLED_AFTER = 32, 8, 4, 2
Q, DELTA = BATCH / N, 1e-5
STEPS_PER_EPOCH = N // BATCH


class _Killed(Exception):
    """Stands for the SIGKILL."""


def _kill_after(fe):
    class KillAfter(fe.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch + 1 == KILLED_AFTER:
                raise _Killed

    return KillAfter()


def _dataset():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, 3)).astype("float32")
    y = rng.normal(size=(N, 1)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)


def _process(fe, mechanism=None):
    """What a (re)started training process builds: model, mechanism, budget."""
    keras = fe.keras
    inputs = keras.Input((3,))
    mechanism = mechanism or DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0, seed=None)
    loss = keras.losses.MeanSquaredError(reduction="none")
    dp = fe.dp_model(keras.Model(inputs, keras.layers.Dense(1)(inputs)), mechanism, batch=BATCH, lr=0.1, loss=loss)
    budget = fe.PrivacyBudget(
        dp.mechanism, sampling_probability=Q, target_epsilon=100.0, target_delta=DELTA, accountant="rdp"
    )
    return dp, budget


def _epsilon(mechanism, steps: int, batching) -> float:
    return privacy_report(
        mechanism=mechanism,
        delta=DELTA,
        sampling_probability=Q,
        dataset_size=N,
        steps=steps,
        accountant="rdp",
        batching=batching,
    )["epsilon"]


def test_keras_backup_and_restore_cannot_resume_a_dp_run_with_a_short_ledger(fe, tmp_path):
    keras = fe.keras
    backup = str(tmp_path / "backup")
    dp, budget = _process(fe)
    try:
        with pytest.raises(_Killed):
            dp.fit(
                _dataset(),
                epochs=EPOCHS,
                verbose=0,
                callbacks=[budget, keras.callbacks.BackupAndRestore(backup), _kill_after(fe)],
            )
    except PrivacyContractError as error:
        assert "BackupAndRestore" in str(error) and "DPCheckpoint" in str(error)
        assert int(dp.mechanism.steps.numpy()) == 0  # refused before training
        return
    dp, budget = _process(fe)  # the restarted process
    history = dp.fit(_dataset(), epochs=EPOCHS, verbose=0, callbacks=[budget, keras.callbacks.BackupAndRestore(backup)])
    steps_behind_the_weights = EPOCHS * STEPS_PER_EPOCH  # KILLED_AFTER epochs before, the rest after
    reported = budget.spent_epsilon()
    actual = _epsilon(dp.mechanism, steps_behind_the_weights, dp.batching)
    pytest.fail(
        f"BackupAndRestore accepted: the resumed run trained {len(history.epoch)} epochs from the restored "
        f"weights; its ledger holds {budget.ledger.steps} of the {steps_behind_the_weights} steps behind them "
        f"(mechanism.steps {int(dp.mechanism.steps.numpy())}); epsilon reported {reported:.4g}, "
        f"actual {actual:.4g}"
    )


def test_non_private_runs_may_use_it(fe, tmp_path):
    dp, _ = _process(fe, NonPrivate())
    dp(next(iter(_dataset()))[0])  # Keras 3's BackupAndRestore needs a built model
    dp.fit(_dataset(), epochs=1, verbose=0, callbacks=[fe.keras.callbacks.BackupAndRestore(str(tmp_path / "b"))])
