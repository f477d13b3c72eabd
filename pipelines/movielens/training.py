"""Stages 1-4 of a MovieLens run: plan q, T and sigma; build the two-tower `DPModel`; fit; flush and evaluate."""

from __future__ import annotations

import dataclasses

import numpy as np

from pipelines import run_limits
from pipelines.movielens import privacy as movielens_privacy
from pipelines.movielens import units as movielens_units
from pipelines.movielens import vocabulary as movielens_vocabulary
from pipelines.movielens.config import (
    MovieLensConfig,
)
from pipelines.movielens.data import counted_batches, training_pool
from pipelines.step_timer import StepTimer
from tfdp_embed import DPModel, Release, ReleasedDatasetSize, RunPlan, keras, release_dataset_size, tf
from tfdp_embed.accounting.contribution_bound import ReleasedContributionBound
from tfdp_embed.data import with_lookahead
from tfdp_embed.data.movielens import (
    MovieLensData,
)
from tfdp_embed.keras2.callbacks import PrivacyBudget
from tfdp_embed.keras2.export import release_ready
from tfdp_embed.keras2.models.two_tower import TwoTowerModel, two_tower_registry
from tfdp_embed.mechanisms import capabilities_of
from tfdp_embed.metrics.retrieval import DEFAULT_KS, precision_recall_at_k


def evaluate(model: TwoTowerModel, contexts, labels, *, ks=DEFAULT_KS, batch_size: int = 2048) -> dict:
    """precision@k / recall@k ranking all items for every (context, label) pair."""
    queries = np.concatenate(
        [model.query(contexts[i : i + batch_size]).numpy() for i in range(0, len(labels), batch_size)]
    )
    candidates = model.item_embedding.candidates().numpy()
    return precision_recall_at_k(
        queries,
        candidates,
        labels,
        candidate_ids=np.arange(1, model.num_items + 1),
        ks=ks,
        batch_size=batch_size,
    )


@dataclasses.dataclass
class Setup:
    """Stage 1's output: the training pool, the privacy units (examples, or users) and the plan for them.

    `released` is N~ in units (examples, or users); `user_ids` the training user of each example (None
    with extra examples, which have no user); `max_examples_per_user` k, how it was chosen and its DP
    release (user level without a given k).
    """

    contexts: np.ndarray
    labels: np.ndarray
    num_extra: int
    sampling_probability: float
    steps: int
    delta: float
    plan: RunPlan
    released: ReleasedDatasetSize
    user_ids: np.ndarray | None = None
    max_examples_per_user: int | None = None
    k_source: str | None = None
    k_release: ReleasedContributionBound | None = None

    @property
    def size(self) -> int:
        return len(self.labels)

    @property
    def user_level(self) -> bool:
        return self.max_examples_per_user is not None


@dataclasses.dataclass
class Trained:
    """Stages 2-3's output: the model, its DP wrapper and budget, and what training recorded."""

    model: TwoTowerModel
    dp_model: DPModel
    budget: PrivacyBudget | None
    counter: movielens_privacy.TouchCounter
    timer: StepTimer
    history: keras.callbacks.History


def plan_training(config: MovieLensConfig, data: MovieLensData, extra_train_examples) -> Setup:
    """Stage 1: the training pool (plus any extra examples), q = B / N, T steps, and the privacy plan."""
    contexts, labels, num_extra = training_pool(data, extra_train_examples)
    user_ids, k, k_source, k_release = _units(config, data, num_extra)
    units = len(labels) if k is None else int(np.unique(user_ids).size)  # examples, or users
    released = release_dataset_size(units, seed=config.seed)  # N~: q, delta, T and the report use it, never N
    n, what = released.value, ("training examples" if k is None else "training users")
    if config.batch_size > n:
        raise ValueError(f"`batch_size` {config.batch_size} exceeds the {n} {what} (released with DP).")
    q = released.sampling_probability(config.batch_size)
    per_epoch = max(1, round(1 / q))
    asked = f"`--epochs` {config.epochs:,} x {per_epoch:,} batches per epoch (N~ / `--batch-size`)"
    fix = "lower --epochs or raise --batch-size"
    steps = run_limits.check_steps(config.epochs * per_epoch, what=asked, fix=fix)
    if config.max_hours:  # the estimated training time, before the noise is calibrated
        step = _forward_backward(config, data, contexts, labels, user_ids if k is not None else None, k)
        run_limits.check_time(
            step, batch=config.batch_size, steps=steps, max_hours=config.max_hours, what=asked, fix=fix
        )
    delta = config.delta if config.delta is not None else released.delta()
    plan = movielens_privacy.plan(
        mechanism=config.mechanism,
        noise_multiplier=config.noise_multiplier,
        epsilon=config.epsilon,
        delta=delta,
        sampling_probability=q,
        steps=steps,
        l2_norm_clip=config.l2_norm_clip,
        accountant=config.accountant,
        seed=config.seed,
        releases=[]
        if config.mechanism == "none"
        else [
            Release.dataset_size(released),
            *([Release.contribution_bound(k_release)] if k_release is not None else []),
            *movielens_vocabulary.releases(data.item_release, seeded=config.seed is not None),
        ],
    )
    if config.verbose:
        released_k = " (k released with DP)" if k_release is not None else ""
        unit = f"{what}, at most {k} examples per user per step{released_k}" if k is not None else what
        print(
            f"movielens: {config.mechanism}, sigma {plan.noise_multiplier:.4g} ({movielens_privacy.noise_source(plan)}), "
            f"N~ {n} {unit} (released with DP), q {q:.4g}, {steps} steps, delta {delta:.3g}",
            flush=True,
        )
    return Setup(contexts, labels, num_extra, q, steps, delta, plan, released, user_ids, k, k_source, k_release)


def _forward_backward(config: MovieLensConfig, data: MovieLensData, contexts, labels, user_ids, k):
    """`run_limits.check_time`'s pass: a throwaway two-tower model on the first `n` examples (or users, each
    bringing at most k examples, padded to k as in a training batch); no sampler, no training randomness."""
    model = TwoTowerModel(
        num_items=data.num_items, embedding_dim=config.embedding_dim, hidden_units=tuple(config.hidden_units)
    )

    run = run_limits.gradient_pass(model, lambda batch: model.compute_loss(batch, True))

    def step(n: int) -> None:
        if user_ids is None:
            run((contexts[:n].astype(np.int32), labels[:n].astype(np.int32)))
        else:
            run(_first_users(contexts, labels, user_ids, n, k))

    return step


def _first_users(contexts, labels, user_ids, n: int, k: int) -> tuple:
    """Users 0 .. n-1's first k examples, `(contexts [n, k, L], labels [n, k])`, 0-padded (label 0: padding)."""
    batch_contexts = np.zeros((n, k, contexts.shape[1]), np.int32)
    batch_labels = np.zeros((n, k), np.int32)
    for user in range(n):
        rows = np.flatnonzero(user_ids == user)[:k]
        batch_contexts[user, : rows.size], batch_labels[user, : rows.size] = contexts[rows], labels[rows]
    return batch_contexts, batch_labels


def _units(config: MovieLensConfig, data: MovieLensData, num_extra: int) -> tuple:
    """`(user of each example or None, k or None, how k was chosen, k's DP release or None)`."""
    if num_extra:  # extra fixed examples (canaries) belong to no user
        if config.privacy_unit == movielens_units.USER:
            raise ValueError(
                "`extra_train_examples` (canaries) have no user: run them with privacy_unit 'example' (a canary "
                "user of its own is not supported yet)."
            )
        return None, None, None, None
    user_ids = movielens_units.example_users(data.train_timelines)
    if config.privacy_unit != movielens_units.USER:
        return user_ids, None, None, None  # example level: the users are kept for the group-privacy epsilon
    k, source, release = movielens_units.choose_k(config.max_examples_per_user, user_ids, seed=config.seed)
    return user_ids, k, source, release


def build_model(config: MovieLensConfig, data: MovieLensData, setup: Setup) -> tuple:
    """Stage 2: the two-tower model, its `DPModel` around the plan's mechanism, and the budget.

    Returns:
      `(model, dp_model, budget)`; the budget is None unless the run is DP with a target epsilon.
    """
    if config.seed is not None:
        keras.utils.set_random_seed(config.seed)
    model = TwoTowerModel(
        num_items=data.num_items,
        embedding_dim=config.embedding_dim,
        hidden_units=tuple(config.hidden_units),
    )
    dp_model = DPModel(
        model,
        mechanism=setup.plan.mechanism,
        expected_batch_size=setup.sampling_probability * setup.released.value,  # q N~: a scale, not a statistic
        registry=two_tower_registry(),
        lookahead=capabilities_of(setup.plan.mechanism).lookahead,
    )
    dp_model.compile(
        optimizer=keras.optimizers.legacy.SGD(learning_rate=config.resolved_learning_rate, momentum=config.momentum)
    )
    plan = setup.plan
    budget = plan.budget() if plan.is_dp and plan.target_epsilon is not None else None
    return model, dp_model, budget


def fit_model(config: MovieLensConfig, data: MovieLensData, setup: Setup, built: tuple) -> Trained:
    """Stage 3: fit on Poisson batches, counting the history rows each batch touches (EANA's bound)."""
    model, dp_model, budget = built
    lazy = capabilities_of(dp_model.mechanism).lookahead
    counter = movielens_privacy.TouchCounter(data.num_items + 1)
    sampler = dict(
        q=setup.sampling_probability,
        seed=config.seed,
        lookahead=lazy,
        counter=counter,
        table_name=model.history_embedding.name,
    )
    if setup.user_level:
        k = int(setup.max_examples_per_user or 0)  # set at user level (`Setup.user_level`)
        batches, _ = movielens_units.user_batches(setup.contexts, setup.labels, setup.user_ids, k=k, **sampler)
        probe = movielens_units.probe_batch(setup.contexts, setup.labels, setup.user_ids, k=k)
    else:
        batches, _ = counted_batches(setup.contexts, setup.labels, **sampler)
        probe = tf.data.Dataset.from_tensors((setup.contexts[:8], setup.labels[:8]))
    # Build the model, check the per-example contract and init the mechanism from a separate
    # probe batch (>= 2 examples or users: the independence check needs them), so that `fit` does not
    # draw (and count) a Poisson batch the model never trains on.
    if lazy:
        probe = with_lookahead(probe, lambda features: {model.history_embedding.name: features})
    dp_model.prepare(probe)
    timer = StepTimer(setup.steps if config.verbose else None, program="python -m pipelines.movielens")
    callbacks = [timer] + ([budget] if budget is not None else [])
    history = dp_model.fit(batches, epochs=config.epochs, callbacks=callbacks, verbose=config.verbose)
    return Trained(model, dp_model, budget, counter, timer, history)


def release_and_evaluate(config: MovieLensConfig, data: MovieLensData, trained: Trained) -> tuple:
    """Stage 4: flush owed noise (LazyDP), detach read hooks, evaluate the released model.

    Returns:
      `(metrics, number of test examples)`.
    """
    release_ready(trained.dp_model)
    mechanism = trained.dp_model.mechanism
    if capabilities_of(mechanism).read_hooks:
        mechanism.detach()
    limit = config.max_test_examples
    test_contexts, test_labels = data.test_contexts[:limit], data.test_labels[:limit]
    metrics = evaluate(trained.model, test_contexts, test_labels)
    if limit is None:  # positions whose movie the map dropped count as misses
        metrics = movielens_vocabulary.scale_metrics(metrics, data, len(test_labels))
    return metrics, len(test_labels)
