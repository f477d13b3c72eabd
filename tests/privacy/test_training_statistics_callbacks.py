"""Attack (issue 33, N3): tell a target example apart by when `EarlyStopping(monitor="loss")` stops.

The training loss a Keras callback reads is the un-noised mean of the
examples' losses. One outlier (x = 3 e1, y = -30, against y = x.w for the
rest) has a loss that grows while the model fits the others, so with it the
epoch loss stops improving after an epoch or two; without it the loss
keeps falling for several epochs. DP-SGD's noise (sigma = 1, C = 1) is on
the gradients, not on this statistic, so the stopping epoch, which decides
the released weights, tells the target apart. The fixed test: "stopped
within 2 epochs" means "the target is in".

Fixed: `DPModel.fit` refuses callbacks that act on training statistics
(`tfdp_embed.fit_callbacks`); `History` still shows the loss to the
operator (the control below runs the same test on it offline).

Both front ends (the `fe` fixture of tests/conftest.py): the policy is the
core's (`tfdp_embed.fit_callbacks`) and recognises tf-keras's and Keras 3's
callbacks alike.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.mechanisms.dense import DenseDPSGD
from tfdp_embed.mechanisms.none import NonPrivate

N, BATCH, EPOCHS, RUNS = 64, 16, 6, 10
EARLY = 2  # the test: training stopped after at most EARLY epochs -> "the target is in"


def _dataset(target: bool) -> tf.data.Dataset:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, 4)).astype("float32")
    y = (x @ np.array([1.0, -1.0, 0.5, 0.0])).astype("float32")[:, None]
    if target:  # the neighbour: the last example replaced by the outlier
        x[-1], y[-1] = [3.0, 0.0, 0.0, 0.0], [-30.0]
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)


def _dp(fe, mechanism=None, metrics=None):
    keras = fe.keras
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(1, kernel_initializer="zeros")(inputs))
    mechanism = mechanism or DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0)
    dp = fe.DPModel(model, mechanism=mechanism, expected_batch_size=BATCH)
    dp.compile(
        optimizer=fe.sgd(0.5),
        loss=keras.losses.MeanSquaredError(reduction="none"),
        metrics=metrics,
    )
    return dp


def _first_non_improving(losses) -> int:
    """The epochs EarlyStopping(patience=0) runs on these epoch losses."""
    best = losses[0]
    for epoch in range(1, len(losses)):
        if losses[epoch] >= best:
            return epoch + 1
        best = losses[epoch]
    return len(losses)


def _epochs_run(dp, initial, target: bool, callbacks) -> list:
    """Each of RUNS fits' epoch losses, every fit from the `initial` weights (the noise differs per run)."""
    runs = []
    for _ in range(RUNS):
        dp.inner.set_weights(initial)
        history = dp.fit(_dataset(target), epochs=EPOCHS, callbacks=callbacks(), verbose=0)
        runs.append(history.history["loss"])
    return runs


def _rates(with_target, without) -> tuple[float, float]:
    """(true positive rate, false positive rate) of "stopped within EARLY epochs"."""
    return float(np.mean([e <= EARLY for e in with_target])), float(np.mean([e <= EARLY for e in without]))


def test_early_stopping_on_the_training_loss_cannot_tell_the_target(fe):
    dp = _dp(fe)
    initial = dp.inner.get_weights()

    def stop():
        return [fe.keras.callbacks.EarlyStopping(monitor="loss", patience=0)]

    try:
        with_target = [len(run) for run in _epochs_run(dp, initial, True, stop)]
        without = [len(run) for run in _epochs_run(dp, initial, False, stop)]
    except PrivacyContractError as error:
        assert "`EarlyStopping(monitor='loss')`" in str(error) and "val_loss" in str(error)
        return
    tpr, fpr = _rates(with_target, without)
    assert tpr - fpr < 0.5, (
        f"EarlyStopping(monitor='loss') accepted: the stopping epoch detects the target {tpr:.0%} of the time "
        f"at {fpr:.0%} false positives (epochs run with it {with_target}, without {without})"
    )


def test_control_the_training_loss_history_shows_does_tell_the_target(fe):
    """Passes on both: the statistic carries the signal (why acting on it is refused); History keeps it."""
    dp = _dp(fe)
    initial = dp.inner.get_weights()
    with_target = [_first_non_improving(run) for run in _epochs_run(dp, initial, True, list)]
    without = [_first_non_improving(run) for run in _epochs_run(dp, initial, False, list)]
    tpr, fpr = _rates(with_target, without)
    assert tpr - fpr >= 0.5, (tpr, fpr, with_target, without)


@pytest.mark.parametrize(
    "make",
    [
        lambda keras, path: keras.callbacks.ReduceLROnPlateau(monitor="loss", patience=0),
        lambda keras, path: keras.callbacks.ModelCheckpoint(path, monitor="loss", save_best_only=True),
        lambda keras, path: keras.callbacks.TerminateOnNaN(),
        lambda keras, path: keras.callbacks.EarlyStopping(monitor="loss", restore_best_weights=True),
    ],
    ids=["reduce_lr", "best_checkpoint", "terminate_on_nan", "early_stopping"],
)
def test_callbacks_acting_on_training_statistics_are_refused_before_training(fe, make, tmp_path):
    dp = _dp(fe)
    path = str(tmp_path / ("best.h5" if fe.name == "keras2" else "best.keras"))
    with pytest.raises(PrivacyContractError, match="training"):
        dp.fit(_dataset(True), epochs=2, callbacks=[make(fe.keras, path)], verbose=0)
    assert int(dp.mechanism.steps.numpy()) == 0  # refused before the first step


def test_a_compiled_metric_is_refused_at_the_first_step_before_any_callback_acts(fe):
    # Keras names compiled metrics when it builds them, in the first step: the guard listed first catches it there.
    dp = _dp(fe, metrics=["mae"])
    stop = fe.keras.callbacks.EarlyStopping(monitor="mae", patience=0)
    with pytest.raises(PrivacyContractError, match=r"EarlyStopping\(monitor='mae'\)"):
        dp.fit(_dataset(True), epochs=3, callbacks=[stop], verbose=0)
    assert int(dp.mechanism.steps.numpy()) == 1
    # Built now: the next fit refuses it before training.
    with pytest.raises(PrivacyContractError, match="mae"):
        dp.fit(_dataset(True), epochs=3, callbacks=[stop], verbose=0)
    assert int(dp.mechanism.steps.numpy()) == 1


def test_validation_monitors_and_non_private_runs_are_accepted(fe, tmp_path):
    keras = fe.keras
    dp = _dp(fe)
    held_out = _dataset(False)  # stands for public / held-out data
    every = str(tmp_path / ("every.h5" if fe.name == "keras2" else "every.weights.h5"))
    callbacks = [
        keras.callbacks.EarlyStopping(monitor="val_loss", patience=0),
        keras.callbacks.ReduceLROnPlateau(),  # default monitor: val_loss
        keras.callbacks.ModelCheckpoint(every, save_weights_only=True),  # keeps every epoch
    ]
    history = dp.fit(_dataset(True), validation_data=held_out, epochs=2, callbacks=callbacks, verbose=0)
    assert "loss" in history.history and "val_loss" in history.history  # the operator still sees both
    plain = _dp(fe, mechanism=NonPrivate())
    plain.fit(_dataset(True), epochs=2, callbacks=[keras.callbacks.EarlyStopping(monitor="loss")], verbose=0)
