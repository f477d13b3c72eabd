"""What a `BudgetTracker` says: its log lines and the messages of its refusals, in one place.

Every function reads the tracker (target, delta, accountant, q, ledger) and
says nothing about Keras.
"""

from __future__ import annotations

import logging

_LOG = logging.getLogger("tfdp_embed.accounting.budget")  # the budget's messages, under one logger


def not_dp(tracker) -> None:
    """Warns that the mechanism is not DP: the budget is DP-SGD's nominal epsilon."""
    _LOG.warning(
        "PrivacyBudget: mechanism %r is NOT differentially private. The budget below is the "
        "epsilon DP-SGD with the same noise multiplier would spend; it is logged as %r and "
        "is not a privacy guarantee for this model.",
        tracker.mechanism.name,
        tracker.log_key,
    )


def already_spent(tracker, what: str, spent: float) -> str:
    """The refusal of a run whose ledger already exceeds the budget."""
    return (
        f"The ledger already spent {what} {spent:.6g} > `target_epsilon`={tracker.target_epsilon:g} "
        f"at delta={tracker.target_delta:g} ({tracker.ledger.steps} steps, {tracker.accountant} accountant): "
        "any further training step would release more than the budget allows. Allowed: a larger "
        "`target_epsilon`, or stop training."
    )


def no_step_fits(tracker, what: str, spent: float) -> str:
    """The refusal of a run in which not one more step fits."""
    return (
        f"Not even one more step fits the budget: {what} is {spent:.6g} now and one more step "
        f"would exceed `target_epsilon`={tracker.target_epsilon:g} at delta={tracker.target_delta:g} "
        f"({tracker.ledger.steps} steps taken, {tracker.accountant} accountant)."
    )


def steps_allowed(tracker, remaining: int, what: str, spent: float) -> None:
    """Logs the outcome of the step search at train begin."""
    _LOG.info(
        "PrivacyBudget: %d more steps allowed (%d in total) within %s %g at delta=%g "
        "(q=%g, %s accountant); %s spent so far: %.6g.",
        remaining,
        tracker.max_steps,
        what,
        tracker.target_epsilon,
        tracker.target_delta,
        tracker.sampling_probability,
        tracker.accountant,
        what,
        spent,
    )


def planned_steps_fit(tracker, planned: int, what: str, after: float) -> None:
    """Logs that the planned steps fit (epsilon `after` them); the search waits."""
    _LOG.info(
        "PrivacyBudget: the %d planned steps fit %s %g at delta=%g (q=%g, %s accountant; %.6g after "
        "them); the steps beyond them are counted if training goes on.",
        planned,
        what,
        tracker.target_epsilon,
        tracker.target_delta,
        tracker.sampling_probability,
        tracker.accountant,
        after,
    )


def crossed_in_one_execution(tracker, steps: int, taken: int) -> str:
    """The error of a multi-step execution that went past the last allowed step."""
    return (
        f"{steps} steps were taken but only {tracker.max_steps} fit the budget "
        f"`target_epsilon`={tracker.target_epsilon:g}: a multi-step execution "
        f"(`steps_per_execution`={taken}) crossed the limit. Do not release this model; use "
        "`steps_per_execution=1` with PrivacyBudget."
    )


def stopping(tracker, steps: int) -> None:
    """Warns that the budget stops training after `steps`."""
    _LOG.warning(
        "PrivacyBudget: stopping training after step %d: one more step would exceed %s %g at delta=%g (%s accountant).",
        steps,
        "epsilon" if tracker.is_dp else "the NOMINAL (not DP) epsilon",
        tracker.target_epsilon,
        tracker.target_delta,
        tracker.accountant,
    )


def train_end(tracker, epsilon: float) -> None:
    """Logs the steps taken and the epsilon at train end."""
    _LOG.info(
        "PrivacyBudget: training ended after %d steps; %s %.6g at delta=%g (%s accountant)%s.",
        tracker.ledger.steps,
        "epsilon" if tracker.is_dp else "NOMINAL epsilon (NOT a DP guarantee)",
        epsilon,
        tracker.target_delta,
        tracker.accountant,
        ", stopped by the privacy budget" if tracker.stopped_by_budget else "",
    )


__all__ = [
    "already_spent",
    "crossed_in_one_execution",
    "no_step_fits",
    "not_dp",
    "planned_steps_fit",
    "stopping",
    "steps_allowed",
    "train_end",
]
