"""The privacy budgets as Keras 3 callbacks (the core's trackers on `keras.callbacks.Callback`).

As `tfdp_embed.keras2.callbacks`: `PrivacyBudget`, `PeriodBudget`, and
`epsilon_first`, which puts epsilon into the epoch logs before any other
callback reads them.
"""

from __future__ import annotations

from collections.abc import Iterable

from tfdp_embed import fit_callbacks
from tfdp_embed.accounting.budget import BudgetTracker
from tfdp_embed.accounting.periods import PeriodTracker
from tfdp_embed.keras3._keras import keras


class PrivacyBudget(BudgetTracker, keras.callbacks.Callback):
    __doc__ = BudgetTracker.__doc__


class PeriodBudget(PeriodTracker, keras.callbacks.Callback):
    __doc__ = PeriodTracker.__doc__


class _EpsilonIntoLogs(keras.callbacks.Callback):
    """Puts `budget`'s epsilon into the epoch logs (listed first)."""

    def __init__(self, budget: BudgetTracker):
        super().__init__()
        self.budget = budget

    def on_epoch_end(self, epoch, logs=None):
        self.budget.put_epsilon(logs)


def epsilon_first(callbacks: Iterable) -> list:
    """`callbacks` with, in front, one callback per `PrivacyBudget` that puts its epsilon into the epoch logs."""
    return fit_callbacks.epsilon_first(callbacks, _EpsilonIntoLogs)


class FirstStepGuard(fit_callbacks.FirstStepGuardLogic, keras.callbacks.Callback):
    __doc__ = fit_callbacks.FirstStepGuardLogic.__doc__


class MechanismWarnings(fit_callbacks.MechanismWarningsLogic, keras.callbacks.Callback):
    __doc__ = fit_callbacks.MechanismWarningsLogic.__doc__


__all__ = ["FirstStepGuard", "MechanismWarnings", "PeriodBudget", "PrivacyBudget", "epsilon_first"]
