"""The secret sharer audit end to end: score canaries and candidates, exposure per insertion count.

Model-agnostic: the model enters only through a scoring callable

    score_fn(contexts int32 [b, L], labels int32 [b]) -> log-probabilities float [b]

(higher = likelier; for a two-tower softmax model, log p(label | context)).
Nothing here imports TensorFlow.

Example (ml-100k: items 1..1682; `pipelines.movielens` trains the model):
    >>> items = np.arange(1, 1683)
    >>> canaries = generate_canaries(item_ids=items, context_length=20, seed=0)
    >>> result = movielens.train_and_evaluate(config, extra_train_examples=canaries.training_examples())
    >>> candidates = sample_candidates(item_ids=items, context_length=20,
    ...                                num_candidates=16384, seed=1, exclude=canaries)
    >>> audit = secret_sharer_audit(result.log_probs, canaries=canaries, candidates=candidates)
    >>> audit.summary()["by_insertion_count"]["100"]["mean_exposure"]

References: Carlini et al., "The Secret Sharer", USENIX Security 2019, §4;
Berlowitz et al., "EANA", RecSys 2022, §2.3, §4.1.3, Fig. 5.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from tfdp_embed._checks import check_int
from tfdp_embed.audit.canaries import CanarySet, RandomSequences
from tfdp_embed.audit.exposure import (
    ScoreDistribution,
    check_scores,
    fit_score_distribution,
    rank_exposure,
)

ScoreFn = Callable[[np.ndarray, np.ndarray], np.ndarray]

#: Expected rank exposure of a canary that is ranked like a random candidate (m uniform on 1..n+1):
#: E[-log2 U] = 1 / ln 2 for U uniform on (0, 1]; the chance level, not 0.
CHANCE_EXPOSURE_BITS = 1.0 / math.log(2.0)


def score_sequences(score_fn: ScoreFn, sequences: RandomSequences, *, batch_size: int = 4096) -> np.ndarray:
    """Calls `score_fn` on the sequences in batches and checks what comes back.

    Args:
      score_fn: (contexts int32 [b, L], labels int32 [b]) -> [b] log-probabilities.
      sequences: canaries or candidates.
      batch_size: sequences per call (>= 1).

    Returns:
      float64 [len(sequences)].

    Raises:
      ValueError: when `score_fn` returns the wrong number of scores, a shape
        other than [b], or non-finite values; or on batch_size < 1.
    """
    batch_size = check_int("batch_size", batch_size)
    pieces = []
    for start in range(0, len(sequences), batch_size):
        contexts = sequences.contexts[start : start + batch_size]
        labels = sequences.labels[start : start + batch_size]
        scores = np.asarray(score_fn(contexts, labels), dtype=np.float64)
        if scores.shape != labels.shape:
            raise ValueError(
                f"`score_fn` must return one log-probability per sequence, shape {labels.shape}; "
                f"returned shape {scores.shape}."
            )
        pieces.append(scores)
    return check_scores("score_fn(...) output", np.concatenate(pieces) if pieces else np.zeros(0))


def summarize_exposure(insertion_counts, exposure, extrapolated_exposure=None) -> dict:
    """Mean / median / min / max exposure per insertion count, JSON-able (keys are str(count)).

    Args:
      insertion_counts: [k] ints, the count of each canary.
      exposure: [k] rank exposures.
      extrapolated_exposure: optional [k] extrapolated exposures.

    Returns:
      {str(count): {"num_canaries", "mean_exposure", "median_exposure",
      "min_exposure", "max_exposure"[, "mean_extrapolated_exposure",
      "median_extrapolated_exposure", "max_extrapolated_exposure"]}}, counts ascending.

    Raises:
      ValueError: on arrays of different lengths or empty input.
    """
    counts = np.asarray(insertion_counts).reshape(-1)
    exposure = check_scores("exposure", exposure)
    if counts.shape != exposure.shape:
        raise ValueError(
            f"`insertion_counts` ({counts.size}) and `exposure` ({exposure.size}) must have one value per canary."
        )
    extra = None
    if extrapolated_exposure is not None:
        extra = check_scores("extrapolated_exposure", extrapolated_exposure)
        if extra.shape != exposure.shape:
            raise ValueError(
                f"`extrapolated_exposure` ({extra.size}) must have one value per canary ({exposure.size})."
            )
    summary = {}
    for count in sorted(set(counts.tolist())):
        mask = counts == count
        row = {
            "num_canaries": int(mask.sum()),
            "mean_exposure": float(exposure[mask].mean()),
            "median_exposure": float(np.median(exposure[mask])),
            "min_exposure": float(exposure[mask].min()),
            "max_exposure": float(exposure[mask].max()),
        }
        if extra is not None:
            row.update(
                mean_extrapolated_exposure=float(extra[mask].mean()),
                median_extrapolated_exposure=float(np.median(extra[mask])),
                max_extrapolated_exposure=float(extra[mask].max()),
            )
        summary[str(int(count))] = row
    return summary


@dataclasses.dataclass(frozen=True)
class SecretSharerAudit:
    """Exposure of every canary of one trained model.

    Attributes:
      insertion_counts: [k] copies of each canary in the training data.
      canary_scores: [k] log-probabilities of the canaries.
      candidate_scores: [n] log-probabilities of the candidates.
      exposure: [k] rank exposure, log2(n) - log2(m).
      extrapolated_exposure: [k] -log2 of the fitted tail probability.
      fit: the distribution fitted to the candidate scores.
      ties: the tie rule of the ranks.
    """

    insertion_counts: np.ndarray
    canary_scores: np.ndarray
    candidate_scores: np.ndarray
    exposure: np.ndarray
    extrapolated_exposure: np.ndarray
    fit: ScoreDistribution
    ties: str

    @property
    def num_candidates(self) -> int:
        return int(self.candidate_scores.size)

    def summary(self) -> dict:
        """JSON-able: n, the rank exposure ceiling log2(n), the chance level, the fit, per count stats."""
        return {
            "num_candidates": self.num_candidates,
            "max_rank_exposure": math.log2(self.num_candidates),
            "chance_exposure": CHANCE_EXPOSURE_BITS,
            "ties": self.ties,
            "fit": self.fit.as_dict(),
            "by_insertion_count": summarize_exposure(self.insertion_counts, self.exposure, self.extrapolated_exposure),
        }

    def as_dict(self) -> dict:
        """`summary()` plus the per-canary values (not the candidates' scores)."""
        return {
            **self.summary(),
            "per_canary": {
                "insertion_counts": self.insertion_counts.tolist(),
                "log_prob": self.canary_scores.tolist(),
                "exposure": self.exposure.tolist(),
                "extrapolated_exposure": self.extrapolated_exposure.tolist(),
            },
        }


def secret_sharer_audit(
    score_fn: ScoreFn,
    *,
    canaries: CanarySet,
    candidates: RandomSequences,
    ties: str = "ahead",
    distribution: str = "skewnorm",
    batch_size: int = 4096,
) -> SecretSharerAudit:
    """Scores canaries and candidates with `score_fn` and computes both exposures.

    Args:
      score_fn: (contexts, labels) -> log-probabilities, see the module docstring.
      canaries: the inserted canaries (`generate_canaries`).
      candidates: non-inserted sequences from the same distribution
        (`sample_candidates(..., exclude=canaries)`), at least 3.
      ties: tie rule of the ranks ("ahead", "behind", "mid"; see `canary_ranks`).
      distribution: fit for extrapolation ("skewnorm" or "normal").
      batch_size: sequences per `score_fn` call.

    Returns:
      A `SecretSharerAudit`.

    Raises:
      ValueError: when canaries and candidates have different context lengths,
        a candidate equals a canary, or on bad scores (see `score_sequences`).

    References: Carlini et al. 2019 §4; EANA (RecSys 2022) §2.3, §4.1.3.
    """
    if canaries.contexts.shape[1:] != candidates.contexts.shape[1:]:
        raise ValueError(
            f"canaries (contexts {canaries.contexts.shape}) and candidates (contexts "
            f"{candidates.contexts.shape}) must have the same context length."
        )
    if canaries.keys() & candidates.keys():
        raise ValueError(
            "some candidates equal an inserted canary: candidates must be non-inserted; draw them with "
            "`sample_candidates(..., exclude=canaries)`."
        )
    canary_scores = score_sequences(score_fn, canaries, batch_size=batch_size)
    candidate_scores = score_sequences(score_fn, candidates, batch_size=batch_size)
    fit = fit_score_distribution(candidate_scores, distribution=distribution)
    return SecretSharerAudit(
        insertion_counts=np.asarray(canaries.insertion_counts),
        canary_scores=canary_scores,
        candidate_scores=candidate_scores,
        exposure=rank_exposure(canary_scores, candidate_scores, ties=ties),
        extrapolated_exposure=fit.exposure(canary_scores),
        fit=fit,
        ties=ties,
    )


__all__ = [
    "CHANCE_EXPOSURE_BITS",
    "ScoreFn",
    "SecretSharerAudit",
    "score_sequences",
    "secret_sharer_audit",
    "summarize_exposure",
]
