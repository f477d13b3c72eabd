"""`search_report`: the privacy report of the model a private hyperparameter search selected.

What releasing the selected model costs is the whole search, not its run:

    epsilon = eps_RDP(search ledger, delta),  search ledger = (caller's entries,) RepeatAndSelect(run, mean, shape)

and the steps it states are the selected run's (the search's ledger has none:
its runs are inside the one event). The number of runs K is never written:
the analysis needs it hidden.

Example:
    >>> search = select_privately(candidates, train, run_event=plan.run_event, mean_runs=5, target_delta=1e-5)
    >>> report = search_report(search, sampling_probability=q, dataset_size=N)
    >>> export_saved_model(search.model, "saved_models/tuned", report=report)

References: Papernot & Steinke, "Hyperparameter Tuning with Renyi
Differential Privacy", ICLR 2022, Theorems 2 and 6.
"""

from __future__ import annotations

import json
import math

import dp_accounting

from tfdp_embed.accounting.report import privacy_report
from tfdp_embed.planning.selection import GEOMETRIC, LOGARITHMIC, POISSON, SelectionResult

SEARCH_CAVEAT = (
    "This model was selected by a private hyperparameter search (select_privately: a random number of runs, "
    "only the best released; Papernot & Steinke 2022). epsilon is the whole search's (RepeatAndSelectDpEvent, "
    "RDP accountant) and holds only while the number of runs stays hidden; `steps` are the selected run's."
)
_SET_HERE = ("ledger", "epsilon", "delta", "accountant")


def search_report(
    result: SelectionResult, *, steps: int | None = None, mechanism=None, batching=None, **report_arguments
) -> dict:
    """The selected model's privacy report: the search's ledger and epsilon, the selected run's steps.

    Args:
      result: what `select_privately` returned.
      steps: the selected run's training steps (default: its mechanism's
        step count, `result.model.mechanism.steps`).
      mechanism: the selected run's mechanism (default `result.model.mechanism`;
        pass `plan.step_source` for a run on truncated batches).
      batching: default `result.model.batching` (what `DPModel.fit` recorded).
      **report_arguments: the rest of `privacy_report`'s arguments
        (`sampling_probability`, `dataset_size`, `assumptions`, `extra`, ...).

    Returns:
      The `privacy_report` dict with epsilon at `result.delta` from
      `result.ledger` (RDP), "ledger" the search's ledger, and a "selection"
      section (the search's parameters, never the number of runs).

    Raises:
      ValueError: nothing was selected (Poisson K = 0), a missing mechanism,
        batching or steps, or `ledger`/`epsilon`/`delta`/`accountant` given
        (the search sets them).
    """
    if not isinstance(result, SelectionResult):
        raise TypeError(f"`result` must be what select_privately returned; received {type(result).__name__}.")
    if result.model is None:
        raise ValueError(
            "The search drew no run (Poisson K = 0): nothing was selected, so there is no model to report."
        )
    given = sorted(set(report_arguments) & set(_SET_HERE))
    if given:
        raise ValueError(f"{given} are the search's (its ledger, at `result.delta`, RDP); do not pass them.")
    mechanism = _from_model(result.model, "mechanism", mechanism)
    batching = _from_model(result.model, "batching", batching)
    if steps is None:
        steps = _from_model(mechanism, "steps", None)
        steps = int(steps.numpy()) if hasattr(steps, "numpy") else int(steps)
    epsilon = result.ledger.epsilon(result.delta, "rdp")
    report = privacy_report(
        mechanism=mechanism,
        batching=batching,
        delta=result.delta,
        epsilon=epsilon,
        accountant="rdp",
        steps=steps,
        **report_arguments,
    )
    report["ledger"] = json.loads(result.ledger.to_json())
    report["selection"] = _selection_section(result)
    report["caveats"].append(SEARCH_CAVEAT)
    return report


def _from_model(owner, name: str, given):
    if given is not None:
        return given
    value = getattr(owner, name, None)
    if value is None:
        raise ValueError(
            f"Pass `{name}=`: the selected model ({type(owner).__name__}) has no `{name}` to read it from."
        )
    return value


def _selection_section(result: SelectionResult) -> dict:
    """The search's public parameters and epsilons (the number of runs stays out: it must stay hidden)."""
    event = result.event
    run = event.event
    shape = float(event.shape)
    names = {GEOMETRIC: "geometric", POISSON: "poisson", LOGARITHMIC: "logarithmic"}
    run_epsilon = float(dp_accounting.rdp.RdpAccountant().compose(run).get_epsilon(result.delta))
    return {
        "method": "random search with a random number of runs, best run released (Papernot & Steinke 2022)",
        "runs_distribution": names.get(shape, "truncated negative binomial"),
        "mean_runs": float(event.mean),
        "shape": "inf" if math.isinf(shape) else shape,
        "search_epsilon": float(result.epsilon),
        "run_epsilon": run_epsilon,
        "delta": float(result.delta),
        "accountant": "rdp",
    }


__all__ = ["SEARCH_CAVEAT", "search_report"]
