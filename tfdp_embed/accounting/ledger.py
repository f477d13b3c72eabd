"""`PrivacyLedger`: everything a training run spent, as `dp_accounting` events.

Events are data; accountants interpret them. The ledger keeps an ordered list
of `(kind, event, count)` entries: one-off "setup" events (e.g. DP-FEST's
top-k selection) recorded once, and "step" events recorded per training step
(consecutive identical step events are merged into one entry with a count,
so recording a step is O(1)). Its total is

    ledger = Composed(setup_1, ..., SelfComposed(step_event_j, count_j), ...)

and `epsilon(delta)` asks a fresh PLD or RDP accountant about it. The ledger
is saved as JSON next to every exported model.

JSON form (`to_json`): {"format": "tfdp_embed.PrivacyLedger", "version": 1,
"entries": [{"kind": "setup"|"step", "count": int, "event": E}, ...]} where E
is `dp_accounting`'s own serialisation (`DpEvent.to_named_tuple()`) written
as a dict: {"module_name": ..., "class_name": ..., <attrs fields>} with
nested events as dicts and tuples/lists as lists.

Example:
    >>> ledger = PrivacyLedger()
    >>> ledger.record_setup(mechanism.setup_event())
    >>> ledger.record_steps(mechanism.step_event(0.01), count=1000)
    >>> ledger.epsilon(1e-5)  # PLD

References: `dp_accounting.dp_event` (events as data), tensorflow-privacy
`privacy_ledger` (the ledger idea).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from collections.abc import Mapping, Sequence

import dp_accounting

from tfdp_embed.accounting.calibration import check_delta, check_steps, entries_epsilon

_FORMAT = "tfdp_embed.PrivacyLedger"
_VERSION = 1
_KINDS = ("setup", "step")


@dataclasses.dataclass
class LedgerEntry:
    """One ledger line: `event` happened `count` times; `kind` is "setup" or "step"."""

    kind: str
    event: dp_accounting.DpEvent
    count: int


class PrivacyLedger:
    """An append-only record of `dp_accounting` events with counts.

    Args:
      entries: optional initial `LedgerEntry`s (as from `from_json`).

    Raises:
      TypeError / ValueError: an entry with a non-event, a bad kind or a
        count < 1.
    """

    def __init__(self, entries: Sequence[LedgerEntry] = ()):
        self._entries: list[LedgerEntry] = []
        for entry in entries:
            self._append(entry.kind, entry.event, entry.count)

    # -- recording --------------------------------------------------------------
    def record_setup(self, event: dp_accounting.DpEvent | None) -> None:
        """Records a one-off event (None is ignored: the mechanism has no setup cost)."""
        if event is not None:
            self._append("setup", event, 1)

    def record_steps(self, event: dp_accounting.DpEvent, count: int = 1) -> None:
        """Records `count` training steps that each cost `event`."""
        count = check_steps(count, "count", allow_zero=True)
        if count == 0:
            return
        last = self._entries[-1] if self._entries else None
        if last is not None and last.kind == "step" and (last.event is event or last.event == event):
            last.count += count
        else:
            self._append("step", event, count)

    def _append(self, kind: str, event, count: int) -> None:
        if kind not in _KINDS:
            raise ValueError(f"Ledger entry `kind` must be one of {_KINDS}; received {kind!r}.")
        if not isinstance(event, dp_accounting.DpEvent):
            raise TypeError(f"Ledger `event` must be a `dp_accounting.DpEvent`; received {event!r}.")
        self._entries.append(LedgerEntry(kind, event, check_steps(count, "count")))

    # -- reading ----------------------------------------------------------------
    @property
    def entries(self) -> list[LedgerEntry]:
        """A copy of the entries, in recording order."""
        return [dataclasses.replace(e) for e in self._entries]

    @property
    def steps(self) -> int:
        """Number of training steps recorded."""
        return sum(e.count for e in self._entries if e.kind == "step")

    def has_setup(self, event: dp_accounting.DpEvent) -> bool:
        """True if `event` is already recorded as a setup event (resumes must not count it twice)."""
        return any(e.kind == "setup" and e.event == event for e in self._entries)

    def as_event(self, extra_steps: int = 0, step_event: dp_accounting.DpEvent | None = None) -> dp_accounting.DpEvent:
        """Everything recorded as one event, optionally plus `extra_steps` more `step_event`s.

        Returns:
          `ComposedDpEvent` of the entries (`SelfComposedDpEvent` for counts > 1);
          `NoOpDpEvent` for an empty ledger.
        """
        events = [
            e.event if e.count == 1 else dp_accounting.SelfComposedDpEvent(e.event, e.count) for e in self._entries
        ]
        if extra_steps:
            if step_event is None:
                raise ValueError("`step_event` is required with `extra_steps` > 0.")
            events.append(dp_accounting.SelfComposedDpEvent(step_event, int(extra_steps)))
        if not events:
            return dp_accounting.NoOpDpEvent()
        return events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(events)

    def epsilon(
        self, delta: float, accountant: str = "pld", *, value_discretization_interval: float | None = None
    ) -> float:
        """epsilon at `delta` of everything recorded (PLD by default, or "rdp").

        Raises:
          ValueError: bad delta/accountant, or an event no accountant can
            compose (a non-DP mechanism such as EANA).
        """
        check_delta(delta)
        entries = tuple((e.event, e.count) for e in self._entries)
        return entries_epsilon(
            entries, delta=float(delta), accountant=accountant, interval=value_discretization_interval, merge=False
        )

    def resume_from(self, saved: PrivacyLedger) -> None:
        """Takes over the entries of `saved` (a checkpointed ledger) to continue a run.

        This ledger must be empty or hold a prefix of `saved` (e.g. the same
        setup event recorded again by a fresh process): nothing already
        accounted is dropped, nothing is counted twice.

        Raises:
          TypeError: `saved` is not a PrivacyLedger.
          ValueError: this ledger holds entries `saved` does not start with
            (they would be lost or counted twice).
        """
        if not isinstance(saved, PrivacyLedger):
            raise TypeError(f"`saved` must be a PrivacyLedger; received {type(saved).__name__}.")
        mine, theirs = self._entries, saved._entries
        prefix_ok = len(mine) <= len(theirs) and all(
            a.kind == b.kind
            and a.event == b.event
            and (a.count == b.count or (i == len(mine) - 1 and a.count <= b.count))
            for i, (a, b) in enumerate(zip(mine, theirs))
        )
        if not prefix_ok:
            raise ValueError(
                f"Cannot resume: this ledger ({self!r}) holds entries the checkpointed ledger ({saved!r}) "
                "does not start with; resuming would drop or double-count them. Resume into an empty ledger."
            )
        self._entries = [dataclasses.replace(e) for e in theirs]

    def __eq__(self, other) -> bool:
        if not isinstance(other, PrivacyLedger):
            return NotImplemented
        return [(e.kind, e.event, e.count) for e in self._entries] == [
            (e.kind, e.event, e.count) for e in other._entries
        ]

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value: unhashable

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"PrivacyLedger(entries={len(self._entries)}, steps={self.steps})"

    # -- serialisation ----------------------------------------------------------
    def to_json(self, *, indent: int | None = 2) -> str:
        """The ledger as JSON (see the module docstring for the format)."""
        return json.dumps(
            {
                "format": _FORMAT,
                "version": _VERSION,
                "steps": self.steps,
                "entries": [{"kind": e.kind, "count": e.count, "event": event_to_dict(e.event)} for e in self._entries],
            },
            indent=indent,
        )

    @classmethod
    def from_json(cls, text: str) -> PrivacyLedger:
        """Reads `to_json` output.

        Raises:
          ValueError: not a ledger written by `to_json`, or an event class
            that is not a `dp_accounting.DpEvent`.
        """
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise ValueError(f"Not a {_FORMAT} JSON document (missing `format`: {_FORMAT!r}).")
        if data.get("version") != _VERSION:
            raise ValueError(f"Unsupported ledger `version` {data.get('version')!r}; allowed: {_VERSION}.")
        return cls([LedgerEntry(e["kind"], event_from_dict(e["event"]), int(e["count"])) for e in data["entries"]])


def event_to_dict(event: dp_accounting.DpEvent) -> dict:
    """`DpEvent` -> JSON-able dict via `DpEvent.to_named_tuple()` (dp_accounting's serialisation)."""
    return _plain(event.to_named_tuple())


def event_from_dict(data: Mapping) -> dp_accounting.DpEvent:
    """Inverse of `event_to_dict`; only classes that are `dp_accounting.DpEvent`s are built."""
    if not isinstance(data, Mapping) or "module_name" not in data or "class_name" not in data:
        raise ValueError(f"An event must be a dict with `module_name` and `class_name`; received {data!r}.")
    module_name, class_name = data["module_name"], data["class_name"]
    if not str(module_name).startswith("dp_accounting"):
        raise ValueError(f"Event `module_name` must be a dp_accounting module; received {module_name!r}.")
    cls = getattr(importlib.import_module(module_name), class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, dp_accounting.DpEvent)):
        raise ValueError(f"{module_name}.{class_name} is not a `dp_accounting.DpEvent`.")
    kwargs = {k: _rebuild(v) for k, v in data.items() if k not in ("module_name", "class_name")}
    return cls(**kwargs)


def _plain(value):
    if hasattr(value, "_fields") and hasattr(value, "class_name"):  # an event named tuple
        return {field: _plain(getattr(value, field)) for field in value._fields}
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _rebuild(value):
    if isinstance(value, Mapping) and "module_name" in value and "class_name" in value:
        return event_from_dict(value)
    if isinstance(value, list):
        return [_rebuild(v) for v in value]
    return value


__all__ = ["LedgerEntry", "PrivacyLedger", "event_from_dict", "event_to_dict"]
