"""The callbacks a `DPModel.fit` accepts under a private mechanism, and the order it runs them in (both front ends).

Refused (`PrivacyContractError`, before anything trains):

* a callback acting on an un-noised training statistic: `EarlyStopping`,
  `ReduceLROnPlateau`, `ModelCheckpoint(save_best_only=True)`, or any
  callback with a `monitor`, whose `monitor` names what the training step
  logs ("loss", each output's loss, compiled and layer metrics). When
  training stops, the learning rate, or which weights are kept would then
  depend on single training examples, with no noise: a fixed test on the
  stopping epoch told a target apart far beyond what epsilon allows
  (tests/privacy/test_training_statistics_callbacks.py). A `val_` metric
  on public or held-out data is accepted, as is a key that another
  callback adds (e.g. a noised statistic accounted in the ledger);
* `TerminateOnNaN`: whether training halts depends on one example's loss;
* Keras' `BackupAndRestore`: it restores the weights but not the
  mechanism, the optimizer or the privacy ledger, so a resumed run
  under-reports epsilon. `tfdp_embed.keras2.checkpointing.DPCheckpoint` resumes
  all of them.

The policy is Keras-free: it recognises each Keras's callbacks by class
(`tfdp_embed.clipping.layer_kinds`), and takes the front end's callback
classes (`epsilon_first`, `FirstStepGuard`) as an argument.

Compiled metrics are named only once Keras has built them, in the first
step of the first `fit`; a monitor naming one is refused by a guard at that
step's end, before any callback has acted on it.

Not refused, by design: callbacks that only *show* the training logs to
the operator (`History`, the progress bar, `TensorBoard`, `CSVLogger`,
experiment loggers). In the central model the operator holding the data is
trusted; those logs are not DP outputs and must not be published. Stripping
the statistics from the logs would not close this exit (a callback holds
`self.model` and can compute anything from the training data) and would
silently break every logger, so a user's own callback that *decides*
something from `logs` (stops, re-tunes, picks weights) is the caller's
responsibility: decide only from validation metrics on public or held-out
data, or from statistics released with noise and accounted.

`NonPrivate` (no per-example clipping, no claim) accepts every callback.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from types import ModuleType

from tfdp_embed.accounting.budget import BudgetTracker
from tfdp_embed.clipping import layer_kinds
from tfdp_embed.errors import PrivacyContractError

_ALTERNATIVE = (
    "Monitor a validation metric on public or held-out data (e.g. `monitor='val_loss'` with "
    "`validation_data`), or a noised statistic released through the privacy ledger."
)


def _monitor(callback) -> str | None:
    """The log key `callback` acts on, or None when it acts on none."""
    if layer_kinds.is_keras_instance(callback, "callbacks", "ModelCheckpoint") and not callback.save_best_only:
        return None  # saves every time: its `monitor` decides nothing
    monitor = getattr(callback, "monitor", None)
    return monitor if isinstance(monitor, str) else None


def refuse_statistic(callback, monitor: str) -> None:
    """Raises: `callback` acts on the un-noised training statistic `monitor`."""
    raise PrivacyContractError(
        f"`{type(callback).__name__}(monitor={monitor!r})` acts on an un-noised training statistic: when "
        "training stops, the learning rate or the weights kept would depend on single training examples, "
        f"outside the DP guarantee. {_ALTERNATIVE}"
    )


def _check_kind(callback) -> None:
    """Refuses the callbacks that act on training data whatever their arguments."""
    if layer_kinds.is_keras_instance(callback, "callbacks", "BackupAndRestore"):
        raise PrivacyContractError(
            f"`{type(callback).__name__}` restores the weights but not the noise mechanism, the optimizer or "
            "the privacy ledger: a resumed run would report epsilon for the steps after the restart only. "
            "Use `tfdp_embed.keras2.checkpointing.DPCheckpoint` (it resumes all of them with the ledger)."
        )
    if layer_kinds.is_keras_instance(callback, "callbacks", "TerminateOnNaN"):
        raise PrivacyContractError(
            "`TerminateOnNaN` stops training on the un-noised training loss: whether the model is released "
            f"would depend on one example's loss. Remove it. {_ALTERNATIVE}"
        )


class FirstStepGuardLogic:
    """At the first training step's end (listed first): refuses monitors among the keys the step logged.

    A front end's `FirstStepGuard` is this on its `keras.callbacks.Callback`.
    """

    def __init__(self, acting: list):
        super().__init__()
        self._acting = acting  # [(callback, monitor)]
        self._checked = False

    def on_train_batch_end(self, batch, logs=None):
        if self._checked:
            return
        self._checked = True
        for callback, monitor in self._acting:
            if monitor in (logs or {}):
                refuse_statistic(callback, monitor)


class MechanismWarningsLogic:
    """At each epoch's end, warns the mechanism's `epoch_warnings` (operator-only notes that read no data).

    A front end's `MechanismWarnings` is this on its `keras.callbacks.Callback`.
    """

    def __init__(self, mechanism):
        super().__init__()
        self._mechanism = mechanism

    def on_epoch_end(self, epoch, logs=None):
        for message in self._mechanism.epoch_warnings():
            warnings.warn(message, RuntimeWarning, stacklevel=2)


def epsilon_first(callbacks: Iterable, into_logs: type) -> list:
    """`callbacks` with, in front, one `into_logs(budget)` per `PrivacyBudget`, which puts its epsilon into the logs."""
    callbacks = list(callbacks)
    budgets = [c for c in callbacks if isinstance(c, BudgetTracker)]
    return [*(into_logs(b) for b in budgets), *callbacks]


def arrange(callbacks: Iterable | None, *, private: bool, logged_names: Iterable[str], front: ModuleType) -> list:
    """The callbacks `DPModel.fit` runs: checked, with epsilon put into the epoch logs first.

    Args:
      callbacks: the caller's callbacks (None: none).
      private: the mechanism clips per example (anything but `NonPrivate`).
      logged_names: the training step's log keys known before the first
        step (`DPModel.metrics` names).
      front: the front end's callbacks module (`epsilon_first`, `FirstStepGuard`).

    Returns:
      A new list: a guard and the budgets' epsilon (`accounting.epsilon_logs`)
      in front, then the caller's callbacks in the caller's order.

    Raises:
      PrivacyContractError: (private only) a callback listed above.
    """
    arranged: list = front.epsilon_first(callbacks or [])
    if not private:
        return arranged
    names = {"loss", *logged_names}
    acting = []
    for callback in arranged:
        _check_kind(callback)
        monitor = _monitor(callback)
        if monitor is None or monitor.startswith("val_"):
            continue
        if monitor in names:
            refuse_statistic(callback, monitor)
        acting.append((callback, monitor))
    return [front.FirstStepGuard(acting), *arranged] if acting else arranged


def with_callbacks(args: tuple, kwargs: dict, *, private: bool, logged_names: Iterable[str], extra: list, front):
    """`fit`'s `(args, kwargs)` with `callbacks` (6th parameter or keyword) arranged, `extra` appended."""
    given = args[4] if len(args) > 4 else kwargs.get("callbacks")
    callbacks = [*arrange(given, private=private, logged_names=logged_names, front=front), *extra]
    if len(args) > 4:
        return (*args[:4], callbacks, *args[5:]), kwargs
    return args, {**kwargs, "callbacks": callbacks}


__all__ = ["FirstStepGuardLogic", "arrange", "epsilon_first", "refuse_statistic", "with_callbacks"]
