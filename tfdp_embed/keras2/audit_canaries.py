"""One-run privacy audit of a tf-keras DP training run with rare-id embedding canaries.

`audit_run` trains a model of the caller's architecture once, on the real
examples plus m canary examples each put in independently with probability
1/2, and returns the tightest one-run epsilon lower bound of Steinke, Nasr &
Jagielski's and the f-DP analyses (`tfdp_embed.audit.fdp_one_run.audit_lower_bound`,
the method named in `bound.method`). It never returns the trained model. The
audit itself (canaries, inclusion, scores, bound) is the core's
`tfdp_embed.audit.rare_id.run_audit`; this module gives it tf-keras'
`DPModel` and per-example loss. Keras 3: `tfdp_embed.keras3.audit_canaries`.

Example:
    >>> plan = plan_run("lazy", target_epsilon=2.0, target_delta=1e-5,
    ...                 sampling_probability=0.05, steps=200, l2_norm_clip=1.0)
    >>> audit = audit_run(build_model, (ids, labels), plan=plan, first_canary_id=1000,
    ...                   num_canaries=500, audit_seed=7, optimizer_fn=lambda: keras.optimizers.legacy.SGD(0.5),
    ...                   loss=keras.losses.BinaryCrossentropy(from_logits=True))
    >>> audit.bound.epsilon_lb <= audit.claimed_epsilon

References: Steinke, Nasr & Jagielski, "Privacy Auditing with One (1) Training
Run", NeurIPS 2023, §3; Mahloujifar, Melis & Chaudhuri, "Auditing f-Differential
Privacy in One Run", ICML 2025, §4.
"""

from __future__ import annotations

import numpy as np

from tfdp_embed.audit.rare_id import CanaryAudit, FrontEndParts, draw_inclusion, id_canaries, run_audit
from tfdp_embed.keras2.per_example_loss import PerExampleLoss
from tfdp_embed.keras2.training import DPModel


def _per_example_loss(model, loss, features, labels) -> np.ndarray:
    predictions = model(features, training=False)
    per_example, _ = PerExampleLoss(loss, output_names=model.output_names)(labels, predictions)
    return per_example.numpy().astype(np.float64)


PARTS = FrontEndParts(dp_model=DPModel, per_example_loss=_per_example_loss)


def audit_run(build_model, examples: tuple, **options) -> CanaryAudit:
    """Trains a tf-keras model once with canaries (each in with probability 1/2); the one-run epsilon lower bound.

    Args:
      build_model: returns a fresh, built tf-keras model of the architecture to audit.
      examples: the real training examples, `(features, labels)`.
      **options: keyword-only, as `tfdp_embed.audit.rare_id.run_audit` takes them: `plan`, `first_canary_id`,
        `num_canaries`, `audit_seed`, `optimizer_fn` (e.g. `keras.optimizers.legacy.SGD(0.5)` for LazyDP),
        `loss`, and optionally `table`, `canary_examples`, `delta`, `confidence`, `batch_seed`.

    Returns:
      A `CanaryAudit` (the bound, never the model).
    """
    return run_audit(PARTS, build_model, examples, **options)


__all__ = ["CanaryAudit", "audit_run", "draw_inclusion", "id_canaries"]
