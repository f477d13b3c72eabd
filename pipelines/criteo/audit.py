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

Every mechanism is auditable, with the pipeline's own calibrated noises (the
run's sigma; DP-AdaFEST's and AdaFEST+'s two, sigma1 of the contribution map
and sigma2 of the gradient, and their threshold) and its selection budget.
DP-FEST and DP-AdaFEST+ select their rows from the bucket counts of the data
the audit run trains on: the real rows plus the canaries that went in (an
included canary's C1 row counts 1, an excluded one's 0; its other features,
all 0, count in bucket 0), so the selection's own leak is part of what is
audited. The selection keeps the pipeline's share of each audit table
(`--top-fraction`, `--top-min-rows`), the canaries' rows included.

References: Steinke, Nasr & Jagielski, NeurIPS 2023; Mahloujifar, Melis &
Chaudhuri, ICML 2025.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pipelines import audit_canaries

#: Mechanisms an audit run of the pipeline supports: every one the pipeline trains with.
AUDITABLE = ("none", "dense", "lazy", "eana", "fest", "adafest", "adafest+")
CANARY_FEATURE = "C1"
_NOISE_ARGUMENTS = ("noise_multiplier", "contribution_noise_multiplier", "threshold", "selection_epsilon")


def check_flags(parser, a) -> None:
    """Refuses `--audit-canaries` with what the audit cannot run (argparse error, exit 2)."""
    if a.audit_canaries is None:
        return
    audit_canaries.check_flag(parser, a.audit_canaries)
    if a.mechanism not in AUDITABLE:
        parser.error(f"--audit-canaries with --mechanism {a.mechanism}: an audit run supports {', '.join(AUDITABLE)}")
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


def training_counts(period, audit_config, included: np.ndarray) -> dict:
    """`{table layer name: bucket counts}` of what the audit run trains on: real rows plus the included canaries."""
    from pipelines.criteo import data as criteo_data
    from tfdp_embed.data.criteo import CAT_FEATURES
    from tfdp_embed.keras2.models.ctr import table_counts

    counts = criteo_data.bucket_counts(period)
    real_rows = len(counts[CANARY_FEATURE])  # V1 + 1: the reader's ids of C1 are 0 .. V1
    canaries = np.zeros(len(included), np.int64)
    canaries[included] = 1  # canary i's C1 id is V1 + 1 + i; every other feature of it is 0
    counts[CANARY_FEATURE] = np.concatenate([counts[CANARY_FEATURE], canaries])
    for name in CAT_FEATURES:
        if name != CANARY_FEATURE:
            counts[name][0] += int(included.sum())
    assert len(counts[CANARY_FEATURE]) == real_rows + len(included)
    return table_counts(audit_config, counts)


def _mechanism_options(config, plan, counts, audit_config) -> dict:
    """The selection (on `counts`) and the contribution map of the pipeline's plan, its noises as they are."""
    from pipelines.criteo import privacy as criteo_privacy
    from tfdp_embed.keras2.models.ctr import table_layout

    settings = config.privacy or criteo_privacy.PrivacySettings(mechanism=config.mechanism, epsilon=None, delta=None)
    given = plan.mechanism_arguments
    options = {key: given[key] for key in ("selection_epsilon", "threshold") if key in given}
    if "selection_epsilon" in given:
        parts = {
            name: [audit_config.vocab_by_feature[f] + 1 for f in group]
            for name, group in table_layout(audit_config).items()
        }
        options.update(counts=counts, **criteo_privacy.top_rows(settings, counts, parts))
    if "contribution_noise_multiplier" in given:
        options.update(contribution_clip=settings.contribution_clip, ratio=settings.adafest_ratio)
    return options


def _audit_plan(config, plan, counts=None, audit_config=None):
    """The audit run's plan: the pipeline's q, T and noises (sigma given, not calibrated again), its selection."""
    from tfdp_embed import plan_run

    run = dict(
        target_delta=plan.target_delta,
        sampling_probability=plan.sampling_probability,
        steps=plan.steps,
        seed=config.seed,
    )
    if config.mechanism == "none":
        return plan_run("none", **run)
    options = _mechanism_options(config, plan, counts, audit_config)
    clip = plan.mechanism.l2_norm_clip
    audit = plan_run(config.mechanism, noise_multiplier=plan.noise_multiplier, l2_norm_clip=clip, **run, **options)
    used = {**audit.mechanism_arguments, **options}  # what built the audit's mechanism
    for key in _NOISE_ARGUMENTS:
        if not np.isclose(used.get(key, 0.0), plan.mechanism_arguments.get(key, 0.0)):
            raise ValueError(
                f"the audit run's {key} {used.get(key)} differs from the pipeline's "
                f"{plan.mechanism_arguments.get(key)}: an audit must run the calibrated mechanism."
            )
    return audit


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
    from tfdp_embed.keras2.audit_canaries import audit_run, draw_inclusion
    from tfdp_embed.keras2.models import build_ctr_model
    from tfdp_embed.keras2.models.ctr import ctr_embedding_dims, feature_table

    if period.streaming:
        raise ValueError("--audit-canaries trains on rows held in memory; these were streamed: add --streaming off.")
    m, vocab = int(config.audit_canaries), tuple(model_config.vocab_sizes)
    dims = model_config.embedding_dims or ctr_embedding_dims(vocab)
    audit_config = dataclasses.replace(model_config, vocab_sizes=(vocab[0] + m, *vocab[1:]), embedding_dims=dims)
    labels = np.asarray(period.labels, np.float32)
    table, offset = feature_table(audit_config, CANARY_FEATURE)  # C1's rows in its table (or stack)
    seed = audit_canaries.audit_seed(config.seed)
    counts = None
    if "selection_epsilon" in plan.mechanism_arguments:  # DP-FEST, AdaFEST+: select on what the run trains on
        counts = training_counts(period, audit_config, draw_inclusion(m, audit_seed=seed))  # audit_run's draw
    audit = audit_run(
        lambda: build_ctr_model(audit_config),
        (period.features, labels),
        plan=_audit_plan(config, plan, counts, audit_config),
        first_canary_id=offset + vocab[0] + 1,  # the reader's ids of C1 are 0 .. V1
        num_canaries=m,
        audit_seed=seed,
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


__all__ = ["AUDITABLE", "check_flags", "run", "training_counts"]
