"""Privacy side of the Criteo pipeline: noise calibration and mechanism construction.

From the CLI's (epsilon, delta), the sampling rate q = B / N and the number
of steps T of one training stream, every DP mechanism gets the noise that
makes the released model (epsilon, delta)-DP:

    dense, lazy:      sigma = calibrate_noise_multiplier(eps, delta, q, T)
    adafest:          sigma as dense; (sigma1, sigma2) = split(sigma, ratio)
                      so that (sigma1^-2 + sigma2^-2)^-1/2 = sigma
    fest:             eps1 = selection share of eps (pure DP top-k selection),
                      sigma for eps - eps1 (basic composition, DP-FEST App. C.3)
    adafest+:         eps1 as fest, then split as adafest
    eana:             NOT DP. sigma is what dense DP-SGD would need (a
                      nominal setting); no epsilon is claimed.
    none:             no clipping, no noise.

With `calibration_fraction` f > 0, eps_c = f x eps pays for the DP output
calibration (`criteo_calibration`: a Laplace histogram, (eps_c, 0)-DP) and
everything above is calibrated for eps - eps_c (basic composition); the
ledgers hold its Laplace event, so the reported epsilon composes it.

Streaming periods (DP-FEST §4.3) compose in PARALLEL, not sequentially.
The argument, for add/remove-one-example neighbours (one Criteo row = one
privacy unit):

1. The periods partition the rows by a property of the row itself (the day
   file it is in), so adding or removing one row x changes exactly one
   period's data, say day j; every other period's data is identical.
2. Training is adaptive: period p starts from the model (and mechanism
   state: momentum, LazyDP's owed noise, AdaFEST counters) left by period
   p - 1. Write the run as M = M_P o ... o M_1, M_p(D_p; state_{p-1}). For
   p != j, M_p's output distribution given any state does not depend on x.
   The privacy-loss random variable of the run is therefore the sum over
   periods of per-period losses, of which all but period j's are 0, so the
   run is (eps_j, delta_j)-DP whenever M_j is (eps_j, delta_j)-DP for every
   fixed input state (adaptive parallel composition; McSherry, PINQ,
   SIGMOD 2009, §4; it holds for adaptively chosen mechanisms because the
   partition does not depend on the outputs). So
       eps_run = max_p eps(period p),   delta_run = delta.
3. What does NOT split: DP-FEST's selection uses RUNNING counts (DP-FEST
   §4.3): the selection made before period p counts days 1..p, so a row of
   day j is in the selections of periods j, j+1, ..., P. Every period's
   account therefore carries all P selections (each eps_1 / P, pure DP,
   basic composition: eps_1 in total), not just its own. AdaFEST+'s one
   selection (day 1's counts) is likewise charged to every period.
4. The sampling rate and step count differ per period (q_p = B / N_p,
   T_p = epochs x round(N_p / B)); one noise multiplier serves all periods:
   sigma = max_p sigma(q_p, T_p), so each period alone meets (eps, delta)
   (`calibrate_periods`). N_p is treated as public, as q = B / N always is.
5. Evaluation metrics computed between periods (AUC on the next day) use
   raw evaluation rows and are not covered by the guarantee (as in any
   DP-SGD evaluation); the released model is.

Accounting follows the argument: each period has its own ledger
(`PeriodBudget`: all P selections reserved up front, then that period's
steps at q_p, training stops at the planned T_p, and a plan over the
budget raises before the period trains); the report's epsilon is the
largest period's, recomputed at the end from the selections that really
ran (`period_ledgers`). One period reduces exactly to the sequential
accounting of a plain run.

References: DP-FEST (NeurIPS 2023) §3.1-3.3, §4.3, App. B, C.3-C.4, D.1;
LazyDP (ASPLOS 2024) §5; EANA (RecSys 2022) §3.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence

import dp_accounting
import numpy as np

from tfdp_embed import PrivacyBudgetExceededError, keras
from tfdp_embed.accounting import PrivacyLedger, calibrate_noise_multiplier
from tfdp_embed.mechanisms import MECHANISMS, one_off_events
from tfdp_embed.mechanisms.adafest import split_noise_multiplier
from tfdp_embed.mechanisms.fest import remaining_budget_noise_multiplier

MECHANISM_NAMES = ("none", "dense", "eana", "lazy", "fest", "adafest", "adafest+")
DP_MECHANISMS = ("dense", "lazy", "fest", "adafest", "adafest+")
SELECTING_MECHANISMS = ("fest", "adafest+")


# Calibration is a pure function of its arguments and PLD calibration can take
# tens of seconds (large q, few steps): runs in one process (benchmarks,
# notebooks) share the results.
_calibrate_dpsgd = functools.lru_cache(maxsize=256)(calibrate_noise_multiplier)
_calibrate_after_selection = functools.lru_cache(maxsize=256)(remaining_budget_noise_multiplier)


def mechanism_class(name: str):
    """The `NoiseMechanism` class registered as `name` in `tfdp_embed.mechanisms.MECHANISMS`."""
    if name not in MECHANISMS or name not in MECHANISM_NAMES:
        raise ValueError(f"`mechanism` must be one of {MECHANISM_NAMES}; received {name!r}.")
    return MECHANISMS[name]


@dataclasses.dataclass(frozen=True)
class PrivacySettings:
    """What the CLI says about privacy (static values only).

    Attributes:
      mechanism: one of `MECHANISM_NAMES`.
      epsilon: target epsilon (> 0) of the released model (nominal for eana).
      delta: target delta in (0, 1).
      l2_norm_clip: per-example gradient clip norm C.
      accountant: "pld" or "rdp".
      selection_fraction: share of epsilon spent on the DP top-k selection
        (fest, adafest+), in (0, 1).
      top_fraction: fraction of each table's rows the selection keeps (fest, adafest+).
      adafest_ratio: sigma1 / sigma2 (adafest, adafest+); App. D.1 tunes 0.1..10.
      adafest_threshold: tau; None means `threshold_sigmas * sigma1 * C1`.
      threshold_sigmas: default tau in units of the contribution-map noise std.
      contribution_clip: C1 of the contribution map.
      calibration_fraction: share of epsilon for the DP output calibration
        (`criteo_calibration`), in [0, 1); 0 turns it off.
      seed: noise seed (None: OS entropy; ints are for tests and reproducible runs).
    """

    mechanism: str
    epsilon: float | None
    delta: float | None
    l2_norm_clip: float = 1.0
    accountant: str = "pld"
    selection_fraction: float = 0.1
    top_fraction: float = 0.1
    adafest_ratio: float = 1.0
    adafest_threshold: float | None = None
    threshold_sigmas: float = 2.0
    contribution_clip: float = 1.0
    calibration_fraction: float = 0.0
    seed: int | None = None


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Noise settings for one training run.

    Attributes:
      noise_multiplier: sigma the accounting uses per step (DP-SGD-equivalent).
      selection_epsilon: eps1 in total (0 when nothing is selected).
      selection_epsilon_per_selection: eps1 / number of selections.
      contribution_noise_multiplier: sigma1 (adafest, adafest+), else None.
      gradient_noise_multiplier: sigma2 for adafest(+), sigma otherwise.
      calibration_epsilon: eps_c of the DP output calibration (0: none).
    """

    noise_multiplier: float
    selection_epsilon: float
    selection_epsilon_per_selection: float
    contribution_noise_multiplier: float | None
    gradient_noise_multiplier: float
    calibration_epsilon: float = 0.0


def calibrate(
    settings: PrivacySettings,
    *,
    sampling_probability: float,
    steps: int,
    num_selections: int = 1,
) -> Calibration:
    """Noise multipliers for `steps` Poisson-sampled steps at rate `sampling_probability`.

    Args:
      settings: the privacy settings.
      sampling_probability: q (for several streaming periods: the largest q,
        an upper bound since epsilon grows with q).
      steps: T, all steps of the run (streaming periods compose sequentially).
      num_selections: DP top-k selections over the run (fest: one per period).

    Returns:
      A `Calibration`.

    Raises:
      ValueError: a target the accountant cannot meet (message from
        `calibrate_noise_multiplier`), or bad settings.
    """
    name = settings.mechanism
    if name == "none":
        return Calibration(0.0, 0.0, 0.0, None, 0.0)
    if not 0 <= settings.calibration_fraction < 1:
        raise ValueError(f"`calibration_fraction` must lie in [0, 1); received {settings.calibration_fraction!r}.")
    selecting = name in SELECTING_MECHANISMS
    eps_c = settings.epsilon * settings.calibration_fraction
    eps_train = settings.epsilon - eps_c  # basic composition with the (eps_c, 0)-DP output calibration
    eps1 = settings.epsilon * settings.selection_fraction if selecting else 0.0
    common = dict(sampling_probability=float(sampling_probability), steps=int(steps), accountant=settings.accountant)
    if selecting:
        if eps1 >= eps_train:
            raise ValueError(
                f"The selection share {settings.selection_fraction:g} and the calibration share "
                f"{settings.calibration_fraction:g} of epsilon leave nothing for training; their sum must be < 1."
            )
        sigma = _calibrate_after_selection(epsilon=eps_train, delta=settings.delta, selection_epsilon=eps1, **common)
    else:
        sigma = _calibrate_dpsgd(target_epsilon=eps_train, target_delta=settings.delta, **common)
    sigma = float(sigma)
    sigma1, sigma2 = None, sigma
    if name in ("adafest", "adafest+"):
        sigma1, sigma2 = split_noise_multiplier(sigma, ratio=settings.adafest_ratio)
    per_selection = eps1 / max(1, num_selections) if selecting else 0.0
    return Calibration(sigma, eps1, per_selection, sigma1, sigma2, eps_c)


@dataclasses.dataclass(frozen=True)
class PeriodPlan:
    """One streaming period's sampling rate q_p = B / N_p and planned steps T_p."""

    sampling_probability: float
    steps: int


def calibrate_periods(
    settings: PrivacySettings,
    *,
    periods: Sequence[PeriodPlan],
    num_selections: int = 1,
) -> Calibration:
    """Noise for streaming periods under parallel composition: sigma = max_p sigma(q_p, T_p).

    Each period alone is then (epsilon, delta)-DP including every DP
    selection (see the module docstring), hence so is the whole run.

    Args:
      settings: the privacy settings.
      periods: each period's `PeriodPlan`.
      num_selections: DP top-k selections over the run (fest: one per period).

    Returns:
      The `Calibration` of the period needing the most noise.

    Raises:
      ValueError: no period, or a target the accountant cannot meet.
    """
    if not periods:
        raise ValueError("`periods` is empty: calibration needs at least one period.")
    calibrations = [
        calibrate(settings, sampling_probability=p.sampling_probability, steps=p.steps, num_selections=num_selections)
        for p in dict.fromkeys(periods)
    ]
    return max(calibrations, key=lambda c: c.noise_multiplier)


def _selection_events(mechanism) -> list:
    """The one-off events a mechanism spent so far: DP-FEST's selections, else its setup event."""
    return one_off_events(mechanism)


def _step_event(mechanism, sampling_probability: float) -> dp_accounting.DpEvent:
    """One step's event; for a non-DP mechanism (EANA) the NOMINAL DP-SGD event with its sigma."""
    if mechanism.is_dp:
        return mechanism.step_event(sampling_probability)
    return dp_accounting.PoissonSampledDpEvent(
        sampling_probability, dp_accounting.GaussianDpEvent(mechanism.noise_multiplier)
    )


def period_ledger(
    mechanism,
    *,
    sampling_probability: float,
    steps: int,
    reserved_selections: int = 0,
    extra_events: Sequence[dp_accounting.DpEvent] = (),
) -> PrivacyLedger:
    """What one row of this period is charged: every selection of the run, then this period's steps.

    Args:
      mechanism: the run's mechanism (its selections so far are recorded).
      sampling_probability: q_p.
      steps: this period's steps.
      reserved_selections: selections the run will still make (recorded as
        copies of the last one: same epsilon and k, same event).
      extra_events: one-off events over all training rows (the output
        calibration), charged to every period.

    Returns:
      A `PrivacyLedger` (setup events, then `steps` step events).
    """
    ledger = PrivacyLedger()
    events = _selection_events(mechanism)
    for event in events + events[-1:] * int(reserved_selections) + list(extra_events):
        ledger.record_setup(event)
    ledger.record_steps(_step_event(mechanism, sampling_probability), int(steps))
    return ledger


class PeriodBudget(keras.callbacks.Callback):
    """One streaming period's account under parallel composition (see the module docstring).

    At train begin it charges the period with every selection of the run
    (those made so far plus `reserved_selections` still to come) and its
    planned steps, and raises if that exceeds the target; it then records one
    step per batch in `ledger` and stops training after `planned_steps`.

    Args:
      mechanism: the run's mechanism.
      sampling_probability: q_p = B / N_p.
      planned_steps: T_p.
      target_epsilon, target_delta: the run's target.
      accountant: "pld" or "rdp".
      reserved_selections: DP selections the run makes after this one begins.
      extra_events: one-off events over all rows (the output calibration).

    Raises:
      PrivacyBudgetExceededError: at train begin, when the plan does not fit the target.
    """

    def __init__(
        self,
        mechanism,
        *,
        sampling_probability: float,
        planned_steps: int,
        target_epsilon: float,
        target_delta: float,
        accountant: str,
        reserved_selections: int = 0,
        extra_events: Sequence[dp_accounting.DpEvent] = (),
    ):
        super().__init__()
        self.mechanism = mechanism
        self.sampling_probability = float(sampling_probability)
        self.planned_steps = int(planned_steps)
        self.target_epsilon = float(target_epsilon)
        self.target_delta = float(target_delta)
        self.accountant = accountant
        self.reserved_selections = int(reserved_selections)
        self.extra_events = list(extra_events)
        self.ledger = PrivacyLedger()
        self.planned_epsilon: float | None = None
        self._step = None

    def on_train_begin(self, logs=None):
        plan = period_ledger(
            self.mechanism,
            sampling_probability=self.sampling_probability,
            steps=self.planned_steps,
            reserved_selections=self.reserved_selections,
            extra_events=self.extra_events,
        )
        self.planned_epsilon = plan.epsilon(self.target_delta, self.accountant)
        if self.planned_epsilon > self.target_epsilon * (1 + 1e-6):
            raise PrivacyBudgetExceededError(
                f"This streaming period's plan ({self.planned_steps} steps at q={self.sampling_probability:.4g} "
                f"plus every DP selection of the run) spends epsilon {self.planned_epsilon:.6g} > target "
                f"{self.target_epsilon:g} at delta={self.target_delta:g}: the calibration does not cover it."
            )
        self._step = _step_event(self.mechanism, self.sampling_probability)

    def on_train_batch_end(self, batch, logs=None):
        self.ledger.record_steps(self._step, 1)
        if self.ledger.steps >= self.planned_steps:
            self.model.stop_training = True


def period_ledgers(
    mechanism, periods: Sequence[tuple[float, int]], *, extra_events: Sequence[dp_accounting.DpEvent] = ()
) -> list:
    """Final per-period ledgers: every selection the run made and `extra_events`, then each period's (q_p, steps)."""
    return [
        period_ledger(mechanism, sampling_probability=q, steps=steps, extra_events=extra_events) for q, steps in periods
    ]


def threshold(settings: PrivacySettings, calibration: Calibration) -> float:
    """DP-AdaFEST's tau: the explicit one, or `threshold_sigmas` x sigma1 x C1."""
    if settings.adafest_threshold is not None:
        return float(settings.adafest_threshold)
    return settings.threshold_sigmas * calibration.contribution_noise_multiplier * settings.contribution_clip


def top_k(table_sizes: Mapping[str, int], fraction: float) -> dict:
    """Rows kept per table: max(1, floor(fraction x rows))."""
    return {name: max(1, int(math.floor(fraction * rows))) for name, rows in table_sizes.items()}


def build_mechanism(
    settings: PrivacySettings,
    calibration: Calibration,
    *,
    counts: Mapping[str, np.ndarray] | None = None,
    table_sizes: Mapping[str, int] | None = None,
):
    """Constructs the `NoiseMechanism` for `settings.mechanism`.

    Args:
      settings: privacy settings.
      calibration: from `calibrate`.
      counts: {table layer name: bucket counts} (fest, adafest+): the
        non-private frequencies the DP selection is made from.
      table_sizes: {table layer name: rows} (adafest+: k per table).

    Returns:
      The mechanism (fest selects in `init`, from `counts`).

    Raises:
      ValueError: a selecting mechanism without `counts`.
    """
    name = settings.mechanism
    cls = mechanism_class(name)
    seed = settings.seed
    if name == "none":
        return cls(seed=seed)
    common = dict(l2_norm_clip=settings.l2_norm_clip, seed=seed)
    if name in ("dense", "lazy", "eana"):
        return cls(noise_multiplier=calibration.noise_multiplier, **common)
    if name in SELECTING_MECHANISMS and counts is None:
        raise ValueError(f"Mechanism {name!r} selects rows from bucket counts; `counts` is required.")
    if name == "fest":
        return cls(
            noise_multiplier=calibration.noise_multiplier,
            selection_epsilon=calibration.selection_epsilon_per_selection,
            top_fraction=settings.top_fraction,
            counts=counts,
            **common,
        )
    adafest = dict(
        noise_multiplier=calibration.gradient_noise_multiplier,
        contribution_clip=settings.contribution_clip,
        contribution_noise_multiplier=calibration.contribution_noise_multiplier,
        threshold=threshold(settings, calibration),
        **common,
    )
    if name == "adafest":
        return cls(**adafest)
    return cls.from_counts(
        counts,
        top_k=top_k(table_sizes, settings.top_fraction),
        selection_epsilon=calibration.selection_epsilon,
        **adafest,
    )


__all__ = [
    "DP_MECHANISMS",
    "MECHANISM_NAMES",
    "SELECTING_MECHANISMS",
    "Calibration",
    "PeriodBudget",
    "PeriodPlan",
    "PrivacySettings",
    "build_mechanism",
    "calibrate",
    "calibrate_periods",
    "mechanism_class",
    "period_ledger",
    "period_ledgers",
    "threshold",
    "top_k",
]
