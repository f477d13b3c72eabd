"""Evaluation of a click model: exact ROC AUC and log loss over a whole stream.

    AUC = P(score of a random click > score of a random non-click) (ties count 1/2)
    logloss = -mean(y log p + (1 - y) log(1 - p))

Both are computed exactly from all predictions (no threshold buckets), in
numpy, after one pass over the evaluation data.

References: DP-FEST §4.1 (AUC is the reported metric).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterable

import numpy as np

from tfdp_embed import tf


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Exact ROC AUC (Mann-Whitney U with average ranks for ties).

    Args:
      labels: 0/1 array.
      scores: same length; any monotone score (logits or probabilities).

    Returns:
      AUC in [0, 1], or NaN when only one class is present.

    Example:
        >>> roc_auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.4, 0.35, 0.8]))
        0.75
    """
    labels = np.asarray(labels).reshape(-1).astype(bool)
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    if labels.shape != scores.shape:
        raise ValueError(f"`labels` and `scores` differ in length: {labels.size} vs {scores.size}.")
    positives = int(labels.sum())
    negatives = labels.size - positives
    if positives == 0 or negatives == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    ranks = np.empty(scores.size, dtype=np.float64)
    # Average rank (1-based) over each run of tied scores.
    boundaries = np.flatnonzero(np.diff(sorted_scores)) + 1
    starts = np.concatenate([[0], boundaries])
    ends = np.concatenate([boundaries, [scores.size]])
    average = (starts + ends + 1) / 2.0
    ranks[order] = np.repeat(average, ends - starts)
    u = ranks[labels].sum() - positives * (positives + 1) / 2.0
    return float(u / (positives * negatives))


def log_loss(labels: np.ndarray, logits: np.ndarray) -> float:
    """Mean binary cross-entropy of logits, computed stably: mean(softplus(z) - y z)."""
    labels = np.asarray(labels, dtype=np.float64).reshape(-1)
    logits = np.asarray(logits, dtype=np.float64).reshape(-1)
    if labels.size == 0:
        return float("nan")
    with np.errstate(invalid="ignore", over="ignore"):  # NaN logits (a diverged model) give NaN
        return float(np.mean(np.logaddexp(0.0, logits) - labels * logits))


# model -> its traced forward pass (one trace per model)
_FORWARD: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _forward(model):
    if model not in _FORWARD:
        signature = tf.nest.map_structure(lambda t: tf.TensorSpec([None, *t.shape[1:]], t.dtype), model.input)
        _FORWARD[model] = tf.function(
            lambda features: tf.reshape(model(features, training=False), [-1]), input_signature=[signature]
        )
    return _FORWARD[model]


def predict_logits(model, dataset: Iterable) -> tuple[np.ndarray, np.ndarray]:
    """(labels, logits) over batched `(features, labels)` (a tf.data dataset or numpy batches); traced once per model."""
    forward = _forward(model)
    labels, logits = [], []
    for features, y in dataset:
        logits.append(forward(features).numpy())
        labels.append(np.asarray(y).reshape(-1))
    if not labels:
        return np.zeros([0]), np.zeros([0])
    return np.concatenate(labels), np.concatenate(logits)


def base_rate_log_loss(click_rate: float) -> float:
    """Log loss of the constant prediction p = click rate: -(r log r + (1 - r) log(1 - r)); 0 for r in {0, 1}.

    The reference a click model must beat: a model that learned nothing but the
    click rate reaches it.

    Example:
        >>> base_rate_log_loss(0.25)  # -(0.25 log 0.25 + 0.75 log 0.75)
        0.5623351446188083
    """
    r = float(click_rate)
    if not 0.0 < r < 1.0:
        return 0.0 if r in (0.0, 1.0) else math.nan
    return -(r * math.log(r) + (1.0 - r) * math.log(1.0 - r))


def auc_note(labels: np.ndarray) -> str | None:
    """Why the AUC of `labels` is undefined (no click, or no non-click), or None when it is defined."""
    labels = np.asarray(labels).reshape(-1)
    if labels.size == 0:
        return "AUC undefined: the evaluation data has no rows"
    positives = int(np.sum(labels > 0.5))
    if positives == 0:
        return f"AUC undefined: all {labels.size} evaluation rows are non-clicks (label 0); it needs both classes"
    if positives == labels.size:
        return f"AUC undefined: all {labels.size} evaluation rows are clicks (label 1); it needs both classes"
    return None


def evaluate(model, dataset: tf.data.Dataset) -> dict:
    """`{"auc", "auc_note", "logloss", "base_rate_logloss", "examples", "click_rate", "mean_prediction"}`.

    `mean_prediction` (mean predicted click probability) next to `click_rate`
    shows calibration-in-the-large: a model can rank well (AUC) and still
    predict far too few or too many clicks (log loss). `base_rate_logloss` is
    the log loss of predicting the click rate for every row. Undefined values
    are None, never NaN: `auc` is None with `auc_note` saying why (one class
    only), the rest are None on empty data.
    """
    labels, logits = predict_logits(model, dataset)
    with np.errstate(over="ignore"):
        probabilities = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
    note = auc_note(labels)
    click_rate = float(labels.mean()) if labels.size else None
    return {
        "auc": None if note else roc_auc(labels, logits),
        "auc_note": note,
        "logloss": log_loss(labels, logits) if labels.size else None,
        "base_rate_logloss": None if click_rate is None else base_rate_log_loss(click_rate),
        "examples": int(labels.size),
        "click_rate": click_rate,
        "mean_prediction": float(probabilities.mean()) if labels.size else None,
    }


__all__ = ["auc_note", "base_rate_log_loss", "evaluate", "log_loss", "predict_logits", "roc_auc"]
