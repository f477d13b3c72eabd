"""A `dp_accounting` PLD accountant that builds each DP-SGD step's privacy loss distribution once per process.

One run asks the PLD accountant about the same step many times: the noise
calibration confirms sigma on the exact grid, the budget checks k and k + 1
steps of that sigma, the epoch end and the report evaluate the ledger.
Every evaluation rebuilds the step's distribution from scratch,
`PLD.from_gaussian_mechanism(sigma, sampling_prob=q)`, which on the default
grid costs several times the composition that follows it. This accountant
keeps the built distribution of each Poisson-sampled Gaussian step, keyed by
(q, sigma, grid, adjacency), and its self-compositions by count, and
composes them exactly as `PLDAccountant` does (`self_compose(count)`, then
`compose`). Distributions are immutable
(every operation returns a new one), so a kept one gives bit-identical
epsilons; every other event goes to `PLDAccountant` unchanged. Nothing here
is a second accountant: the arithmetic is `dp_accounting`'s.

References: `dp_accounting.pld.PLDAccountant._maybe_compose` (the method a
`PrivacyAccountant` subclass implements); Doroshenko et al. 2022.
"""

from __future__ import annotations

import functools

import dp_accounting
from dp_accounting.pld import privacy_loss_distribution

# Step distributions kept per process (a few MB each on the default grid).
MAX_KEPT_STEPS = 32
# Self-compositions kept (a budget's search for its last step composes many counts once each).
MAX_KEPT_COMPOSITIONS = 8


@functools.lru_cache(maxsize=MAX_KEPT_STEPS)
def step_distribution(
    sampling_probability: float,
    noise_multiplier: float,
    interval: float,
    neighboring_relation: dp_accounting.NeighboringRelation,
) -> privacy_loss_distribution.PrivacyLossDistribution:
    """The PLD of one Poisson-sampled Gaussian step, as `PLDAccountant` builds it (memoised)."""
    return privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=noise_multiplier,
        value_discretization_interval=interval,
        sampling_prob=sampling_probability,
        neighboring_relation=neighboring_relation,
    )


@functools.lru_cache(maxsize=MAX_KEPT_COMPOSITIONS)
def composed_steps(
    sampling_probability: float,
    noise_multiplier: float,
    interval: float,
    neighboring_relation: dp_accounting.NeighboringRelation,
    count: int,
) -> privacy_loss_distribution.PrivacyLossDistribution:
    """`count` such steps composed, `step_distribution(...).self_compose(count)` (memoised).

    The calibration composes the run's steps to confirm sigma, then the
    budget composes the same steps with the one-off releases, and the
    report once more: the self-composition (~0.2 s on the default grid) is
    done once.
    """
    step = step_distribution(sampling_probability, noise_multiplier, interval, neighboring_relation)
    return step.self_compose(count)


class StepMemoPLDAccountant(dp_accounting.pld.PLDAccountant):
    """`dp_accounting.pld.PLDAccountant`, with each DP-SGD step's distribution built once (`step_distribution`)."""

    def _maybe_compose(self, event: dp_accounting.DpEvent, count: int, do_compose: bool):
        if do_compose and _sampled_gaussian(event):
            steps = composed_steps(
                float(event.sampling_probability),
                float(event.event.noise_multiplier),
                float(self._value_discretization_interval),
                self.neighboring_relation,
                int(count),
            )
            self._pld = self._pld.compose(steps)  # type: ignore[has-type]  # dp_accounting: untyped
            return None
        return super()._maybe_compose(event, count, do_compose)


def _sampled_gaussian(event: dp_accounting.DpEvent) -> bool:
    """A Poisson-sampled Gaussian with q > 0 and sigma > 0 (the zero cases stay with `PLDAccountant`)."""
    return (
        isinstance(event, dp_accounting.PoissonSampledDpEvent)
        and isinstance(event.event, dp_accounting.GaussianDpEvent)
        and event.sampling_probability != 0
        and event.event.noise_multiplier != 0
    )


__all__ = ["MAX_KEPT_COMPOSITIONS", "MAX_KEPT_STEPS", "StepMemoPLDAccountant", "composed_steps", "step_distribution"]
