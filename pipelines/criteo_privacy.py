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

Streaming periods (DP-FEST §4.3): all periods' steps are composed
sequentially (as if every example could be in every period: an upper bound,
since each day's examples only train in their own period) at the largest
period's q, and DP-FEST's selection budget eps1 is split over its
re-selections, so the whole run is (epsilon, delta)-DP.

References: DP-FEST (NeurIPS 2023) §3.1-3.3, §4.3, App. B, C.3-C.4, D.1;
LazyDP (ASPLOS 2024) §5; EANA (RecSys 2022) §3.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping

import numpy as np

from tfdp_embed.accounting import calibrate_noise_multiplier
from tfdp_embed.mechanisms import MECHANISMS
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
    """

    noise_multiplier: float
    selection_epsilon: float
    selection_epsilon_per_selection: float
    contribution_noise_multiplier: float | None
    gradient_noise_multiplier: float


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
    selecting = name in SELECTING_MECHANISMS
    eps1 = settings.epsilon * settings.selection_fraction if selecting else 0.0
    common = dict(sampling_probability=float(sampling_probability), steps=int(steps), accountant=settings.accountant)
    if selecting:
        sigma = _calibrate_after_selection(
            epsilon=settings.epsilon, delta=settings.delta, selection_epsilon=eps1, **common
        )
    else:
        sigma = _calibrate_dpsgd(target_epsilon=settings.epsilon, target_delta=settings.delta, **common)
    sigma = float(sigma)
    sigma1, sigma2 = None, sigma
    if name in ("adafest", "adafest+"):
        sigma1, sigma2 = split_noise_multiplier(sigma, ratio=settings.adafest_ratio)
    per_selection = eps1 / max(1, num_selections) if selecting else 0.0
    return Calibration(sigma, eps1, per_selection, sigma1, sigma2)


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
    "PrivacySettings",
    "build_mechanism",
    "calibrate",
    "mechanism_class",
    "threshold",
    "top_k",
]
