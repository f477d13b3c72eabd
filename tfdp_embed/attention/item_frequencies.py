"""Item frequencies p_i for Re-Attention: public by assumption, or released with DP.

DPFormer (Remark A.2) assumes the frequencies are public (purchase counts
are shown on many platforms). Without that assumption, the per-item user
counts are released once with a Gaussian or Laplace mechanism and the
release is one more `dp_accounting` event composed with training:

    count_i = |{u : item i in u's training input}|           (each user: at most L distinct items)
    Gaussian: count_i + N(0, (z sqrt(L))^2)                  L2 sensitivity sqrt(L)
    Laplace:  count_i + Lap(z L)                             L1 sensitivity L
    p_i = max(noisy count_i, 0) / N

under add/remove-one-user adjacency (N, the number of users, is treated as
public, as everywhere in the privacy report). The event is
`GaussianDpEvent(z)` or `LaplaceDpEvent(z)`.

Example:
    >>> freq = private_item_frequencies(counts, num_users=31013, max_items_per_user=50,
    ...                                 noise_multiplier=20.0, seed=None)
    >>> ledger.record_setup(freq.event)

References: DPFormer Remark A.2, Claim 4.4; Dwork & Roth 2014 §3.3, §3.5.
"""

from __future__ import annotations

import dataclasses
import math

import dp_accounting
import numpy as np

MECHANISMS = ("gaussian", "laplace")


@dataclasses.dataclass(frozen=True)
class ItemFrequencies:
    """p_i and how they were obtained.

    Attributes:
      frequencies: float64 `[V + 1]` p_i in [0, 1] (index 0: padding, 0).
      source: "public" or "private-gaussian" / "private-laplace".
      event: the `dp_accounting.DpEvent` of the release (None when public).
      noise_multiplier: z (None when public).
      noise_std: the noise std added to each count (None when public).
    """

    frequencies: np.ndarray
    source: str
    event: dp_accounting.DpEvent | None = None
    noise_multiplier: float | None = None
    noise_std: float | None = None

    def report(self) -> dict:
        return {
            "source": self.source,
            "noise_multiplier": self.noise_multiplier,
            "noise_std": self.noise_std,
            "dp_event": None if self.event is None else repr(self.event),
        }


def _check_counts(counts, num_users) -> np.ndarray:
    counts = np.asarray(counts)
    if counts.ndim != 1 or counts.size < 2 or np.any(counts < 0):
        raise ValueError(f"`counts` must be a 1-D array [items + 1] of counts >= 0; received shape {counts.shape}.")
    if isinstance(num_users, bool) or not isinstance(num_users, (int, np.integer)) or num_users < 1:
        raise ValueError(f"`num_users` must be an int >= 1; received {num_users!r}.")
    if counts.max() > num_users:
        raise ValueError(f"A count ({counts.max()}) exceeds `num_users`={num_users}: counts must count users.")
    return counts.astype(np.float64)


def public_item_frequencies(counts, *, num_users: int) -> ItemFrequencies:
    """p_i = count_i / N, treated as public (DPFormer Remark A.2): no privacy cost is accounted."""
    counts = _check_counts(counts, num_users)
    freq = counts / num_users
    freq[0] = 0.0
    return ItemFrequencies(frequencies=freq, source="public")


def private_item_frequencies(
    counts,
    *,
    num_users: int,
    max_items_per_user: int,
    noise_multiplier: float,
    mechanism: str = "gaussian",
    seed: int | None = None,
) -> ItemFrequencies:
    """Releases p_i with the Gaussian (or Laplace) mechanism; returns them with their DP event.

    Args:
      counts: `[V + 1]` users per item (each user counted once per item).
      num_users: N.
      max_items_per_user: L, the most distinct items one user adds to (the
        training input length): the sensitivity is sqrt(L) (L2) or L (L1).
      noise_multiplier: z > 0, noise std (Gaussian) or scale (Laplace) per unit sensitivity.
      mechanism: "gaussian" or "laplace".
      seed: int for tests; None draws from OS entropy.

    Returns:
      `ItemFrequencies` with `event` = `GaussianDpEvent(z)` / `LaplaceDpEvent(z)`.

    Raises:
      ValueError: bad counts, a non-positive multiplier or L, an unknown mechanism.
    """
    counts = _check_counts(counts, num_users)
    if isinstance(max_items_per_user, bool) or not isinstance(max_items_per_user, (int, np.integer)) or max_items_per_user < 1:
        raise ValueError(f"`max_items_per_user` must be an int >= 1; received {max_items_per_user!r}.")
    if not (noise_multiplier > 0 and math.isfinite(noise_multiplier)):
        raise ValueError(f"`noise_multiplier` must be a finite number > 0; received {noise_multiplier!r}.")
    if mechanism not in MECHANISMS:
        raise ValueError(f"`mechanism` must be one of {MECHANISMS}; received {mechanism!r}.")
    rng = np.random.default_rng(seed)
    if mechanism == "gaussian":
        std = noise_multiplier * math.sqrt(max_items_per_user)
        noisy = counts + rng.normal(0.0, std, size=counts.shape)
        event = dp_accounting.GaussianDpEvent(float(noise_multiplier))
    else:
        scale = noise_multiplier * max_items_per_user
        noisy = counts + rng.laplace(0.0, scale, size=counts.shape)
        std = scale * math.sqrt(2.0)
        event = dp_accounting.LaplaceDpEvent(float(noise_multiplier))
    freq = np.clip(noisy, 0.0, num_users) / num_users
    freq[0] = 0.0
    return ItemFrequencies(
        frequencies=freq,
        source=f"private-{mechanism}",
        event=event,
        noise_multiplier=float(noise_multiplier),
        noise_std=float(std),
    )


__all__ = ["MECHANISMS", "ItemFrequencies", "private_item_frequencies", "public_item_frequencies"]
