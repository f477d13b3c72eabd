"""`plan_run`: from a privacy target (or a given noise) to a `RunPlan` (see `tfdp_embed.planning`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tfdp_embed.accounting.calibration import check_accountant, check_delta, check_epsilon
from tfdp_embed.accounting.periods import Period, calibrate_periods
from tfdp_embed.mechanisms import factory
from tfdp_embed.mechanisms.adafest import split_noise_multiplier
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
    periods: Sequence[Period] | None = None,
    l2_norm_clip: float = 1.0,
    releases: Sequence[Release] = (),
    seed: int | None = None,
    noise_multiplier: float | None = None,
    assumptions: Sequence[str] = (),
    dataset_size: int | None = None,
    max_batch_size: int | None = None,
    **mechanism_options,
) -> RunPlan:
    """Plans a run: calibrates every noise multiplier and builds the mechanism (`mechanisms.create`).

    Args:
      mechanism: a `tfdp_embed.mechanisms.MECHANISMS` name.
      target_epsilon: epsilon of the whole run (nominal for non-DP mechanisms).
      target_delta: delta.
      accountant: "pld" (default) or "rdp".
      sampling_probability, steps: q and T of a plain run; or
      periods: `Period`s of a streaming run (parallel composition; one
        sigma for all, the noisiest period's).
      l2_norm_clip: C.
      releases: `Release`s charged to the same budget.
      seed: noise seed (None: OS entropy).
      noise_multiplier: sigma given instead of `target_epsilon` (nothing is calibrated).
      assumptions: conditions the guarantee rests on (e.g. public data), for the report.
      dataset_size, max_batch_size: N and the cap B of Poisson batches
        truncated at B (`tfdp_embed.data`, `fixed_shape_batches`): every
        step is calibrated, budgeted and reported as
        `TruncatedSubsampledGaussianDpEvent(N, q, B, sigma)` (PLD only). With
        `periods`, give them in each `Period` instead.
      **mechanism_options: the mechanism's constructor options (`mechanisms.options(name)`),
        plus `ratio` (sigma1 / sigma2 of a contribution map, default 1) and
        `threshold_sigmas` (tau in units of sigma1 x contribution_clip).

    Returns:
      A frozen `RunPlan`.

    Raises:
      ValueError: an unknown mechanism or option, both or neither of
        `target_epsilon`/`noise_multiplier`, releases leaving nothing for
        training, a selecting mechanism without `Release.selection`, or a
        target the accountant cannot meet.
    """
    options = dict(mechanism_options)
    allowed = factory.options(mechanism, counts="counts" in options)
    delta, accountant = check_delta(target_delta), check_accountant(accountant)
    periods, parallel = _periods(sampling_probability, steps, periods, (dataset_size, max_batch_size))
    releases = tuple(releases)
    common: dict[str, Any] = dict(
        mechanism_name=mechanism,
        target_delta=delta,
        accountant=accountant,
        periods=periods,
        parallel=parallel,
        assumptions=tuple(assumptions),
    )
    if "noise_multiplier" not in allowed:
        return _non_private(common, target_epsilon, noise_multiplier, releases, options, seed)
    if (target_epsilon is None) == (noise_multiplier is None):
        raise ValueError(
            f"Mechanism {mechanism!r} needs exactly one of `target_epsilon` (sigma is calibrated) and "
            f"`noise_multiplier`; received {target_epsilon!r}, {noise_multiplier!r}."
        )
    if noise_multiplier is not None:
        sigma, training, source = float(noise_multiplier), None, "given"
        planned = plan_event_releases(releases, delta=delta, accountant=accountant)
    else:
        sigma, planned, training = _calibrated(check_epsilon(target_epsilon), releases, delta, accountant, periods)
        source = "calibrated"
    arguments = _noise_arguments(mechanism, sigma, options, allowed) | _selection_arguments(
        mechanism, planned, options, allowed, calibrated=target_epsilon is not None
    )
    built = factory.create(mechanism, l2_norm_clip=l2_norm_clip, seed=seed, **arguments, **options)
    return RunPlan(
        mechanism=built,
        target_epsilon=None if target_epsilon is None else float(target_epsilon),
        l2_norm_clip=built.l2_norm_clip,
        noise_multiplier=sigma,
        noise_source=source,
        mechanism_arguments=arguments,
        training_epsilon=training,
        releases=planned,
        **common,
    )


# -- helpers -----------------------------------------------------------------------------


def _periods(sampling_probability, steps, periods, truncation: tuple) -> tuple[tuple, bool]:
    """(periods, parallel): one `Period` from (q, T[, N, B]), or the given ones."""
    if periods is None:
        if sampling_probability is None or steps is None:
            raise ValueError("Pass `sampling_probability` and `steps`, or `periods`.")
        return (Period(sampling_probability, steps, *truncation),), False
    if sampling_probability is not None or steps is not None or truncation != (None, None):
        raise ValueError(
            "Pass `periods` or (`sampling_probability`, `steps`[, `dataset_size`, `max_batch_size`]), not both."
        )
    periods = tuple(periods)
    if not periods or not all(isinstance(p, Period) for p in periods):
        raise ValueError(f"`periods` must be a non-empty sequence of `Period`s; received {periods!r}.")
    return periods, len(periods) > 1


def _non_private(common: dict, target_epsilon, noise_multiplier, releases, options, seed) -> RunPlan:
    """A mechanism without noise ("none"): nothing to calibrate, nothing to charge."""
    if releases or noise_multiplier:
        raise ValueError(
            f"Mechanism {common['mechanism_name']!r} trains without noise: it takes no `releases` (no budget to "
            f"charge them to) and no `noise_multiplier`; received {list(releases)}, {noise_multiplier!r}."
        )
    built = factory.create(common["mechanism_name"], seed=seed, **options)
    return RunPlan(
        mechanism=built,
        target_epsilon=None if target_epsilon is None else float(target_epsilon),
        l2_norm_clip=None,
        noise_multiplier=0.0,
        noise_source="non-private",
        mechanism_arguments={},
        **common,
    )


def _calibrated(target: float, releases: tuple, delta: float, accountant: str, periods: tuple):
    """(sigma, planned releases, training epsilon) for a target: shares deducted, events composed."""
    planned, training = plan_releases(releases, target=target, delta=delta, accountant=accountant)
    composed = [event for r in planned if r.composition == ACCOUNTANT for event in r.events]
    sigma = calibrate_periods(
        periods, target_epsilon=training, target_delta=delta, releases=composed, accountant=accountant
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
    sigma1, sigma2 = split_noise_multiplier(sigma, ratio=1.0 if ratio is None else ratio)
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
