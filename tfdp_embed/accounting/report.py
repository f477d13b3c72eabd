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

The dataset size is `dataset_size`: N~ from `release_dataset_size` (its
Gaussian event in the ledger; the report then holds no exact N and q, delta
and the expected batch come from N~), or an int N, stated exactly and so
an assumption (N public). A run whose noise, batches or N~ were seeded
lists them in `seeded` (names only) and its guarantee excludes whoever knows
the seed. Every report states the privacy unit, the contribution bound and
the membership-test bound TPR <= min(e^eps FPR + delta, ...) (`attacker_bound`); for epsilons
accounted from the run's events it adds the tighter TPR-at-FPR rows of the run's PLD (`pld_bounds`)
and, for plain DP-SGD steps, the central-limit mu-GDP (`gdp_clt`, an approximation; `tradeoff`).

Example:
    >>> report = privacy_report(mechanism=mechanism, ledger=budget.ledger, delta=1e-5,
    ...     sampling_probability=q, dataset_size=size, batching=dp_model.batching)
    >>> write_privacy_report("model/privacy_report.json", report)

References: Abadi et al. 2016 §3.1; Ponomareva et al., "How to DP-fy ML",
JAIR 2023, §5.3 (what a privacy statement must report); Chua et al. 2024
(shuffling vs Poisson; truncated Poisson batches).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, cast

import dp_accounting
from scipy import stats

from tfdp_embed.accounting.calibration import (
    check_accountant,
    check_delta,
    check_sampling_probability,
    check_steps,
    compute_epsilon,
)
from tfdp_embed.accounting.dataset_size import PUBLIC_N_ASSUMPTION, ReleasedDatasetSize
from tfdp_embed.accounting.ledger import PrivacyLedger, event_to_dict
from tfdp_embed.accounting.search_runs import check_report as check_search_run
from tfdp_embed.accounting.tradeoff import tradeoff_fields
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
USER_ADJACENCY = "add-or-remove-one-user"
NOT_RELEASED = "not released"
DEFAULT_PRIVACY_UNIT = "one example"
USER_UNIT = "user"
"""`privacy_unit="user"` with example-level batches: the caller declares one example per user (e.g. one sequence)."""
SEEDED_CAVEAT = (
    "This run was seeded ({parts}): whoever knows the seed regenerates that randomness exactly, subtracts the "
    "noise and recomputes the batches, so the guarantee does not hold against them. The seed is written nowhere "
    "in this report; for a release, train with seed=None (OS entropy)."
)


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
    dataset_size: int | ReleasedDatasetSize,
    batching: str | Any,
    ledger: PrivacyLedger | None = None,
    epsilon: float | None = None,
    accountant: str = "pld",
    steps: int | None = None,
    assumptions: Sequence[str] = (),
    extra: Mapping | None = None,
    privacy_unit: str | None = None,
    contribution_bound: str | None = None,
    seeded_releases: Sequence[str] = (),
) -> dict:
    """The privacy report of a training run as a JSON-able dict: epsilon = eps(ledger, delta), null if not DP.

    Args:
      mechanism: the `NoiseMechanism` used (its `report()` fields are included).
      delta: delta in (0, 1). sampling_probability: q in (0, 1].
      dataset_size: N~, the `ReleasedDatasetSize` of `release_dataset_size` (its event in the ledger),
        stated alone; or an int N, stated exactly (the guarantee then assumes N public).
      batching: required: `dp_model.batching` (what `DPModel.fit` recorded from the data), or the caller's
        "poisson", "fixed_shuffled", "unverified" or `BatchingInfo` (a stated Poisson is not verified).
      ledger: the run's `PrivacyLedger`; epsilon is computed from it. epsilon: one computed elsewhere (instead).
      accountant: "pld" or "rdp" (how epsilon was / is computed).
      steps: training steps (default `ledger.steps`). With neither `ledger` nor `epsilon`, epsilon is
        computed from the mechanism's setup event plus `steps` step events.
      assumptions: conditions beyond the ledger, in plain words (the guarantee holds only under them); extra:
        more JSON-able fields, stored under "extra".
      privacy_unit: what one neighbouring dataset adds or removes (default one example; "user": batches of
        `poisson_user_batches` (k and users stated; another unit refused), or one example per user, k = 1).
      contribution_bound: how much one unit can contribute (default: its clipped gradient in each step).
      seeded_releases: names of one-off releases other than N~ drawn from an explicit seed (`Release.seeded`).

    Returns:
      dict: epsilon, delta, ..., guarantee, noise, clip, q, batch, steps, unit, assumptions, caveats, mechanism_report.

    Raises:
      ValueError: bad or contradictory arguments (both `ledger` and `epsilon`, `steps` disagreeing with the
        ledger, unknown batching, an example-level `privacy_unit` for user-level batches).
    """
    run = _checked_run(delta, sampling_probability, accountant, dataset_size, ledger, epsilon, steps, batching)
    mech, report, caveats = _mechanism_fields(mechanism)
    clip = mech.get("l2_norm_clip", getattr(mechanism, "l2_norm_clip", None))
    unit = unit_fields(run.batching.details, privacy_unit, contribution_bound, clip=clip, num_units=run.dataset_size)
    public_n = [PUBLIC_N_ASSUMPTION] if run.released is None and report["is_dp"] else []
    assumptions = _check_assumptions(assumptions) + public_n
    report.update(
        _epsilon_fields(mechanism, run, report, caveats, unit, epsilon=epsilon, ledger=ledger, assumptions=assumptions)
    )
    report.update(_run_fields(mechanism, mech, run, report["epsilon"], unit, assumptions))
    _add_tradeoff(report, mechanism, run, ledger, given_epsilon=epsilon)
    _add_caveats(report, caveats, mechanism, run, assumptions, seeded_releases)
    _add_records(report, mech, ledger, run.released, extra)
    check_search_run(report, mechanism)  # a run of a private search: the search's epsilon, or refused
    return report


class _Run(NamedTuple):
    """The report's checked inputs."""

    delta: float
    q: float
    accountant: str
    released: ReleasedDatasetSize | None
    steps: int
    batching: _Batching
    dataset_size: int  # N~'s value when released


def _checked_run(delta, sampling_probability, accountant, dataset_size, ledger, epsilon, steps, batching) -> _Run:
    """Checks the report's arguments (in this order) and that the sampler's own N and q are the report's."""
    delta = check_delta(delta, "delta")
    q = check_sampling_probability(sampling_probability)
    accountant = check_accountant(accountant)
    released = _released_size(dataset_size, ledger)
    steps = _resolve_steps(ledger, epsilon, steps)
    stated = _batching(batching)
    check_batching_matches(stated.details, dataset_size=dataset_size if released is None else released, q=q)
    n = released.value if released is not None else cast(int, dataset_size)  # an int: _released_size
    return _Run(delta, q, accountant, released, steps, stated, n)


def _epsilon_fields(
    mechanism, run: _Run, report: dict, caveats: list, unit: Mapping, *, epsilon, ledger, assumptions
) -> dict:
    """epsilon and the guarantee line: from `epsilon`, the ledger or the mechanism's events; NONE for non-DP."""
    if not report["is_dp"]:
        return _not_dp_fields(report["mechanism"], epsilon, caveats)
    if epsilon is None:
        if ledger is not None:  # memoised: the budget's epoch-end epsilon of the same ledger is reused
            epsilon = ledger.epsilon(run.delta, run.accountant)
        else:
            events = _events(mechanism, run.q, run.steps) + ([run.released.event] if run.released is not None else [])
            epsilon = compute_epsilon(events, target_delta=run.delta, accountant=run.accountant)
    adjacency = unit["adjacency"]  # the batches' unit, or the caller's declared one
    return _guarantee(
        epsilon,
        delta=run.delta,
        steps=run.steps,
        accountant=run.accountant,
        assumptions=assumptions,
        adjacency=adjacency,
    )


def _run_fields(mechanism, mech: dict, run: _Run, epsilon, unit: dict, assumptions) -> dict:
    """The run's noise, clip, sampling, steps, size, batching, privacy unit and attacker bound (in report order)."""
    clip = mech.pop("l2_norm_clip", getattr(mechanism, "l2_norm_clip", None))
    return dict(
        delta=run.delta,
        accountant=run.accountant,
        noise_multiplier=mech.pop("noise_multiplier", getattr(mechanism, "noise_multiplier", None)),
        noise_multipliers=_noise_multipliers(mechanism, mech),
        l2_norm_clip=clip,
        sampling_probability=run.q,
        expected_batch_size=run.q * run.dataset_size,
        steps=run.steps,
        epochs=run.steps * run.q,
        dataset_size=run.dataset_size,
        batching=run.batching.name,
        batching_source=run.batching.source,
        **unit,
        attacker_bound=attacker_bound(epsilon, run.delta),
        assumptions=list(assumptions),
    )


def _add_tradeoff(report: dict, mechanism, run: _Run, ledger, *, given_epsilon) -> None:
    """The attacker bound's PLD rows and mu-GDP (`tradeoff`), for epsilons accounted here from known events."""
    epsilon = report["epsilon"]
    if not report["is_dp"] or given_epsilon is not None or epsilon is None or not math.isfinite(epsilon):
        return
    if ledger is not None:
        entries = [(entry.event, entry.count) for entry in ledger.entries]
    else:
        released = [run.released.event] if run.released is not None else []
        entries = [(event, 1) for event in _events(mechanism, run.q, run.steps) + released]
    bound = report["attacker_bound"]
    bound.update(tradeoff_fields(entries, epsilon=epsilon))
    for row, line in zip(bound.get("pld_bounds", ()), bound["bounds"]):  # both are bounds: keep the tighter
        if row["fpr"] == line["fpr"]:
            row["max_tpr"] = min(row["max_tpr"], line["max_tpr"])


def _add_caveats(
    report: dict, caveats: list, mechanism, run: _Run, assumptions: list, seeded_releases: Sequence[str] = ()
) -> None:
    """The assumptions', batching's, dataset size's and seed's caveats and sections, then `caveats` itself."""
    caveats.extend(f"The guarantee holds only if {text}" for text in assumptions)
    exact_n = run.released.exact_total() if run.released is not None else run.dataset_size  # for the truncation delta
    exact = check_matches_batching(mechanism, run.batching.details)
    _add_batching_section(report, caveats, run.batching, exact_truncation=exact, n=exact_n)
    _add_dataset_size(report, caveats, run.released)
    parts = seeded_parts(mechanism, run.batching.details, run.released, releases=seeded_releases)
    add_seed_caveat(report, caveats, parts)
    report["caveats"] = caveats


def _add_records(report: dict, mech: dict, ledger, released: ReleasedDatasetSize | None, extra) -> None:
    """The mechanism's own report, the ledger and `extra`, with the exact N written as not released under N~."""
    report["mechanism_report"] = _jsonable(mech)
    if ledger is not None:
        report["ledger"] = json.loads(ledger.to_json())
        if released is not None:
            report["ledger"] = _redact_dataset_size(report["ledger"])
    if released is not None and isinstance(report["mechanism_report"].get("step_accounting"), str):
        text = report["mechanism_report"]["step_accounting"]
        report["mechanism_report"]["step_accounting"] = re.sub(r"of N=\d+ ", "of N (not released) ", text)
    if extra is not None:
        report["extra"] = _jsonable(dict(extra))
        if released is not None:
            report["extra"] = _redact_dataset_size(report["extra"])


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


def attacker_bound(epsilon: float | None, delta: float) -> dict:
    """What a membership test on the privacy unit can achieve: TPR <= min(e^eps FPR + delta, 1 - e^-eps (1 - delta - FPR)).

    References: Kairouz, Oh & Viswanath 2015, Thm 2.1 (the hypothesis-testing region of (eps, delta)-DP).
    """
    if epsilon is None:
        return {"note": "no differential-privacy guarantee: no bound on what a membership test learns"}
    rows = []
    for fpr in (0.001, 0.01, 0.1):
        tpr = min(1.0, math.exp(min(epsilon, 700.0)) * fpr + delta, 1.0 - math.exp(-epsilon) * (1.0 - delta - fpr))
        rows.append({"fpr": fpr, "max_tpr": max(fpr, tpr)})
    return {
        "note": "the best true-positive rate of any test for whether the privacy unit is in the training data, "
        "at each false-positive rate, that the guarantee allows",
        "bounds": rows,
    }


def unit_fields(details: Mapping | None, privacy_unit, contribution_bound, *, clip, num_units: int) -> dict:
    """adjacency, privacy_unit, contribution_bound, num_units (and k, for user-level batches) of the report.

    The unit comes from the batches when their sampler states it (`poisson_user_batches`: "user", with k);
    a caller's example-level unit for them is refused: the report would understate what is protected.
    """
    if _adjacency(details) != USER_ADJACENCY and privacy_unit == USER_UNIT:
        return _one_example_per_user(contribution_bound, clip, num_units)
    if _adjacency(details) != USER_ADJACENCY:
        bound = contribution_bound or _default_bound(clip)
        return dict(
            adjacency=ADJACENCY,
            privacy_unit=str(privacy_unit or DEFAULT_PRIVACY_UNIT),
            contribution_bound=bound,
            num_units=num_units,
        )
    assert details is not None  # a user adjacency is read from them
    if privacy_unit is not None and not str(privacy_unit).lower().startswith("user"):
        raise ValueError(
            f"`privacy_unit`={privacy_unit!r} but the batches were sampled per user (poisson_user_batches): "
            "the report states privacy_unit 'user'; drop the argument."
        )
    k = details.get("max_examples_per_unit")
    return dict(
        adjacency=USER_ADJACENCY,
        privacy_unit="user",
        contribution_bound=contribution_bound or _user_bound(clip, k),
        max_examples_per_unit=k,
        num_units=num_units,
    )


def _one_example_per_user(contribution_bound, clip, num_units: int) -> dict:
    """Example-level batches whose every example is one user's whole data (the caller's `privacy_unit="user"`)."""
    return dict(
        adjacency=USER_ADJACENCY,
        privacy_unit=USER_UNIT,
        contribution_bound=contribution_bound
        or "one example per user (all of the user's data): " + _default_bound(clip),
        max_examples_per_unit=1,
        num_units=num_units,
        unit_declared_by_caller="every example holds one user's whole data (one row per user); the batches are "
        "sampled per example, which is then sampling per user",
    )


def _adjacency(details: Mapping | None) -> str:
    return USER_ADJACENCY if (details or {}).get("privacy_unit") == "user" else ADJACENCY


def _user_bound(clip, k) -> str:
    rows = f"at most {k} of the user's examples (drawn uniformly) in every step the user is sampled in"
    if clip is None:
        return f"{rows}; no clipping: a user's contribution is unbounded"
    return f"one gradient per user, of the summed loss over {rows}, clipped to L2 norm {clip:g}"


def _default_bound(clip) -> str:
    if clip is None:
        return "none (no clipping: a unit's contribution is unbounded)"
    return f"each unit's gradient is clipped to L2 norm {clip:g} in every step it is sampled in"


def _released_size(dataset_size, ledger: PrivacyLedger | None) -> ReleasedDatasetSize | None:
    """The `ReleasedDatasetSize` (its event checked against the ledger), or None for an int N (checked)."""
    if isinstance(dataset_size, ReleasedDatasetSize):
        if ledger is not None and not ledger.has_setup(dataset_size.event):
            raise ValueError(
                f"`dataset_size` was released with {dataset_size.event!r}, but the ledger holds no such setup "
                "event: its cost is not counted. Plan it with `releases=[Release.dataset_size(size)]`."
            )
        return dataset_size
    if isinstance(dataset_size, bool) or not isinstance(dataset_size, int) or dataset_size < 1:
        raise ValueError(
            f"`dataset_size` must be a `ReleasedDatasetSize` (tfdp_embed.release_dataset_size) or an int >= 1 "
            f"(stated as public); received {dataset_size!r}."
        )
    return None


def check_batching_matches(details: dict | None, *, dataset_size, q: float) -> None:
    """The sampler's own N and q (when it reported them) must be the report's (N~ was drawn from the N sampled)."""
    if details is None:
        return
    n_info, q_info = details.get("num_examples"), details.get("sampling_probability")
    if isinstance(dataset_size, ReleasedDatasetSize):
        if n_info is not None and not dataset_size.matches(n_info):
            raise ValueError("`dataset_size` was not released from the number of examples the batches were drawn from.")
        if details.get("batching") != "poisson":
            return  # shuffled batches have no q: theirs is B / N, the report's B / N~ (and they are caveated)
    elif n_info is not None and n_info != dataset_size:
        raise ValueError(f"`dataset_size`={dataset_size} but the batching info has {n_info} examples.")
    if q_info is not None and not math.isclose(q_info, q, rel_tol=1e-9):
        raise ValueError(f"`sampling_probability`={q!r} but the batches were sampled with q={q_info!r}.")


def _add_dataset_size(report: dict, caveats: list, released: ReleasedDatasetSize | None) -> None:
    """N~ and how it was released; the sampler's exact N and q N become "not released" (the caller's int: public)."""
    if released is None:
        report["dataset_size_release"] = {"convention": "add-or-remove adjacency; N stated exactly, assumed public"}
        return
    report.update(released.report())
    details = report.get("batching_details") or {}
    for key in ("num_examples", "expected_batch_size"):
        if key in details:
            details[key] = NOT_RELEASED
    if report.get("step_accounting") == "truncated_poisson" or "delta_with_truncation" in report:
        caveats.append(
            "The truncated Poisson batches are accounted at the exact N (TruncatedSubsampledGaussianDpEvent, or the "
            "truncation delta, takes it): epsilon or delta_with_truncation is a function of it; the ledger's and "
            "the plan's copies of N are written as 'not released'."
        )


def seeded_parts(
    mechanism, details: Mapping | None, released: ReleasedDatasetSize | None = None, *, releases: Sequence[str] = ()
) -> list:
    """What in the run drew its randomness from an explicit seed (names only, never the seed).

    `releases`: the names of seeded one-off releases other than N~ (the k and vocabulary releases, ...).
    """
    parts = []
    if getattr(mechanism, "seed", None) is not None:
        parts.append("the training noise")
    if details and details.get("seeded"):
        parts.append("the batch sampler")
    if released is not None and released.seeded:
        parts.append("the dataset-size release")
    parts.extend(f"the {name.replace('_', ' ')} release" for name in releases)
    return parts


def add_seed_caveat(report: dict, caveats: list, parts: Sequence[str]) -> None:
    """`seeded` (names, no values) and, for a seeded run, the caveat and the guarantee's exception."""
    report["seeded"] = list(parts)
    if not parts:
        return
    caveats.append(SEEDED_CAVEAT.format(parts=", ".join(parts)))
    if report.get("is_dp"):
        report["guarantee"] += f" It does NOT hold against anyone who knows the seed of {', '.join(parts)}."


def _mechanism_fields(mechanism) -> tuple[dict, dict, list]:
    """(the mechanism's remaining report fields, the report's first fields, its caveats)."""
    mech = dict(mechanism.report())
    is_dp = bool(mechanism.is_dp) and bool(mech.get("is_dp", True))
    caveats = [str(c) for c in mech.pop("caveats", [])]
    report = {"mechanism": mech.pop("mechanism", mechanism.name), "is_dp": is_dp}
    mech.pop("is_dp", None)
    return mech, report, caveats


def _guarantee(
    epsilon: float, *, delta: float, steps: int, accountant: str, assumptions: list, adjacency: str = ADJACENCY
) -> dict:
    """epsilon and the guarantee line of a DP run (conditional on `assumptions`, if any)."""
    return {
        "epsilon": float(epsilon),
        "guarantee": (
            f"({float(epsilon):.6g}, {delta:g})-differential privacy, {adjacency} adjacency, "
            f"for every model checkpoint released during the {steps} steps ({accountant.upper()} accountant)"
            + (f", CONDITIONAL on: {'; '.join(assumptions)}." if assumptions else ".")
        ),
    }


def _not_dp_fields(name: str, nominal_epsilon: float | None, caveats: list) -> dict:
    """A non-DP run: epsilon null, the guarantee says NONE; a nominal epsilon only labelled as such."""
    fields: dict[str, Any] = {"epsilon": None, "guarantee": NOT_DP_GUARANTEE.format(name=name)}
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


def _add_batching_section(report: dict, caveats: list, batching: _Batching, *, exact_truncation: bool, n: int) -> None:
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
        _add_truncation(report, caveats, batching, exact=exact_truncation, n=n)


def _add_truncation(report: dict, caveats: list, batching: _Batching, *, exact: bool, n: int) -> None:
    """Truncated Poisson batches: exact (truncated events) or `delta_with_truncation` and a caveat saying what it adds."""
    details = batching.details
    assert details is not None  # called only with details (_add_batching_section)
    cap = details.get("max_batch_size")
    if batching.name != "poisson" or cap is None:
        return
    cut = f"({details.get('truncated_batches', 0)} batches, {details.get('truncated_examples', 0)} examples cut)"
    shape = " and padded with weight-0 examples to that fixed shape" if details.get("fixed_shape") else ""
    if exact:
        report["step_accounting"] = "truncated_poisson"
        caveats.append(
            f"Poisson batches were truncated at max_batch_size={cap}{shape} {cut}; every step is accounted "
            "as dp-accounting's TruncatedSubsampledGaussianDpEvent (Poisson sampling, then truncation), so "
            "epsilon and delta already include the truncation."
        )
        return
    extra_delta = truncation_delta(
        dataset_size=n,
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


def _redact_dataset_size(value):
    """The ledger's JSON with every event's exact `dataset_size` (truncated steps) written as "not released"."""
    if isinstance(value, dict):
        return {k: NOT_RELEASED if k == "dataset_size" else _redact_dataset_size(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_dataset_size(v) for v in value]
    return value


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
        reported = details.get("batching")
        if reported not in BATCHINGS:
            raise ValueError(f"`batching.report()['batching']` must be one of {BATCHINGS}; received {reported!r}.")
        name = str(reported)
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


__all__ = [
    "ADJACENCY",
    "BATCHINGS",
    "DECLARED_CAVEAT",
    "DEFAULT_PRIVACY_UNIT",
    "NOT_DP_GUARANTEE",
    "NOT_POISSON_CAVEAT",
    "NOT_RELEASED",
    "SEEDED_CAVEAT",
    "STATED_CAVEAT",
    "UNVERIFIED_CAVEAT",
    "USER_ADJACENCY",
    "add_seed_caveat",
    "attacker_bound",
    "check_batching_matches",
    "not_released_note",
    "privacy_report",
    "read_privacy_report",
    "seeded_parts",
    "truncation_delta",
    "unit_fields",
    "write_privacy_report",
]
