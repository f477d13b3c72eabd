"""`--audit-canaries M` for MovieLens: rare-id canaries in the two-tower model, scored from the released model.

Canary i is the example (context [n + 1 + i, 0, ...], label n + 1 + i), n the
catalogue's items: a movie id of its own, one that no real rating holds, as
its only history and as its next item. The model of an audit run has M more
item rows (history and candidate tables); a canary that went in pulls its
query and its candidate row together, one that did not leaves its history row
at its initial value. The score is log P(label | context) under the released
(flushed) model, full softmax over all n + M items: higher for canaries
trained on. See `pipelines.audit_canaries` for the run as a whole.

References: Steinke, Nasr & Jagielski, NeurIPS 2023; Mahloujifar, Melis &
Chaudhuri, ICML 2025.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pipelines import audit_canaries


@dataclasses.dataclass(frozen=True)
class Canaries:
    """The M canary examples (all of them, in or out) and which went in."""

    contexts: np.ndarray
    labels: np.ndarray
    included: np.ndarray


def prepare(config, data, extra_train_examples) -> tuple:
    """(data with M more items, training extras with the canaries that went in, the `Canaries`)."""
    m, first = int(config.audit_canaries), data.num_items + 1
    ids = np.arange(first, first + m, dtype=np.int32)
    contexts = np.zeros((m, data.context_length), np.int32)
    contexts[:, 0] = ids  # left-aligned, 0-padded
    included = audit_canaries.inclusion(m, config.seed)
    extra: tuple = (contexts[included], ids[included])
    if extra_train_examples is not None:
        extra = tuple(np.concatenate([np.asarray(a), b]) for a, b in zip(extra_train_examples, extra))
    extended = dataclasses.replace(data, num_items=data.num_items + m)
    return extended, extra, Canaries(contexts, ids, included)


def field(model, canaries: Canaries, privacy: dict, delta: float, *, batch_size: int = 4096) -> dict:
    """report.json's `audit` for the released `model`."""
    scores = np.concatenate(
        [
            model.log_probs(canaries.contexts[i : i + batch_size], canaries.labels[i : i + batch_size]).numpy()
            for i in range(0, len(canaries.labels), batch_size)
        ]
    ).astype(np.float64)
    return audit_canaries.audit_field(scores, canaries.included, claimed_epsilon=privacy.get("epsilon"), delta=delta)


__all__ = ["Canaries", "field", "prepare"]
