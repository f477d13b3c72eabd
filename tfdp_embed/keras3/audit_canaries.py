"""One-run privacy audit of a Keras 3 DP training run with rare-id embedding canaries.

The same audit as the tf-keras front end's (`tfdp_embed.keras2.audit_canaries`):
the core's `tfdp_embed.audit.rare_id.run_audit` (canaries, inclusion, scores,
the tightest of Steinke et al.'s and the f-DP bounds) with this front end's
`DPModel` and per-example loss. It returns the bound, never the trained model.

Example:
    >>> from tfdp_embed.keras3 import DPEmbedding, keras
    >>> audit = audit_run(build_model, (ids, labels), plan=plan, first_canary_id=50, num_canaries=400,
    ...                   audit_seed=7, optimizer_fn=lambda: keras.optimizers.SGD(0.5),
    ...                   loss=keras.losses.BinaryCrossentropy(from_logits=True))
    >>> audit.bound.epsilon_lb <= audit.claimed_epsilon

References: Steinke, Nasr & Jagielski, NeurIPS 2023, §3; Mahloujifar, Melis & Chaudhuri, ICML 2025, §4.
"""

from __future__ import annotations

import numpy as np

from tfdp_embed.audit.rare_id import CanaryAudit, FrontEndParts, draw_inclusion, id_canaries, run_audit
from tfdp_embed.keras3.per_example_loss import per_example_loss_fn
from tfdp_embed.keras3.training import DPModel


def _per_example_loss(model, loss, features, labels) -> np.ndarray:
    predictions = model(features, training=False)
    return np.asarray(per_example_loss_fn(loss)(labels, predictions)).astype(np.float64)


PARTS = FrontEndParts(dp_model=DPModel, per_example_loss=_per_example_loss)


def audit_run(build_model, examples: tuple, **options) -> CanaryAudit:
    """Trains a Keras 3 model once with canaries (each in with probability 1/2); the one-run epsilon lower bound.

    Args:
      build_model: returns a fresh, built Keras 3 model with `tfdp_embed.keras3.DPEmbedding` tables.
      examples: the real training examples, `(features, labels)`.
      **options: keyword-only, as `tfdp_embed.audit.rare_id.run_audit` takes them: `plan`, `first_canary_id`,
        `num_canaries`, `audit_seed`, `optimizer_fn` (e.g. `keras.optimizers.SGD(0.5)`), `loss`, and
        optionally `table`, `canary_examples`, `delta`, `confidence`, `batch_seed`.

    Returns:
      A `CanaryAudit` (the bound, never the model).
    """
    return run_audit(PARTS, build_model, examples, **options)


__all__ = ["CanaryAudit", "audit_run", "draw_inclusion", "id_canaries"]
