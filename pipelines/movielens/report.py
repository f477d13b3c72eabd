"""The MovieLens run's report: privacy report, metrics, references (not released), EANA's bounds (NOT DP)."""

from __future__ import annotations

import math

import numpy as np

from pipelines import quality
from pipelines.movielens import privacy as movielens_privacy
from pipelines.movielens import units as movielens_units
from pipelines.movielens import vocabulary as movielens_vocabulary
from pipelines.movielens.config import (
    PRIVACY_UNIT,
    SMALL_SIGMA_FOR_PLD,
    MovieLensConfig,
)
from pipelines.movielens.training import (
    Setup,
    Trained,
)
from tfdp_embed import accounting
from tfdp_embed.data.item_ids import table_size_warning
from tfdp_embed.data.movielens import (
    MovieLensData,
)
from tfdp_embed.metrics.baselines import NOT_RELEASED_NOTE, chance_retrieval, item_counts, popularity_retrieval
from tfdp_embed.metrics.retrieval import DEFAULT_KS


def privacy_report(config: MovieLensConfig, data: MovieLensData, setup: Setup, trained: Trained) -> dict:
    """The privacy report: the budget's ledger, or the steps run; EANA's nominal epsilon; the item ids' source."""
    plan, budget, steps_run = setup.plan, trained.budget, trained.counter.steps
    sigma = plan.noise_multiplier
    # PLD's privacy-loss grid grows without bound as sigma -> 0 (gigabytes at EANA's sigma 0.01);
    # RDP is cheap there, and over-states epsilon slightly (never under-states it).
    accountant = config.accountant if sigma >= SMALL_SIGMA_FOR_PLD else "rdp"
    vocabulary, caveats = movielens_vocabulary.report_terms(data, data.item_release, config.mechanism)
    user_level = setup.user_level  # the unit, k and the bound then come from the user-level batches
    ledger = budget.ledger if budget is not None else None  # sigma given: `plan.report` counts its releases
    report = plan.report(
        dataset_size=setup.released,  # N~, never the exact number of examples (or users)
        privacy_unit=None if user_level else PRIVACY_UNIT,
        contribution_bound=None
        if user_level
        else f"one example's gradient clipped to L2 norm {config.l2_norm_clip:g} in each step it is "
        "sampled in; a user's examples are not bounded together (group privacy over their ratings)",
        dp_model=trained.dp_model,  # what fit was fed (verified from the data)
        ledger=ledger,
        steps=None if ledger is not None else steps_run,
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
        extra={
            "item_ids": data.item_ids.summary() if data.item_ids is not None else None,
            **vocabulary,
            **({"max_examples_per_user_release": setup.k_release.report()} if setup.k_release is not None else {}),
        },
    )
    if user_level and config.max_examples_per_user is None:
        caveats.append(f"k = {setup.max_examples_per_user}: {setup.k_source}.")
    report["caveats"] = [*report.get("caveats", []), *caveats]
    return movielens_vocabulary.add_threshold_delta(report, data.item_release)


def run_warnings(config: MovieLensConfig, data: MovieLensData, final_loss: float | None) -> list:
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


def quality_checks(data: MovieLensData, metrics: dict, references: dict, final_loss, test_examples: int) -> dict:
    """The model against chance and popularity (recall@10), a stuck loss, duplicated ratings: `pipelines.quality`.

    Duplicated (user, movie) ratings are KEPT, and counted and warned about: a MovieLens file rates each movie
    once per user, so a repeat means a file joined twice or a bad export. Which copy is "the" rating (its
    timestamp places it in the timeline) is the file's to say, and dropping one would silently change the
    examples and N of a run that the file (and its checksum) still describes. The operator fixes the file.
    """
    comparison, warnings = quality.ranking_references(
        metrics, references, keys=("recall@10",), what=f"{test_examples} test examples"
    )
    stuck = quality.stuck_loss_warning(
        final_loss, quality.uniform_softmax_loss(data.num_items), initial=f"ln({data.num_items} movies)"
    )
    duplicates, rows = quality.duplicate_pairs([*data.train_timelines.values(), *data.test_timelines.values()])
    repeated = quality.duplicates_warning(
        duplicates,
        rows,
        path=data.path,
        what="(user, movie) pair",
        kept="kept: each copy is one more position of the user's timeline (a training example or a test query). "
        "Remove the repeats from the file unless they are intended.",
    )
    return {
        "references": comparison,
        "data_quality": {"ratings": rows, "duplicate_user_movie_ratings": duplicates, "duplicates": "kept"},
        "warnings": warnings + [w for w in (stuck, repeated) if w],
    }


def baselines(data: MovieLensData, labels: np.ndarray) -> dict:
    """Chance and popularity precision@k / recall@k on the test `labels` (not released; see `metrics.baselines`)."""
    counts = item_counts(np.concatenate(list(data.train_timelines.values())), data.num_items)
    return {
        "note": NOT_RELEASED_NOTE,
        "chance": chance_retrieval(data.num_items, ks=DEFAULT_KS),
        "popularity": popularity_retrieval(counts, labels, ks=DEFAULT_KS),
        "popularity_counts": "ratings of each movie by the training users (exact counts, not private)",
    }


def build_report(
    config: MovieLensConfig,
    data: MovieLensData,
    setup: Setup,
    trained: Trained,
    privacy: dict,
    metrics: dict,
    test_examples: int,
    *,
    train_seconds: float,
) -> dict:
    """Stage 5: the report, the privacy report plus metrics, counts, timings, settings (and EANA's bounds)."""
    counter, history = trained.counter, trained.history
    final_loss = float(history.history["loss"][-1]) if history.history.get("loss") else None
    report, references = dict(privacy), baselines(data, data.test_labels[: config.max_test_examples])
    row_loss = final_loss  # per example; at user level the loss is a user's sum over <= k rows
    if setup.user_level and final_loss is not None:
        row_loss = final_loss / movielens_units.mean_rows_per_user(setup)
    checks = quality_checks(data, metrics, references, row_loss, test_examples)
    report.update(
        warnings=run_warnings(config, data, final_loss) + checks.pop("warnings"),
        **checks,
        privacy_unit=privacy["privacy_unit"],
        noise_source=movielens_privacy.noise_source(setup.plan),
        target_epsilon=setup.plan.target_epsilon,
        **metrics,
        train_examples=setup.released.value,  # N~ (released with DP), not the exact count
        extra_train_examples=setup.num_extra,
        test_examples=test_examples,
        baselines=references,
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
    if setup.user_level:
        report.update(movielens_units.user_level_fields(setup))
    else:
        report["group_privacy"] = movielens_units.group_privacy_fields(setup, trained, privacy.get("epsilon"))
    if config.mechanism == "eana" and setup.plan.noise_multiplier > 0 and counter.steps > 0 and not setup.user_level:
        report.update(_eana_bounds(config, data, setup, trained))  # bounds per example (not for user units)
    return report


def _eana_bounds(config: MovieLensConfig, data: MovieLensData, setup: Setup, trained: Trained) -> dict:
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
        "per user (group privacy)": _group_line(report.get("group_privacy")),
        "k per user": _k_line(report),
    }
    return accounting.format_report(report, title="movielens two-tower report", details=details)


def _group_line(group: dict | None) -> str | None:
    """Example level: what the guarantee says about a user with the median and with the most examples."""
    if not group:
        return None
    parts = [
        f"{name.replace('_', ' ')} ({group[name]['examples']} examples) eps {group[name]['epsilon']:.4g}"
        for name in ("median_user", "largest_user")
    ]
    return ", ".join(parts) + f" at delta {group['median_user']['delta']:.3g} (example-level DP: not user-level)"


def _k_line(report: dict) -> str | None:
    if report.get("max_examples_per_user") is None:
        return None
    return f"{report['max_examples_per_user']} ({report['max_examples_per_user_choice']})"


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
