"""Runs of a private hyperparameter search: their reports must carry the whole search's epsilon.

`tfdp_embed.select_privately` (Papernot & Steinke 2022) trains a random
number of runs and releases only the best; what that model cost is the
search's `RepeatAndSelectDpEvent`, not the run's own ledger (one run at
eps 2.0 inside a geometric search of mean 5 costs about 3.0). A run's own
budget and ledger know nothing of the search, so this module remembers, per
mechanism object, which search it ran in:

* while the search runs (`searching`), every report built is marked as ONE
  RUN of a search, not a release (a caveat and a line in the guarantee);
* after it (`mark_search_runs`), a report of a run's mechanism must account
  the search: its ledger holds the search's event, or its epsilon is at
  least the search's at that delta. Anything less is refused
  (`check_report`), and so is any report of a run that was not selected;
* `export_saved_model` checks the report it writes the same way
  (`check_export`).

`privacy_report` calls `check_report` once; nothing here computes an
epsilon except through `dp_accounting`'s RDP accountant (the one that
composes the search's event).

References: Papernot & Steinke, "Hyperparameter Tuning with Renyi
Differential Privacy", ICLR 2022, Theorems 2 and 6.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import weakref
from collections.abc import Iterator, Mapping

import dp_accounting

from tfdp_embed.errors import PrivacyContractError

# Slack for comparing an epsilon with the search's (float noise between two RDP evaluations of one event).
_RELATIVE_SLACK = 1e-9


@dataclasses.dataclass(frozen=True)
class SearchMark:
    """What a run's mechanism remembers of the search it ran in.

    Attributes:
      event: the search's `RepeatAndSelectDpEvent`.
      selected: True for the run whose model the search released.
    """

    event: dp_accounting.DpEvent
    selected: bool

    def epsilon(self, delta: float) -> float:
        """The search's epsilon at `delta` (RDP: the accountant that composes the event)."""
        return float(dp_accounting.rdp.RdpAccountant().compose(self.event).get_epsilon(float(delta)))


_MARKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_ACTIVE: contextvars.ContextVar[dp_accounting.DpEvent | None] = contextvars.ContextVar("tfdp_search", default=None)

RUN_CAVEAT = (
    "This report was built during a private hyperparameter search (select_privately): it is ONE RUN's, not a "
    "release. The model the search selects costs the whole search's epsilon ({event}); build its report with "
    "tfdp_embed.planning.search_report."
)


@contextlib.contextmanager
def searching(event: dp_accounting.DpEvent) -> Iterator[None]:
    """Marks every report built inside the block as one run of the search `event`."""
    token = _ACTIVE.set(event)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def mark_search_runs(mechanisms, *, selected, event: dp_accounting.DpEvent) -> None:
    """Remembers that `mechanisms` (one per run) ran in the search `event`; `selected` is the released run's.

    A mechanism shared by several runs counts as selected if any of them was.
    Objects that cannot be weakly referenced, and None, are skipped.
    """
    for mechanism in mechanisms:
        if mechanism is None:
            continue
        was_selected = mechanism is selected or (mechanism in _MARKS and _MARKS[mechanism].selected)
        try:
            _MARKS[mechanism] = SearchMark(event, bool(was_selected))
        except TypeError:  # not weakly referenceable: nothing to attach the mark to
            continue


def search_mark(mechanism) -> SearchMark | None:
    """The search `mechanism` (or the source a `TruncatedSteps` wraps) ran in, or None."""
    for candidate in (mechanism, getattr(mechanism, "__dict__", {}).get("source")):
        try:
            if candidate is not None and candidate in _MARKS:
                return _MARKS[candidate]
        except TypeError:
            continue
    return None


def check_report(report: dict, mechanism) -> None:
    """Refuses a report of a search run that does not account the search; marks reports built during one.

    Args:
      report: the report `privacy_report` built (epsilon, delta, caveats, guarantee, ledger).
      mechanism: the mechanism it was built for.

    Raises:
      PrivacyContractError: the mechanism ran in a finished search and the
        report's epsilon is below the search's (or the run was not selected).
    """
    active = _ACTIVE.get()
    if active is not None:
        report["caveats"].append(RUN_CAVEAT.format(event=type(active).__name__))
        report["guarantee"] = f"{report['guarantee']} ONE RUN of a private hyperparameter search, not a release."
    mark = search_mark(mechanism)
    if mark is None:
        return
    _check_covers(mark, epsilon=report.get("epsilon"), delta=report["delta"], ledger=report.get("ledger"))


def check_export(mechanism, report: Mapping | None) -> None:
    """`export_saved_model`'s check: the report written beside a search run's model accounts the search.

    Raises:
      PrivacyContractError: see `check_report`; also a search run exported without a report.
    """
    mark = search_mark(mechanism)
    if mark is None:
        return
    if report is None:
        raise PrivacyContractError(
            "This model came out of a private hyperparameter search (select_privately) and is exported without a "
            "privacy report: its epsilon is the whole search's. Pass `report=search_report(result, ...)`."
        )
    _check_covers(mark, epsilon=report.get("epsilon"), delta=report.get("delta"), ledger=report.get("ledger"))


def _check_covers(mark: SearchMark, *, epsilon, delta, ledger) -> None:
    if not mark.selected:
        raise PrivacyContractError(
            "This mechanism ran in a private hyperparameter search (select_privately) whose selected model is "
            "another run's: the search's epsilon covers releasing the selected model only. Release that one, "
            "with `search_report(result, ...)`."
        )
    if _ledger_holds(ledger, mark.event):
        return
    search = mark.epsilon(delta) if isinstance(delta, (int, float)) and 0 < delta < 1 else None
    if isinstance(epsilon, (int, float)) and search is not None and epsilon >= search * (1 - _RELATIVE_SLACK):
        return
    shown = "none" if search is None else f"{search:.6g}"
    raise PrivacyContractError(
        f"This model was selected by a private hyperparameter search (select_privately): its epsilon is the "
        f"whole search's ({shown} at delta {delta!r}, RDP), not {epsilon!r} from one run's ledger; a report of "
        "one run understates what releasing it costs. Build the report with "
        "`tfdp_embed.planning.search_report(result, ...)` (the search's ledger and the selected run's steps)."
    )


def _ledger_holds(ledger, event: dp_accounting.DpEvent) -> bool:
    """True when `ledger` (a PrivacyLedger or its JSON dict) records `event` as a setup entry."""
    entries = getattr(ledger, "entries", None)
    if entries is not None:
        return any(e.kind == "setup" and e.event == event for e in entries)
    if isinstance(ledger, Mapping):
        from tfdp_embed.accounting.ledger import event_to_dict

        wanted = event_to_dict(event)
        return any(e.get("kind") == "setup" and e.get("event") == wanted for e in ledger.get("entries", []))
    return False


__all__ = ["SearchMark", "check_export", "check_report", "mark_search_runs", "search_mark", "searching"]
