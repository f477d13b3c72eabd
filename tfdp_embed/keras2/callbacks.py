"""The privacy budgets as tf-keras callbacks, and epsilon in the epoch logs before any callback reads them.

The logic is the core's (`tfdp_embed.accounting.budget.BudgetTracker`,
`tfdp_embed.accounting.periods.PeriodTracker`); here it becomes a
`keras.callbacks.Callback`. `RunPlan.budget()` returns these.

Keras calls the callbacks' `on_epoch_end` in list order with one shared
`logs` dict; a `PrivacyBudget` listed after `TensorBoard` (or `CSVLogger`,
or a user's callback) would add epsilon to logs those had already written.
`DPModel.fit` therefore puts, in front of the list, one small callback per
budget that puts its epsilon into the logs (`epsilon_first`); every other
hook keeps the order the caller gave.

Example:
    >>> callbacks = epsilon_first([keras.callbacks.TensorBoard(log_dir), budget])
    >>> model.fit(batches, epochs=3, callbacks=callbacks)  # TensorBoard writes epoch_epsilon
"""

from __future__ import annotations

from collections.abc import Iterable

from tfdp_embed import fit_callbacks
from tfdp_embed.accounting.budget import BudgetTracker
from tfdp_embed.accounting.periods import PeriodTracker
from tfdp_embed.keras2._keras import keras


class PrivacyBudget(BudgetTracker, keras.callbacks.Callback):
    __doc__ = BudgetTracker.__doc__


class PeriodBudget(PeriodTracker, keras.callbacks.Callback):
    __doc__ = PeriodTracker.__doc__


class _EpsilonIntoLogs(keras.callbacks.Callback):
    """Puts `budget`'s epsilon into the epoch logs (listed first; the budget writes its own scalars later)."""

    def __init__(self, budget: BudgetTracker):
        super().__init__()
        self.budget = budget

    def on_epoch_end(self, epoch, logs=None):
        self.budget.put_epsilon(logs)


def epsilon_first(callbacks: Iterable[keras.callbacks.Callback]) -> list:
    """`callbacks` with, in front, one callback per `PrivacyBudget` that puts its epsilon into the epoch logs.

    Args:
      callbacks: the caller's callbacks, in the caller's order.

    Returns:
      A new list; without a `PrivacyBudget`, the callbacks unchanged.
    """
    return fit_callbacks.epsilon_first(callbacks, _EpsilonIntoLogs)


class FirstStepGuard(fit_callbacks.FirstStepGuardLogic, keras.callbacks.Callback):
    __doc__ = fit_callbacks.FirstStepGuardLogic.__doc__


class MechanismWarnings(fit_callbacks.MechanismWarningsLogic, keras.callbacks.Callback):
    __doc__ = fit_callbacks.MechanismWarningsLogic.__doc__


__all__ = ["FirstStepGuard", "MechanismWarnings", "PeriodBudget", "PrivacyBudget", "epsilon_first"]
