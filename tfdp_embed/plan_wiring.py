"""`DPModel(model, plan=)`: the mechanism and q N from a `RunPlan`, and fed batches checked against its q and N."""

from __future__ import annotations

import math

from tfdp_embed.accounting.report import check_batching_matches
from tfdp_embed.errors import PrivacyContractError


def from_plan(plan, mechanism, expected_batch_size) -> tuple:
    """(mechanism, expected batch size): the plan's, or the explicit ones; both given and different is refused.

    Raises:
      ValueError: `plan` with a different `mechanism` or `expected_batch_size`, a plan that does not know N
        without `expected_batch_size`, or neither `plan` nor `mechanism`.
    """
    if plan is None:
        if mechanism is None:
            raise ValueError("Pass `plan` (a `plan_run` RunPlan) or `mechanism`.")
        return mechanism, expected_batch_size
    if mechanism is not None and mechanism is not plan.mechanism:
        raise ValueError("`mechanism` is not the `plan`'s mechanism: pass `plan` alone (its mechanism is used).")
    planned = None if plan.dataset_size is None else plan.sampling_probability * plan.dataset_size
    if expected_batch_size is None:
        if planned is None and plan.mechanism.clips_per_example:
            raise ValueError(
                "`plan` does not know N (plan with `plan_run(batching=info)`), so pass `expected_batch_size`."
            )
        return plan.mechanism, planned
    if planned is not None and not math.isclose(float(expected_batch_size), planned, rel_tol=1e-9):
        raise ValueError(
            f"`expected_batch_size`={expected_batch_size!r} but the plan's q N is {planned!r}: pass `plan` alone."
        )
    return plan.mechanism, expected_batch_size


def check_fed(plan, fed) -> None:
    """Refuses, before the first step, batches whose sampler's q or N is not the plan's (the report's check).

    Raises:
      PrivacyContractError: the fed `BatchingInfo` disagrees with the plan: epsilon would describe another run.
    """
    if plan is None or plan.parallel or fed is None or fed.info is None:
        return
    details = fed.info.report()
    size = details.get("num_examples") if plan.dataset_size is None else plan.dataset_size
    try:
        check_batching_matches(details, dataset_size=size, q=plan.sampling_probability)
    except ValueError as error:
        raise PrivacyContractError(
            f"The batches fed to `fit` do not match the plan (q={plan.sampling_probability!r}, "
            f"N={plan.dataset_size!r}): {error} The plan's epsilon would not describe this run; plan with "
            "`plan_run(batching=info)` using the sampler's info."
        ) from error


__all__ = ["check_fed", "from_plan"]
