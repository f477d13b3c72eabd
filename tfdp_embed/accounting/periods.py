"""Streaming periods composed in PARALLEL: each period's account, its budget and the run's epsilon.

A run trained period by period (DP-FEST §4.3: one period per day file) is
(eps, delta)-DP with eps = max_p eps(period p), not the sum, for
add/remove-one-example neighbours:

1. The periods partition the examples by a property of the example itself
   (the day it is in), so adding or removing one example changes exactly one
   period's data, say period j.
2. Training is adaptive (period p starts from the model and mechanism state
   period p - 1 left), but given any input state period p != j's output
   distribution does not depend on the example. The run's privacy loss is
   the sum of per-period losses, all 0 but period j's, so the run is
   (eps_j, delta)-DP when period j is for every fixed input state (adaptive
   parallel composition; McSherry, PINQ, SIGMOD 2009, §4: the partition
   does not depend on the outputs).
3. What does NOT split: one-off releases over several periods' data. A
   selection from RUNNING counts (DP-FEST §4.3) made before period p
   counts periods 1..p, so every period's account carries every one-off
   event of the run (reserved up front: `planned_one_off_events`), as does
   a release over all training data (an output calibration: `events`).
4. One noise multiplier serves all periods: sigma = max_p sigma(q_p, T_p)
   (`calibrate_periods`), so each period alone meets the target. The
   period sizes behind q_p are treated as public, as q = B / N always is.

Metrics measured between periods on raw evaluation data are not covered.

Example:
    >>> periods = [AccountingPeriod(0.02, 100), AccountingPeriod(0.05, 100)]
    >>> sigma = calibrate_periods(periods, target_epsilon=2.0, target_delta=1e-5)
    >>> ledgers = period_ledgers(mechanism, periods)
    >>> epsilons, worst = parallel_epsilon(ledgers, delta=1e-5)

References: McSherry 2009 §4 (parallel composition); DP-FEST (NeurIPS
2023) §4.3 (streaming periods, running counts).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

import dp_accounting

from tfdp_embed.accounting.calibration import check_sampling_probability, check_steps
from tfdp_embed.accounting.events import EventSource, accountable_event
from tfdp_embed.accounting.ledger import PrivacyLedger
from tfdp_embed.accounting.one_off_releases import calibrate_noise_multiplier_with_releases
from tfdp_embed.accounting.truncated import truncate_event
from tfdp_embed.errors import PrivacyBudgetExceededError

PARALLEL = "parallel over streaming periods"


@dataclasses.dataclass(frozen=True)
class AccountingPeriod:
    """One streaming period: its Poisson rate q_p = B / N_p and its planned steps T_p.

    With `max_batch_size` (and the period's `dataset_size` N_p), its batches
    are truncated at that cap and each step is accounted as
    `TruncatedSubsampledGaussianDpEvent(N_p, q_p, cap, sigma)` (PLD only;
    `accounting.truncated`).
    """

    sampling_probability: float
    steps: int
    dataset_size: int | None = None
    max_batch_size: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "sampling_probability", check_sampling_probability(self.sampling_probability))
        object.__setattr__(self, "steps", check_steps(self.steps, allow_zero=True))
        if (self.dataset_size is None) != (self.max_batch_size is None):
            raise ValueError(
                "A truncated period needs both `dataset_size` and `max_batch_size`; received "
                f"{self.dataset_size!r}, {self.max_batch_size!r}."
            )

    @property
    def truncation(self) -> tuple[int, int] | None:
        """(N_p, cap) of truncated batches, else None."""
        if self.dataset_size is None or self.max_batch_size is None:
            return None
        return (self.dataset_size, self.max_batch_size)

    def step_event(self, source: EventSource) -> dp_accounting.DpEvent:
        """One step of `source` on this period's batches (nominal for non-DP sources; truncated when capped)."""
        q = self.sampling_probability
        event = accountable_event(source.step_event(q), source=source, sampling_probability=q)
        if self.truncation is None:
            return event
        n, cap = self.truncation
        return truncate_event(event, dataset_size=n, max_batch_size=cap)


def calibrate_periods(
    periods: Sequence[AccountingPeriod],
    *,
    target_epsilon: float,
    target_delta: float,
    releases: Sequence[dp_accounting.DpEvent] = (),
    accountant: str = "pld",
) -> float:
    """sigma = max_p sigma(q_p, T_p): each period with `releases` then meets the target alone.

    Each sigma(q_p, T_p) is `calibrate_noise_multiplier_with_releases`
    (a repeated one costs no accountant call: epsilons are memoised by
    event). One period is the plain sequential calibration.

    Raises:
      ValueError: no period, or a target the accountant cannot meet.
    """
    if not periods:
        raise ValueError("`periods` is empty: calibration needs at least one period.")
    return max(
        calibrate_noise_multiplier_with_releases(
            target_epsilon=target_epsilon,
            target_delta=target_delta,
            sampling_probability=p.sampling_probability,
            steps=p.steps,
            releases=list(releases),
            accountant=accountant,
            truncation=p.truncation,
        )
        for p in dict.fromkeys(periods)
    )


def period_ledger(
    source: EventSource,
    period: AccountingPeriod,
    *,
    planned_one_off_events: int = 0,
    events: Sequence[dp_accounting.DpEvent] = (),
) -> PrivacyLedger:
    """What one example of `period` is charged: every one-off event of the run, then the period's steps.

    Args:
      source: the run's mechanism (its one-off events so far are recorded).
      period: q_p and the steps to charge.
      planned_one_off_events: one-off events the run makes in all; those the
        source has not made yet are charged as copies of its last one.
      events: one-off events over all periods' data (e.g. an output
        calibration), charged to every period.

    Returns:
      A `PrivacyLedger`: setup events, then `period.steps` step events (the
      nominal DP-SGD step for a non-DP source).
    """
    ledger = PrivacyLedger()
    made = list(source.one_off_events())
    reserved = made[-1:] * max(0, int(planned_one_off_events) - len(made))
    for event in made + reserved + list(events):
        ledger.record_setup(event)
    ledger.record_steps(period.step_event(source), period.steps)
    return ledger


def period_ledgers(
    source: EventSource, periods: Sequence[AccountingPeriod], *, events: Sequence[dp_accounting.DpEvent] = ()
) -> list:
    """Each period's ledger after the run: every one-off event the source made and `events`, then its steps."""
    return [period_ledger(source, period, events=events) for period in periods]


def parallel_epsilon(ledgers: Sequence[PrivacyLedger], *, delta: float, accountant: str = "pld") -> tuple[list, int]:
    """(each period's epsilon, the index of the largest): the run's epsilon is the largest."""
    epsilons = [ledger.epsilon(delta, accountant) for ledger in ledgers]
    return epsilons, max(range(len(epsilons)), key=epsilons.__getitem__)


def add_period_accounting(report: dict, ledgers: Sequence[PrivacyLedger], epsilons: Sequence, worst: int) -> dict:
    """Adds the parallel composition to a privacy report: the worst period's ledger and every period's account."""
    report["composition"] = PARALLEL
    report["ledger"] = json.loads(ledgers[worst].to_json())
    report["period_accounting"] = [
        {"period": i + 1, "epsilon": eps, "steps": ledger.steps, "ledger": json.loads(ledger.to_json())}
        for i, (ledger, eps) in enumerate(zip(ledgers, epsilons))
    ]
    report["caveats"].append(
        f"Streaming periods ({len(ledgers)}): parallel composition. Each example is in one period, so "
        "epsilon is the largest period's, not the sum: each period is charged its own steps at its own "
        "sampling rate plus every one-off release of the run (running counts put a period's examples into "
        f"every later selection). Worst period: {worst + 1}. Metrics measured between periods on raw "
        "evaluation data are not covered by the guarantee."
    )
    return report


class PeriodTracker:
    """One streaming period's account under parallel composition (see the module docstring).

    Keras-free; the front end's callback is `tfdp_embed.keras2.callbacks.PeriodBudget`.

    At train begin it charges the period with every one-off event of the run
    (those made so far plus the planned ones still to come) and its planned
    steps, and raises if that exceeds the target; it then records one step
    per batch in `ledger` and stops training after `period.steps`.

    Args:
      source: the run's mechanism.
      period: q_p and the planned steps T_p.
      target_epsilon, target_delta: the run's target.
      accountant: "pld" or "rdp".
      planned_one_off_events: as in `period_ledger`.
      events: one-off events over all periods' data (an output calibration).

    Raises:
      PrivacyBudgetExceededError: at train begin, when the plan does not fit the target.
    """

    def __init__(
        self,
        source: EventSource,
        *,
        period: AccountingPeriod,
        target_epsilon: float,
        target_delta: float,
        accountant: str = "pld",
        planned_one_off_events: int = 0,
        events: Sequence[dp_accounting.DpEvent] = (),
    ):
        super().__init__()
        self.source, self.period = source, period
        self.target_epsilon, self.target_delta = float(target_epsilon), float(target_delta)
        self.accountant = accountant
        self.planned_one_off_events = int(planned_one_off_events)
        self.events = list(events)
        self.ledger = PrivacyLedger()
        self.planned_epsilon: float | None = None
        self._step = None

    def on_train_begin(self, logs=None):
        plan = period_ledger(
            self.source, self.period, planned_one_off_events=self.planned_one_off_events, events=self.events
        )
        self.planned_epsilon = plan.epsilon(self.target_delta, self.accountant)
        if self.planned_epsilon > self.target_epsilon * (1 + 1e-6):
            raise PrivacyBudgetExceededError(
                f"This streaming period's plan ({self.period.steps} steps at q={self.period.sampling_probability:.4g} "
                f"plus every one-off release of the run) spends epsilon {self.planned_epsilon:.6g} > target "
                f"{self.target_epsilon:g} at delta={self.target_delta:g}: the calibration does not cover it."
            )
        self._step = self.period.step_event(self.source)

    def on_train_batch_end(self, batch, logs=None):
        self.ledger.record_steps(self._step, 1)
        if self.ledger.steps >= self.period.steps:
            self.model.stop_training = True


__all__ = [
    "PARALLEL",
    "AccountingPeriod",
    "PeriodTracker",
    "add_period_accounting",
    "calibrate_periods",
    "parallel_epsilon",
    "period_ledger",
    "period_ledgers",
]
