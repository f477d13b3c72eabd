"""Exposure of canaries (the secret sharer test): by rank among candidates, and extrapolated.

Scores are **log-probabilities** the model assigns to a sequence, higher =
likelier (for EANA's next-movie model: log p(label | context) under the full
softmax; the log-perplexity Carlini et al. rank by is its negative).

Rank exposure (EANA §2.3): with n non-inserted candidates,

    exposure = log2(n) - log2(m),   m = 1 + #{candidates ranked ahead of the canary}

so m = 1 (the canary is likelier than every candidate) gives the maximum,
log2(n), and m = n + 1 (less likely than all) gives log2(n / (n + 1)), just
below 0. A canary the model has not memorised has m roughly uniform on
1..n + 1 and expected exposure about log2(e) ~= 1.44 bits: that, not 0, is
the chance level. Ties: `ties="ahead"` (default) places candidates with
exactly the canary's score ahead of it, as Carlini et al.'s
Pr_t[Px(s[t]) <= Px(s[r])] does (the conservative choice: ties never raise
exposure); "behind" places them behind, "mid" counts half of them.

Extrapolated exposure (Carlini et al. §4.3, EANA §2.3 and Fig. 5b): rank
exposure saturates at log2(n). Fitting a distribution to the candidates'
scores and replacing m / n by its tail probability,

    exposure_extrapolated = -log2 Pr_{s ~ fit}[s >= canary score],

tells memorised canaries apart beyond log2(n). The default fit is a
skew-normal, as in Carlini et al. (fitting the log-perplexities -s is the same
family with the shape's sign flipped). Tail probabilities far below 1e-8 are
computed in log space (log density at the canary plus the log of the
integral of the density ratio over the tail), so they do not underflow.

Example:
    >>> candidates = np.random.default_rng(0).normal(size=4096)      # n = 4096: ceiling 12 bits
    >>> rank_exposure([0.0, 3.0, 6.0], candidates)                    # 1.04, 10.4, 12 (capped)
    >>> fit_score_distribution(candidates).exposure([0.0, 3.0, 6.0])  # 1.02, 9.45, 28.6 bits

References: Carlini et al., "The Secret Sharer", USENIX Security 2019, §4
(Definition 4 exposure; §4.2-4.3 estimation by sampling and by
extrapolation with a skew-normal fit); Berlowitz et al., "EANA", RecSys 2022,
§2.3 and Fig. 5.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import integrate, special, stats

TIES = ("ahead", "behind", "mid")
DISTRIBUTIONS = ("skewnorm", "normal")

_LN2 = math.log(2.0)
#: Below this tail probability the closed-form survival function loses digits; integrate in log space.
_DIRECT_TAIL_FLOOR = 1e-8


def check_scores(name: str, scores, *, min_size: int = 1) -> np.ndarray:
    """A 1-D float64 array of finite scores, or a ValueError naming the argument."""
    array = np.asarray(scores, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"`{name}` must be a 1-D array of scores (one per sequence); received shape {array.shape}.")
    if array.size < min_size:
        raise ValueError(f"`{name}` needs at least {min_size} score(s); received {array.size}.")
    bad = ~np.isfinite(array)
    if bad.any():
        raise ValueError(
            f"`{name}` must be finite log-probabilities; {int(bad.sum())} of {array.size} are NaN or infinite "
            f"(first at index {int(np.argmax(bad))}: {array[np.argmax(bad)]!r})."
        )
    return array


def _check_ties(ties: str) -> str:
    if ties not in TIES:
        raise ValueError(f"`ties` must be one of {TIES}; received {ties!r}.")
    return ties


def canary_ranks(canary_scores, candidate_scores, *, ties: str = "ahead") -> np.ndarray:
    """Rank m of each canary among the candidates: 1 + the number of candidates ahead of it.

    Args:
      canary_scores: [k] log-probabilities of the canaries (higher = likelier).
      candidate_scores: [n] log-probabilities of non-inserted candidates, n >= 1.
      ties: where candidates with exactly the canary's score go: "ahead"
        (default, Carlini et al.'s <=), "behind", or "mid" (half of them ahead).

    Returns:
      float64 [k], ranks in [1, n + 1] (half-integers possible with "mid").

    Raises:
      ValueError: on non-1-D or non-finite scores, no candidates, or an unknown `ties`.

    References: Carlini et al. 2019, Definition 3 (rank), §4.2; EANA §2.3.
    """
    canaries = check_scores("canary_scores", canary_scores)
    candidates = np.sort(check_scores("candidate_scores", candidate_scores))
    ties = _check_ties(ties)
    n = candidates.size
    # candidates strictly likelier than the canary / tied with it, by binary search on the sorted scores
    at_or_above = n - np.searchsorted(candidates, canaries, side="left")
    strictly_above = n - np.searchsorted(candidates, canaries, side="right")
    tied = at_or_above - strictly_above
    ahead = {
        "ahead": at_or_above,
        "behind": strictly_above,
        "mid": strictly_above + 0.5 * tied,
    }[ties]
    return 1.0 + np.asarray(ahead, dtype=np.float64)


def rank_exposure(canary_scores, candidate_scores, *, ties: str = "ahead") -> np.ndarray:
    """exposure = log2(n) - log2(m): EANA §2.3's exposure of each canary against n candidates.

    Args:
      canary_scores: [k] log-probabilities of the canaries.
      candidate_scores: [n] log-probabilities of non-inserted candidates, n >= 1.
      ties: see `canary_ranks`.

    Returns:
      float64 [k] in [log2(n / (n + 1)), log2(n)]; about 1.44 bits for a
      canary the model ranks like any random sequence.

    Raises:
      ValueError: as `canary_ranks`.

    References: EANA (RecSys 2022) §2.3; Carlini et al. 2019, Definition 4 and §4.2.
    """
    candidates = check_scores("candidate_scores", candidate_scores)
    ranks = canary_ranks(canary_scores, candidates, ties=ties)
    return math.log2(candidates.size) - np.log2(ranks)


@dataclasses.dataclass(frozen=True)
class ScoreDistribution:
    """A distribution fitted to the candidates' scores, for extrapolated exposure.

    Attributes:
      distribution: "skewnorm" or "normal".
      shape: skew-normal shape a (0 for "normal").
      loc: location.
      scale: scale (> 0).
      num_candidates: how many scores it was fitted to.
      ks_statistic: Kolmogorov-Smirnov distance between the fit and the
        candidates (how well the fit describes the bulk; says nothing about
        the far tail the extrapolation reaches into).
    """

    distribution: str
    shape: float
    loc: float
    scale: float
    num_candidates: int
    ks_statistic: float

    def _frozen(self):
        if self.distribution == "normal":
            return stats.norm(loc=self.loc, scale=self.scale)
        return stats.skewnorm(self.shape, loc=self.loc, scale=self.scale)

    def _logpdf(self, x: float) -> float:
        z = (x - self.loc) / self.scale
        base = -0.5 * z * z - 0.5 * math.log(2 * math.pi) - math.log(self.scale)
        if self.distribution == "normal":
            return base
        return math.log(2.0) + base + float(special.log_ndtr(self.shape * z))

    def log_tail(self, scores) -> np.ndarray:
        """ln Pr_{s ~ fit}[s >= score] for each score, accurate far into the upper tail.

        Raises:
          ValueError: on non-finite scores.
        """
        scores = check_scores("scores", scores)
        if self.distribution == "normal":
            return special.log_ndtr(-(scores - self.loc) / self.scale)
        with np.errstate(divide="ignore"):
            direct = np.log(self._frozen().sf(scores))
        out = np.array(direct, dtype=np.float64)
        for i in np.flatnonzero(~(direct > math.log(_DIRECT_TAIL_FLOOR))):
            out[i] = self._log_tail_by_integral(float(scores[i]))
        return out

    def _log_tail_by_integral(self, x: float) -> float:
        # ln SF(x) = ln f(x) + ln int_0^inf f(x + u) / f(x) du; the ratio is <= 1 and decays at least
        # like a Gaussian in u past the mode (log-concave density), so quad converges.
        at_x = self._logpdf(x)
        ratio, _ = integrate.quad(
            lambda u: math.exp(self._logpdf(x + u) - at_x),
            0.0,
            math.inf,
            epsabs=0.0,
            epsrel=1e-10,
            limit=200,
        )
        return at_x + math.log(ratio)

    def exposure(self, canary_scores) -> np.ndarray:
        """Extrapolated exposure -log2 Pr_{s ~ fit}[s >= canary score], in bits (not capped at log2 n)."""
        return -self.log_tail(canary_scores) / _LN2

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def fit_score_distribution(candidate_scores, *, distribution: str = "skewnorm") -> ScoreDistribution:
    """Fits a skew-normal (Carlini et al. §4.3) or a normal to the candidates' scores by maximum likelihood.

    Args:
      candidate_scores: [n] finite log-probabilities of non-inserted candidates,
        n >= 3, not all equal.
      distribution: "skewnorm" (default) or "normal".

    Returns:
      A `ScoreDistribution`.

    Raises:
      ValueError: on fewer than 3 scores, constant scores, non-finite scores or
        an unknown distribution.

    References: Carlini et al. 2019 §4.3 (skew-normal fit of log-perplexities);
    EANA (RecSys 2022) §2.3, Fig. 5b.
    """
    scores = check_scores("candidate_scores", candidate_scores, min_size=3)
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"`distribution` must be one of {DISTRIBUTIONS}; received {distribution!r}.")
    spread = float(np.std(scores))
    if not spread > 0:
        raise ValueError(
            "`candidate_scores` are all equal: no distribution can be fitted (the model gives every "
            "candidate the same score); use rank exposure only."
        )
    if distribution == "normal":
        shape, loc, scale = 0.0, float(np.mean(scores)), spread
    else:
        # Fit on standardised scores (the optimiser is scale-sensitive), then map back.
        center = float(np.mean(scores))
        shape, loc, scale = stats.skewnorm.fit((scores - center) / spread)
        shape, loc, scale = (
            float(shape),
            center + float(loc) * spread,
            float(scale) * spread,
        )
    fitted = ScoreDistribution(distribution, shape, loc, scale, int(scores.size), 0.0)
    ks = float(stats.kstest(scores, fitted._frozen().cdf).statistic)  # noqa: SLF001 - same module
    return dataclasses.replace(fitted, ks_statistic=ks)


def extrapolated_exposure(canary_scores, candidate_scores, *, distribution: str = "skewnorm") -> np.ndarray:
    """-log2 of the fitted tail probability at each canary's score (EANA Fig. 5b).

    Args:
      canary_scores: [k] log-probabilities of the canaries.
      candidate_scores: [n] log-probabilities of the candidates (n >= 3).
      distribution: "skewnorm" (default) or "normal".

    Returns:
      float64 [k] in bits; not capped at log2(n).

    Raises:
      ValueError: as `fit_score_distribution` and `check_scores`.
    """
    return fit_score_distribution(candidate_scores, distribution=distribution).exposure(canary_scores)


__all__ = [
    "DISTRIBUTIONS",
    "TIES",
    "ScoreDistribution",
    "canary_ranks",
    "check_scores",
    "extrapolated_exposure",
    "fit_score_distribution",
    "rank_exposure",
]
