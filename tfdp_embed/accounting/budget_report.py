"""The privacy report a `BudgetTracker` writes at train end (or when it refuses to start), with the budget's outcome."""

from __future__ import annotations

import logging

from tfdp_embed.accounting.dataset_size import ReleasedDatasetSize

_LOG = logging.getLogger("tfdp_embed.accounting.budget")  # the budget's messages, under one logger


def check_report_dataset_size(report_path, dataset_size) -> None:
    """Refuses a `report_path` without the `dataset_size` the report needs."""
    if (
        report_path is not None
        and not isinstance(dataset_size, ReleasedDatasetSize)
        and (isinstance(dataset_size, bool) or not isinstance(dataset_size, int) or dataset_size < 1)
    ):
        raise ValueError(
            "`dataset_size` (N~ from `release_dataset_size`, or an int >= 1 stated as public) is required with "
            f"`report_path`; received {dataset_size!r}."
        )


def budget_outcome(tracker, *, max_steps: int | None, stopped: bool, refused_to_start: bool) -> dict:
    """The report's `extra.budget`: target, steps allowed and taken, whether the budget stopped training."""
    return {
        "target_epsilon": tracker.target_epsilon,
        "target_delta": tracker.target_delta,
        "max_steps": max_steps,  # None: training never went past the planned steps, which fit
        "steps": tracker.ledger.steps,
        "stopped_by_budget": bool(stopped),
        "refused_to_start": bool(refused_to_start),
        "message": (
            "Not one more step fits the budget: training did not start."
            if refused_to_start
            else "Training stopped because one more step would exceed the budget."
            if stopped
            else "Training ended within the budget."
        ),
    }


def write_budget_report(tracker, *, max_steps: int | None, stopped: bool, refused_to_start: bool) -> None:
    """Writes `tracker`'s privacy report to its `report_path` (if set), with the budget's outcome."""
    if tracker.report_path is None:
        return
    from tfdp_embed.accounting.report import privacy_report, write_privacy_report

    assert tracker.dataset_size is not None  # required with `report_path` (checked in __init__)
    report = privacy_report(
        mechanism=tracker.mechanism,
        batching=tracker.report_batching(),
        delta=tracker.target_delta,
        sampling_probability=tracker.sampling_probability,
        dataset_size=tracker.dataset_size,
        ledger=tracker.ledger if tracker.is_dp else None,
        epsilon=None if tracker.is_dp else tracker.epsilon,
        steps=None if tracker.is_dp else tracker.ledger.steps,
        accountant=tracker.accountant,
        extra={
            "budget": budget_outcome(tracker, max_steps=max_steps, stopped=stopped, refused_to_start=refused_to_start)
        },
    )
    write_privacy_report(tracker.report_path, report)
    _LOG.info("PrivacyBudget: privacy report written to %s.", tracker.report_path)


__all__ = ["budget_outcome", "check_report_dataset_size", "write_budget_report"]
