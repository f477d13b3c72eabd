"""Epsilon in the epoch logs before any callback reads them, whatever the order of `callbacks`.

Keras calls the callbacks' `on_epoch_end` in list order with one shared
`logs` dict; a `PrivacyBudget` listed after `TensorBoard` (or `CSVLogger`,
or a user's callback) used to add epsilon to logs those had already
written. `DPModel.fit` therefore puts, in front of the list, one small
callback per budget whose `on_epoch_end` puts that budget's epsilon into
the logs (`PrivacyBudget.put_epsilon`). Nothing else moves: the budgets
themselves, and every other hook, keep the order the caller gave.

Example:
    >>> callbacks = epsilon_first([keras.callbacks.TensorBoard(log_dir), budget])
    >>> model.fit(batches, epochs=3, callbacks=callbacks)  # TensorBoard writes epoch_epsilon
"""

from __future__ import annotations

from collections.abc import Iterable

from tfdp_embed._keras import keras
from tfdp_embed.accounting.budget import PrivacyBudget


class _EpsilonIntoLogs(keras.callbacks.Callback):
    """Puts `budget`'s epsilon into the epoch logs (listed first; the budget writes its own scalars later)."""

    def __init__(self, budget: PrivacyBudget):
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
    callbacks = list(callbacks)
    budgets = [c for c in callbacks if isinstance(c, PrivacyBudget)]
    return [*(_EpsilonIntoLogs(b) for b in budgets), *callbacks]


__all__ = ["epsilon_first"]
