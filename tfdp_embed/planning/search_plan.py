"""`plan_search`: the per-run noise that makes a whole private hyperparameter search meet a target epsilon.

A search of a random number of runs (`select_privately`) costs more than one
run: `RepeatAndSelectDpEvent(run, mean, shape)`. Planning each run for the
target and searching afterwards overshoots it (eps 2.0 per run, mean 5,
geometric: about 3.0). `plan_search` calibrates the other way round:

    sigma* = min{sigma : eps_RDP(RepeatAndSelect(run(sigma), mean, shape), delta) <= target}

with `run(sigma)` = `plan_event(plan_run(mechanism, noise_multiplier=sigma, ...))`
(its releases, selections and steps), by the library's one calibration
(`accounting.calibration.calibrate`: bracketing, then Brent's method). Every
run is then planned with sigma* (`SearchPlan.run_plan`) and enforced by a
budget at one run's epsilon (`SearchPlan.budget`).

Example:
    >>> search_plan = plan_search("dense", target_epsilon=3.0, target_delta=1e-5, mean_runs=5,
    ...                           sampling_probability=q, steps=T)
    >>> def train(candidate):
    ...     run = search_plan.run_plan()
    ...     dp_model = DPModel(build(candidate), mechanism=run.mechanism, expected_batch_size=q * N)
    ...     dp_model.fit(batches, callbacks=[search_plan.budget(run)])
    ...     return dp_model, validation_score(dp_model)
    >>> result = search_plan.select(candidates, train)
    >>> report = search_report(result, sampling_probability=q, dataset_size=N)   # epsilon <= 3.0

References: Papernot & Steinke, "Hyperparameter Tuning with Renyi
Differential Privacy", ICLR 2022, Theorems 2 and 6.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import dp_accounting

from tfdp_embed import front_end
from tfdp_embed.accounting.budget import BudgetTracker
from tfdp_embed.accounting.calibration import MAX_NOISE_MULTIPLIER, calibrate, check_delta, check_epsilon
from tfdp_embed.accounting.coarse_to_exact import Unreachable
from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.planning.plan import plan_run
from tfdp_embed.planning.run_plan import RunPlan
from tfdp_embed.planning.selection import GEOMETRIC, SelectionResult, _mean_shape, plan_event, select_privately

_SET_HERE = ("noise_multiplier", "target_epsilon", "target_delta", "accountant")
# A run's budget allows its planned epsilon up to float noise between two RDP evaluations of the same events.
_BUDGET_SLACK = 1e-9


@dataclasses.dataclass(frozen=True)
class SearchPlan:
    """A planned private search: the per-run noise, one run's event and what the whole search costs.

    Attributes:
      mechanism_name: the runs' mechanism.
      target_epsilon, target_delta: the whole search's target.
      mean_runs, shape: the distribution of the number of runs.
      noise_multiplier: sigma* of every run.
      run_event: one run's event (`plan_event`).
      event: the search's `RepeatAndSelectDpEvent`.
      epsilon: the search's epsilon at `target_delta` (RDP), <= `target_epsilon`.
      run_epsilon: one run's epsilon at `target_delta` (RDP).
      run_arguments: the `plan_run` arguments of every run.
    """

    mechanism_name: str
    target_epsilon: float
    target_delta: float
    mean_runs: float
    shape: float
    noise_multiplier: float
    run_event: dp_accounting.DpEvent
    event: dp_accounting.DpEvent
    epsilon: float
    run_epsilon: float
    run_arguments: Mapping = dataclasses.field(default_factory=dict)

    def run_plan(self) -> RunPlan:
        """A fresh `RunPlan` (new mechanism) for one run, at sigma*.

        Raises:
          PrivacyContractError: the plan's event is not `run_event` (cannot
            happen unless the mechanism's accounting changed since planning).
        """
        plan = _plan(self.mechanism_name, self.noise_multiplier, self.target_delta, self.run_arguments)
        if plan_event(plan) != self.run_event:
            raise PrivacyContractError(
                f"A run planned now costs {plan_event(plan)!r}, not the planned {self.run_event!r}: the search's "
                "epsilon would not hold. Plan the search again."
            )
        return plan

    def budget(self, plan: RunPlan, **kwargs) -> BudgetTracker:
        """The callback that holds one run to `run_epsilon` (RDP), starting from `plan`'s one-off events.

        Args:
          plan: the run's `RunPlan` (`run_plan()`).
          **kwargs: more `PrivacyBudget` arguments (`report_path`, `dataset_size`, ...).
        """
        kwargs.setdefault("ledger", plan.ledger())
        kwargs.setdefault("planned_steps", plan.steps)
        return front_end.callbacks().PrivacyBudget(
            plan.step_source,
            sampling_probability=plan.sampling_probability,
            target_epsilon=self.run_epsilon * (1.0 + _BUDGET_SLACK),
            target_delta=self.target_delta,
            accountant="rdp",
            **kwargs,
        )

    def select(self, candidates: Sequence, train: Callable[[Any], tuple[Any, float]], **kwargs) -> SelectionResult:
        """`select_privately` with this plan's run event, number of runs and delta (`**kwargs`: ledger, rng, ...)."""
        return select_privately(
            candidates,
            train,
            run_event=self.run_event,
            mean_runs=self.mean_runs,
            shape=self.shape,
            target_delta=self.target_delta,
            **kwargs,
        )


def plan_search(
    mechanism: str,
    *,
    target_epsilon: float,
    target_delta: float,
    mean_runs: float,
    shape: float = GEOMETRIC,
    **run_arguments,
) -> SearchPlan:
    """Calibrates the runs' noise multiplier so that the whole search meets `target_epsilon` (see the module).

    Args:
      mechanism: a `tfdp_embed.mechanisms.MECHANISMS` name (a DP one).
      target_epsilon: epsilon of the whole search (> 0).
      target_delta: delta in (0, 1).
      mean_runs: E[K] >= 1.
      shape: the distribution of K (`selection.GEOMETRIC`, ...).
      **run_arguments: `plan_run`'s arguments for every run
        (`sampling_probability`, `steps`, `l2_norm_clip`, mechanism options,
        releases as `Release(name, event=...)`, `selection_epsilon`); the
        noise is the search's to set.

    Returns:
      A `SearchPlan` whose `epsilon` <= `target_epsilon` (within the
      calibration's relative tolerance of it).

    Raises:
      ValueError: a bad argument (named), `noise_multiplier`/`target_epsilon`/
        `accountant` among `run_arguments`, or a target no sigma <=
        `MAX_NOISE_MULTIPLIER` meets.
    """
    target, delta = check_epsilon(target_epsilon), check_delta(target_delta)
    mean, shape = _mean_shape(mean_runs, shape)
    given = sorted(set(run_arguments) & set(_SET_HERE))
    if given:
        raise ValueError(f"{given} are the search's to set (`target_epsilon` is the whole search's); do not pass them.")
    arguments = dict(run_arguments)

    def search_event(sigma: float) -> dp_accounting.DpEvent:
        run = plan_event(_plan(mechanism, sigma, delta, arguments))
        return dp_accounting.dp_event.RepeatAndSelectDpEvent(run, mean, shape)

    sigma = _search_sigma(search_event, target, delta, mean)
    event = search_event(sigma)
    return SearchPlan(
        mechanism_name=mechanism,
        target_epsilon=target,
        target_delta=delta,
        mean_runs=mean,
        shape=shape,
        noise_multiplier=sigma,
        run_event=event.event,
        event=event,
        epsilon=_rdp_epsilon(event, delta),
        run_epsilon=_rdp_epsilon(event.event, delta),
        run_arguments=arguments,
    )


def _search_sigma(search_event: Callable, target: float, delta: float, mean: float) -> float:
    """`calibrate` (RDP) with the search's event factory sigma -> RepeatAndSelect(run(sigma), mean, shape)."""
    what = f"a search of {mean:g} runs on average, epsilon={target:g} at delta={delta:.3g} (RDP)"
    try:
        return calibrate(
            search_event, target_epsilon=target, target_delta=delta, accountant="rdp", what=what, accelerate=True
        )
    except Unreachable:
        raise ValueError(
            f"`target_epsilon`={target!r} for the whole search (mean {mean:g} runs) cannot be met at "
            f"`target_delta`={delta!r}: each run would need a noise multiplier above {MAX_NOISE_MULTIPLIER:g}. "
            "Allowed: a larger target, fewer runs on average, fewer steps or a smaller sampling probability."
        ) from None


def _plan(mechanism: str, sigma: float, delta: float, arguments: Mapping) -> RunPlan:
    return plan_run(mechanism, noise_multiplier=sigma, target_delta=delta, accountant="rdp", **arguments)


def _rdp_epsilon(event: dp_accounting.DpEvent, delta: float) -> float:
    return float(dp_accounting.rdp.RdpAccountant().compose(event).get_epsilon(delta))


__all__ = ["SearchPlan", "plan_search"]
