"""Steps on Poisson batches truncated at a maximum size, accounted exactly (`truncated_steps`).

A sampler given `max_batch_size = B` cuts a batch larger than B to a
uniform random subset of B (`tfdp_embed.data`, and `fixed_shape_batches`
pads the others up to B). dp-accounting (>= 0.6) has that mechanism as an
event; its PLD accountant composes it:

    PoissonSampled(q, Gaussian(sigma))  ->  TruncatedSubsampledGaussian(N, q, B, sigma)

`truncated_steps(mechanism, dataset_size=N, max_batch_size=B)` is the
mechanism as an `EventSource` whose step event is the truncated one, so
a `PrivacyBudget`, a `PrivacyLedger` and `privacy_report` given it charge
every step exactly, instead of the untruncated event plus the coupling
bound's extra delta (`accounting.report.truncation_delta`). The report
checks that N and B are the batches' own (`check_matches_batching`).

Only the PLD accountant composes the event (the RDP one raises).

Example:
    >>> source = truncated_steps(mechanism, dataset_size=n, max_batch_size=cap)
    >>> budget = PrivacyBudget(source, sampling_probability=q, target_epsilon=3.0, target_delta=1e-5)
    >>> dp_model.fit(fixed_batches, callbacks=[budget])

References: dp-accounting `TruncatedSubsampledGaussianDpEvent` and
`pld.privacy_loss_distribution.from_truncated_subsampled_gaussian_mechanism`
(arXiv:2508.15089); Chua et al., NeurIPS 2024 (truncated Poisson batches).
"""

from __future__ import annotations

import dataclasses

import dp_accounting

from tfdp_embed.accounting.events import EventSource, check_event_source
from tfdp_embed.errors import PrivacyContractError


def truncate_event(event: dp_accounting.DpEvent, *, dataset_size: int, max_batch_size: int) -> dp_accounting.DpEvent:
    """`event` with every PoissonSampled(q, Gaussian(sigma)) made TruncatedSubsampledGaussian(N, q, B, sigma).

    Composed and self-composed events are rewritten inside; other events
    (one-off releases, unsupported ones) are returned as they are.

    Raises:
      ValueError: a Poisson-sampled event of something other than a Gaussian (no truncated form).
    """
    if isinstance(event, dp_accounting.PoissonSampledDpEvent):
        if not isinstance(event.event, dp_accounting.GaussianDpEvent):
            raise ValueError(f"Only Poisson-sampled Gaussian steps have a truncated event; received {event!r}.")
        return dp_accounting.TruncatedSubsampledGaussianDpEvent(
            dataset_size=int(dataset_size),
            sampling_probability=float(event.sampling_probability),
            truncated_batch_size=int(max_batch_size),
            noise_multiplier=float(event.event.noise_multiplier),
        )
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        inner = truncate_event(event.event, dataset_size=dataset_size, max_batch_size=max_batch_size)
        return dp_accounting.SelfComposedDpEvent(inner, event.count)
    if isinstance(event, dp_accounting.ComposedDpEvent):
        return dp_accounting.ComposedDpEvent(
            [truncate_event(e, dataset_size=dataset_size, max_batch_size=max_batch_size) for e in event.events]
        )
    return event


@dataclasses.dataclass(frozen=True)
class TruncatedSteps:
    """An `EventSource`: `source`, with each step on Poisson batches truncated at `max_batch_size`.

    Attributes:
      source: the mechanism (or another `EventSource`).
      dataset_size: N, the examples the batches are drawn from.
      max_batch_size: B, the cap.
    """

    source: EventSource
    dataset_size: int
    max_batch_size: int

    @property
    def name(self) -> str:
        return self.source.name

    @property
    def is_dp(self) -> bool:
        return bool(self.source.is_dp)

    @property
    def noise_multiplier(self) -> float:
        return self.source.noise_multiplier

    @property
    def steps(self):
        return self.source.steps

    def step_event(self, sampling_probability: float) -> dp_accounting.DpEvent:
        """TruncatedSubsampledGaussian(N, q, B, sigma) for the source's Poisson-sampled Gaussian step."""
        return truncate_event(
            self.source.step_event(sampling_probability),
            dataset_size=self.dataset_size,
            max_batch_size=self.max_batch_size,
        )

    def one_off_events(self) -> list:
        return list(self.source.one_off_events())

    def report(self) -> dict:
        report = dict(self.source.report())
        report["step_accounting"] = (
            f"Poisson batches truncated at max_batch_size={self.max_batch_size} of N={self.dataset_size} "
            "examples: each step is dp-accounting's TruncatedSubsampledGaussianDpEvent (PLD)"
        )
        return report

    def __getattr__(self, attribute):  # everything else (e.g. `l2_norm_clip`) is the source's
        if attribute == "source":
            raise AttributeError(attribute)
        return getattr(self.source, attribute)


def truncated_steps(source: EventSource, *, dataset_size: int, max_batch_size: int) -> TruncatedSteps:
    """`source` accounted on Poisson batches of N examples truncated at B (see the module docstring).

    Raises:
      TypeError: `source` is not an `EventSource`.
      ValueError: N or B not an int >= 1, or B > N.
    """
    check_event_source(source, "source")
    for name, value in (("dataset_size", dataset_size), ("max_batch_size", max_batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"`{name}` must be an int >= 1; received {value!r}.")
    if max_batch_size > dataset_size:
        raise ValueError(f"`max_batch_size`={max_batch_size} exceeds `dataset_size`={dataset_size}.")
    return TruncatedSteps(source, int(dataset_size), int(max_batch_size))


def check_matches_batching(source, details: dict | None) -> bool:
    """True when `source` accounts truncated steps; then N and B must be the batches' own.

    Args:
      source: the report's mechanism.
      details: the batching's `BatchingInfo.report()` fields (None: not known).

    Raises:
      PrivacyContractError: truncated accounting for batches that were not
        truncated at that cap, or drawn from another N.
    """
    if not isinstance(source, TruncatedSteps):
        return False
    cap = None if details is None else details.get("max_batch_size")
    n = None if details is None else details.get("num_examples")
    if cap != source.max_batch_size or n != source.dataset_size:
        raise PrivacyContractError(
            f"The steps are accounted as Poisson batches of N={source.dataset_size} truncated at "
            f"max_batch_size={source.max_batch_size}, but the batches fed were drawn with N={n}, "
            f"max_batch_size={cap}: the truncated event would not describe them. Sample with "
            f"`max_batch_size={source.max_batch_size}` (tfdp_embed.data) or account with the mechanism itself."
        )
    return True


__all__ = ["TruncatedSteps", "check_matches_batching", "truncate_event", "truncated_steps"]
