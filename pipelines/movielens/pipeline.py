"""One MovieLens run end to end (`train_and_evaluate`): the stages of `training.py`, the report, the export."""

from __future__ import annotations

import dataclasses
import os
import time

import numpy as np

from pipelines.movielens import audit as movielens_audit
from pipelines.movielens import vocabulary as movielens_vocabulary
from pipelines.movielens.config import (
    MovieLensConfig,
)
from pipelines.movielens.data import check_examples, load_movielens
from pipelines.movielens.report import build_report, privacy_report
from pipelines.movielens.training import (
    Trained,
    build_model,
    fit_model,
    plan_training,
    release_and_evaluate,
)
from pipelines.output_dir import Staging, staged_release
from tfdp_embed.accounting import write_privacy_report
from tfdp_embed.accounting.report import not_released_note
from tfdp_embed.data.movielens import (
    MovieLensData,
)
from tfdp_embed.keras2.export import export_saved_model
from tfdp_embed.keras2.models.two_tower import TwoTowerModel
from tfdp_embed.keras2.models.two_tower_serving import RetrievalServingModule


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
        contexts, labels = check_examples(contexts, labels, self.model.num_items, "log_probs")
        out = [
            self.model.log_probs(contexts[i : i + batch_size], labels[i : i + batch_size]).numpy()
            for i in range(0, len(labels), batch_size)
        ]
        return np.concatenate(out).astype(np.float64) if out else np.zeros([0])


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
      ValueError: bad settings or extra examples, more steps than `run_limits.MAX_STEPS`;
        `output_dir.OutputBusyError` (a ValueError) when another run writes `out_dir`.
      PrivacyContractError: the model cannot be released (owed noise).
    """
    required = AUDIT_FILES if config.audit_canaries else RELEASE_FILES  # an audit run exports no model
    with staged_release(out_dir, required=required) as staging:  # `output_dir`: all or nothing at `out_dir`
        return _run(config, data, extra_train_examples, staging)


RELEASE_FILES = (
    "retrieval_saved_model/saved_model.pb",
    "retrieval_saved_model/privacy_report.json",
    "report.json",
)
"""What `out_dir` holds once published (`pipelines.output_dir`)."""
AUDIT_FILES = ("report.json",)
"""What an audit run (`--audit-canaries`) publishes: its report, no model."""


def _run(config: MovieLensConfig, data: MovieLensData | None, extra_train_examples, staging: Staging | None):
    """The run; with `staging`, writes into `staging.path` and reports the published paths."""
    out_dir = None if staging is None else staging.path
    started = time.perf_counter()
    data = data if data is not None else load_movielens(config)
    movielens_vocabulary.check_data(config, data)  # a DP run ships a catalogue's or a DP-released movie-id map
    canaries = None
    if config.audit_canaries:  # canaries of their own item ids join the pool; nothing is exported
        data, extra_train_examples, canaries = movielens_audit.prepare(config, data, extra_train_examples)
    setup = plan_training(config, data, extra_train_examples)
    if staging is not None:  # OUT.budget.jsonl: this run's epsilon counts from now, even if it dies
        staging.budget.start(setup.plan, program="python -m pipelines.movielens")
    trained = fit_model(config, data, setup, build_model(config, data, setup))
    train_seconds = time.perf_counter() - started
    metrics, test_examples = release_and_evaluate(config, data, trained)
    privacy = privacy_report(config, data, setup, trained)
    report = build_report(config, data, setup, trained, privacy, metrics, test_examples, train_seconds=train_seconds)
    if canaries is not None:
        report["audit"] = movielens_audit.field(trained.model, canaries, privacy, setup.delta)
        report["released"] = False
    elif out_dir is not None:
        report["saved_model"] = _export(config, data, trained, privacy, out_dir)
    report["wall_seconds"] = time.perf_counter() - started
    report["not_released"] = not_released_note(
        [
            "the precision/recall metrics",
            "baselines",
            "references",
            "data_quality",
            "eana_bound",
            "eana_per_instance_bounds",
            "group_privacy",
            "users_with_more_examples_than_k",
            "examples_dropped_per_epoch_share",
            "data",
        ],
        release="retrieval_saved_model/",
    )
    if staging is not None:
        report["earlier_runs"] = staging.budget.spent(report)
        report = staging.published(report)
        write_privacy_report(os.path.join(staging.path, "report.json"), report)
    return MovieLensResult(model=trained.model, report=report, data=data)


def _export(config: MovieLensConfig, data: MovieLensData, trained: Trained, privacy: dict, out_dir: str) -> str:
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
