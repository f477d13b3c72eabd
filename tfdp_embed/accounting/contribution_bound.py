"""A per-unit contribution bound k released with DP: a noisy quantile of the examples per unit.

User-level DP bounds what one unit brings to a step: at most k of its
examples. A k read from the exact counts (their median, say) tells whoever
reads the report something about the users, outside epsilon. Released here
instead, with the Gaussian mechanism on a histogram:

    h_j = #{units u : 2^j <= n_u < 2^(j+1)},  j = 0 .. J-1,   h_J = #{u : n_u >= max_bound = 2^J}
    h~_j = h_j + N(0, z^2)                    one unit adds 1 to one bucket: L2 sensitivity 1
    k = 2^j* for the first j* with  sum_{i<=j*} max(h~_i, 0) / sum_i max(h~_i, 0) >= quantile

k is the lower edge of the bucket holding the noisy quantile (post-processing
of h~). When every h~_j <= 0 the histogram says nothing, and k = `max_bound`
(the fallback: no unit's examples are truncated below max_bound; the clip
still bounds each unit). The release is one `GaussianDpEvent(z)`, charged to
the run's budget as a setup event (`Release.contribution_bound`).

    bound = release_contribution_bound(examples_per_user)   # OS entropy; z = DEFAULT_NOISE_MULTIPLIER
    plan = plan_run(..., releases=[Release.dataset_size(size), Release.contribution_bound(bound)])
    k = bound.value

References: Dwork & Roth 2014 §3.5 (Gaussian mechanism, post-processing);
Amin et al., "Bounding user contributions", ICML 2019 (choosing the bound);
Chua et al., "Mind the Privacy Unit!", COLM 2024 §3 (k at user level).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import dp_accounting
import numpy as np

CONTRIBUTION_BOUND = "contribution_bound"
DEFAULT_QUANTILE = 0.75
"""Three units in four bring all their examples up to the bucket's edge (the rest are truncated at k)."""
DEFAULT_MAX_BOUND = 1024
DEFAULT_NOISE_MULTIPLIER = 10.0
"""z of the bucket counts: alone (rho = 1/(2 z^2) = 0.005)-zCDP; the accountant composes it with the steps."""
_STREAM = 0xC0B0  # a noise stream of its own: a seed shared with `release_dataset_size` draws other noise


def bucket_edges(max_bound: int = DEFAULT_MAX_BOUND) -> tuple:
    """The buckets' lower edges 1, 2, 4, ..., max_bound (the last bucket is [max_bound, infinity)).

    Raises:
      ValueError: `max_bound` not a power of two >= 1.
    """
    if isinstance(max_bound, bool) or not isinstance(max_bound, (int, np.integer)) or max_bound < 1:
        raise ValueError(f"`max_bound` must be a power of two >= 1 (an int); received {max_bound!r}.")
    if int(max_bound) & (int(max_bound) - 1):
        raise ValueError(f"`max_bound` must be a power of two (1, 2, 4, ..., 1024, ...); received {max_bound!r}.")
    return tuple(2**j for j in range(int(max_bound).bit_length()))


def bucket_counts(examples_per_unit, *, max_bound: int = DEFAULT_MAX_BOUND) -> np.ndarray:
    """The exact histogram h over `bucket_edges(max_bound)`: never write it anywhere (it is what gets noised).

    Raises:
      ValueError: an empty input, a count that is not an int >= 1, or a bad `max_bound`.
    """
    edges = bucket_edges(max_bound)
    counts = _checked_counts(examples_per_unit)
    index = np.minimum(np.floor(np.log2(counts)).astype(np.int64), len(edges) - 1)  # n in [2^j, 2^(j+1)) -> j
    return np.bincount(index, minlength=len(edges)).astype(np.int64)


@dataclasses.dataclass(frozen=True)
class ReleasedContributionBound:
    """k: the bucket edge of a noisy quantile of the examples per unit, and its ledger event.

    Attributes:
      value: k, a power of two in [1, max_bound].
      quantile: the quantile q in (0, 1) of the examples per unit that k targets.
      noise_multiplier: z, the noise std of each bucket count (the sensitivity is 1).
      edges: the buckets' lower edges (1, 2, 4, ..., max_bound).
      noisy_counts: h~, the released bucket counts (DP; before clamping at 0).
      fallback: True when every h~_j <= 0 and k is `max_bound` (no quantile could be read).
      seeded: True when the draw was seeded (the report then says so).
    """

    value: int
    quantile: float
    noise_multiplier: float
    edges: tuple
    noisy_counts: tuple
    fallback: bool = False
    seeded: bool = False

    @property
    def event(self) -> dp_accounting.GaussianDpEvent:
        """`GaussianDpEvent(z)`: the release's cost (one unit moves one bucket by 1: L2 sensitivity 1)."""
        return dp_accounting.GaussianDpEvent(self.noise_multiplier)

    def describe(self) -> str:
        """How k was chosen, in the report's words (no exact count)."""
        edges = [str(e) for e in self.edges]
        shown = ", ".join(edges if len(edges) <= 4 else [*edges[:3], "...", edges[-1]])
        how = (
            f"every noisy count <= 0: k = max_bound {self.value} (the fallback)"
            if self.fallback
            else f"k = {self.value}, the lower edge of the bucket where the noisy cumulative share first reaches "
            f"{self.quantile:g}"
        )
        return (
            f"released with DP: quantile {self.quantile:g} of examples per user, noise z {self.noise_multiplier:g} "
            f"(Gaussian, sensitivity 1) on the count of units in power-of-two buckets with edges {shown}+; {how}"
        )

    def report(self) -> dict:
        """The report's record of the release (no exact counts, no seed)."""
        return {
            "mechanism": "gaussian",
            "value": self.value,
            "quantile": self.quantile,
            "noise_multiplier": self.noise_multiplier,
            "sensitivity": 1,
            "bucket_edges": list(self.edges),
            "fallback": self.fallback,
            "seeded": self.seeded,
        }


def release_contribution_bound(
    examples_per_unit,
    *,
    quantile: float = DEFAULT_QUANTILE,
    noise_multiplier: float = DEFAULT_NOISE_MULTIPLIER,
    max_bound: int = DEFAULT_MAX_BOUND,
    seed: int | None = None,
) -> ReleasedContributionBound:
    """Releases k = 2^j*, the bucket edge of the noisy `quantile` of the examples per unit (see the module).

    Args:
      examples_per_unit: each unit's number of examples (ints >= 1), e.g. per user.
      quantile: q in (0, 1): k is the lower edge of the bucket where the noisy cumulative share reaches q.
      noise_multiplier: z > 0, the noise std of each bucket count.
      max_bound: the largest k, a power of two; units with more examples share the last bucket.
      seed: None (OS entropy) for a release; an int for tests only: whoever knows it recovers the counts.

    Returns:
      A `ReleasedContributionBound`; charge it with `Release.contribution_bound(bound)`.

    Raises:
      ValueError: an empty input, a count that is not an int >= 1, a `quantile` outside (0, 1), a bad
        `noise_multiplier` or `max_bound`.

    Example:
      >>> bound = release_contribution_bound([20, 64, 150, 700])
      >>> k = bound.value
    """
    q = _checked_quantile(quantile)
    z = float(noise_multiplier) if isinstance(noise_multiplier, (int, float, np.number)) else math.nan
    if isinstance(noise_multiplier, bool) or not (z > 0 and math.isfinite(z)):
        raise ValueError(f"`noise_multiplier` must be a finite number > 0; received {noise_multiplier!r}.")
    exact = bucket_counts(examples_per_unit, max_bound=max_bound)
    edges = bucket_edges(max_bound)
    rng = np.random.default_rng(None if seed is None else (int(seed), _STREAM))
    noisy = exact + z * rng.standard_normal(len(edges))
    value, fallback = _quantile_edge(noisy, edges, q)
    return ReleasedContributionBound(
        value, q, z, edges, tuple(float(c) for c in noisy), fallback=fallback, seeded=seed is not None
    )


def _quantile_edge(noisy: np.ndarray, edges: Sequence[int], quantile: float) -> tuple:
    """(k, fallback): the lower edge of the first bucket whose clamped cumulative share reaches `quantile`."""
    clamped = np.maximum(noisy, 0.0)
    total = float(clamped.sum())
    if total <= 0.0:
        return int(edges[-1]), True
    shares = np.cumsum(clamped) / total
    j = int(np.argmax(shares >= quantile))  # the last share is 1 > quantile: always found
    return int(edges[j]), False


def _checked_quantile(quantile) -> float:
    if isinstance(quantile, bool) or not isinstance(quantile, (int, float, np.number)) or not 0 < quantile < 1:
        raise ValueError(f"`quantile` must be a number in (0, 1) (exclusive); received {quantile!r}.")
    return float(quantile)


def _checked_counts(examples_per_unit) -> np.ndarray:
    counts = np.asarray(examples_per_unit)
    if counts.ndim != 1 or counts.size == 0:
        raise ValueError(
            f"`examples_per_unit` must be a non-empty 1-D sequence of ints >= 1 (one per unit); received "
            f"{_short(examples_per_unit)}."
        )
    if counts.dtype == bool or not np.issubdtype(counts.dtype, np.integer):
        raise ValueError(
            f"`examples_per_unit` must hold ints (a count of examples per unit); received dtype {counts.dtype} "
            f"({_short(examples_per_unit)})."
        )
    if counts.min() < 1:
        raise ValueError(
            f"`examples_per_unit` must be >= 1 for every unit (a unit with no examples is not a unit); received "
            f"a count of {int(counts.min())}."
        )
    return counts.astype(np.int64)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


__all__ = [
    "CONTRIBUTION_BOUND",
    "DEFAULT_MAX_BOUND",
    "DEFAULT_NOISE_MULTIPLIER",
    "DEFAULT_QUANTILE",
    "ReleasedContributionBound",
    "bucket_counts",
    "bucket_edges",
    "release_contribution_bound",
]
