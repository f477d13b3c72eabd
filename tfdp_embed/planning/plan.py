"""`plan_run`: from a privacy target (or a given noise) to a `RunPlan` (see `tfdp_embed.planning`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tfdp_embed.accounting.calibration import check_accountant, check_delta, check_epsilon
from tfdp_embed.accounting.periods import AccountingPeriod, calibrate_periods
from tfdp_embed.data.provenance import BatchingInfo
from tfdp_embed.mechanisms import factory
from tfdp_embed.planning.from_batching import run_from_batching
from tfdp_embed.planning.releases import ACCOUNTANT, SELECTION, Release, plan_event_releases, plan_releases
from tfdp_embed.planning.run_plan import RunPlan


def plan_run(
    mechanism: str,
    *,
    target_epsilon: float | None = None,
    target_delta: float,
    accountant: str = "pld",
    sampling_probability: float | None = None,
    steps: int | None = None,
    periods: Sequence[AccountingPeriod] | None = None,
    l2_norm_clip: float = 1.0,
    releases: Sequence[Release] = (),
    seed: int | None = None,
    noise_multiplier: float | None = None,
    assumptions: Sequence[str] = (),
    dataset_size: int | None = None,
    max_batch_size: int | None = None,
    batching: BatchingInfo | None = None,
    epochs: float | None = None,
    **mechanism_options,
) -> RunPlan:
    """Plans a run: calibrates every noise multiplier and builds the mechanism (`mechanisms.create`).

    Args:
      mechanism: a `tfdp_embed.mechanisms.MECHANISMS` name.
      target_epsilon, target_delta: the whole run's (epsilon nominal for non-DP mechanisms).
      accountant: "pld" (default) or "rdp".
      sampling_probability, steps: q and T of a plain run; or
      periods: `AccountingPeriod`s of a streaming run (parallel composition; the noisiest period's sigma).
      l2_norm_clip, seed: C and the noise seed (None: OS entropy).
      releases: `Release`s charged to the same budget.
      noise_multiplier: sigma given instead of `target_epsilon` (nothing is calibrated).
      assumptions: conditions the guarantee rests on (e.g. public data), for the report.
      dataset_size, max_batch_size: N and the cap B of Poisson batches truncated at B (`fixed_shape_batches`):
        each step is `TruncatedSubsampledGaussianDpEvent(N, q, B, sigma)` (PLD only; with `periods`, per period).
      **mechanism_options: the mechanism's constructor options (`mechanisms.options(name)`), plus `ratio`
        (sigma1 / sigma2 of a contribution map, default 1) and `threshold_sigmas` (tau in sigma1 x contribution_clip).
      batching: the sampler's `BatchingInfo`: q, N (and its cap) are read from it, stated once.
      epochs: instead of `steps`, T = round(epochs / q).

    Returns a frozen `RunPlan`. Raises ValueError: an unknown mechanism or option, both or neither of
    `target_epsilon`/`noise_multiplier`, releases leaving nothing for training, a selecting mechanism
    without `Release.selection`, or a target the accountant cannot meet.
    """
    options = dict(mechanism_options)
    allowed = factory.options(mechanism, counts="counts" in options)
    q, steps, dataset_size, max_batch_size, known_size = run_from_batching(
        batching,
        sampling_probability=sampling_probability,
        steps=steps,
        epochs=epochs,
        dataset_size=dataset_size,
        max_batch_size=max_batch_size,
    )
    run = (q, steps, periods, (dataset_size, max_batch_size))
    common = _common(mechanism, target_epsilon, target_delta, accountant, assumptions, *run)
    common["dataset_size"] = known_size
    if "noise_multiplier" not in allowed:
        return _non_private(common, noise_multiplier, tuple(releases), options, seed)
    return _private(common, noise_multiplier, tuple(releases), options, allowed, l2_norm_clip, seed)


# -- helpers -----------------------------------------------------------------------------


def _common(mechanism: str, target_epsilon, target_delta, accountant, assumptions, *run) -> dict[str, Any]:
    """The `RunPlan` fields every plan has: the mechanism's name, the target, the periods, the assumptions."""
    periods, parallel = _periods(*run)
    return dict(
        mechanism_name=mechanism,
        target_epsilon=None if target_epsilon is None else check_epsilon(target_epsilon),
        target_delta=check_delta(target_delta),
        accountant=check_accountant(accountant),
        periods=periods,
        parallel=parallel,
        assumptions=tuple(assumptions),
    )


def _periods(sampling_probability, steps, periods, truncation: tuple) -> tuple[tuple, bool]:
    """(periods, parallel): one `AccountingPeriod` from (q, T[, N, B]), or the given ones."""
    if periods is None:
        if sampling_probability is None or steps is None:
            raise ValueError("Pass `sampling_probability` and `steps`, or `periods`.")
        return (AccountingPeriod(sampling_probability, steps, *truncation),), False
    if sampling_probability is not None or steps is not None or truncation != (None, None):
        raise ValueError(
            "Pass `periods` or (`sampling_probability`, `steps`[, `dataset_size`, `max_batch_size`]), not both."
        )
    periods = tuple(periods)
    if not periods or not all(isinstance(p, AccountingPeriod) for p in periods):
        raise ValueError(f"`periods` must be a non-empty sequence of `AccountingPeriod`s; received {periods!r}.")
    return periods, len(periods) > 1


def _non_private(common: dict, noise_multiplier, releases: tuple, options: dict, seed) -> RunPlan:
    """A mechanism without noise ("none"): nothing to calibrate, nothing to charge."""
    if releases or noise_multiplier:
        raise ValueError(
            f"Mechanism {common['mechanism_name']!r} trains without noise: it takes no `releases` (no budget to "
            f"charge them to) and no `noise_multiplier`; received {list(releases)}, {noise_multiplier!r}."
        )
    built = factory.create(common["mechanism_name"], seed=seed, **options)
    return RunPlan(
        mechanism=built,
        l2_norm_clip=None,
        noise_multiplier=0.0,
        noise_source="non-private",
        mechanism_arguments={},
        **common,
    )


def _private(
    common: dict, noise_multiplier, releases: tuple, options: dict, allowed: frozenset, l2_norm_clip, seed
) -> RunPlan:
    """A noised mechanism: sigma (given or calibrated), the releases' shares, then the built mechanism."""
    mechanism = common["mechanism_name"]
    sigma, planned, training = _noise(common, noise_multiplier, releases)
    selection = _selection_arguments(mechanism, planned, options, allowed, calibrated=noise_multiplier is None)
    arguments = _noise_arguments(mechanism, sigma, options, allowed) | selection
    built = factory.create(mechanism, l2_norm_clip=l2_norm_clip, seed=seed, **arguments, **options)
    return RunPlan(
        mechanism=built,
        l2_norm_clip=built.l2_norm_clip,
        noise_multiplier=sigma,
        noise_source="calibrated" if noise_multiplier is None else "given",
        mechanism_arguments=arguments,
        training_epsilon=training,
        releases=planned,
        **common,
    )


def _noise(common: dict, noise_multiplier, releases: tuple) -> tuple:
    """(sigma, planned releases, training epsilon): sigma given, or calibrated for the target after the shares."""
    target, delta, accountant = common["target_epsilon"], common["target_delta"], common["accountant"]
    if (target is None) == (noise_multiplier is None):
        raise ValueError(
            f"Mechanism {common['mechanism_name']!r} needs exactly one of `target_epsilon` (sigma is calibrated) "
            f"and `noise_multiplier`; received {target!r}, {noise_multiplier!r}."
        )
    if noise_multiplier is not None:
        return float(noise_multiplier), plan_event_releases(releases, delta=delta, accountant=accountant), None
    planned, training = plan_releases(releases, target=target, delta=delta, accountant=accountant)
    composed = [event for r in planned if r.composition == ACCOUNTANT for event in r.events]
    sigma = calibrate_periods(
        common["periods"], target_epsilon=training, target_delta=delta, releases=composed, accountant=accountant
    )
    return float(sigma), planned, training


def _noise_arguments(name: str, sigma: float, options: dict, allowed: frozenset) -> dict:
    """The mechanism's noise keywords: sigma, or (sigma1, sigma2, tau) for a contribution map."""
    ratio, sigmas = options.pop("ratio", None), options.pop("threshold_sigmas", None)
    if "contribution_noise_multiplier" not in allowed:
        if ratio is not None or sigmas is not None:
            raise ValueError(
                f"`ratio` and `threshold_sigmas` are for mechanisms with a contribution map, not {name!r}."
            )
        return {"noise_multiplier": sigma}
    split = getattr(factory.mechanism_class(name), "split_noise_multiplier", None)
    if split is None:
        raise ValueError(
            f"Mechanism {name!r} takes `contribution_noise_multiplier` but has no `split_noise_multiplier(sigma, "
            "ratio=)` to split a calibrated sigma into (sigma1, sigma2); pass both noise multipliers yourself."
        )
    sigma1, sigma2 = split(sigma, ratio=1.0 if ratio is None else ratio)
    arguments = {"noise_multiplier": sigma2, "contribution_noise_multiplier": sigma1}
    if sigmas is not None and options.get("threshold") is None:
        if "contribution_clip" not in options:
            raise ValueError("`threshold_sigmas` sets tau = threshold_sigmas x sigma1 x `contribution_clip`: pass it.")
        options.pop("threshold", None)
        arguments["threshold"] = sigmas * sigma1 * options["contribution_clip"]
    return arguments


def _selection_arguments(name: str, planned: tuple, options: dict, allowed: frozenset, *, calibrated: bool) -> dict:
    """`selection_epsilon` (per selection) from `Release.selection` for mechanisms that select."""
    selection = [r for r in planned if r.name == SELECTION]
    if "selection_epsilon" not in allowed:
        if selection:
            raise ValueError(f"Mechanism {name!r} makes no DP selection; drop `Release.selection`.")
        return {}
    if not calibrated:
        return {}  # noise given: `selection_epsilon` is the caller's option
    if not selection or "selection_epsilon" in options:
        raise ValueError(
            f"Mechanism {name!r} makes a DP selection: pass its budget as `releases=[Release.selection(share)]` "
            "(deducted from the target), not as `selection_epsilon`."
        )
    return {"selection_epsilon": selection[0].epsilon_each}


__all__ = ["plan_run"]
