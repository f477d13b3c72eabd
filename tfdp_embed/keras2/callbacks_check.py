"""The callbacks `DPModel.fit` accepts under a private mechanism, and the order it runs them in.

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

from collections.abc import Iterable

from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.keras2._keras import keras
from tfdp_embed.keras2.callbacks import epsilon_first

_ALTERNATIVE = (
    "Monitor a validation metric on public or held-out data (e.g. `monitor='val_loss'` with "
    "`validation_data`), or a noised statistic released through the privacy ledger."
)


def _monitor(callback) -> str | None:
    """The log key `callback` acts on, or None when it acts on none."""
    if isinstance(callback, keras.callbacks.ModelCheckpoint) and not callback.save_best_only:
        return None  # saves every time: its `monitor` decides nothing
    monitor = getattr(callback, "monitor", None)
    return monitor if isinstance(monitor, str) else None


def _refuse_statistic(callback, monitor: str) -> None:
    raise PrivacyContractError(
        f"`{type(callback).__name__}(monitor={monitor!r})` acts on an un-noised training statistic: when "
        "training stops, the learning rate or the weights kept would depend on single training examples, "
        f"outside the DP guarantee. {_ALTERNATIVE}"
    )


def _check_kind(callback) -> None:
    """Refuses the callbacks that act on training data whatever their arguments."""
    if isinstance(callback, keras.callbacks.BackupAndRestore):
        raise PrivacyContractError(
            f"`{type(callback).__name__}` restores the weights but not the noise mechanism, the optimizer or "
            "the privacy ledger: a resumed run would report epsilon for the steps after the restart only. "
            "Use `tfdp_embed.keras2.checkpointing.DPCheckpoint` (it resumes all of them with the ledger)."
        )
    if isinstance(callback, keras.callbacks.TerminateOnNaN):
        raise PrivacyContractError(
            "`TerminateOnNaN` stops training on the un-noised training loss: whether the model is released "
            f"would depend on one example's loss. Remove it. {_ALTERNATIVE}"
        )


class _FirstStepGuard(keras.callbacks.Callback):
    """At the first training step's end (listed first): refuses monitors among the keys the step logged."""

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
                _refuse_statistic(callback, monitor)


def arrange(callbacks: Iterable | None, *, private: bool, logged_names: Iterable[str]) -> list:
    """The callbacks `DPModel.fit` runs: checked, with epsilon put into the epoch logs first.

    Args:
      callbacks: the caller's callbacks (None: none).
      private: the mechanism clips per example (anything but `NonPrivate`).
      logged_names: the training step's log keys known before the first
        step (`DPModel.metrics` names).

    Returns:
      A new list: a guard and the budgets' epsilon (`accounting.epsilon_logs`)
      in front, then the caller's callbacks in the caller's order.

    Raises:
      PrivacyContractError: (private only) a callback listed above.
    """
    callbacks = epsilon_first(callbacks or [])
    if not private:
        return callbacks
    names = {"loss", *logged_names}
    acting = []
    for callback in callbacks:
        _check_kind(callback)
        monitor = _monitor(callback)
        if monitor is None or monitor.startswith("val_"):
            continue
        if monitor in names:
            _refuse_statistic(callback, monitor)
        acting.append((callback, monitor))
    return [_FirstStepGuard(acting), *callbacks] if acting else callbacks


def with_callbacks(args: tuple, kwargs: dict, *, private: bool, logged_names: Iterable[str], extra: list):
    """`fit`'s `(args, kwargs)` with `callbacks` (6th parameter or keyword) arranged, `extra` appended."""
    given = args[4] if len(args) > 4 else kwargs.get("callbacks")
    callbacks = [*arrange(given, private=private, logged_names=logged_names), *extra]
    if len(args) > 4:
        return (*args[:4], callbacks, *args[5:]), kwargs
    return args, {**kwargs, "callbacks": callbacks}


__all__ = ["arrange", "with_callbacks"]
