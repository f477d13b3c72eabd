"""MovieLens next-movie retrieval (EANA §4.1) with DP-SGD, EANA, LazyDP or no privacy.

    python -m pipelines.movielens --mechanism eana --noise-multiplier 0.01 --epochs 5 --out runs/eana
    python -m pipelines.movielens --mechanism dense --epsilon 3 --epochs 5 --out runs/dense

What happens:
  1. read the ratings (`--data`: ml-100k `u.data`, ml-latest / ML-20M
     `ratings.csv`, ML-1M `ratings.dat`, or a dataset directory holding one;
     default ../shared/data/movielens/ml-100k/u.data), number the movies
     densely 1..n (from the catalogue beside the ratings, `movies.csv` /
     `u.item`, when there is one; else, for DP runs, from the ratings' movie
     set released with DP, `pipelines.movielens_vocabulary`), build
     per-user timelines, split users 80/20 (seeded), build every (context,
     label) pair of the training users (the privacy units; see
     `tfdp_embed.data.movielens` for what an example is and what epsilon
     protects) plus any extra fixed examples (secret-sharer canaries);
  2. q = batch_size / N, T = epochs x round(1/q) steps; sigma given, or
     calibrated for (epsilon, delta = 1/N by default) with `dp_accounting` (PLD);
  3. train the two-tower model (`tfdp_embed.keras2.models.two_tower`: bag-of-words
     context tower, item lookup label tower, full softmax over all items)
     with `DPModel` on Poisson-sampled batches (LazyDP with the one-batch
     lookahead), a privacy budget stopping DP runs at the target epsilon;
  4. flush (LazyDP's owed noise), evaluate precision@k / recall@k for
     k in {1, 5, 10, 20} ranking all items for every test position, next to
     two references that are not released: chance and the most-popular
     ranking of the training split (`tfdp_embed.metrics.baselines`);
  5. with an output directory: export `DIR/retrieval_saved_model/` (history of
     ORIGINAL movie ids -> top-k original ids and scores; the id map inside;
     unknown ids dropped, see `two_tower_serving`; privacy report beside it)
     and write `DIR/report.json`. A run that fails leaves no `DIR` behind.

Public API (used by the secret-sharer audit): `MovieLensConfig`,
`load_movielens`, `train_and_evaluate`, `MovieLensResult` (`.model`,
`.report`, `.log_probs(contexts, labels)`).

References: Berlowitz et al., "EANA", RecSys 2022, §4.1; Lim et al.,
"LazyDP", ASPLOS 2024, §5; Abadi et al. 2016 (DP-SGD, Poisson sampling).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
from collections.abc import Sequence

import numpy as np

from pipelines import cli_types, movielens_privacy, movielens_vocabulary
from pipelines.output_dir import removed_on_failure
from pipelines.step_timer import StepTimer
from tfdp_embed import DPModel, Release, ReleasedDatasetSize, RunPlan, accounting, keras, release_dataset_size, tf
from tfdp_embed.accounting import write_privacy_report
from tfdp_embed.accounting.report import not_released_note
from tfdp_embed.data import poisson_batches, with_lookahead
from tfdp_embed.data.item_ids import table_size_warning
from tfdp_embed.data.movielens import (
    PADDING_ID,
    MovieLensData,
    MovieLensFormatError,
    load_movielens_data,
    read_ratings,
)
from tfdp_embed.keras2.callbacks import PrivacyBudget
from tfdp_embed.keras2.export import export_saved_model, release_ready
from tfdp_embed.keras2.models.two_tower import TwoTowerModel, two_tower_registry
from tfdp_embed.keras2.models.two_tower_serving import RetrievalServingModule
from tfdp_embed.metrics.baselines import NOT_RELEASED_NOTE, chance_retrieval, item_counts, popularity_retrieval
from tfdp_embed.metrics.retrieval import DEFAULT_KS, precision_recall_at_k

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DATA_PATH = os.path.join(ROOT, "..", "shared", "data", "movielens", "ml-100k", "u.data")
# SGD step sizes (momentum 0.9, batch 256, dim 32), from 2-epoch runs on ml-100k (seed 0):
# none: lr 0.2 / 1.0 / 3.0 gave recall@10 0.080 / 0.087 / 0.032; EANA at sigma 0.01: lr 0.5 / 2.0 /
# 5.0 gave 0.047 / 0.095 / 0.037. A DP step divides the clipped sum by the expected batch, so clipped
# runs take a larger rate. DP-SGD and LazyDP use EANA's rate (not tuned separately). These
# rates suit small sigma only: DP-SGD at sigma 0.6723 (epsilon 3, 5 epochs) gave recall@10
# 0.074 / 0.082 / 0.022 at lr 0.25 / 0.5 / 2.0: calibrated runs default to 0.5.
DEFAULT_LEARNING_RATES = {"none": 1.0, "dense": 2.0, "eana": 2.0, "lazy": 2.0}
LARGE_NOISE_LEARNING_RATE = 0.5
"""Default SGD rate of noised runs with `epsilon` set or sigma >= SMALL_SIGMA_FOR_PLD (see the comment above)."""
SMALL_SIGMA_FOR_PLD = 0.3
"""Below this noise multiplier epsilon is reported with the RDP accountant (PLD needs too much memory)."""
PRIVACY_UNIT = (
    "one (context, label) example: a position of a training user's timeline (example-level, as in EANA "
    "§4.1). A user contributes one example per rated movie after the first, so a user's whole history "
    "is protected only by group privacy over all of them; this is not user-level DP."
)


@dataclasses.dataclass(frozen=True)
class MovieLensConfig:
    """One run's settings (CLI flags map onto these).

    Attributes:
      data_path: the ratings file (u.data, ratings.csv, ratings.dat) or a dataset directory.
      item_catalogue: how movies are numbered: "auto" (the catalogue beside the ratings if any),
        a catalogue file (movies.csv, u.item), or None (the ratings' movies: a DP release for dense / lazy).
      vocabulary_epsilon_share, vocabulary_noise_multiplier, vocabulary_max_items: the DP release of the
        movie ids without a catalogue (`pipelines.movielens_vocabulary`): its share of `epsilon` (or its z
        with sigma given) and D0.
      mechanism: "none", "dense" (DP-SGD), "eana" (not DP) or "lazy" (LazyDP).
      noise_multiplier: sigma; or None with `epsilon` set (calibrated).
      epsilon: target epsilon for dense/lazy (sigma calibrated; a nominal sigma for eana).
      delta: delta; None = 1 / N (N training examples including extra ones).
      l2_norm_clip: per-example clip norm C.
      epochs: passes (each round(1/q) Poisson batches).
      batch_size: expected Poisson batch size q N.
      learning_rate: SGD rate; None = `LARGE_NOISE_LEARNING_RATE` for noised runs with
        `epsilon` set or sigma >= `SMALL_SIGMA_FOR_PLD`, else `DEFAULT_LEARNING_RATES[mechanism]`.
      momentum: SGD momentum (legacy SGD; LazyDP defers it exactly).
      embedding_dim: d of both towers.
      hidden_units: ReLU widths of the context tower after pooling.
      context_length: L, previous movies in a context.
      test_fraction: share of users held out.
      split_seed: seed of the user split (part of the dataset definition).
      seed: seed of initialisation, batches and noise (None: OS entropy; tests and
        benchmarks set it).
      accountant: "pld" or "rdp".
      max_test_examples: evaluate on the first N test examples only (None: all).
      k: top-k of the exported retrieval signature.
      eana_bound_examples: training examples to compute EANA's per-instance bound for.
      verbose: Keras progress bar (1) or silent (0).
    """

    data_path: str = DEFAULT_DATA_PATH
    item_catalogue: str | None = "auto"
    vocabulary_epsilon_share: float | None = None
    vocabulary_noise_multiplier: float | None = None
    vocabulary_max_items: int = movielens_vocabulary.DEFAULT_MAX_ITEMS_PER_USER
    mechanism: str = "eana"
    noise_multiplier: float | None = None
    epsilon: float | None = None
    delta: float | None = None
    l2_norm_clip: float = 1.0
    epochs: int = 5
    batch_size: int = 256
    learning_rate: float | None = None
    momentum: float = 0.9
    embedding_dim: int = 32
    hidden_units: tuple = (64,)
    context_length: int = 20
    test_fraction: float = 0.2
    split_seed: int = 0
    seed: int | None = None
    accountant: str = "pld"
    max_test_examples: int | None = None
    k: int = 10
    eana_bound_examples: int = 3
    verbose: int = 1

    def __post_init__(self):
        if self.mechanism not in movielens_privacy.MECHANISM_NAMES:
            raise ValueError(
                f"`mechanism` must be one of {movielens_privacy.MECHANISM_NAMES}; received {self.mechanism!r}."
            )
        for name in ("epochs", "batch_size", "embedding_dim", "context_length", "k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be an int >= 1; received {value!r}.")
        for name in ("l2_norm_clip",) + (("learning_rate",) if self.learning_rate is not None else ()):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0 or not math.isfinite(value):
                raise ValueError(f"`{name}` must be a finite number > 0; received {value!r}.")
        if self.delta is not None and not 0 < self.delta < 1:
            raise ValueError(f"`delta` must lie in (0, 1); received {self.delta!r}.")

    @property
    def resolved_learning_rate(self) -> float:
        if self.learning_rate is not None:
            return self.learning_rate
        large_noise = self.epsilon is not None or (self.noise_multiplier or 0.0) >= SMALL_SIGMA_FOR_PLD
        if self.mechanism != "none" and large_noise:
            return LARGE_NOISE_LEARNING_RATE
        return DEFAULT_LEARNING_RATES[self.mechanism]


def load_movielens(config: MovieLensConfig) -> MovieLensData:
    """Reads and splits the ratings of `config.data_path` (see `tfdp_embed.data.movielens`).

    Raises:
      FileNotFoundError, MovieLensFormatError: unreadable input (file and line named).
    """
    ids, release = None, None
    if movielens_vocabulary.needs_release(config, read_ratings(config.data_path).path):
        ids, release = movielens_vocabulary.dp_movie_ids(config, config.data_path)  # no catalogue: DP movie ids
    data = load_movielens_data(
        config.data_path,
        context_length=config.context_length,
        test_fraction=config.test_fraction,
        split_seed=config.split_seed,
        catalogue=config.item_catalogue,
        item_ids=ids,
    )
    return dataclasses.replace(data, item_release=release)


@dataclasses.dataclass
class MovieLensResult:
    """A trained, flushed two-tower model and its report.

    Attributes:
      model: the `TwoTowerModel` (flushed: LazyDP's owed noise added; read hooks removed).
      report: the run's report (what `DIR/report.json` holds).
      data: the `MovieLensData` used.
    """

    model: TwoTowerModel
    report: dict
    data: MovieLensData

    def log_probs(self, contexts, labels, *, batch_size: int = 4096) -> np.ndarray:
        """log P(label | context) under the trained model, float64 `[n]` (full softmax over all items).

        Args:
          contexts: int `[n, context_length]`, 0-padded, at least one id per row.
          labels: int `[n]` item ids in [1, num_items].

        Raises:
          ValueError: shapes that do not match; `tf.errors.InvalidArgumentError` for ids out of range.
        """
        contexts, labels = _check_examples(contexts, labels, self.model.num_items, "log_probs")
        out = [
            self.model.log_probs(contexts[i : i + batch_size], labels[i : i + batch_size]).numpy()
            for i in range(0, len(labels), batch_size)
        ]
        return np.concatenate(out).astype(np.float64) if out else np.zeros([0])


def _check_examples(contexts, labels, num_items: int, what: str) -> tuple:
    contexts, labels = np.asarray(contexts), np.asarray(labels)
    if contexts.ndim != 2 or labels.ndim != 1 or contexts.shape[0] != labels.shape[0]:
        raise ValueError(
            f"`{what}` takes contexts [n, context_length] and labels [n]; received shapes {contexts.shape} "
            f"and {labels.shape}."
        )
    if contexts.dtype.kind not in "iu" or labels.dtype.kind not in "iu":
        raise ValueError(f"`{what}`: contexts and labels must be integer item ids (0 = padding in contexts).")
    if contexts.size and (contexts.min() < 0 or contexts.max() > num_items):
        raise ValueError(f"`{what}`: context ids must lie in [0, {num_items}] (0 = padding).")
    if labels.size and (labels.min() < 1 or labels.max() > num_items):
        raise ValueError(f"`{what}`: labels must be item ids in [1, {num_items}].")
    if contexts.size and not np.all(np.any(contexts != PADDING_ID, axis=1)):
        raise ValueError(f"`{what}`: every context needs at least one item id (a row holds only padding).")
    return contexts.astype(np.int32), labels.astype(np.int32)


def _training_pool(data: MovieLensData, extra) -> tuple:
    contexts, labels = data.train_contexts, data.train_labels
    if extra is None:
        return contexts, labels, 0
    if not isinstance(extra, (tuple, list)) or len(extra) != 2:
        raise ValueError("`extra_train_examples` must be a pair (contexts [n, context_length], labels [n]).")
    extra_contexts, extra_labels = _check_examples(extra[0], extra[1], data.num_items, "extra_train_examples")
    if extra_contexts.shape[1] != data.context_length:
        raise ValueError(
            f"`extra_train_examples` contexts must have context_length {data.context_length} columns; "
            f"received {extra_contexts.shape[1]}."
        )
    return (
        np.concatenate([contexts, extra_contexts]),
        np.concatenate([labels, extra_labels]),
        len(extra_labels),
    )


def _batches(contexts, labels, *, q, seed, lookahead: bool, counter, table_name: str):
    """Poisson batches; each batch the model trains on is recorded in `counter` (per epoch).

    The count is a `map` over the sampler's batches (a pass-through step), so
    `DPModel.fit` still sees the Poisson sampler it was fed.
    """
    pool = tf.data.Dataset.from_tensor_slices((contexts.astype(np.int32), labels.astype(np.int32)))
    batches, info = poisson_batches(pool, sampling_probability=q, seed=seed, num_examples=len(labels))
    counter.batches_per_epoch = info.batches_per_epoch

    def record(batch_contexts):
        counter.record(batch_contexts)
        return np.int64(0)

    def counted(batch_contexts, batch_labels):
        done = tf.numpy_function(record, [batch_contexts], tf.int64, stateful=True)
        with tf.control_dependencies([done]):
            return tf.identity(batch_contexts), tf.identity(batch_labels)

    dataset = batches.map(counted)
    if lookahead:
        dataset = with_lookahead(dataset, lambda features: {table_name: features})
    return dataset, info


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
class _Setup:
    """Stage 1's output: the training pool (the privacy units) and the plan for it."""

    contexts: np.ndarray
    labels: np.ndarray
    num_extra: int
    sampling_probability: float
    steps: int
    delta: float
    plan: RunPlan
    released: ReleasedDatasetSize

    @property
    def size(self) -> int:
        return len(self.labels)


@dataclasses.dataclass
class _Trained:
    """Stages 2-3's output: the model, its DP wrapper and budget, and what training recorded."""

    model: TwoTowerModel
    dp_model: DPModel
    budget: PrivacyBudget | None
    counter: movielens_privacy.TouchCounter
    timer: StepTimer
    history: keras.callbacks.History


def train_and_evaluate(
    config: MovieLensConfig,
    *,
    data: MovieLensData | None = None,
    extra_train_examples=None,
    out_dir: str | None = None,
) -> MovieLensResult:
    """Trains, flushes, evaluates (and with `out_dir` exports) one MovieLens two-tower model.

    Args:
      config: the run's settings.
      data: a `load_movielens(config)` result to reuse (None: read it).
      extra_train_examples: optional `(contexts int32 [n, L] 0-padded, labels int32 [n])`
        fixed examples ADDED to the training pool (secret-sharer canaries); each row is
        one example of the Poisson pool (insert a canary r times by repeating its row).
      out_dir: where to write `report.json` and `retrieval_saved_model/` (None: nothing written).

    Returns:
      `MovieLensResult`.

    Raises:
      ValueError: bad settings or extra examples; PrivacyContractError if the model
        cannot be released (owed noise).
    """
    with removed_on_failure(out_dir):  # a failed run leaves no `out_dir` behind
        return _run(config, data, extra_train_examples, out_dir)


def _run(config: MovieLensConfig, data: MovieLensData | None, extra_train_examples, out_dir: str | None):
    started = time.perf_counter()
    data = data if data is not None else load_movielens(config)
    movielens_vocabulary.check_data(config, data)  # a DP run ships a catalogue's or a DP-released movie-id map
    setup = _plan(config, data, extra_train_examples)
    trained = _train(config, data, setup, _build(config, data, setup))
    train_seconds = time.perf_counter() - started
    metrics, test_examples = _release_and_evaluate(config, data, trained)
    privacy = _privacy_report(config, data, setup, trained)
    report = _report(config, data, setup, trained, privacy, metrics, test_examples, train_seconds=train_seconds)
    if out_dir is not None:
        report["saved_model"] = _export(config, data, trained, privacy, out_dir)
    report["wall_seconds"] = time.perf_counter() - started
    report["not_released"] = not_released_note(
        ["the precision/recall metrics", "baselines", "eana_bound", "eana_per_instance_bounds", "data"],
        release="retrieval_saved_model/",
    )
    if out_dir is not None:
        write_privacy_report(os.path.join(out_dir, "report.json"), report)
    return MovieLensResult(model=trained.model, report=report, data=data)


def _plan(config: MovieLensConfig, data: MovieLensData, extra_train_examples) -> _Setup:
    """Stage 1: the training pool (plus any extra examples), q = B / N, T steps, and the privacy plan."""
    contexts, labels, num_extra = _training_pool(data, extra_train_examples)
    released = release_dataset_size(len(labels), seed=config.seed)  # N~: q, delta, T and the report use it, never N
    n = released.value
    if config.batch_size > n:
        raise ValueError(f"`batch_size` {config.batch_size} exceeds the {n} training examples (released with DP).")
    q = released.sampling_probability(config.batch_size)
    steps = config.epochs * max(1, round(1 / q))
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
        else [Release.dataset_size(released), *movielens_vocabulary.releases(data.item_release)],
    )
    if config.verbose:
        print(
            f"movielens: {config.mechanism}, sigma {plan.noise_multiplier:.4g} ({movielens_privacy.noise_source(plan)}), "
            f"N~ {n} (released with DP), q {q:.4g}, {steps} steps, delta {delta:.3g}",
            flush=True,
        )
    return _Setup(contexts, labels, num_extra, q, steps, delta, plan, released)


def _build(config: MovieLensConfig, data: MovieLensData, setup: _Setup) -> tuple:
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
        lookahead=config.mechanism == "lazy",
    )
    dp_model.compile(
        optimizer=keras.optimizers.legacy.SGD(learning_rate=config.resolved_learning_rate, momentum=config.momentum)
    )
    plan = setup.plan
    budget = plan.budget() if plan.is_dp and plan.target_epsilon is not None else None
    return model, dp_model, budget


def _train(config: MovieLensConfig, data: MovieLensData, setup: _Setup, built: tuple) -> _Trained:
    """Stage 3: fit on Poisson batches, counting the history rows each batch touches (EANA's bound)."""
    model, dp_model, budget = built
    lazy = config.mechanism == "lazy"
    counter = movielens_privacy.TouchCounter(data.num_items + 1)
    batches, _ = _batches(
        setup.contexts,
        setup.labels,
        q=setup.sampling_probability,
        seed=config.seed,
        lookahead=lazy,
        counter=counter,
        table_name=model.history_embedding.name,
    )
    # Build the model, check the per-example contract and init the mechanism from a separate
    # probe batch (>= 2 examples: the independence check needs them), so that `fit` does not
    # draw (and count) a Poisson batch the model never trains on.
    probe = tf.data.Dataset.from_tensors((setup.contexts[:8], setup.labels[:8]))
    if lazy:
        probe = with_lookahead(probe, lambda features: {model.history_embedding.name: features})
    dp_model.prepare(probe)
    timer = StepTimer()
    callbacks = [timer] + ([budget] if budget is not None else [])
    history = dp_model.fit(batches, epochs=config.epochs, callbacks=callbacks, verbose=config.verbose)
    return _Trained(model, dp_model, budget, counter, timer, history)


def _release_and_evaluate(config: MovieLensConfig, data: MovieLensData, trained: _Trained) -> tuple:
    """Stage 4: flush owed noise (LazyDP), detach read hooks, evaluate the released model.

    Returns:
      `(metrics, number of test examples)`.
    """
    release_ready(trained.dp_model)
    mechanism = trained.dp_model.mechanism
    if hasattr(mechanism, "detach"):
        mechanism.detach()
    limit = config.max_test_examples
    test_contexts, test_labels = data.test_contexts[:limit], data.test_labels[:limit]
    metrics = evaluate(trained.model, test_contexts, test_labels)
    if limit is None:  # positions whose movie the map dropped count as misses
        metrics = movielens_vocabulary.scale_metrics(metrics, data, len(test_labels))
    return metrics, len(test_labels)


def _privacy_report(config: MovieLensConfig, data: MovieLensData, setup: _Setup, trained: _Trained) -> dict:
    """The privacy report: the budget's ledger, or the steps run; EANA's nominal epsilon; the item ids' source."""
    plan, budget, steps_run = setup.plan, trained.budget, trained.counter.steps
    sigma = plan.noise_multiplier
    # PLD's privacy-loss grid grows without bound as sigma -> 0 (gigabytes at EANA's sigma 0.01);
    # RDP is cheap there, and over-states epsilon slightly (never under-states it).
    accountant = config.accountant if sigma >= SMALL_SIGMA_FOR_PLD else "rdp"
    vocabulary, caveats = movielens_vocabulary.report_terms(data, data.item_release, config.mechanism)
    report = plan.report(
        dataset_size=setup.released,  # N~, never the exact number of examples
        privacy_unit=PRIVACY_UNIT,
        contribution_bound=f"one example's gradient clipped to L2 norm {config.l2_norm_clip:g} in each step it is "
        "sampled in; a user's examples are not bounded together (group privacy over their ratings)",
        dp_model=trained.dp_model,  # what fit was fed (verified from the data)
        ledger=budget.ledger if budget is not None else None,
        steps=None if budget is not None else steps_run,
        accountant=accountant,
        epsilon=(
            movielens_privacy.nominal_epsilon(
                noise_multiplier=sigma,
                sampling_probability=setup.sampling_probability,
                steps=steps_run,
                delta=setup.delta,
                accountant=accountant,
            )
            if config.mechanism == "eana"
            else None
        ),
        extra={"item_ids": data.item_ids.summary() if data.item_ids is not None else None, **vocabulary},
    )
    report["caveats"] = [*report.get("caveats", []), *caveats]
    return movielens_vocabulary.add_threshold_delta(report, data.item_release)


def _warnings(config: MovieLensConfig, data: MovieLensData, final_loss: float | None) -> list:
    warnings = []
    if final_loss is not None and not math.isfinite(final_loss):
        warnings.append(
            f"Training diverged (final loss {final_loss}): the metrics are meaningless. Lower the learning "
            f"rate (now {config.resolved_learning_rate:g}) or the momentum (now {config.momentum:g})."
        )
    rated = data.rated_items if data.rated_items is not None else data.num_items
    table = table_size_warning(table_rows=data.num_items + 1, distinct_ids=rated, what="item")
    if table and data.item_ids is not None and data.item_ids.source.startswith("catalogue"):
        table += (
            f" Here the {data.item_ids.source} lists movies nobody rated: `--item-catalogue none` numbers only the "
            "rated ones."
        )
    return warnings + ([table] if table else [])


def baselines(data: MovieLensData, labels: np.ndarray) -> dict:
    """Chance and popularity precision@k / recall@k on the test `labels` (not released; see `metrics.baselines`)."""
    counts = item_counts(np.concatenate(list(data.train_timelines.values())), data.num_items)
    return {
        "note": NOT_RELEASED_NOTE,
        "chance": chance_retrieval(data.num_items, ks=DEFAULT_KS),
        "popularity": popularity_retrieval(counts, labels, ks=DEFAULT_KS),
        "popularity_counts": "ratings of each movie by the training users (exact counts, not private)",
    }


def _report(
    config: MovieLensConfig,
    data: MovieLensData,
    setup: _Setup,
    trained: _Trained,
    privacy: dict,
    metrics: dict,
    test_examples: int,
    *,
    train_seconds: float,
) -> dict:
    """Stage 5: the report, the privacy report plus metrics, counts, timings, settings (and EANA's bounds)."""
    counter, history = trained.counter, trained.history
    final_loss = float(history.history["loss"][-1]) if history.history.get("loss") else None
    report = dict(privacy)
    report.update(
        warnings=_warnings(config, data, final_loss),
        privacy_unit=PRIVACY_UNIT,
        noise_source=movielens_privacy.noise_source(setup.plan),
        target_epsilon=setup.plan.target_epsilon,
        **metrics,
        train_examples=setup.released.value,  # N~ (released with DP), not the exact count
        extra_train_examples=setup.num_extra,
        test_examples=test_examples,
        baselines=baselines(data, data.test_labels[: config.max_test_examples]),
        planned_steps=setup.steps,
        steps_run=counter.steps,
        final_train_loss=final_loss,
        mean_history_rows_per_step=float(np.mean(counter.rows_per_step)) if counter.rows_per_step else None,
        median_step_s=trained.timer.median(),
        train_seconds=train_seconds,
        data=data.summary(),
        model={
            "embedding_dim": config.embedding_dim,
            "hidden_units": list(config.hidden_units),
            "num_items": data.num_items,
            "loss": "full softmax cross-entropy over all items",
        },
        training={
            "epochs": config.epochs,
            "batch_size": config.batch_size,
            "learning_rate": config.resolved_learning_rate,
            "momentum": config.momentum,
            "optimizer": "keras.optimizers.legacy.SGD",
            "seeded": config.seed is not None,
        },
    )
    if config.mechanism == "eana" and setup.plan.noise_multiplier > 0 and counter.steps > 0:
        report.update(_eana_bounds(config, data, setup, trained))
    return report


def _eana_bounds(config: MovieLensConfig, data: MovieLensData, setup: _Setup, trained: _Trained) -> dict:
    """EANA's data-dependent bound (Theorem 3.1) and per-instance bounds of the first examples: NOT DP."""
    sigma, k = setup.plan.noise_multiplier, min(config.eana_bound_examples, setup.size)
    return {
        "eana_bound": movielens_privacy.eana_theorem_bound(
            model=trained.model,
            counter=trained.counter,
            noise_multiplier=sigma,
            context_length=data.context_length,
            delta=setup.delta,
        ),
        "eana_per_instance_bounds": movielens_privacy.eana_per_instance_bounds(
            model=trained.model,
            counter=trained.counter,
            contexts=setup.contexts[:k],
            labels=setup.labels[:k],
            noise_multiplier=sigma,
            l2_norm_clip=config.l2_norm_clip,
            delta=setup.delta,
        ),
    }


def _export(config: MovieLensConfig, data: MovieLensData, trained: _Trained, privacy: dict, out_dir: str) -> str:
    """Exports `out_dir/retrieval_saved_model/` (original movie ids -> top-k original ids, the id map inside,
    the privacy report beside it); its path."""
    os.makedirs(out_dir, exist_ok=True)
    serving = RetrievalServingModule(trained.model, k=config.k, item_ids=data.item_ids)
    path = os.path.join(out_dir, "retrieval_saved_model")
    export_saved_model(
        trained.dp_model,
        path,
        serving_module=serving,
        signatures={"serving_default": serving.serve},
        report=privacy,
    )
    return path


# -- command line -------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pipelines.movielens",
        description="Train the EANA two-tower next-movie model on MovieLens with DP-SGD, EANA, LazyDP or no "
        "privacy; report precision@k/recall@k (k = 1, 5, 10, 20 over all items) and export a retrieval SavedModel.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    _add_privacy_flags(p)
    p.add_argument("--epochs", type=cli_types.positive(int), required=True)
    p.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="writes DIR/report.json and DIR/retrieval_saved_model/",
    )
    p.add_argument(
        "--data",
        default=DEFAULT_DATA_PATH,
        metavar="PATH",
        help="ratings: ml-100k u.data, ml-latest/ML-20M ratings.csv, ML-1M ratings.dat, or a dataset directory",
    )
    p.add_argument(
        "--item-catalogue",
        default="auto",
        metavar="PATH",
        help="numbers the movies densely: 'auto' = movies.csv / movies.dat / u.item beside the ratings if present, "
        "a catalogue file, or 'none' = the ratings' movies (dense / lazy: released with DP, unit = user)",
    )
    p.add_argument(
        "--vocabulary-epsilon-share",
        type=float,
        help="without a catalogue (dense / lazy): share of --epsilon the movie-set release is sized for "
        f"(default {movielens_vocabulary.DEFAULT_EPSILON_SHARE})",
    )
    p.add_argument(
        "--vocabulary-noise-multiplier",
        type=cli_types.positive(float),
        help="without a catalogue (dense / lazy): z of the movie-set release (default: from the share with "
        f"--epsilon, {movielens_vocabulary.DEFAULT_NOISE_MULTIPLIER} with --noise-multiplier)",
    )
    p.add_argument(
        "--vocabulary-max-items",
        type=cli_types.positive(int),
        default=movielens_vocabulary.DEFAULT_MAX_ITEMS_PER_USER,
        help="D0: each user's most recent distinct movies counted in the movie-set release",
    )
    p.add_argument(
        "--batch-size",
        type=cli_types.positive(int),
        default=256,
        help="expected Poisson batch size",
    )
    p.add_argument(
        "--learning-rate",
        type=cli_types.positive(float),
        help=f"SGD rate (default {DEFAULT_LEARNING_RATES}; {LARGE_NOISE_LEARNING_RATE} for noised runs "
        f"with --epsilon or a noise multiplier >= {SMALL_SIGMA_FOR_PLD})",
    )
    p.add_argument("--momentum", type=cli_types.non_negative_float, default=0.9)
    p.add_argument("--l2-norm-clip", type=cli_types.positive(float), default=1.0)
    p.add_argument("--embedding-dim", type=cli_types.positive(int), default=32)
    p.add_argument("--context-length", type=cli_types.positive(int), default=20)
    p.add_argument(
        "--seed",
        type=int,
        help="seed for init, batches and noise (default: OS entropy)",
    )
    p.add_argument("--accountant", choices=("pld", "rdp"), default="pld", help="privacy accountant")
    p.add_argument("--k", type=cli_types.positive(int), default=10, help="top-k of the exported signature")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _add_privacy_flags(p: argparse.ArgumentParser) -> None:
    """The mechanism and its noise: a given sigma or a target epsilon (exclusive), and delta."""
    p.add_argument("--mechanism", choices=movielens_privacy.MECHANISM_NAMES, required=True)
    noise = p.add_mutually_exclusive_group()
    noise.add_argument(
        "--noise-multiplier",
        type=cli_types.non_negative_float,
        help="sigma (e.g. EANA's 0.01 or 0.001)",
    )
    noise.add_argument(
        "--epsilon",
        type=cli_types.positive(float),
        help="target epsilon (sigma calibrated; nominal for eana)",
    )
    p.add_argument(
        "--delta",
        type=cli_types.positive(float),
        help="delta (default 1/N, N training examples)",
    )


def parse_args(argv: Sequence[str] | None = None) -> tuple:
    """(MovieLensConfig, out_dir) from command-line flags; exits with status 2 on bad flags."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.mechanism != "none" and args.noise_multiplier is None and args.epsilon is None:
        parser.error(f"--mechanism {args.mechanism} needs --noise-multiplier or --epsilon")
    if args.mechanism == "none" and (args.noise_multiplier is not None or args.epsilon is not None):
        parser.error("--mechanism none takes neither --noise-multiplier nor --epsilon")
    if args.vocabulary_epsilon_share is not None and not 0 < args.vocabulary_epsilon_share < 1:
        parser.error(f"--vocabulary-epsilon-share must lie in (0, 1); received {args.vocabulary_epsilon_share}")
    if args.delta is not None and args.delta >= 1:
        parser.error(f"--delta must lie in (0, 1); received {args.delta}")
    config = MovieLensConfig(
        data_path=args.data,
        item_catalogue=None if args.item_catalogue == "none" else args.item_catalogue,
        mechanism=args.mechanism,
        noise_multiplier=args.noise_multiplier,
        epsilon=args.epsilon,
        delta=args.delta,
        l2_norm_clip=args.l2_norm_clip,
        epochs=args.epochs,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        momentum=args.momentum,
        embedding_dim=args.embedding_dim,
        context_length=args.context_length,
        seed=args.seed,
        k=args.k,
        accountant=args.accountant,
        vocabulary_epsilon_share=args.vocabulary_epsilon_share,
        vocabulary_noise_multiplier=args.vocabulary_noise_multiplier,
        vocabulary_max_items=args.vocabulary_max_items,
        verbose=0 if args.quiet else 1,
    )
    return config, args.out


def format_report(report: dict) -> str:
    """The summary printed at the end of a run: the library's privacy lines, then the retrieval metrics."""
    bound = report.get("eana_bound")
    details = {
        "noise source": report.get("noise_source"),
        "steps run": report["steps_run"],
        "precision@k": ", ".join(f"@{k} {report[f'precision@{k}']:.4f}" for k in DEFAULT_KS),
        "recall@k": ", ".join(f"@{k} {report[f'recall@{k}']:.4f}" for k in DEFAULT_KS),
        **_baseline_lines(report.get("baselines")),
        "test examples": report["test_examples"],
        "median step": _milliseconds(report.get("median_step_s")),
        "EANA bound": None
        if bound is None
        else (f"data-dependent eps {bound['data_dependent_epsilon']:.4g} (NOT DP: {bound['label']})"),
    }
    return accounting.format_report(report, title="movielens two-tower report", details=details)


def _baseline_lines(baselines: dict | None) -> dict:
    if not baselines:
        return {}
    return {
        f"{name} recall@k": ", ".join(f"@{k} {baselines[name][f'recall@{k}']:.4f}" for k in DEFAULT_KS)
        + (" (training-split counts, not private, not released)" if name == "popularity" else " (random ranking)")
        for name in ("chance", "popularity")
    }


def _milliseconds(seconds) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:.1f} ms"


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit status (2 for bad flags, 1 for bad data or settings)."""
    config, out = parse_args(argv)
    try:
        result = train_and_evaluate(config, out_dir=out)
    except (FileNotFoundError, MovieLensFormatError, ValueError) as error:  # `out` was removed again
        print(f"python -m pipelines.movielens: error: {error}", file=sys.stderr)
        return 1
    print(format_report(result.report))
    print(f"report: {os.path.join(out, 'report.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
