"""The step math of a `BudgetTracker`: the ledger as the accountant charges it, and the steps that still fit.

`max_extra_steps` finds the largest k with eps(ledger + k steps) <= target
< eps(ledger + k + 1 steps), on coarse PLD grids first; the budget's own
grid decides (`coarse_to_exact.largest_count`: it checks k and k + 1).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import dp_accounting

from tfdp_embed.accounting.calibration import epsilon_levels, pld_interval
from tfdp_embed.accounting.coarse_to_exact import largest_count
from tfdp_embed.accounting.events import EventSource, accountable_event
from tfdp_embed.accounting.ledger import PrivacyLedger
from tfdp_embed.accounting.progress import announced

_LOG = logging.getLogger("tfdp_embed.accounting.budget")  # the budget's messages, under one logger

# Upper end of the step search: a budget that allows more steps than this is
# treated as allowing exactly this many (2**40 steps is far beyond any run).
MAX_STEPS = 2**40


def entries_after(
    ledger: PrivacyLedger,
    step_event: dp_accounting.DpEvent,
    extra_steps: int,
    *,
    source: EventSource,
    sampling_probability: float,
    accountant: str,
) -> tuple:
    """The ledger's `(event, count)` entries plus `extra_steps` more steps, as the accountant charges them.

    Events are as recorded for DP mechanisms; for non-DP ones, DP-SGD's (nominal) event where unsupported.
    """

    def charged(event: dp_accounting.DpEvent) -> dp_accounting.DpEvent:
        return accountable_event(event, source=source, sampling_probability=sampling_probability, accountant=accountant)

    step = charged(step_event)
    entries = [(charged(e.event), e.count) for e in ledger.entries]
    if extra_steps:
        entries.append((step, int(extra_steps)))
    return tuple(entries)


def max_extra_steps(
    entries_after: Callable[[int], tuple],
    *,
    target_epsilon: float,
    target_delta: float,
    sampling_probability: float,
    accountant: str,
    value_discretization_interval: float | None,
) -> int:
    """Largest k >= 0 with eps(`entries_after(k)`) <= `target_epsilon` (capped at `MAX_STEPS`)."""
    interval = pld_interval(accountant, value_discretization_interval)
    levels = epsilon_levels(entries_after, delta=target_delta, accountant=accountant, interval=interval)
    what = (
        f"epsilon={target_epsilon:g} at delta={target_delta:.3g} (q={sampling_probability:.4g}, {accountant.upper()})"
    )
    with announced(f"PrivacyBudget: counting the steps that fit {what}") as note:
        k = largest_count(levels, target_epsilon, start=max(1, round(1.0 / sampling_probability)), highest=MAX_STEPS)
        note.result = f"PrivacyBudget: {k} more steps fit {what}"
    if k == MAX_STEPS:
        _LOG.warning("PrivacyBudget: the budget allows more than %d steps; capping there.", MAX_STEPS)
    return k


def expected_extra_steps(planned_steps: int | None, ledger_steps: int, params: dict) -> int | None:
    """The steps a run expects to add: `planned_steps` less the ledger's, else Keras' epochs x steps (`params`)."""
    if planned_steps is not None:
        return planned_steps - ledger_steps
    epochs, steps = params.get("epochs"), params.get("steps")
    return epochs * steps if isinstance(epochs, int) and isinstance(steps, int) else None


def is_last_batch(model, params: dict, epoch: int, batch: int) -> bool:
    """True when no training step follows `batch` (stopping, or the last batch of the last epoch in `params`)."""
    if model is not None and model.stop_training:
        return True
    epochs, steps = params.get("epochs"), params.get("steps")
    return isinstance(epochs, int) and isinstance(steps, int) and epoch == epochs - 1 and batch + 1 >= steps


__all__ = ["MAX_STEPS", "entries_after", "expected_extra_steps", "is_last_batch", "max_extra_steps"]
