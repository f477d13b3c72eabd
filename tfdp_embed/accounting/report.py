"""The privacy report: what was guaranteed, under which assumptions, in JSON.

One dict (written as JSON next to every exported model) with epsilon, delta,
accountant, mechanism, noise multiplier(s), clip norm, sampling rate, steps,
dataset size, batching, `is_dp`, the ledger and a list of caveats in plain
words. Two situations are never dressed up as a guarantee:

* a mechanism with `is_dp` False (EANA, non-private training): `epsilon` is
  null and `guarantee` says it is NOT a differential-privacy guarantee;
* batches that were not Poisson-sampled (`batching="fixed_shuffled"`): a
  caveat says the epsilon assumes Poisson sampling and does not hold as
  stated for shuffled fixed-size batches;
* batches not verified as Poisson: `batching` is required and is best
  `dp_model.batching`, what `DPModel.fit` recorded from the data itself
  (Poisson only for `tfdp_embed.data` samplers; "unverified" for anything
  else, with a caveat). A Poisson batching the caller declared to `fit`, or
  states here as a string or `BatchingInfo`, is reported with a caveat
  that it was not verified against the data (`batching_source`).

Conditions the ledger cannot see (e.g. statistics supplied as public) are
passed as `assumptions`: the guarantee line then says it is conditional on them.

Truncated Poisson batches (`max_batch_size`) are accounted for as
delta' = delta + (1 + e^eps) * T * P[Binomial(N + 1, q) > max_batch_size]
(`truncation_delta`): the truncated run differs from the untruncated one
only when a batch overflows.

Example:
    >>> report = privacy_report(mechanism=mechanism, ledger=budget.ledger, delta=1e-5,
    ...     sampling_probability=q, dataset_size=N, batching=dp_model.batching)
    >>> write_privacy_report("model/privacy_report.json", report)

References: Abadi et al. 2016 §3.1; Ponomareva et al., "How to DP-fy ML",
JAIR 2023, §5.3 (what a privacy statement must report); Chua et al. 2024
(shuffling vs Poisson; truncated Poisson batches).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import dp_accounting
from scipy import stats

from tfdp_embed.accounting.calibration import (
    check_accountant,
    check_delta,
    check_sampling_probability,
    check_steps,
    compute_epsilon,
)
from tfdp_embed.accounting.ledger import PrivacyLedger, event_to_dict
from tfdp_embed.accounting.truncated import check_matches_batching
from tfdp_embed.data.provenance import DECLARED, FedBatching

BATCHINGS = ("poisson", "fixed_shuffled", "unverified")

NOT_POISSON_CAVEAT = (
    "The epsilon assumes Poisson sampling (each example in each batch independently with "
    "probability q), but the batches were fixed-size shuffled batches, not Poisson-sampled. "
    "The accounting does not describe this run exactly; shuffled batches can be much less "
    "private than the Poisson number suggests (Chua et al. 2024)."
)
UNVERIFIED_CAVEAT = (
    "The epsilon assumes Poisson sampling (each example in each batch independently with "
    "probability q), but the batches fed to training were not verified as Poisson-sampled: {fed}. "
    "Only batches from tfdp_embed.data's Poisson samplers are; the accounting may not describe this run."
)
DECLARED_CAVEAT = (
    "The {batching} batching was declared by the caller (DPModel.fit(batching=...)), not verified "
    "against the data: the guarantee holds only if the declaration is true."
)
STATED_CAVEAT = (
    "Poisson sampling is stated by the caller of privacy_report, not verified against the data fed to "
    "training; pass `batching=dp_model.batching` (recorded by DPModel.fit from the data) for a verified claim."
)
NOT_DP_GUARANTEE = (
    "NONE: mechanism {name!r} is NOT differentially private. This report is NOT a "
    "differential-privacy guarantee and no epsilon is reported."
)
ADJACENCY = "add-or-remove-one-example"


def truncation_delta(
    *, dataset_size: int, sampling_probability: float, max_batch_size: int, steps: int, epsilon: float
) -> float:
    """Extra delta of truncating Poisson batches at `max_batch_size`.

    delta_trunc = (1 + e^eps) * T * P[Binomial(N + 1, q) > B]

    Args:
      dataset_size: N.
      sampling_probability: q.
      max_batch_size: B.
      steps: T.
      epsilon: the epsilon the delta goes with.

    Returns:
      The term to add to delta (capped at 1).

    References: Chua et al. 2024 (truncated Poisson batches); the coupling
    argument in `tfdp_embed.data.poisson`.
    """
    tail = float(stats.binom.sf(max_batch_size, dataset_size + 1, sampling_probability))
    if tail == 0.0:
        return 0.0
    return min(1.0, (1.0 + math.exp(min(epsilon, 700.0))) * steps * tail)


def privacy_report(
    *,
    mechanism,
    delta: float,
    sampling_probability: float,
    dataset_size: int,
    batching: str | Any,
    ledger: PrivacyLedger | None = None,
    epsilon: float | None = None,
    accountant: str = "pld",
    steps: int | None = None,
    assumptions: Sequence[str] = (),
    extra: Mapping | None = None,
) -> dict:
    """The privacy report of a training run as a JSON-able dict.

    epsilon = eps(ledger, delta) for DP mechanisms; null for non-DP ones.

    Args:
      mechanism: the `NoiseMechanism` used (its `report()` fields are included).
      delta: delta in (0, 1).
      sampling_probability: q in (0, 1].
      dataset_size: N (examples, or users for user-level DP).
      ledger: the run's `PrivacyLedger`; epsilon is computed from it.
      epsilon: an epsilon computed elsewhere (instead of `ledger`).
      accountant: "pld" or "rdp" (how epsilon was / is computed).
      steps: training steps (default: `ledger.steps`). With neither `ledger`
        nor `epsilon`, epsilon is computed from the mechanism's setup event
        plus `steps` step events.
      batching: required. `dp_model.batching` (the `FedBatching` that
        `DPModel.fit` recorded from the data: verified, declared or not
        verified), or the caller's statement: "poisson", "fixed_shuffled",
        "unverified" or a `BatchingInfo` (from `tfdp_embed.data`; its
        counters and cap go into the report). A stated Poisson batching is
        reported as not verified.
      assumptions: conditions the guarantee rests on beyond the ledger, in
        plain words (e.g. "the supplied item frequencies are independent of
        the training data"); the guarantee line says it holds only under them.
      extra: more JSON-able fields, stored under "extra".

    Returns:
      dict with keys epsilon, delta, accountant, mechanism, is_dp, guarantee,
      noise_multiplier, noise_multipliers, l2_norm_clip, sampling_probability,
      expected_batch_size, steps, epochs, dataset_size, batching, batching_source, adjacency,
      assumptions, caveats, mechanism_report, (ledger, batching_details, delta_with_truncation, extra).

    Raises:
      ValueError: bad or contradictory arguments (both `ledger` and
        `epsilon`, `steps` disagreeing with the ledger, unknown batching).
    """
    delta = check_delta(delta, "delta")
    q = check_sampling_probability(sampling_probability)
    accountant = check_accountant(accountant)
    if isinstance(dataset_size, bool) or not isinstance(dataset_size, int) or dataset_size < 1:
        raise ValueError(f"`dataset_size` must be an int >= 1; received {dataset_size!r}.")
    steps = _resolve_steps(ledger, epsilon, steps)
    assumptions = _check_assumptions(assumptions)
    batching = _batching(batching)
    _check_batching_matches(batching.details, dataset_size=dataset_size, q=q)
    mech, report, caveats = _mechanism_fields(mechanism)
    if report["is_dp"]:
        if epsilon is None:
            if ledger is not None:  # memoised: the budget's epoch-end epsilon of the same ledger is reused
                epsilon = ledger.epsilon(delta, accountant)
            else:
                epsilon = compute_epsilon(_events(mechanism, q, steps), target_delta=delta, accountant=accountant)
        report.update(_guarantee(epsilon, delta=delta, steps=steps, accountant=accountant, assumptions=assumptions))
    else:
        report.update(_not_dp_fields(report["mechanism"], epsilon, caveats))
    report.update(
        delta=delta,
        accountant=accountant,
        noise_multiplier=mech.pop("noise_multiplier", getattr(mechanism, "noise_multiplier", None)),
        noise_multipliers=_noise_multipliers(mechanism, mech),
        l2_norm_clip=mech.pop("l2_norm_clip", getattr(mechanism, "l2_norm_clip", None)),
        sampling_probability=q,
        expected_batch_size=q * dataset_size,
        steps=steps,
        epochs=steps * q,
        dataset_size=dataset_size,
        batching=batching.name,
        batching_source=batching.source,
        adjacency=ADJACENCY,
        assumptions=list(assumptions),
    )
    caveats.extend(f"The guarantee holds only if {text}" for text in assumptions)
    _add_batching_section(
        report, caveats, batching, exact_truncation=check_matches_batching(mechanism, batching.details)
    )
    report["caveats"] = caveats
    report["mechanism_report"] = _jsonable(mech)
    if ledger is not None:
        report["ledger"] = json.loads(ledger.to_json())
    if extra is not None:
        report["extra"] = _jsonable(dict(extra))
    return report


def _resolve_steps(ledger: PrivacyLedger | None, epsilon: float | None, steps: int | None) -> int:
    """The run's step count: the ledger's (checked against `steps`), else `steps` (then required)."""
    if ledger is not None and epsilon is not None:
        raise ValueError("Pass either `ledger` (epsilon is computed from it) or `epsilon`, not both.")
    if ledger is not None:
        if steps is not None and check_steps(steps, allow_zero=True) != ledger.steps:
            raise ValueError(f"`steps`={steps!r} but the ledger records {ledger.steps} steps.")
        steps = ledger.steps
    elif steps is None:
        raise ValueError("`steps` is required when no `ledger` is given.")
    return check_steps(steps, allow_zero=True)


def _check_batching_matches(details: dict | None, *, dataset_size: int, q: float) -> None:
    """The sampler's own N and q (when it reported them) must be the report's."""
    if details is None:
        return
    n_info, q_info = details.get("num_examples"), details.get("sampling_probability")
    if n_info is not None and n_info != dataset_size:
        raise ValueError(f"`dataset_size`={dataset_size} but the batching info has {n_info} examples.")
    if q_info is not None and not math.isclose(q_info, q, rel_tol=1e-9):
        raise ValueError(f"`sampling_probability`={q!r} but the batches were sampled with q={q_info!r}.")


def _mechanism_fields(mechanism) -> tuple[dict, dict, list]:
    """(the mechanism's remaining report fields, the report's first fields, its caveats)."""
    mech = dict(mechanism.report())
    is_dp = bool(mechanism.is_dp) and bool(mech.get("is_dp", True))
    caveats = [str(c) for c in mech.pop("caveats", [])]
    report = {"mechanism": mech.pop("mechanism", mechanism.name), "is_dp": is_dp}
    mech.pop("is_dp", None)
    return mech, report, caveats


def _guarantee(epsilon: float, *, delta: float, steps: int, accountant: str, assumptions: list) -> dict:
    """epsilon and the guarantee line of a DP run (conditional on `assumptions`, if any)."""
    return {
        "epsilon": float(epsilon),
        "guarantee": (
            f"({float(epsilon):.6g}, {delta:g})-differential privacy, {ADJACENCY} adjacency, "
            f"for every model checkpoint released during the {steps} steps ({accountant.upper()} accountant)"
            + (f", CONDITIONAL on: {'; '.join(assumptions)}." if assumptions else ".")
        ),
    }


def _not_dp_fields(name: str, nominal_epsilon: float | None, caveats: list) -> dict:
    """A non-DP run: epsilon null, the guarantee says NONE; a nominal epsilon only labelled as such."""
    fields = {"epsilon": None, "guarantee": NOT_DP_GUARANTEE.format(name=name)}
    caveats.insert(
        0,
        f"Mechanism {name!r} is NOT differentially private: epsilon is null because no "
        "differential-privacy guarantee exists for this model.",
    )
    if nominal_epsilon is not None:
        fields["nominal_epsilon_not_dp"] = float(nominal_epsilon)
        caveats.append(
            "nominal_epsilon_not_dp is the epsilon DP-SGD with the same noise multiplier would have; "
            "it is NOT a guarantee for this model."
        )
    return fields


def _add_batching_section(report: dict, caveats: list, batching: _Batching, *, exact_truncation: bool) -> None:
    """Caveats on how the data was batched; the guarantee says when Poisson sampling was not verified."""
    caveats.extend(batching.caveats)
    if batching.name == "fixed_shuffled":
        caveats.append(NOT_POISSON_CAVEAT)
    elif batching.name == "unverified":
        fed = (batching.details or {}).get("fed", "the caller said so")
        caveats.append(UNVERIFIED_CAVEAT.format(fed=fed))
    if report["is_dp"] and (batching.name != "poisson" or batching.source != "verified"):
        report["guarantee"] += (
            " Conditional on Poisson sampling, which was not verified for this run's batches (see caveats)."
        )
    if batching.details is not None:
        report["batching_details"] = batching.details
        _add_truncation(report, caveats, batching, exact=exact_truncation)


def _add_truncation(report: dict, caveats: list, batching: _Batching, *, exact: bool) -> None:
    """Truncated Poisson batches: exact (truncated events) or `delta_with_truncation` and a caveat saying what it adds."""
    cap = batching.details.get("max_batch_size")
    if batching.name != "poisson" or cap is None:
        return
    cut = (
        f"({batching.details.get('truncated_batches', 0)} batches, "
        f"{batching.details.get('truncated_examples', 0)} examples cut)"
    )
    shape = " and padded with weight-0 examples to that fixed shape" if batching.details.get("fixed_shape") else ""
    if exact:
        report["step_accounting"] = "truncated_poisson"
        caveats.append(
            f"Poisson batches were truncated at max_batch_size={cap}{shape} {cut}; every step is accounted "
            "as dp-accounting's TruncatedSubsampledGaussianDpEvent (Poisson sampling, then truncation), so "
            "epsilon and delta already include the truncation."
        )
        return
    extra_delta = truncation_delta(
        dataset_size=report["dataset_size"],
        sampling_probability=report["sampling_probability"],
        max_batch_size=int(cap),
        steps=report["steps"],
        epsilon=report["epsilon"] if report["epsilon"] is not None else 0.0,
    )
    report["delta_with_truncation"] = min(1.0, report["delta"] + extra_delta)
    caveats.append(
        f"Poisson batches were truncated at max_batch_size={cap}{shape} {cut}. The guarantee holds with "
        f"delta + (1 + e^eps) * steps * P[Binomial(N + 1, q) > {cap}] = "
        f"{report['delta_with_truncation']:.3g} (see delta_with_truncation)."
    )


def not_released_note(non_dp_fields, *, release: str) -> str:
    """The `not_released` line of a pipeline's run report (operator-only, written next to the release).

    Args:
      non_dp_fields: the report's fields computed from un-noised data
        (metrics, training loss, data-dependent bounds).
      release: what is released instead (e.g. "saved_model/").
    """
    return (
        "This run report is the operator's, NOT a release: "
        + ", ".join(non_dp_fields)
        + f" are computed from un-noised data and are not differentially private. Release {release} only; "
        "its privacy_report.json holds DP quantities and hyperparameters."
    )


def write_privacy_report(path: str | os.PathLike, report: Mapping) -> str:
    """Writes `report` as JSON (non-finite numbers as strings "inf"/"nan"); returns the path."""
    path = os.fspath(path)
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(_jsonable(dict(report)), f, indent=2, sort_keys=False, allow_nan=False)
        f.write("\n")
    return path


def read_privacy_report(path: str | os.PathLike) -> dict:
    """Reads a report written by `write_privacy_report`."""
    with open(os.fspath(path), encoding="utf-8") as f:
        return json.load(f)


# -- helpers -----------------------------------------------------------------------


def _events(mechanism, q: float, steps: int) -> list:
    events = list(mechanism.one_off_events())  # a mechanism refuses undeclared one-off events
    if steps:
        events.append(dp_accounting.SelfComposedDpEvent(mechanism.step_event(q), steps))
    return events


def _check_assumptions(assumptions) -> list[str]:
    if isinstance(assumptions, str) or not isinstance(assumptions, Sequence):
        raise TypeError(f"`assumptions` must be a sequence of sentences; received {assumptions!r}.")
    for text in assumptions:
        if not isinstance(text, str) or not text.strip():
            raise TypeError(f"`assumptions` must hold non-empty strings; received {text!r}.")
    return [text.strip() for text in assumptions]


class _Batching(NamedTuple):
    """How the run's data was batched, as the report states it."""

    name: str
    details: dict | None
    source: str
    caveats: list


def _batching(batching) -> _Batching:
    """The `_Batching` of a `FedBatching`, `BatchingInfo` or string."""
    if isinstance(batching, FedBatching):
        details = _jsonable(batching.report())
        caveats = [DECLARED_CAVEAT.format(batching=batching.batching)] if batching.source == DECLARED else []
        return _Batching(batching.batching, details, batching.source, caveats)
    if isinstance(batching, str):
        if batching not in BATCHINGS:
            raise ValueError(
                f"`batching` must be one of {BATCHINGS}, a BatchingInfo or `dp_model.batching`; received {batching!r}."
            )
        name, details = batching, None
    elif hasattr(batching, "report") and callable(batching.report):
        details = dict(batching.report())
        name = details.get("batching")
        if name not in BATCHINGS:
            raise ValueError(f"`batching.report()['batching']` must be one of {BATCHINGS}; received {name!r}.")
        details = _jsonable(details)
    else:
        raise ValueError(
            f"`batching` must be one of {BATCHINGS}, a BatchingInfo or `dp_model.batching`; received {batching!r}."
        )
    return _Batching(name, details, "stated", [STATED_CAVEAT] if name == "poisson" else [])


def _noise_multipliers(mechanism, mech: dict) -> dict:
    """Every noise multiplier the mechanism reports (e.g. AdaFEST's sigma1, sigma2, effective)."""
    out = {"noise_multiplier": getattr(mechanism, "noise_multiplier", None)}
    for key, value in mech.items():
        if "noise_multiplier" in key and isinstance(value, (int, float)):
            out[key] = value
    return out


def _jsonable(value):
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else ("inf" if value > 0 else "-inf" if value < 0 else "nan")
    if hasattr(value, "item") and callable(value.item):  # numpy / tf scalars
        try:
            return _jsonable(value.item())
        except (TypeError, ValueError):
            pass
    if hasattr(value, "numpy"):
        return _jsonable(value.numpy().tolist())
    if isinstance(value, dp_accounting.DpEvent):
        return event_to_dict(value)
    return str(value)
