"""The dataset size released with DP: N~ = round(N + N(0, z^2)), the only N a report, plan or file ever holds.

Under add-or-remove adjacency N itself differs between neighbours: a report
stating N exactly (or anything it fixes: q = B / N, delta = 1 / N, q N,
steps = epochs N / B) tells whoever reads it whether the target is in.
One convention for every pipeline: the count of privacy units is released
once with Gaussian noise (sensitivity 1: one unit changes the count by one;
the sizes of disjoint parts, e.g. streaming periods, as one vector of L2
sensitivity 1), charged to the run's budget as a setup event of the ledger
(`Release.dataset_size`), and everything planned or reported from N is
computed from N~ (post-processing). The exact N stays in memory: the
samplers need it, and `expected_batch_size = q N` stays a private scale.

    size = release_dataset_size(n)                       # OS entropy; noise std DEFAULT_NOISE_MULTIPLIER
    plan = plan_run(..., target_delta=size.delta(), sampling_probability=size.sampling_probability(B),
                    steps=size.steps(epochs, B), releases=[Release.dataset_size(size), ...])
    report = plan.report(dataset_size=size, ...)         # N~, never N

References: Dwork & Roth 2014 §3.5 (Gaussian mechanism, post-processing);
Ponomareva et al., "How to DP-fy ML", JAIR 2023, §5.3 (what a statement reports).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import dp_accounting
import numpy as np

DATASET_SIZE = "dataset_size"
DEFAULT_NOISE_MULTIPLIER = 20.0
"""Noise std of N~ (sensitivity 1): +-20 units moves q by a few percent at 1,000 units; its RDP cost is a/800."""

CONVENTION = (
    "add-or-remove adjacency; the number of privacy units N is not released: the report's dataset_size is "
    "N + Gaussian noise (std {z:g}, sensitivity 1, a setup event of the ledger), and q, delta, steps and the "
    "expected batch size are computed from it"
)
PUBLIC_N_ASSUMPTION = (
    "the dataset size N stated in this report is public: under add-or-remove adjacency N differs between "
    "neighbouring datasets, and the report states it exactly (release it with tfdp_embed.release_dataset_size)"
)


@dataclasses.dataclass(frozen=True)
class ReleasedDatasetSize:
    """N~: the dataset size (or the sizes of disjoint parts) with Gaussian noise, and its ledger event.

    Attributes:
      values: N~ of each part (one for a plain run), each >= 1.
      noise_multiplier: z, the noise std (the sensitivity is 1).
      seeded: True when the draw was seeded (the report then says so).
    """

    values: tuple
    noise_multiplier: float
    seeded: bool = False
    _exact: tuple = dataclasses.field(default=(), repr=False, compare=False)

    @property
    def value(self) -> int:
        """N~ of the whole dataset (the sum over parts)."""
        return int(sum(self.values))

    @property
    def event(self) -> dp_accounting.DpEvent:
        """`GaussianDpEvent(z)`: the release's cost (L2 sensitivity 1)."""
        return dp_accounting.GaussianDpEvent(self.noise_multiplier)

    def delta(self) -> float:
        """delta = 1 / N~ (the usual default; N~ is DP, so this delta is too)."""
        return 1.0 / self.value

    def sampling_probability(self, batch_size: float, part: int | None = None) -> float:
        """q = min(1, B / N~) (of part `part`, else of the whole dataset)."""
        n = self.value if part is None else int(self.values[part])
        return min(1.0, float(batch_size) / n)

    def steps(self, epochs: int, batch_size: float, part: int | None = None) -> int:
        """T = epochs x max(1, round(N~ / B))."""
        n = self.value if part is None else int(self.values[part])
        return int(epochs) * max(1, round(n / float(batch_size)))

    def matches(self, exact: int | Sequence[int]) -> bool:
        """True if this release was drawn from `exact` (the caller's N, checked in memory, never written)."""
        parts = (int(exact),) if isinstance(exact, (int, np.integer)) else tuple(int(n) for n in exact)
        return parts == self._exact or (len(parts) == 1 and parts[0] == sum(self._exact))

    def exact_total(self) -> int:
        """The exact N, for computations that need it (the truncation delta): never write it anywhere."""
        return int(sum(self._exact))

    def report(self) -> dict:
        """The report's fields: N~ and how it was released (no exact N, no seed)."""
        return {
            "dataset_size": self.value,
            "dataset_size_release": {
                "mechanism": "gaussian",
                "noise_multiplier": self.noise_multiplier,
                "sensitivity": 1,
                "parts": [int(v) for v in self.values] if len(self.values) > 1 else None,
                "convention": CONVENTION.format(z=self.noise_multiplier),
            },
        }


def release_dataset_size(
    num_units: int | Sequence[int], *, noise_multiplier: float = DEFAULT_NOISE_MULTIPLIER, seed: int | None = None
) -> ReleasedDatasetSize:
    """Releases the number of privacy units with Gaussian noise: N~ = max(1, round(N + z g)), g ~ N(0, 1).

    Args:
      num_units: N (examples, or users for user-level DP), or the sizes of
        disjoint parts (streaming periods): one draw each, one event (the
        vector's L2 sensitivity is 1 when every unit is in one part).
      noise_multiplier: z > 0, the noise std.
      seed: None (OS entropy) for a release; an int for tests only: whoever
        knows it recovers N exactly.

    Returns:
      A `ReleasedDatasetSize`; charge it with `Release.dataset_size(size)`.

    Raises:
      ValueError: a count < 1 or a bad `noise_multiplier`.

    Example:
      >>> size = release_dataset_size(60_000)
      >>> q = size.sampling_probability(256)
    """
    parts = (num_units,) if isinstance(num_units, (int, np.integer)) else tuple(num_units)
    if not parts or any(isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1 for n in parts):
        raise ValueError(f"`num_units` must be an int >= 1 or a non-empty sequence of them; received {num_units!r}.")
    z = float(noise_multiplier)
    if not (z > 0 and math.isfinite(z)):
        raise ValueError(f"`noise_multiplier` must be a finite number > 0; received {noise_multiplier!r}.")
    rng = np.random.default_rng(seed)
    noisy = tuple(max(1, int(round(int(n) + z * rng.standard_normal()))) for n in parts)
    return ReleasedDatasetSize(noisy, z, seeded=seed is not None, _exact=tuple(int(n) for n in parts))


__all__ = [
    "CONVENTION",
    "DATASET_SIZE",
    "DEFAULT_NOISE_MULTIPLIER",
    "PUBLIC_N_ASSUMPTION",
    "ReleasedDatasetSize",
    "release_dataset_size",
]
