"""What the accounting reads from a noise mechanism: its events, as data (`EventSource`).

Budgets, ledgers and reports take an `EventSource`, never a mechanism
class: every `tfdp_embed.mechanisms.NoiseMechanism` is one, and so is any
object with these members, so `accounting` depends on `dp_accounting`
events only.

A mechanism that is not DP (EANA) has no epsilon. Where a number is still
wanted to compare runs (a budget's step cap, a nominal epsilon), its steps
are accounted as the DP-SGD steps with the same noise multiplier
(`accountable_event`), and everything that uses them says it is not a
guarantee.

Example:
    >>> isinstance(mechanism, EventSource)      # True for every NoiseMechanism
    >>> accountable_event(eana.step_event(q), source=eana, sampling_probability=q)
    PoissonSampledDpEvent(q, GaussianDpEvent(sigma))   # nominal, NOT DP

References: `dp_accounting.dp_event` (events as data).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import dp_accounting

from tfdp_embed.accounting.calibration import make_accountant


@runtime_checkable
class EventSource(Protocol):
    """What budgets and reports read from a mechanism.

    Attributes:
      name: the mechanism's name (reports).
      is_dp: False for mechanisms without a DP guarantee (EANA, non-private).
      noise_multiplier: sigma of a step (the nominal DP-SGD sigma for non-DP ones).
      steps: steps taken so far (an int, or a scalar tensor/variable).
    """

    name: str
    is_dp: bool
    noise_multiplier: float
    steps: object

    def step_event(self, sampling_probability: float) -> dp_accounting.DpEvent:
        """The privacy cost of one training step at Poisson rate q."""

    def one_off_events(self) -> list:
        """One-off events spent so far (e.g. one per DP selection), each counted once."""

    def report(self) -> dict:
        """Fields for the privacy report (noise multipliers, clip norms, caveats)."""


def check_event_source(source, name: str = "mechanism") -> EventSource:
    """`source` if it is an `EventSource`; else a TypeError naming the missing members."""
    if isinstance(source, EventSource):
        return source
    members = ("name", "is_dp", "noise_multiplier", "steps", "step_event", "one_off_events", "report")
    missing = [m for m in members if not hasattr(source, m)]
    raise TypeError(
        f"`{name}` must be a `NoiseMechanism` or another `tfdp_embed.accounting.EventSource`; received "
        f"{type(source).__name__}, which lacks {missing}."
    )


def steps_taken(source: EventSource) -> int:
    """The source's step count as an int (from an int, a numpy or a TF scalar)."""
    steps: Any = source.steps
    if hasattr(steps, "numpy"):
        steps = steps.numpy()
    return int(steps)


def accountable_event(
    event: dp_accounting.DpEvent, *, source: EventSource, sampling_probability: float, accountant: str = "pld"
) -> dp_accounting.DpEvent:
    """`event` for DP sources (and events the accountant composes); else the NOMINAL DP-SGD step.

        nominal = PoissonSampled(q, Gaussian(source.noise_multiplier))

    Args:
      event: an event the source reported (a step or a one-off event).
      source: who reported it.
      sampling_probability: q of the nominal step.
      accountant: "pld" or "rdp" (what it must compose).

    Returns:
      A `dp_accounting.DpEvent` the accountant composes. For a non-DP
      source it is a number for comparing runs, never a guarantee.
    """
    if source.is_dp or make_accountant(accountant).supports(event):
        return event
    return nominal_step_event(source, sampling_probability)


def nominal_step_event(source: EventSource, sampling_probability: float) -> dp_accounting.DpEvent:
    """DP-SGD's step with the source's sigma: PoissonSampled(q, Gaussian(sigma)) (nominal for non-DP sources)."""
    return dp_accounting.PoissonSampledDpEvent(
        sampling_probability, dp_accounting.GaussianDpEvent(source.noise_multiplier)
    )


__all__ = ["EventSource", "accountable_event", "check_event_source", "nominal_step_event", "steps_taken"]
