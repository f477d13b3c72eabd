"""`--audit-canaries M`: a pipeline run that trains with M rare-id canaries and audits itself; never a release.

Each of M canary examples gets an id of its own (a row of one embedding
table no real example touches) and is put into the training data with
probability 1/2 (`tfdp_embed.audit.rare_id.draw_inclusion`, the
auditor's generator, seeded by `--seed` or by OS entropy). The pipeline then
trains as usual on the real examples plus the canaries that went in, scores
every canary from the released (flushed) model alone, and reports the one-run
lower bound (`tfdp_embed.audit.fdp_one_run.audit_lower_bound`: the tightest
of Steinke et al.'s and the f-DP analyses, named in `method`) next to the
epsilon the run claims, in report.json's `audit` field.

An audit run is not a release: the model trained on canaries is never
exported (no SavedModel is written; report.json says `released: false`).
Train the model you release in a separate run without `--audit-canaries`.
The run still spends the real data's privacy budget (it trains on it).

References: Steinke, Nasr & Jagielski, NeurIPS 2023 (the one-run audit);
Mahloujifar, Melis & Chaudhuri, ICML 2025 (f-DP).
"""

from __future__ import annotations

import secrets

import numpy as np

from pipelines import cli_types

#: Fewest canaries: 10 all-correct guesses are needed to reject anything at 95 % over 42 tests.
MIN_CANARIES = 16
KIND = "rare-id"
NOTE = (
    "An audit run, not a release: {m} canaries (each put in with probability 1/2) were trained on, so no model "
    "was exported. epsilon_lb is a lower bound on the run's privacy loss that holds with the stated confidence; "
    "it should stay below the claimed epsilon. Train the model you release in a separate run without "
    "--audit-canaries."
)


def add_flag(parser) -> None:
    """`--audit-canaries M` on a pipeline's parser."""
    parser.add_argument(
        "--audit-canaries",
        type=cli_types.positive(int),
        default=None,
        metavar="M",
        help=f"audit run: train with M rare-id canaries (each in with probability 1/2; at least {MIN_CANARIES}, "
        "hundreds for a useful bound) and report the empirical epsilon lower bound beside the claimed epsilon; "
        "no model is exported",
    )


def check_flag(parser, value) -> None:
    """Refuses M below `MIN_CANARIES` (argparse error, exit 2)."""
    if value is not None and value < MIN_CANARIES:
        parser.error(f"--audit-canaries {value}: at least {MIN_CANARIES} canaries (hundreds for a useful bound)")


def audit_seed(seed: int | None) -> int:
    """The auditor's seed: the run's `--seed`, or OS entropy."""
    return secrets.randbits(31) if seed is None else int(seed)


def inclusion(num_canaries: int, seed: int | None) -> np.ndarray:
    """[M] booleans, each True with probability 1/2: which canaries go in (the auditor's generator)."""
    from tfdp_embed.audit.rare_id import draw_inclusion

    return draw_inclusion(num_canaries, audit_seed=audit_seed(seed))


def audit_field(scores, included, *, claimed_epsilon, delta: float, confidence: float = 0.95, bound=None) -> dict:
    """report.json's `audit`: the bound, its method, the guesses and the claim it is set against.

    Args:
      scores: [M] canary scores from the released model (higher = looks trained on).
      included: [M] booleans from `inclusion`.
      claimed_epsilon: the run's epsilon (None when it has none: not DP).
      delta: delta of the claim and of the bound.
      confidence: the bound holds with this probability.
      bound: the `audit_lower_bound` of these scores when already computed (`audit_run`'s); None: computed here.
    """
    from tfdp_embed.audit.fdp_one_run import audit_lower_bound

    if bound is None:
        bound = audit_lower_bound(scores, included, delta=delta, confidence=confidence)
    m = int(np.size(included))
    return {
        "kind": KIND,
        "canaries": m,
        "canaries_included": int(np.sum(included)),
        "epsilon_lb": bound.epsilon_lb,
        "method": bound.method,
        "mu_lb": bound.mu_lb,
        "epsilon_lb_by_method": bound.by_method,
        "confidence": confidence,
        "delta": delta,
        "claimed_epsilon": claimed_epsilon,
        "correct": bound.correct,
        "guesses": bound.guesses,
        "released": False,
        "note": NOTE.format(m=m),
    }


def summary_line(audit: dict) -> str:
    """One line for the console."""
    claimed = audit["claimed_epsilon"]
    versus = "no claimed epsilon (not DP)" if claimed is None else f"claimed epsilon {claimed:.4g}"
    return (
        f"audit: {audit['canaries']} rare-id canaries, empirical epsilon lower bound {audit['epsilon_lb']:.4g} "
        f"({audit['method']}, {audit['confidence']:.0%}) against {versus}; "
        f"{audit['correct']}/{audit['guesses']} guesses right. Audit run: no model exported."
    )


__all__ = [
    "KIND",
    "MIN_CANARIES",
    "NOTE",
    "add_flag",
    "audit_field",
    "audit_seed",
    "check_flag",
    "inclusion",
    "summary_line",
]
