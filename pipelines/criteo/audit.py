"""`--audit-canaries M` for Criteo: the pCTR model trained once with M rare-id canaries in its C1 table.

Canary i is a click (label 1) whose C1 id is V1 + 1 + i, a row of its own
beyond the V1 + 1 rows the reader hashes real ids into (the audit model's C1
table has M more rows, same width; with stacked tables, C1's part of its
stack), every other feature 0. The run is
`tfdp_embed.keras2.audit_canaries.audit_run` on the period's rows in memory:
the plan's noise multiplier, q and T, each canary in with probability 1/2,
Poisson batches; each canary is scored from the released (flushed) weights
alone (the loss its own row lowered). The bound is
`pipelines.audit_canaries.audit_field`'s; no model is exported.

DP-FEST and DP-AdaFEST+ select rows from the real data's bucket counts before
training and DP-AdaFEST calibrates two noises: audit them with
`python -m benchmarks.privacy_audit` (rare-id canaries, selection counts that
include the canaries).

References: Steinke, Nasr & Jagielski, NeurIPS 2023; Mahloujifar, Melis &
Chaudhuri, ICML 2025.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pipelines import audit_canaries

#: Mechanisms an audit run of the pipeline supports (the others: `benchmarks.privacy_audit`).
AUDITABLE = ("none", "dense", "lazy", "eana")
CANARY_FEATURE = "C1"


def check_flags(parser, a) -> None:
    """Refuses `--audit-canaries` with what the audit cannot run (argparse error, exit 2)."""
    if a.audit_canaries is None:
        return
    audit_canaries.check_flag(parser, a.audit_canaries)
    if a.mechanism not in AUDITABLE:
        parser.error(
            f"--audit-canaries with --mechanism {a.mechanism}: an audit run supports {', '.join(AUDITABLE)}; audit "
            "DP-FEST and DP-AdaFEST(+) with python -m benchmarks.privacy_audit"
        )
    if a.streaming == "on" or a.streaming_periods or a.beam_shards:
        parser.error(
            "--audit-canaries trains on rows held in memory: leave out --streaming on, --streaming-periods and "
            "--beam-shards"
        )


def _canary_examples(features: dict, labels: np.ndarray, offset: int):
    """Canary examples for table rows `row_ids`: C1 ids `row_ids - offset` (C1's rows start at `offset`)."""

    def make(row_ids):
        m = len(row_ids)
        made = {
            name: np.zeros((m, *np.shape(values)[1:]), np.asarray(values).dtype) for name, values in features.items()
        }
        made[CANARY_FEATURE] = (np.asarray(row_ids) - offset).astype(made[CANARY_FEATURE].dtype)
        return made, np.ones((m, *np.shape(labels)[1:]), np.float32)

    return make


def _audit_plan(config, plan):
    from tfdp_embed import plan_run

    run = dict(
        target_delta=plan.target_delta,
        sampling_probability=plan.sampling_probability,
        steps=plan.steps,
        seed=config.seed,
    )
    if config.mechanism == "none":
        return plan_run("none", **run)
    clip = plan.mechanism.l2_norm_clip
    return plan_run(config.mechanism, noise_multiplier=plan.noise_multiplier, l2_norm_clip=clip, **run)


def run(config, period, model_config, plan) -> dict:
    """The audit run on `period` (in memory); report.json's `audit` field.

    Args:
      config: the pipeline's `PipelineConfig` (`audit_canaries` set).
      period: the training period (`criteo_data.Period` with its rows in memory).
      model_config: the pCTR model's `CTRModelConfig` (real vocabularies).
      plan: the run's `RunPlan` (sigma, q, T and the claimed epsilon).

    Raises:
      ValueError: the period's rows are streamed, not in memory.
    """
    from tfdp_embed import keras
    from tfdp_embed.keras2.audit_canaries import audit_run
    from tfdp_embed.keras2.models import build_ctr_model
    from tfdp_embed.keras2.models.ctr import ctr_embedding_dims, feature_table

    if period.streaming:
        raise ValueError("--audit-canaries trains on rows held in memory; these were streamed: add --streaming off.")
    m, vocab = int(config.audit_canaries), tuple(model_config.vocab_sizes)
    dims = model_config.embedding_dims or ctr_embedding_dims(vocab)
    audit_config = dataclasses.replace(model_config, vocab_sizes=(vocab[0] + m, *vocab[1:]), embedding_dims=dims)
    labels = np.asarray(period.labels, np.float32)
    table, offset = feature_table(audit_config, CANARY_FEATURE)  # C1's rows in its table (or stack)
    audit = audit_run(
        lambda: build_ctr_model(audit_config),
        (period.features, labels),
        plan=_audit_plan(config, plan),
        first_canary_id=offset + vocab[0] + 1,  # the reader's ids of C1 are 0 .. V1
        num_canaries=m,
        audit_seed=audit_canaries.audit_seed(config.seed),
        optimizer_fn=lambda: keras.optimizers.legacy.SGD(config.learning_rate, momentum=config.momentum),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
        table=table,
        canary_examples=_canary_examples(period.features, labels, offset),
        batch_seed=config.seed,
    )
    claimed = plan.target_epsilon if config.mechanism not in ("none", "eana") else None
    return audit_canaries.audit_field(
        audit.scores, audit.included, claimed_epsilon=claimed, delta=plan.target_delta, bound=audit.bound
    )


__all__ = ["AUDITABLE", "check_flags", "run"]
