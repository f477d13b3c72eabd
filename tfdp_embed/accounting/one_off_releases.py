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
(DP-SGD); `accounting.calibration.calibrate`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import dp_accounting

from tfdp_embed.accounting.calibration import (
    MAX_NOISE_MULTIPLIER,
    calibrate,
    calibrate_noise_multiplier,
    check_accountant,
    check_delta,
    check_epsilon,
    check_sampling_probability,
    check_steps,
    make_accountant,
)
from tfdp_embed.accounting.coarse_to_exact import Unreachable

RELEASE_MECHANISMS: dict[str, Callable[[float], dp_accounting.DpEvent]] = {
    "gaussian": dp_accounting.GaussianDpEvent,
    "laplace": dp_accounting.LaplaceDpEvent,
}

# First step above the steps-only sigma when bracketing (RDP): releases usually raise sigma by a few percent.
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
    for Laplace); the caller scales it. `calibrate` with the release's event.

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
    try:
        return calibrate(
            RELEASE_MECHANISMS[mechanism],
            target_epsilon=epsilon,
            target_delta=delta,
            accountant=accountant,
            value_discretization_interval=value_discretization_interval,
            what=f"a {mechanism} release of epsilon={epsilon:g} at delta={delta:.3g}",
            accelerate=True,
        )
    except Unreachable:
        raise ValueError(
            f"A {mechanism} release with `epsilon`={epsilon!r} at `delta`={delta!r} would need a noise "
            f"multiplier above {MAX_NOISE_MULTIPLIER:g} ({accountant.upper()} accountant). Allowed: a larger epsilon."
        ) from None


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
    """The smallest DP-SGD noise multiplier sigma with eps(releases + T steps, delta) <= target (`calibrate`).

    sigma* = min{sigma : eps(Composed(r_1..r_m, SelfComposed(PoissonSampled(q, Gaussian(sigma)), T)), delta) <= eps}

    Args:
      target_epsilon, target_delta: epsilon > 0 for the whole run, delta in (0, 1).
      sampling_probability, steps: Poisson rate q in (0, 1], T >= 1.
      releases: one-off `dp_accounting.DpEvent`s charged before training (may be empty).
      accountant, value_discretization_interval: "pld" (default) or "rdp"; the PLD grid step.
      truncation: (N, B) for Poisson batches of N examples truncated at B:
        each step is `TruncatedSubsampledGaussianDpEvent(N, q, B, sigma)` (PLD only).

    Returns:
      sigma (float).

    Raises:
      ValueError: a bad argument (named); releases the accountant cannot compose or that alone
        spend the target; or a target the steps cannot meet with sigma <= `MAX_NOISE_MULTIPLIER`.
    """
    target_epsilon, delta = check_epsilon(target_epsilon), check_delta(target_delta)
    q, steps = check_sampling_probability(sampling_probability), check_steps(steps)
    releases = _check_releases(releases, check_accountant(accountant))
    make_step = _step_factory(q, truncation, accountant)
    spent = _check_spent(releases, target_epsilon, delta, accountant, value_discretization_interval)

    def make_event(sigma: float) -> dp_accounting.DpEvent:
        return dp_accounting.ComposedDpEvent([*releases, dp_accounting.SelfComposedDpEvent(make_step(sigma), steps)])

    cap = "" if truncation is None else f", truncated at {truncation[1]}"
    what = f"epsilon={target_epsilon:g} at delta={delta:.3g} (q={q:.4g}, {steps} steps{cap}, {accountant.upper()})"
    try:
        return calibrate(
            make_event,
            target_epsilon=target_epsilon,
            target_delta=delta,
            accountant=accountant,
            value_discretization_interval=value_discretization_interval,
            what=what + (f", {len(releases)} one-off release(s)" if releases else ""),
            **_rdp_search(releases, target_epsilon, delta, q, steps, accountant),
        )
    except Unreachable as err:
        raise ValueError(
            f"`target_epsilon`={target_epsilon!r} cannot be met at `target_delta`={delta!r} with "
            f"`sampling_probability`={q!r}, `steps`={steps!r}{cap} and releases spending epsilon {spent:.6g}: even "
            f"noise multiplier {MAX_NOISE_MULTIPLIER:g} gives epsilon {err.epsilon_at_highest:.6g} "
            f"({accountant.upper()} accountant). Allowed: a larger target, fewer steps, a smaller sampling "
            "probability or cheaper releases."
        ) from None


# -- helpers -----------------------------------------------------------------------


def _rdp_search(releases: list, target: float, delta: float, q: float, steps: int, accountant: str) -> dict:
    """RDP with releases: the search starts at the steps' own sigma (composition only adds loss), stepping 5%."""
    if accountant != "rdp" or not releases:
        return {}
    base = calibrate_noise_multiplier(
        target_epsilon=target, target_delta=delta, sampling_probability=q, steps=steps, accountant="rdp"
    )
    return dict(start=base, factor=_FIRST_STEP, accelerate=True, lowest=base)


def _step_factory(q: float, truncation, accountant: str) -> Callable[[float], dp_accounting.DpEvent]:
    """sigma -> one step's event: Poisson-sampled Gaussian, or truncated at B (PLD only)."""
    if truncation is None:
        return lambda sigma: dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    if accountant != "pld":
        raise ValueError(
            f"Truncated Poisson steps (`truncation`={truncation!r}) are composed by the PLD accountant only; "
            f"received `accountant`={accountant!r}."
        )
    n, cap = truncation
    return lambda sigma: dp_accounting.TruncatedSubsampledGaussianDpEvent(int(n), q, int(cap), sigma)


def _check_spent(releases: list, target: float, delta: float, accountant: str, interval) -> float:
    """The releases' own epsilon, which must leave room for training."""
    if not releases:
        return 0.0
    spent = release_epsilon(releases, delta=delta, accountant=accountant, value_discretization_interval=interval)
    if spent >= target:
        raise ValueError(
            f"The one-off releases alone spend epsilon {spent:.6g} >= `target_epsilon`={target!r} at "
            f"delta {delta:g}: no training noise can meet the target. Allowed: releases with more noise "
            "(a smaller share of the budget) or a larger target."
        )
    return spent


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


__all__ = [
    "RELEASE_MECHANISMS",
    "calibrate_noise_multiplier_with_releases",
    "release_epsilon",
    "release_noise_multiplier",
]
