"""What a `BudgetTracker`'s ledger holds before this run's steps: one-off events, earlier steps, a resumed ledger."""

from __future__ import annotations

import logging

import dp_accounting

from tfdp_embed.accounting.events import EventSource, steps_taken
from tfdp_embed.accounting.ledger import PrivacyLedger

_LOG = logging.getLogger("tfdp_embed.accounting.budget")  # the budget's messages, under one logger


def record_setup_events(ledger: PrivacyLedger, mechanism: EventSource) -> bool:
    """Records the mechanism's one-off events the ledger lacks (by multiplicity); True if any was new."""
    events = list(mechanism.one_off_events())
    recorded = [e.event for e in ledger.entries if e.kind == "setup"]
    new = False
    for event in {id(e): e for e in events}.values():
        missing = sum(e == event for e in events) - sum(e == event for e in recorded)
        for _ in range(max(0, missing)):
            ledger.record_setup(event)
            new = True
        recorded.extend([event] * max(0, missing))
    return new


def record_earlier_steps(
    ledger: PrivacyLedger, mechanism: EventSource, step_event: dp_accounting.DpEvent, initial_steps: int | None
) -> None:
    """Adds the steps taken before this run (`mechanism.steps` or `initial_steps`, the larger) the ledger lacks."""
    known = ledger.steps
    sources = {"mechanism.steps": steps_taken(mechanism)}
    if initial_steps is not None:
        sources["initial_steps"] = initial_steps
    source, claimed = max(sources.items(), key=lambda kv: kv[1])
    if claimed > known:
        _LOG.info(
            "PrivacyBudget: counting %d steps taken before this run (%s=%d; the ledger held %d).",
            claimed - known,
            source,
            claimed,
            known,
        )
        ledger.record_steps(step_event, claimed - known)
    elif initial_steps is not None and initial_steps < known:
        _LOG.warning(
            "PrivacyBudget: `initial_steps`=%d is below the ledger's %d steps; the ledger's count is used.",
            initial_steps,
            known,
        )


def warn_foreign_steps(ledger: PrivacyLedger, step_event: dp_accounting.DpEvent) -> None:
    """Warns when a checkpointed ledger holds steps with another event than this run's (they count as recorded)."""
    foreign = [e for e in ledger.entries if e.kind == "step" and e.event != step_event]
    if foreign:
        _LOG.warning(
            "PrivacyBudget.resume_from: %d checkpointed step entries have another event than this run's "
            "(%s); they are accounted as recorded.",
            len(foreign),
            step_event,
        )


__all__ = ["record_earlier_steps", "record_setup_events", "warn_foreign_steps"]
