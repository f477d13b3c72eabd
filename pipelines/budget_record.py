"""The privacy budget spent on one `--out`, run after run: `OUT.budget.jsonl` beside the release.

A run that re-trains into the same `--out` (after a kill, a failure, or to
try other settings) usually reads the same data: each run spends its own
epsilon, and the data's total is their sum (basic composition). The record
keeps it, one JSON object a line, appended (never rewritten):

* `started`: written when the run's noise is calibrated, before the first
  step (mechanism, target epsilon, delta, planned steps);
* `finished` (the release was published; epsilon and steps from its report)
  or `interrupted` (it failed or was stopped after training started).

A SIGKILLed run leaves only its `started` line: it counts, at its planned
epsilon (an upper bound on what it spent). The file lives beside `OUT`
(`OUT.budget.jsonl`), not inside it: publishing a release renames
directories, and the record must survive them. It is written under
`OUT.lock` (`pipelines.output_dir`): one run at a time.

`summary()` (the report's `earlier_runs`) counts the earlier runs and sums
their epsilon and delta; a run that was not DP (mechanism `none`, EANA) has
no epsilon, and with one such run on the same data the total is unbounded
(`epsilon_total` is None).

Example:
    >>> record = BudgetRecord.read("runs/a")            # under the lock
    >>> record.start(plan)                               # prints earlier runs' epsilon to stderr
    >>> report["earlier_runs"] = record.spent(report)    # then record.close(finished=True)
"""

from __future__ import annotations

import datetime
import json
import math
import os
import secrets
import sys

SUFFIX = ".budget.jsonl"


def record_path(out: str) -> str:
    """`OUT.budget.jsonl`."""
    return out + SUFFIX


class BudgetRecord:
    """The earlier runs on one `--out` (read when the run takes the lock) and this run's lines."""

    def __init__(self, out: str, earlier: list):
        self.out, self.path, self.earlier = out, record_path(out), earlier
        now = datetime.datetime.now(datetime.UTC)
        self.run = f"{now:%Y%m%dT%H%M%S}-{os.getpid()}-{secrets.token_hex(3)}"  # unique, even in one process
        self.entry: dict | None = None  # this run's fields, once started

    @classmethod
    def read(cls, out: str) -> BudgetRecord:
        """The record of `out` (no file: no earlier run); unreadable lines are skipped."""
        runs: dict = {}
        try:
            with open(record_path(out)) as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            lines = []
        for line in lines:
            try:
                entry = json.loads(line)
                runs.setdefault(entry["run"], {}).update(entry)  # the run's last line wins, fields kept
            except (ValueError, KeyError, TypeError):
                continue
        return cls(out, list(runs.values()))

    def start(self, plan, *, program: str = "") -> None:
        """Appends this run's `started` line (from its `RunPlan`); prints what earlier runs spent, if any."""
        epsilon = plan.target_epsilon if plan.is_dp else None
        self.entry = {
            "mechanism": plan.mechanism_name,
            "is_dp": bool(plan.is_dp),
            "epsilon": _number(epsilon),
            "delta": _number(plan.target_delta) if plan.is_dp else None,
            "steps": int(plan.steps),
        }
        self._append("started", finished=False)
        if self.earlier:
            print(f"{program or 'budget'}: {self.describe()}", file=sys.stderr, flush=True)

    def spent(self, report: dict) -> dict:
        """This run's epsilon, delta and steps from its `report` (kept for its `finished` line); the `summary`."""
        if self.entry is not None:
            dp = bool(report.get("is_dp", self.entry["is_dp"]))
            self.entry.update(is_dp=dp, steps=report.get("steps", self.entry["steps"]))
            if dp and report.get("epsilon") is not None:
                self.entry.update(epsilon=_number(report["epsilon"]), delta=_number(report.get("delta")))
        return self.summary()

    def close(self, *, finished: bool) -> None:
        """Appends `finished` or `interrupted` (only for a run that started training)."""
        if self.entry is not None:
            self._append("finished" if finished else "interrupted", finished=finished)
            self.entry = None

    def summary(self) -> dict:
        """The report's `earlier_runs`: how many, their epsilon and delta summed (basic composition)."""
        private = [run for run in self.earlier if run.get("is_dp") and run.get("epsilon") is not None]
        unbounded = [run for run in self.earlier if run not in private]
        epsilon = sum(float(run["epsilon"]) for run in private)
        this = self.entry.get("epsilon") if self.entry and self.entry.get("is_dp") else None
        return {
            "record": self.path,
            "count": len(self.earlier),
            "finished": sum(bool(run.get("finished")) for run in self.earlier),
            "epsilon": epsilon,
            "delta": sum(float(run.get("delta") or 0) for run in private),
            "without_epsilon": len(unbounded),
            "epsilon_total": None if unbounded or this is None else epsilon + float(this),
            "composition": "basic (epsilons and deltas add up); a run without epsilon (not DP) leaves the total "
            "unbounded; an interrupted run counts at its planned epsilon",
        }

    def describe(self) -> str:
        """One line: what the earlier runs on `out` spent, and the total with this run."""
        summary = self.summary()
        text = (
            f"{summary['count']} earlier run(s) into {self.out} ({summary['finished']} finished) spent epsilon "
            f"{summary['epsilon']:.4g} (delta {summary['delta']:.3g})"
        )
        if summary["without_epsilon"]:
            text += f"; {summary['without_epsilon']} had no epsilon (not DP)"
        total = summary["epsilon_total"]
        total_text = "unbounded" if total is None else f"{total:.4g}"
        return f"{text}; with this run, epsilon {total_text} in total on this data (basic composition, {self.path})."

    def _append(self, event: str, *, finished: bool) -> None:
        line = {"run": self.run, "event": event, "date": _now(), **(self.entry or {}), "finished": finished}
        try:
            with open(self.path, "a") as f:
                f.write(json.dumps(line) + "\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as error:  # the run goes on; the operator is told the record is missing a line
            print(f"budget: could not append to {self.path}: {error.strerror or error}", file=sys.stderr)


def _number(value):
    return None if value is None or not math.isfinite(float(value)) else float(value)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


__all__ = ["BudgetRecord", "SUFFIX", "record_path"]
