"""One sequential run end to end (`run`): read, the stages of `training.py`, release, `report.json`."""

from __future__ import annotations

import dataclasses
import os
import time

from pipelines import input_files
from pipelines.output_dir import Staging, staged_release
from pipelines.sequential.config import SequentialConfig
from pipelines.sequential.report import (
    baselines,
    quality_checks,
    release,
    run_warnings,
)
from pipelines.sequential.training import build_model, evaluate_model, fit_model, log, plan_privacy
from pipelines.sequential.vocabulary import check_item_memory
from tfdp_embed.accounting import write_privacy_report
from tfdp_embed.accounting.report import not_released_note
from tfdp_embed.data.sequences import (
    load_sequences,
)
from tfdp_embed.keras2.models.sasrec import SASRec, SASRecServing


@dataclasses.dataclass
class SequentialResult:
    report: dict
    model: SASRec
    serving: SASRecServing


def run(config: SequentialConfig) -> SequentialResult:
    """read -> frequencies + calibration -> build -> train -> evaluate -> export; writes `OUT/report.json`.

    Raises:
      SequenceFormatError: a malformed input line (names file and line).
      ValueError: settings the data or the accountant cannot support, more steps than
        `run_limits.MAX_STEPS`, item logits larger than the memory; `OutputBusyError` (a ValueError):
        another run writes `config.out`.
    """
    with staged_release(config.out, required=RELEASE_FILES) as staging:  # `output_dir`: all or nothing at `out`
        return _run(dataclasses.replace(config, out=staging.path), staging)


RELEASE_FILES = ("saved_model/saved_model.pb", "saved_model/privacy_report.json", "report.json")
"""What `out` holds once published (`pipelines.output_dir`)."""
PROGRAM = "python -m pipelines.sequential"


def _load(config: SequentialConfig) -> tuple:
    """`(SequenceData, bom)`: the file read, not text refused naming its line, a UTF-8 BOM stripped (`input_files`)."""
    bom = input_files.check_text(config.data, what="'user item' or 'user item item ...' lines")
    if not bom:
        return load_sequences(config.data, max_len=config.max_len, layout=config.layout), False
    log(config, f"{config.data} starts with a UTF-8 byte-order mark (BOM): read without it")
    with input_files.without_bom(config.data) as path:
        return load_sequences(path, max_len=config.max_len, layout=config.layout), True


def _run(config: SequentialConfig, staging: Staging) -> SequentialResult:
    """The run, writing into `config.out` (the staging directory); the report names the published paths."""
    started = time.perf_counter()
    data, bom = _load(config)
    check_item_memory(config, data)
    summary = {k: v for k, v in data.summary().items() if k != "users"}  # N is not released, not even to a log
    log(config, f"read {config.data}: {summary}")
    privacy = plan_privacy(config, data)
    staging.budget.start(privacy.run, program=PROGRAM)  # OUT.budget.jsonl: spent even if the run dies now
    raw, data = data, privacy.data  # the data in the run's item ids (a DP vocabulary or a public catalogue)
    model, dp_model, budget = build_model(config, data, privacy)
    timer, history = fit_model(config, data, privacy, dp_model, budget)
    train_seconds = time.perf_counter() - started
    valid, test = evaluate_model(config, data, model)
    report_privacy, serving, saved_model = release(config, data, privacy, model, dp_model, budget, timer)
    report, references = dict(report_privacy), baselines(raw, limit=config.max_eval_users)
    losses = [float(x) for x in history.history.get("loss", [])]
    checks = quality_checks(data, test, references, losses)
    report.update(
        {
            "ndcg@10": test["ndcg@10"],
            "hit@10": test["hit@10"],
            "test": test,
            "validation": valid,
            "baselines": references,
            "references": checks["references"],
            "warnings": run_warnings(data) + checks["warnings"],
            "model": config.model,
            "target_epsilon": privacy.epsilon,
            "noise_multiplier": privacy.run.noise_multiplier,
            "steps": len(timer.durations),
            "loss_per_epoch": losses,
            "median_step_s": timer.median(),
            "train_seconds": train_seconds,
            "wall_seconds": time.perf_counter() - started,
            "data": {"file": config.data, **data.summary()} | ({"byte_order_mark": "stripped"} if bom else {}),
            "settings": {k: v for k, v in dataclasses.asdict(config).items() if k not in ("data", "out", "seed")}
            | {"seeded": config.seed is not None},  # never the seed itself
            "metric_protocol": "full ranking over all items (no sampling), history items kept, ties pessimistic",
            "saved_model": saved_model,
            "not_released": not_released_note(
                ["ndcg@10", "hit@10", "test", "validation", "baselines", "references", "loss_per_epoch", "data"],
                release="saved_model/",
            ),
        }
    )
    report["earlier_runs"] = staging.budget.spent(report)
    report = staging.published(report)
    write_privacy_report(os.path.join(config.out, "report.json"), report)
    return SequentialResult(report=report, model=model, serving=serving)
