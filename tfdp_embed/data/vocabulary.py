"""DP vocabularies: the key set of the training data (item ids, user ids, tokens) released with DP.

A vocabulary read off the training data names every key somebody holds: a
model that ships it (table shapes, an id map, a `StringLookup`) reveals that
a key held by one person occurs. `dp_vocabulary` releases the key set with
DP partition selection by Gaussian thresholding (one privacy unit, e.g. a
user, at a time):

    each unit keeps at most D0 of its distinct keys (the first D0 in the order given), each with weight 1/sqrt(D0)
    noisy_count(k) = sum_u w_u(k) + N(0, sigma^2)          (L2 sensitivity of the counts: 1)
    released = {k : noisy_count(k) > tau},  tau = 1/sqrt(D0) + sigma Phi^-1((1 - delta_thr)^(1/D0))

With `weighting="per_unit"` (Gopi et al.'s weighted Gaussian) a unit keeping
k <= D0 keys gives each 1/sqrt(k) instead (still L2 norm <= 1): units with few
keys count more, and D0 can be large; tau is then the smallest with
max_k [1 - Phi((tau - 1/sqrt(k)) / sigma)^k] <= delta_thr.

Keys no unit holds are never released, so a unit whose keys nobody else
holds can make at most its D0 keys appear; tau makes that happen with
probability <= delta_thr. The release is (eps, delta_gauss + delta_thr)-DP
where eps is the Gaussian mechanism's at delta_gauss
(`dp_accounting.GaussianDpEvent(sigma)`, composed by the accountant with the
rest of the run through a `Release`) and delta_thr is the threshold's. The
noisy counts are not released, only the set.

With a public catalogue (`public_vocabulary`) nothing is spent.

Example:
    >>> vocab = dp_vocabulary([[3, 5], [5, 9], [5]], max_keys_per_unit=2, epsilon=1.0, delta=1e-6)
    >>> vocab.keys          # usually empty: three users are far too few
    >>> ids = ItemIdMap(vocab.keys) if vocab.keys.size else None

References: Gopi, Gulhane, Kulkarni, Shen, Shokouhi, Yekhanin, "Differentially
private set union", ICML 2020, §3 (Gaussian weighting); Desfontaines, Voss,
Gipson, Mandayam, "Differentially private partition selection", PoPETs 2022, §2
(thresholding, the threshold delta).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable

import dp_accounting
import numpy as np
from scipy import stats

from tfdp_embed.accounting.one_off_releases import release_epsilon, release_noise_multiplier

PUBLIC = "public"
WEIGHTINGS = ("uniform", "per_unit")
_SMALL_SIGMA_FOR_PLD = 0.3
THRESHOLD_DELTA_SHARE = 0.5
"""Share of a standalone release's delta given to the threshold (the rest to the Gaussian mechanism)."""


@dataclasses.dataclass(frozen=True)
class DPVocabulary:
    """A released key set and what it cost.

    Attributes:
      keys: the selected keys, sorted (numpy array of the keys' type).
      source: "dp" (released with `dp_vocabulary`) or `PUBLIC` (a catalogue, nothing spent).
      name: the release's name in the plan and ledger.
      max_keys_per_unit: D0, the most keys one unit adds to (None for a public vocabulary).
      noise_multiplier: sigma of the counts (L2 sensitivity 1).
      threshold: tau, the noisy count a key must exceed.
      threshold_delta: delta_thr, the bound on P[a key held by one unit only is released].
      gaussian_delta: the delta at which `epsilon` is stated (the Gaussian mechanism's).
      epsilon: the release's epsilon alone, at `gaussian_delta`.
      candidate_keys: distinct keys the units held (after the D0 bound); internal, never released.
    """

    keys: np.ndarray
    source: str
    name: str = "vocabulary"
    max_keys_per_unit: int | None = None
    noise_multiplier: float | None = None
    threshold: float | None = None
    threshold_delta: float = 0.0
    gaussian_delta: float = 0.0
    epsilon: float = 0.0
    candidate_keys: int | None = None
    weighting: str = "uniform"

    @property
    def is_public(self) -> bool:
        return self.source == PUBLIC

    @property
    def event(self) -> dp_accounting.DpEvent | None:
        """`GaussianDpEvent(sigma)` of a DP release; None for a public vocabulary."""
        if self.is_public or self.noise_multiplier is None:
            return None
        return dp_accounting.GaussianDpEvent(float(self.noise_multiplier))

    @property
    def release(self):
        """The `planning.Release` to charge to a run's plan (its event; the threshold's delta is `threshold_delta`)."""
        from tfdp_embed.planning.releases import Release  # the planning package imports `tfdp_embed.data`

        return None if self.is_public else Release(self.name, event=self.event)

    @property
    def delta(self) -> float:
        """delta_gauss + delta_thr: the release's delta alone."""
        return self.gaussian_delta + self.threshold_delta

    def summary(self) -> dict:
        """For reports: what was released and at what cost (never the candidate count: it is not released)."""
        out = {"name": self.name, "source": self.source, "keys": int(self.keys.size)}
        if not self.is_public:
            out.update(
                max_keys_per_unit=self.max_keys_per_unit,
                noise_multiplier=self.noise_multiplier,
                threshold=self.threshold,
                threshold_delta=self.threshold_delta,
                epsilon=self.epsilon,
                gaussian_delta=self.gaussian_delta,
                mechanism="Gaussian thresholding (partition selection)",
                weighting=self.weighting,
            )
        return out


def public_vocabulary(keys, *, name: str = "vocabulary") -> DPVocabulary:
    """A vocabulary from a public catalogue (independent of the training data): nothing is spent."""
    keys = np.unique(np.asarray(list(keys) if not isinstance(keys, np.ndarray) else keys))
    return DPVocabulary(keys=keys, source=PUBLIC, name=name)


def vocabulary_threshold(
    *, noise_multiplier: float, max_keys_per_unit: int, threshold_delta: float, weighting: str = "uniform"
) -> float:
    """tau with P[any of a unit's one-unit keys passes] <= delta_thr (see the module docstring).

    uniform: tau = 1/sqrt(D0) + sigma Phi^-1((1 - delta_thr)^(1/D0)); per_unit: the largest such tau over k = 1..D0
    keys of weight 1/sqrt(k) each.
    """
    if weighting not in WEIGHTINGS:
        raise ValueError(f"`weighting` must be one of {WEIGHTINGS}; received {weighting!r}.")
    sizes = [max_keys_per_unit] if weighting == "uniform" else range(1, max_keys_per_unit + 1)

    def tau_for(k: int) -> float:
        per_key = -math.expm1(math.log1p(-threshold_delta) / k)  # 1 - (1 - delta_thr)^(1/k)
        return 1.0 / math.sqrt(k) + noise_multiplier * float(stats.norm.isf(per_key))

    return max(tau_for(k) for k in sizes)


def dp_vocabulary(
    keys_per_unit: Iterable[Iterable],
    *,
    max_keys_per_unit: int,
    delta: float,
    epsilon: float | None = None,
    noise_multiplier: float | None = None,
    threshold_delta: float | None = None,
    seed: int | None = None,
    name: str = "vocabulary",
    weighting: str = "uniform",
) -> DPVocabulary:
    """Releases the keys held by enough units with Gaussian thresholding (see the module docstring).

    Args:
      keys_per_unit: one iterable of keys per privacy unit (e.g. a user's item ids, most relevant first).
      max_keys_per_unit: D0 >= 1: a unit's first D0 distinct keys count, the rest are dropped.
      delta: the release's delta alone, delta_gauss + delta_thr, in (0, 1).
      epsilon: the release's epsilon at delta_gauss: sigma is calibrated for it. Or give
      noise_multiplier: sigma (e.g. planned by `plan_run` from a `Release` share); epsilon is then computed.
      threshold_delta: delta_thr < delta (default `THRESHOLD_DELTA_SHARE` x delta).
      seed: int for tests; None draws the noise from OS entropy.
      name: the release's name (plan, ledger, report).
      weighting: "uniform" (1/sqrt(D0) per key) or "per_unit" (1/sqrt(k) for a unit keeping k keys).

    Returns:
      A `DPVocabulary` (keys sorted).

    Raises:
      ValueError: a bad argument (named), or both / neither of `epsilon` and `noise_multiplier`.
    """
    d0 = _check_d0(max_keys_per_unit)
    delta, threshold_delta = _check_deltas(delta, threshold_delta)
    gaussian_delta = delta - threshold_delta
    sigma, epsilon = _noise(epsilon, noise_multiplier, gaussian_delta)
    tau = vocabulary_threshold(
        noise_multiplier=sigma, max_keys_per_unit=d0, threshold_delta=threshold_delta, weighting=weighting
    )
    candidates, counts = bounded_key_counts(keys_per_unit, max_keys_per_unit=d0, weighting=weighting)
    noisy = counts + np.random.default_rng(seed).normal(0.0, sigma, size=counts.shape)
    return DPVocabulary(
        keys=np.sort(candidates[noisy > tau]),
        source="dp",
        name=name,
        max_keys_per_unit=d0,
        noise_multiplier=sigma,
        threshold=tau,
        threshold_delta=threshold_delta,
        gaussian_delta=gaussian_delta,
        epsilon=epsilon,
        candidate_keys=int(candidates.size),
        weighting=weighting,
    )


def bounded_key_counts(
    keys_per_unit: Iterable[Iterable], *, max_keys_per_unit: int, weighting: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(distinct keys, their counts) after each unit keeps its first D0 distinct keys.

    weighting None: units holding each key; "uniform": that / sqrt(D0); "per_unit": sum of 1/sqrt(k_u).
    """
    d0 = _check_d0(max_keys_per_unit)
    if weighting is not None and weighting not in WEIGHTINGS:
        raise ValueError(f"`weighting` must be one of {WEIGHTINGS}; received {weighting!r}.")
    counts: dict = {}
    for unit in keys_per_unit:
        kept: dict = {}
        for key in unit:
            if len(kept) == d0:
                break
            kept.setdefault(key.item() if isinstance(key, np.generic) else key, None)
        size = d0 if weighting == "uniform" else len(kept) if weighting == "per_unit" else 1
        for key in kept:
            counts[key] = counts.get(key, 0) + 1 / math.sqrt(size)
    keys = np.asarray(list(counts))
    return keys, np.asarray(list(counts.values()), np.float64)


def _check_d0(value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"`max_keys_per_unit` must be an int >= 1 (D0, keys one unit adds to); received {value!r}.")
    return int(value)


def _check_deltas(delta, threshold_delta) -> tuple[float, float]:
    if not isinstance(delta, (int, float)) or not 0 < delta < 1:
        raise ValueError(f"`delta` must lie in (0, 1) (the release's delta alone); received {delta!r}.")
    if threshold_delta is None:
        threshold_delta = THRESHOLD_DELTA_SHARE * delta
    if not isinstance(threshold_delta, (int, float)) or not 0 < threshold_delta < delta:
        raise ValueError(
            f"`threshold_delta` must lie in (0, `delta`={delta!r}) (the threshold's part of delta); received "
            f"{threshold_delta!r}."
        )
    return float(delta), float(threshold_delta)


def _noise(epsilon, noise_multiplier, gaussian_delta: float) -> tuple[float, float]:
    """(sigma, epsilon at gaussian_delta) from exactly one of them."""
    if (epsilon is None) == (noise_multiplier is None):
        raise ValueError(
            "Pass exactly one of `epsilon` (sigma is calibrated) and `noise_multiplier`; received "
            f"epsilon={epsilon!r}, noise_multiplier={noise_multiplier!r}."
        )
    if noise_multiplier is None:
        if not isinstance(epsilon, (int, float)) or not (epsilon > 0 and math.isfinite(epsilon)):
            raise ValueError(f"`epsilon` must be a finite number > 0; received {epsilon!r}.")
        sigma = release_noise_multiplier(epsilon=float(epsilon), delta=gaussian_delta)
    else:
        if not isinstance(noise_multiplier, (int, float)) or not (
            noise_multiplier > 0 and math.isfinite(noise_multiplier)
        ):
            raise ValueError(f"`noise_multiplier` must be a finite number > 0; received {noise_multiplier!r}.")
        sigma = float(noise_multiplier)
    return sigma, gaussian_release_epsilon(sigma, delta=gaussian_delta)


@functools.lru_cache(maxsize=64)
def gaussian_release_epsilon(noise_multiplier: float, *, delta: float) -> float:
    """epsilon at `delta` of one `GaussianDpEvent(z)`: PLD, or RDP (never lower) when z is too small for PLD's grid."""
    accountant = "pld" if noise_multiplier >= _SMALL_SIGMA_FOR_PLD else "rdp"
    return release_epsilon(dp_accounting.GaussianDpEvent(float(noise_multiplier)), delta=delta, accountant=accountant)


def add_threshold_delta(report: dict, vocabulary: DPVocabulary | None, *, what: str) -> dict:
    """Adds `delta_with_vocabulary` (the report's delta + delta_thr) and its caveat for a DP key-set release.

    The threshold's delta_thr is not a `dp_accounting` event, so, like batch
    truncation's, it is stated beside delta. `what` names the key set in the
    caveat ("item vocabulary", "movie-id map"). Public vocabularies add nothing.
    """
    if vocabulary is None or vocabulary.is_public or report.get("delta") is None:
        return report
    report["delta_with_vocabulary"] = report["delta"] + vocabulary.threshold_delta
    report.setdefault("caveats", []).append(
        f"The {what} is a DP partition selection: besides epsilon's delta it adds delta_thr = "
        f"{vocabulary.threshold_delta:.3g} (the chance that a key only one unit holds is released); the run's "
        f"guarantee is (epsilon, {report['delta_with_vocabulary']:.3g}) (see delta_with_vocabulary)."
    )
    return report


__all__ = [
    "PUBLIC",
    "THRESHOLD_DELTA_SHARE",
    "DPVocabulary",
    "add_threshold_delta",
    "bounded_key_counts",
    "dp_vocabulary",
    "gaussian_release_epsilon",
    "public_vocabulary",
    "vocabulary_threshold",
]
