"""The MovieLens run's privacy unit: user level (the default) or example level, and what each report states.

User level (`--privacy-unit user`): the unit is a training user's whole timeline.
Each step samples users with q = expected users per batch / U
(`tfdp_embed.data.poisson_user_batches`); a sampled user brings at most k of
their (context, label) examples, drawn uniformly, packed `[users, k, L]`; the
two-tower model takes that unit axis and a user's loss is the sum over their
rows, so one clipped gradient per user. q, N (= U, released with DP) and delta
(= 1 / U by default) are counted in users.

k (`--max-examples-per-user`) is a public choice when given; without it k is
released with DP from the users' example counts
(`tfdp_embed.release_contribution_bound`: quantile 0.75 over power-of-two
buckets, noise z = `K_NOISE_MULTIPLIER`), its Gaussian event charged to the
run's budget beside N~'s (`Release.contribution_bound`); see docs/user_level.md.

Example level (`--privacy-unit example`): today's run over (context, label)
examples; the report then adds the group-privacy epsilon of a user with the
median and with the largest number of examples
(`tfdp_embed.accounting.group_epsilon`), so that what it says about a person
is visible.

References: Chua et al., "Mind the Privacy Unit!", COLM 2024; Dwork & Roth 2014, Thm 2.2 (group privacy).
"""

from __future__ import annotations

import numpy as np

from tfdp_embed.accounting import group_epsilon, release_contribution_bound
from tfdp_embed.data import poisson_user_batches

USER, EXAMPLE = "user", "example"
PRIVACY_UNITS = (USER, EXAMPLE)
# ml-100k, DP-SGD at epsilon 3 (delta 1e-5), k = 128, 5 epochs, seed 0: 16 / 32 / 64 / 128 / 256 users per batch
# gave recall@10 0.003 / 0.008 / 0.022 / 0.047 / 0.033 (the noise sigma C / B shrinks with B, the steps with it).
# Measured on the test split: a default, not a private choice.
DEFAULT_USERS_PER_BATCH = 128
"""Expected users per batch at user level when `--batch-size` is not given (about 6 steps per epoch on ml-100k)."""
# ml-100k's 754 training users (80% of 943) have 19-736 examples; the buckets [64, 128) and [128, 256) end at
# cumulative shares 0.696 and 0.901, so the 0.75 quantile's edge is k = 128. Released over 1,000 seeds:
#   z = 10: k = 128 in 998, 64 in 2 (the first 50 seeds: 128 in 50); z = 8: 128 in 999; z = 16: 128 in 976;
#   z = 20: 128 in 946 (64 in 54).
# .venv/bin/python -c "from collections import Counter; from pipelines import movielens; from pipelines.movielens
#   import units; from tfdp_embed import release_contribution_bound as r; d = movielens.load_movielens(
#   movielens.MovieLensConfig(verbose=0)); c = units.examples_per_user(units.example_users(d.train_timelines));
#   print(Counter(r(c, noise_multiplier=10, seed=s).value for s in range(1000)))"
# Its cost, composed with the steps (PLD, 128 users per batch, 5 epochs, delta 1/N~): the calibrated sigma
# grows by 2.8% at epsilon 1, 0.3% at 3, 0.1% at 8 (z = 8: 4.5% / 0.5% / 0.1%).
K_NOISE_MULTIPLIER = 10.0
"""z of the DP release of k (noise std of each bucket's count of users)."""
K_QUANTILE = 0.75
"""The quantile of the examples per user whose power-of-two bucket edge is k."""
K_GIVEN = "given (--max-examples-per-user): a public choice, no release"


def example_users(timelines: dict) -> np.ndarray:
    """The training user (0 .. U-1) of each example, in `timeline_examples` order: n_u - 1 examples per user."""
    counts = [max(len(t) - 1, 0) for t in timelines.values()]
    return np.repeat(np.arange(len(counts), dtype=np.int64), counts)


def examples_per_user(user_ids: np.ndarray) -> np.ndarray:
    """Each user's number of examples (users with at least one)."""
    return np.unique(user_ids, return_counts=True)[1]


def choose_k(given: int | None, user_ids: np.ndarray, *, seed: int | None) -> tuple:
    """`(k, how it was chosen, its release or None)`: the given k (public), or k released with DP.

    The release (`tfdp_embed.release_contribution_bound` over each user's number of examples) must be
    charged to the run's plan: `Release.contribution_bound(release)`.
    """
    if given is not None:
        return int(given), K_GIVEN, None
    bound = release_contribution_bound(
        examples_per_user(user_ids), quantile=K_QUANTILE, noise_multiplier=K_NOISE_MULTIPLIER, seed=seed
    )
    return bound.value, bound.describe(), bound


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
    budget = trained.budget
    events = budget.ledger if budget is not None else setup.plan.steps_ledger(max(1, trained.counter.steps))
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


__all__ = [
    "DEFAULT_USERS_PER_BATCH",
    "K_NOISE_MULTIPLIER",
    "K_QUANTILE",
    "PRIVACY_UNITS",
    "choose_k",
    "example_users",
    "group_privacy_fields",
    "mean_rows_per_user",
    "probe_batch",
    "user_batches",
    "user_level_fields",
]
