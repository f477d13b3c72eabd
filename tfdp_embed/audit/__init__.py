"""Empirical privacy audits: the secret sharer test (Carlini et al. 2019) as EANA §4.1 runs it, and
the one-run epsilon lower bound (Steinke, Nasr & Jagielski, NeurIPS 2023).

Modules:
  canaries: random (context, label) canaries with insertion counts, their
    repeated training examples, and non-inserted candidates.
  exposure: rank exposure log2(n) - log2(m), the fitted-distribution
    (extrapolated) exposure.
  secret_sharer: scores canaries and candidates with any scoring callable and
    summarises exposure per insertion count (JSON-able).
  one_run: the epsilon lower bound from m canaries each included with
    probability 1/2 and the auditor's guesses (Steinke et al. 2023, §3 and
    §5).
  rare_id: the one-run audit of a training run with rare-id embedding
    canaries (`run_audit`); it imports TensorFlow, so it is not re-exported
    here. Its front ends: `tfdp_embed.keras2.audit_canaries` and
    `tfdp_embed.keras3.audit_canaries` (`audit_run`).
  fdp_one_run: the same game analysed under a whole f-DP trade-off curve
    (Mahloujifar, Melis & Chaudhuri, ICML 2025): mu-GDP and (eps, delta)
    curves; `audit_lower_bound` reports the tightest method and names it.
  gradient_canaries: white-box Dirac gradient canaries run through a
    mechanism's noising (`gradient_canary_audit`), observed step by step or
    through the released table (every mechanism); it imports TensorFlow and
    the mechanisms, so it is not re-exported here: import it from its module.

Numpy and scipy only: the model is a callable returning log-probabilities.
"""

from tfdp_embed.audit.canaries import (
    DEFAULT_INSERTION_COUNTS,
    EANA_CANARIES_PER_COUNT,
    EANA_NUM_CANDIDATES,
    CanarySet,
    RandomSequences,
    generate_canaries,
    sample_candidates,
)
from tfdp_embed.audit.exposure import (
    ScoreDistribution,
    canary_ranks,
    extrapolated_exposure,
    fit_score_distribution,
    rank_exposure,
)
from tfdp_embed.audit.fdp_one_run import (
    METHODS,
    AuditBound,
    approx_dp_epsilon_for_counts,
    audit_lower_bound,
    fdp_rejects,
    gdp_epsilon,
    mu_for_counts,
)
from tfdp_embed.audit.one_run import (
    DEFAULT_GUESS_FRACTIONS,
    OneRunBound,
    count_correct,
    default_guess_pairs,
    epsilon_for_counts,
    epsilon_lower_bound,
    one_run_p_value,
)
from tfdp_embed.audit.secret_sharer import (
    CHANCE_EXPOSURE_BITS,
    SecretSharerAudit,
    score_sequences,
    secret_sharer_audit,
    summarize_exposure,
)

__all__ = [
    "METHODS",
    "AuditBound",
    "approx_dp_epsilon_for_counts",
    "audit_lower_bound",
    "fdp_rejects",
    "gdp_epsilon",
    "mu_for_counts",
    "CHANCE_EXPOSURE_BITS",
    "DEFAULT_GUESS_FRACTIONS",
    "DEFAULT_INSERTION_COUNTS",
    "EANA_CANARIES_PER_COUNT",
    "EANA_NUM_CANDIDATES",
    "CanarySet",
    "OneRunBound",
    "RandomSequences",
    "ScoreDistribution",
    "SecretSharerAudit",
    "canary_ranks",
    "count_correct",
    "default_guess_pairs",
    "epsilon_for_counts",
    "epsilon_lower_bound",
    "extrapolated_exposure",
    "fit_score_distribution",
    "generate_canaries",
    "one_run_p_value",
    "rank_exposure",
    "sample_candidates",
    "score_sequences",
    "secret_sharer_audit",
    "summarize_exposure",
]
