"""DP mean and variance of clipped features, from one Gaussian release (Keras-free).

`dp_normalization_statistics(values, ...)` releases (count, sum, sum of
squares) of values clipped to public bounds, once, with Gaussian noise; the
tf-keras front end builds a `Normalization` layer from the result
(`tfdp_embed.keras2.dp_preprocessing.normalization_layer`). The release
carries its `Release` (`.release`) for the run's plan and ledger.
Statistics of one unit per row: a unit with several rows must be
aggregated first (the sensitivity assumes one row per unit).

    values clipped to [lo, hi], centred: x = clip(v) - c, c = (lo + hi) / 2, |x| <= r = (hi - lo) / 2
    release (n, S1 / r, S2 / r^2) + N(0, z^2 (1 + 2 d) I)     (L2 sensitivity sqrt(1 + 2d) for d features)
    mean = c + S1~ / n~,  variance = max(S2~ / n~ - (S1~ / n~)^2, floor)

Example:
    >>> stats = dp_normalization_statistics(ages, epsilon=0.5, delta=1e-6, clip_range=(0, 100))

References: Dwork & Roth 2014 §3.5 (Gaussian mechanism); Biswas et al., "CoinPress", NeurIPS 2020 (clipped
DP means and variances).
"""

from __future__ import annotations

import dataclasses
import math
from typing import cast

import dp_accounting
import numpy as np

from tfdp_embed.accounting.one_off_releases import release_noise_multiplier
from tfdp_embed.data.vocabulary import gaussian_release_epsilon
from tfdp_embed.planning.releases import Release


@dataclasses.dataclass(frozen=True)
class NormalizationStatistics:
    """DP mean and variance per feature, and the release that produced them."""

    mean: np.ndarray
    variance: np.ndarray
    noise_multiplier: float
    noise_std: float
    clip_range: tuple
    epsilon: float
    delta: float
    name: str = "normalization"

    @property
    def event(self) -> dp_accounting.DpEvent:
        return dp_accounting.GaussianDpEvent(self.noise_multiplier)

    @property
    def release(self) -> Release:
        return Release(self.name, event=self.event)


def dp_normalization_statistics(
    values,
    *,
    clip_range: tuple,
    delta: float,
    epsilon: float | None = None,
    noise_multiplier: float | None = None,
    variance_floor: float = 1e-6,
    seed: int | None = None,
    name: str = "normalization",
) -> NormalizationStatistics:
    """Mean and variance of `values` `[n]` or `[n, d]` (one row per unit) from one Gaussian release.

    Args:
      values: the data, one row per privacy unit.
      clip_range: (lo, hi), lo < hi, public bounds every value is clipped to.
      delta: delta in (0, 1) of the release.
      epsilon: the release's epsilon (z calibrated); or give `noise_multiplier` z.
      variance_floor: the smallest variance returned (noise can make the estimate negative).
      seed: int for tests; None draws the noise from OS entropy.

    Raises:
      ValueError: a bad argument (named).
    """
    x, lo, hi = _checked_values(values, clip_range)
    z = _checked_noise_multiplier(delta=delta, epsilon=epsilon, noise_multiplier=noise_multiplier)
    d = x.shape[1]
    centre, radius = (lo + hi) / 2, (hi - lo) / 2
    scaled = (np.clip(x, lo, hi) - centre) / radius  # |scaled| <= 1
    std = float(z) * math.sqrt(1 + 2 * d)
    rng = np.random.default_rng(seed)
    count = max(1.0, x.shape[0] + rng.normal(0.0, std))
    s1 = scaled.sum(axis=0) + rng.normal(0.0, std, d)
    s2 = (scaled**2).sum(axis=0) + rng.normal(0.0, std, d)
    mean = np.clip(s1 / count, -1.0, 1.0)
    variance = np.maximum((s2 / count - mean**2) * radius**2, variance_floor)
    spent = gaussian_release_epsilon(float(z), delta=delta) if epsilon is None else epsilon
    return NormalizationStatistics(
        mean=centre + radius * mean,
        variance=variance,
        noise_multiplier=float(z),
        noise_std=std,
        clip_range=(lo, hi),
        epsilon=float(spent),
        delta=float(delta),
        name=name,
    )


def _checked_values(values, clip_range: tuple) -> tuple:
    """(values as float64 `[n, d]`, lo, hi); refuses an empty or badly shaped `values`, a bad `clip_range`."""
    x = np.asarray(values, np.float64)
    x = x[:, None] if x.ndim == 1 else x
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"`values` must be [n] or [n, d] with n >= 1; received shape {np.shape(values)}.")
    lo, hi = (float(v) for v in clip_range)
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError(f"`clip_range` must be finite (lo, hi) with lo < hi; received {clip_range!r}.")
    return x, lo, hi


def _checked_noise_multiplier(*, delta: float, epsilon: float | None, noise_multiplier: float | None) -> float:
    """The release's z: `noise_multiplier`, or calibrated to (`epsilon`, `delta`); bad arguments refused."""
    if not 0 < delta < 1:
        raise ValueError(f"`delta` must lie in (0, 1); received {delta!r}.")
    if (epsilon is None) == (noise_multiplier is None):
        raise ValueError("Pass exactly one of `epsilon` and `noise_multiplier`.")
    if epsilon is not None and not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"`epsilon` must be a finite number > 0; received {epsilon!r}.")
    z = (
        float(cast(float, noise_multiplier))
        if epsilon is None
        else release_noise_multiplier(epsilon=epsilon, delta=delta)
    )
    if not (z > 0 and math.isfinite(z)):
        raise ValueError(f"`noise_multiplier` must be a finite number > 0; received {noise_multiplier!r}.")
    return z


__all__ = ["NormalizationStatistics", "dp_normalization_statistics"]
