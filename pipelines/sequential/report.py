"""The sequential run's report: privacy report and export, references (not released), the summary."""

from __future__ import annotations

import os

from pipelines import quality
from pipelines.sequential import vocabulary as sequential_vocabulary
from pipelines.sequential.config import SequentialConfig
from tfdp_embed import accounting, export_saved_model
from tfdp_embed.data.item_ids import table_size_warning
from tfdp_embed.keras2.models.sasrec import SASRecServing
from tfdp_embed.metrics.baselines import NOT_RELEASED_NOTE, chance_ranking, item_counts, popularity_ranking


def baselines(data, *, limit: int | None = None, k: int = 10) -> dict:
    """Chance and popularity NDCG@k / HIT@k on the test users (references; not released, see `metrics.baselines`).

    Popularity counts every item of the users' training sequences (inputs and their last target).
    """
    counts = item_counts(data.train_inputs, data.num_items) + item_counts(data.train_targets[:, -1], data.num_items)
    return {
        "note": NOT_RELEASED_NOTE,
        "chance": chance_ranking(data.num_items, k=k),
        "popularity": popularity_ranking(counts, data.test_targets[:limit], k=k),
        "popularity_counts": "items of the training sequences (exact counts, not private)",
    }


def quality_checks(data, test: dict, references: dict, losses: list) -> dict:
    """The model against chance and popularity (NDCG@10, HIT@10) and a loss stuck at ln(#items): `pipelines.quality`.

    Repeated items in a user's sequence are not counted as duplicates: consuming an item again is data.
    """
    comparison, warnings = quality.ranking_references(
        test, references, keys=("ndcg@10", "hit@10"), what=f"{test.get('users')} test users"
    )
    stuck = quality.stuck_loss_warning(
        losses[-1] if losses else None,
        quality.uniform_softmax_loss(data.num_items),
        initial=f"ln({data.num_items} items)",
    )
    return {"references": comparison, "warnings": warnings + ([stuck] if stuck else [])}


def run_warnings(data) -> list:
    table = table_size_warning(
        table_rows=data.num_items + 1, distinct_ids=data.distinct_items or data.num_items, what="item"
    )
    return [table] if table else []


def release(config: SequentialConfig, data, privacy, model, dp_model, budget, timer) -> tuple:
    """Stage 6: the privacy report and the export of `OUT/saved_model`. Returns `(privacy report, serving, path)`."""
    run = privacy.run
    report_privacy = run.report(
        dataset_size=privacy.size,  # N~: the exact number of users is not released
        privacy_unit="user",  # declared: one training sequence per user (the library states k = 1 and the users)
        contribution_bound=f"one training sequence of at most {data.max_len} items per user"
        + (f", its gradient clipped to L2 norm {run.l2_norm_clip:g} in each step" if run.l2_norm_clip else ""),
        dp_model=dp_model,  # what fit was fed (verified from the data)
        ledger=budget.ledger if budget is not None else None,
        steps=None if budget is not None else len(timer.durations),
        extra={
            "item_frequencies": privacy.frequency_report(),
            "calibrated_steps": run.steps,
        },
    )
    sequential_vocabulary.add_to_report(report_privacy, privacy.items)
    serving = SASRecServing(model, k=min(config.top_k, model.config.num_items), item_ids=privacy.items.ids)
    saved_model = os.path.join(config.out, "saved_model")
    export_saved_model(
        dp_model,
        saved_model,
        serving_module=serving,
        signatures={"serving_default": serving.serve},
        report=report_privacy,
    )
    return report_privacy, serving, saved_model


def frequency_summary(info: dict) -> str:
    if info.get("dp_event") is None:
        return info["source"] + (f" ({info['file']})" if info.get("file") else "")
    return (
        f"{info['source']}, noise multiplier {info['noise_multiplier']:.4g} (count noise std {info['noise_std']:.3g}), "
        f"epsilon {info['release_epsilon']:.3g} alone ({100 * info['epsilon_share']:.3g}% of the target)"
    )


def format_summary(report: dict) -> str:
    """The summary printed at the end of a run: the library's privacy lines, then the ranking metrics."""
    frequencies = report.get("extra", {}).get("item_frequencies")
    details = {
        "model": report["model"],
        "item frequencies": frequency_summary(frequencies) if frequencies else "n/a",
        "NDCG@10 / HIT@10": f"{100 * report['ndcg@10']:.2f}% / {100 * report['hit@10']:.2f}% "
        f"({report['test']['users']} test users, all items ranked)",
        **_baseline_lines(report.get("baselines")),
        "wall time": f"{report['wall_seconds']:.1f} s",
    }
    return accounting.format_report(report, title="sequential report", details=details)


def _baseline_lines(baselines: dict | None) -> dict:
    if not baselines:
        return {}
    return {
        f"{name} reference": f"{100 * baselines[name]['ndcg@10']:.2f}% / {100 * baselines[name]['hit@10']:.2f}%"
        + (" (training-split counts, not private, not released)" if name == "popularity" else " (random ranking)")
        for name in ("chance", "popularity")
    }
