"""One-off releases charged before training, composed with the steps (with `dp_accounting` only).

A run may release data-dependent statistics once, before training: item
frequencies (DPFormer's Re-Attention, a popularity prior, head rows), a
DP-FEST top-k selection. Each release is a `dp_accounting.DpEvent` composed
with the T training steps, so the whole run is

    Composed(release_1, ..., release_m, SelfComposed(PoissonSampled(q, Gaussian(sigma)), T))

Two questions plan such a run:

* how much noise one release needs for its share of the budget
  (`release_noise_multiplier`: the smallest z with eps(release(z), delta) <= share x eps);
* which training noise multiplier then meets the target for the whole
  composition (`calibrate_noise_multiplier_with_releases`).

The release is sized at the run's full delta, as a rule for splitting
epsilon, not as a split of delta: the guarantee is the composition's
(eps, delta) computed by the accountant, which is tighter than adding the
parts (the training gets more than (1 - share) x eps).

Example:
    >>> z = release_noise_multiplier(epsilon=0.1 * 8.0, delta=1e-5)      # 10% of eps 8
    >>> sigma = calibrate_noise_multiplier_with_releases(
    ...     target_epsilon=8.0, target_delta=1e-5, sampling_probability=0.01, steps=1000,
    ...     releases=[dp_accounting.GaussianDpEvent(z)])

References: Dwork & Roth 2014 §3.5 (composition); Abadi et al. 2016
(DP-SGD); `dp_accounting.calibrate_dp_mechanism`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import dp_accounting

from tfdp_embed.accounting.calibration import (
    MAX_NOISE_MULTIPLIER,
    MIN_NOISE_MULTIPLIER,
    calibrate_noise_multiplier,
    check_accountant,
    check_delta,
    check_epsilon,
    check_sampling_probability,
    check_steps,
    dpsgd_event,
    epsilon_levels,
    make_accountant,
    pld_interval,
)
from tfdp_embed.accounting.coarse_to_exact import Unreachable, smallest_parameter
from tfdp_embed.accounting.progress import announced

RELEASE_MECHANISMS: dict[str, Callable[[float], dp_accounting.DpEvent]] = {
    "gaussian": dp_accounting.GaussianDpEvent,
    "laplace": dp_accounting.LaplaceDpEvent,
}

# Relative tolerance on the noise multiplier (as in `calibration`): epsilon lies just below the target.
_RTOL = 1e-4
# First step above the steps-only sigma when bracketing: releases usually raise sigma by a few percent.
_FIRST_STEP = 1.05


def release_epsilon(
    releases: Sequence[dp_accounting.DpEvent] | dp_accounting.DpEvent,
    *,
    delta: float,
    accountant: str = "pld",
    value_discretization_interval: float | None = None,
) -> float:
    """Epsilon at `delta` of one or more one-off release events composed (the releases alone)."""
    event = _compose(_check_releases(releases, accountant))
    acc = make_accountant(accountant, value_discretization_interval=value_discretization_interval)
    return float(acc.compose(event).get_epsilon(check_delta(delta, "delta")))


def release_noise_multiplier(
    *,
    epsilon: float,
    delta: float,
    mechanism: str = "gaussian",
    accountant: str = "pld",
    value_discretization_interval: float | None = None,
) -> float:
    """The smallest noise multiplier z of one release with eps(release(z), delta) <= epsilon.

    z = min{z : eps(GaussianDpEvent(z), delta) <= epsilon}  (or `LaplaceDpEvent(z)`)

    The noise added is z times the release's sensitivity (L2 for Gaussian, L1
    for Laplace); the caller scales it.

    Args:
      epsilon: the release's epsilon > 0 (e.g. a share of the run's target).
      delta: delta in (0, 1) at which `epsilon` is measured.
      mechanism: "gaussian" or "laplace".
      accountant: "pld" (default) or "rdp".
      value_discretization_interval: PLD grid step (PLD only).

    Returns:
      z (float).

    Raises:
      ValueError: a bad argument (named), or an `epsilon` so small that z
        would exceed `MAX_NOISE_MULTIPLIER`.
    """
    epsilon = check_epsilon(epsilon, "epsilon")
    delta = check_delta(delta, "delta")
    accountant = check_accountant(accountant)
    if mechanism not in RELEASE_MECHANISMS:
        raise ValueError(f"`mechanism` must be one of {tuple(RELEASE_MECHANISMS)}; received {mechanism!r}.")
    make_event = RELEASE_MECHANISMS[mechanism]
    epsilon_of = _epsilon_function(make_event, delta, accountant, value_discretization_interval)
    lo, hi = _bracket_decreasing(epsilon_of, epsilon, start=1.0, factor=2.0)
    if hi is None:
        raise ValueError(
            f"A {mechanism} release with `epsilon`={epsilon!r} at `delta`={delta!r} would need a noise "
            f"multiplier above {MAX_NOISE_MULTIPLIER:g} ({accountant.upper()} accountant). Allowed: a larger epsilon."
        )
    if lo is None:
        return float(hi)
    return _brent(make_event, epsilon, delta, accountant, value_discretization_interval, lo, hi)


def calibrate_noise_multiplier_with_releases(
    *,
    target_epsilon: float,
    target_delta: float,
    sampling_probability: float,
    steps: int,
    releases: Sequence[dp_accounting.DpEvent] = (),
    accountant: str = "pld",
    value_discretization_interval: float | None = None,
    truncation: tuple[int, int] | None = None,
) -> float:
    """The smallest DP-SGD noise multiplier sigma with eps(releases + T steps, delta) <= target.

    sigma* = min{sigma : eps(Composed(r_1..r_m, SelfComposed(PoissonSampled(q, Gaussian(sigma)), T)), delta) <= eps}

    With PLD the search runs on coarse grids first and the exact grid
    confirms the answer (`accounting.coarse_to_exact`, as in
    `calibrate_noise_multiplier`). With RDP, composition only adds privacy
    loss, so sigma* is at least the sigma of the steps alone: the search
    starts there and grows the upper end until it brackets the target, then
    Brent's method (`dp_accounting.calibrate_dp_mechanism`) finds sigma*.
    The epsilon of sigma* never exceeds the target under the accountant and
    grid asked for.

    Args:
      target_epsilon: epsilon > 0 for the whole run.
      target_delta: delta in (0, 1).
      sampling_probability: Poisson rate q in (0, 1].
      steps: T >= 1.
      releases: one-off `dp_accounting.DpEvent`s charged before training
        (empty: the same as `calibrate_noise_multiplier`).
      accountant: "pld" (default) or "rdp".
      value_discretization_interval: PLD grid step (PLD only).
      truncation: (N, B) for Poisson batches of N examples truncated at B:
        each step is `TruncatedSubsampledGaussianDpEvent(N, q, B, sigma)` (PLD only).

    Returns:
      sigma (float).

    Raises:
      ValueError: a bad argument (named); releases the accountant cannot
        compose; releases that alone spend the target; or a target the
        steps cannot meet with sigma <= `MAX_NOISE_MULTIPLIER`.
    """
    target_epsilon = check_epsilon(target_epsilon)
    delta = check_delta(target_delta)
    q = check_sampling_probability(sampling_probability)
    steps = check_steps(steps)
    accountant = check_accountant(accountant)
    releases = _check_releases(releases, accountant)
    if truncation is not None:
        return _truncated_sigma(
            releases, q, steps, target_epsilon, delta, accountant, value_discretization_interval, truncation
        )
    common: dict[str, Any] = dict(
        target_delta=delta,
        sampling_probability=q,
        steps=steps,
        accountant=accountant,
        value_discretization_interval=value_discretization_interval,
    )
    if not releases:
        return calibrate_noise_multiplier(target_epsilon=target_epsilon, **common)
    spent = release_epsilon(
        releases, delta=delta, accountant=accountant, value_discretization_interval=value_discretization_interval
    )
    if spent >= target_epsilon:
        raise ValueError(
            f"The one-off releases alone spend epsilon {spent:.6g} >= `target_epsilon`={target_epsilon!r} at "
            f"delta {delta:g}: no training noise can meet the target. Allowed: releases with more noise "
            "(a smaller share of the budget) or a larger target."
        )

    def make_event(sigma: float) -> dp_accounting.DpEvent:
        return _compose([*releases, dpsgd_event(sampling_probability=q, noise_multiplier=sigma, steps=steps)])

    unreachable = (
        f"`target_epsilon`={target_epsilon!r} cannot be met at `target_delta`={delta!r} with "
        f"`sampling_probability`={q!r}, `steps`={steps!r} and releases spending epsilon {spent:.6g}: it "
        f"would need a noise multiplier above {MAX_NOISE_MULTIPLIER:g} ({accountant.upper()} accountant). "
        "Allowed: a larger target, fewer steps, a smaller sampling probability or cheaper releases."
    )
    what = (
        f"epsilon={target_epsilon:g} at delta={delta:.3g} (q={q:.4g}, {steps} steps, {len(releases)} one-off "
        f"release(s), {accountant.upper()})"
    )
    with announced(f"calibrating the noise multiplier for {what}") as note:
        if accountant == "pld":
            sigma = _pld_sigma(releases, q, steps, target_epsilon, delta, value_discretization_interval, unreachable)
        else:
            sigma = _rdp_sigma(make_event, target_epsilon, delta, common, unreachable)
        note.result = f"noise multiplier {sigma:.6g} for {what}"
    return sigma


# -- helpers -----------------------------------------------------------------------


def _truncated_sigma(releases, q, steps, target, delta, accountant, interval, truncation) -> float:
    """The PLD search for steps on Poisson batches of N truncated at B (`TruncatedSubsampledGaussianDpEvent`)."""
    if accountant != "pld":
        raise ValueError(
            f"Truncated Poisson steps (`truncation`={truncation!r}) are composed by the PLD accountant only; "
            f"received `accountant`={accountant!r}."
        )
    n, cap = truncation
    unreachable = (
        f"`target_epsilon`={target!r} cannot be met at `target_delta`={delta!r} with q={q!r}, {steps} steps on "
        f"batches truncated at {cap} and the releases given: it would need a noise multiplier above "
        f"{MAX_NOISE_MULTIPLIER:g}."
    )

    def step_of(sigma: float) -> dp_accounting.DpEvent:
        return dp_accounting.TruncatedSubsampledGaussianDpEvent(int(n), q, int(cap), sigma)

    with announced(f"calibrating the noise multiplier for epsilon={target:g} (truncated at {cap}, PLD)") as note:
        sigma = _pld_sigma(releases, q, steps, target, delta, interval, unreachable, step_of=step_of)
        note.result = f"noise multiplier {sigma:.6g} (truncated at {cap})"
    return sigma


def _pld_sigma(
    releases: list, q: float, steps: int, target: float, delta: float, interval, unreachable: str, *, step_of=None
) -> float:
    """The PLD search, coarse grids first (`coarse_to_exact`); the result meets the target on the exact grid."""

    def make_entries(sigma: float) -> tuple:
        if step_of is not None:
            step = step_of(sigma)
        else:
            step = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
        return (*((release, 1) for release in releases), (step, steps))

    levels = epsilon_levels(make_entries, delta=delta, accountant="pld", interval=pld_interval("pld", interval))
    try:
        sigma, _ = smallest_parameter(
            levels, target, start=1.0, factor=2.0, lowest=MIN_NOISE_MULTIPLIER, highest=MAX_NOISE_MULTIPLIER, rtol=_RTOL
        )
    except Unreachable:
        raise ValueError(unreachable) from None
    return sigma


def _rdp_sigma(make_event, target: float, delta: float, common: dict, unreachable: str) -> float:
    """The RDP search: up from the steps' own sigma (releases only add loss), then Brent's method."""
    base = calibrate_noise_multiplier(target_epsilon=target, **common)
    epsilon_of = _epsilon_function(make_event, delta, "rdp", None)
    lo, hi = _bracket_decreasing(epsilon_of, target, start=base, factor=_FIRST_STEP, lowest=base)
    if hi is None:
        raise ValueError(unreachable)
    if lo is None:  # the steps' own sigma already pays for the releases (they cost almost nothing)
        return float(hi)
    return _brent(make_event, target, delta, "rdp", None, lo, hi)


def _check_releases(releases, accountant: str) -> list[dp_accounting.DpEvent]:
    if isinstance(releases, dp_accounting.DpEvent):
        releases = [releases]
    if isinstance(releases, (str, bytes)) or not isinstance(releases, Sequence):
        raise TypeError(f"`releases` must be a sequence of `dp_accounting.DpEvent`s; received {releases!r}.")
    acc = make_accountant(accountant)
    for event in releases:
        if not isinstance(event, dp_accounting.DpEvent):
            raise TypeError(f"`releases` must hold `dp_accounting.DpEvent`s; received {event!r}.")
        if not acc.supports(event):
            raise ValueError(f"The {accountant!r} accountant cannot compose the release event {event!r}.")
    return list(releases)


def _compose(events: list[dp_accounting.DpEvent]) -> dp_accounting.DpEvent:
    return events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(events)


def _epsilon_function(make_event, delta: float, accountant: str, interval: float | None) -> Callable[[float], float]:
    def epsilon_of(x: float) -> float:
        acc = make_accountant(accountant, value_discretization_interval=interval)
        return float(acc.compose(make_event(x)).get_epsilon(delta))

    return epsilon_of


def _bracket_decreasing(
    epsilon_of: Callable[[float], float],
    target: float,
    *,
    start: float,
    factor: float,
    lowest: float = MIN_NOISE_MULTIPLIER,
) -> tuple[float | None, float | None]:
    """(lo, hi) with eps(lo) > target >= eps(hi), for eps decreasing in the noise multiplier.

    Going down it divides by `factor`; going up it multiplies by a factor
    that squares every step (1.05, 1.1, 1.22, 1.48, ...), so a small first
    step still reaches a far bracket quickly. lo is None when eps(lowest) <=
    target (hi = lowest then); hi is None when even eps(MAX_NOISE_MULTIPLIER) > target.
    """
    x = min(max(start, lowest), MAX_NOISE_MULTIPLIER)
    if epsilon_of(x) <= target:  # go down until infeasible
        hi = x
        while hi > lowest:
            lo = max(hi / factor, lowest)
            if epsilon_of(lo) > target:
                return lo, hi
            hi = lo
        return None, hi
    lo, step = x, factor  # go up until feasible
    while lo < MAX_NOISE_MULTIPLIER:
        hi = min(lo * step, MAX_NOISE_MULTIPLIER)
        if epsilon_of(hi) <= target:
            return lo, hi
        lo, step = hi, step * step
    return lo, None


def _brent(make_event, target: float, delta: float, accountant: str, interval, lo: float, hi: float) -> float:
    """Brent's method in [lo, hi] (`dp_accounting.calibrate_dp_mechanism`); the result meets the target."""
    return float(
        dp_accounting.calibrate_dp_mechanism(
            lambda: make_accountant(accountant, value_discretization_interval=interval),
            make_event,
            target,
            delta,
            bracket_interval=dp_accounting.ExplicitBracketInterval(lo, hi),
            tol=hi * _RTOL,
        )
    )


__all__ = [
    "RELEASE_MECHANISMS",
    "calibrate_noise_multiplier_with_releases",
    "release_epsilon",
    "release_noise_multiplier",
]
