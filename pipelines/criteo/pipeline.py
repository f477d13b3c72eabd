"""The Criteo pipeline's run, stage by stage: read -> plan -> build -> train -> release -> report.

Each stage is one function below; `run` calls them in order and writes
`report.json`. What each stage does, and why, is in the package docstring
(`pipelines.criteo`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time

from pipelines.criteo import calibration as criteo_calibration
from pipelines.criteo import data as criteo_data
from pipelines.criteo import evaluation as criteo_eval
from pipelines.criteo import privacy as criteo_privacy
from pipelines.criteo import report as criteo_report
from pipelines.criteo import training as criteo_training
from pipelines.criteo.config import PipelineConfig
from pipelines.step_timer import StepTimer
from tfdp_embed import DPEmbedding, RunPlan, export_saved_model, keras
from tfdp_embed.accounting import Period, PrivacyBudget
from tfdp_embed.accounting.report import not_released_note
from tfdp_embed.data.criteo import CAT_FEATURES, resolve_vocab_sizes
from tfdp_embed.export import release_ready
from tfdp_embed.models import CTRModelConfig, CTRServingModule, build_ctr_model


@dataclasses.dataclass
class PipelineResult:
    """What `run` produced: the report and, for in-process use, the trained objects.

    Attributes:
      report: the dict written to `report.json`.
      model: the trained (flushed) Keras pCTR model.
      model_config: its `CTRModelConfig`.
      serving: the exported `CTRServingModule` (its `serve` was traced by the export).
    """

    report: dict
    model: object
    model_config: CTRModelConfig
    serving: CTRServingModule


def _log(config: PipelineConfig, message: str) -> None:
    if config.verbose:
        print(f"[criteo] {message}", flush=True)


def _skipped(*periods) -> dict:
    total: dict[str, int] = {}
    for period in periods:
        for reason, count in period.stats.as_dict()["skipped"].items():
            total[reason] = total.get(reason, 0) + int(count)
    return total


def _layer_counts(counts: dict) -> dict:
    return {f"embedding_{name}": counts[name] for name in CAT_FEATURES}


@dataclasses.dataclass
class _Data:
    """Stage 1's output: the files and their periods (in memory or streaming)."""

    train_files: list
    eval_files: list
    synthetic: criteo_data.SyntheticSpec | None
    vocab: dict
    periods: list  # one `criteo_data.Period` per streaming period (one without streaming)
    final_eval: criteo_data.Period

    @property
    def rows(self) -> int:
        return sum(p.size for p in self.periods)


@dataclasses.dataclass
class _Training:
    """Stage 3's output: the model, its tables, the privacy plan (its mechanism), the DP wrapper and the budget."""

    model: object
    tables: list
    plan: RunPlan
    dp_model: object
    budget: PrivacyBudget | None  # one period: the sequential budget; several: None (`plan.budget(period=i)` each)
    counts: dict | None

    @property
    def mechanism(self):
        return self.plan.mechanism


def _read(config: PipelineConfig) -> _Data:
    """Stage 1: default data if needed, then read (or scan, when streaming) and validate every file."""
    train_files, eval_files, synthetic = list(config.train), list(config.eval), None
    if not train_files:
        synthetic = config.synthetic
        _log(
            config, f"no --train: writing synthetic Criteo data to {config.out}/data ({dataclasses.asdict(synthetic)})"
        )
        train_files, eval_files = criteo_data.write_default_data(os.path.join(config.out, "data"), synthetic)
    vocab = resolve_vocab_sizes(None, config.hash_size)
    read = dict(vocab_sizes=vocab, skip_bad_rows=config.skip_bad_rows, streaming=config.streaming)
    selecting = criteo_privacy.selects_rows(config.mechanism)
    groups = [[f] for f in train_files] if config.streaming_periods else [train_files]
    periods = [criteo_data.open_period(files, **read, count_buckets=selecting) for files in groups]
    data = _Data(train_files, eval_files, synthetic, vocab, periods, criteo_data.open_period(eval_files, **read))
    streamed = sum(p.streaming for p in periods)
    _log(
        config,
        f"read {data.rows} training rows from {len(train_files)} file(s) ({streamed} of {len(periods)} period(s) "
        f"streamed), {data.final_eval.size} for evaluation",
    )
    for period in periods:
        if config.batch > period.size:
            raise ValueError(
                f"`--batch` {config.batch} is larger than the {period.size} training rows of "
                f"{period.files}; allowed: 1..{period.size}."
            )
    return data


def _periods(config: PipelineConfig, data: _Data) -> list:
    """Per period q_p = B / N_p and T_p = epochs x batches per epoch (at most `--max-steps`)."""
    periods = []
    for period in data.periods:
        per_epoch = (
            period.size // config.batch if config.fixed_size_batches else max(1, round(period.size / config.batch))
        )
        steps = config.epochs * per_epoch
        if config.max_steps is not None:
            steps = min(steps, config.max_steps)
        periods.append(Period(config.batch / period.size, steps))
    return periods


def _settings(config: PipelineConfig, data: _Data) -> criteo_privacy.PrivacySettings:
    """The privacy settings with delta resolved (1/N by default)."""
    settings = config.privacy or criteo_privacy.PrivacySettings(
        mechanism=config.mechanism, epsilon=config.epsilon, delta=None
    )
    return dataclasses.replace(settings, delta=config.delta if config.delta is not None else 1.0 / data.rows)


def _plan(config: PipelineConfig, data: _Data) -> tuple[RunPlan, dict | None]:
    """Stage 2: bucket counts for a DP selection, then the privacy plan (`criteo_privacy.plan`).

    One period: sequential accounting of its T steps. Several: parallel
    composition over periods (`tfdp_embed.accounting.periods`), sigma =
    max_p sigma(q_p, T_p), every DP selection charged to every period.
    """
    settings = _settings(config, data)
    counts = criteo_data.bucket_counts(data.periods[0]) if criteo_privacy.selects_rows(settings.mechanism) else None
    plan = criteo_privacy.plan(
        settings, periods=_periods(config, data), counts=None if counts is None else _layer_counts(counts)
    )
    composition = "parallel over periods, " if plan.parallel else ""
    _log(
        config,
        f"mechanism {settings.mechanism}: noise multiplier {plan.noise_multiplier:.4g} for "
        f"epsilon {settings.epsilon:g}, delta {settings.delta:.3g}, {composition}q {plan.sampling_probability:.4g}, "
        f"{plan.steps} steps",
    )
    return plan, counts


def _build(config: PipelineConfig, model_config: CTRModelConfig, plan: RunPlan, counts: dict | None) -> _Training:
    """Stage 3: the pCTR model, the DP wrapper around the plan's mechanism, the budget."""
    if config.seed is not None:
        keras.utils.set_random_seed(config.seed)
    model = build_ctr_model(model_config)
    tables = [layer for layer in model.layers if isinstance(layer, DPEmbedding)]
    dp_model = criteo_training.make_dp_model(
        model,
        plan.mechanism,
        expected_batch_size=config.batch,
        learning_rate=config.learning_rate,
        momentum=config.momentum,
        lookahead=plan.mechanism_name == "lazy",
    )
    budget = plan.budget() if plan.mechanism_name != "none" and not plan.parallel else None
    return _Training(model, tables, plan, dp_model, budget, counts)


class _StopAfter(keras.callbacks.Callback):
    """Stops `fit` after `steps` batches (`--max-steps`; the calibration counted exactly these)."""

    def __init__(self, steps: int):
        super().__init__()
        self.steps, self.seen = int(steps), 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen >= self.steps:
            self.model.stop_training = True


def _train(config: PipelineConfig, data: _Data, model_config: CTRModelConfig, training: _Training) -> dict:
    """Stage 4: fit period by period (DP-FEST re-selects from running counts; each period evaluated on the next day)."""
    trained = {"timer": StepTimer(), "infos": [], "fed": [], "periods": []}
    touched = criteo_data.TouchedRows(dict(zip(CAT_FEATURES, model_config.dims)))
    counts = training.counts
    for index, period in enumerate(data.periods):
        if index > 0 and config.mechanism == "fest":
            counts = criteo_data.bucket_counts(period, counts=counts)
            training.mechanism.reselect(_layer_counts(counts))
        _fit_period(config, data, training, index, touched, trained)
        if len(data.periods) > 1:
            trained["periods"].append(_evaluate_period(config, data, training, index, trained["timer"]))
    steps_by_period = [p["steps"] for p in trained["periods"]]
    steps_by_period = [b - a for a, b in zip([0] + steps_by_period[:-1], steps_by_period)]
    return trained | {"touched": touched.mean(), "steps_by_period": steps_by_period}


def _fit_period(config: PipelineConfig, data: _Data, training: _Training, index: int, touched, trained: dict) -> None:
    """Fits period `index` for its planned steps on its own batches, charging the budget that covers it."""
    period, steps, several = data.periods[index], training.plan.periods[index].steps, len(data.periods) > 1
    batches, info = criteo_data.train_batches(
        period,
        batch_size=config.batch,
        poisson=not config.fixed_size_batches,
        lookahead=config.mechanism == "lazy",
        seed=None if config.seed is None else config.seed * 1009 + index,
        stream_buffer_rows=config.stream_buffer_rows,
    )
    trained["infos"].append(info)
    if several:
        _log(config, f"streaming period {index + 1}/{len(data.periods)}: {period.files[0]} ({period.size} rows)")
    callbacks = [trained["timer"], _StopAfter(steps)]
    if training.budget is not None:
        callbacks.append(training.budget)
    elif several and config.mechanism != "none":
        callbacks.append(training.plan.budget(period=index))  # parallel composition: this period's own ledger
    epochs = math.ceil(steps / info.batches_per_epoch)
    with period.stats.python_errors():
        training.dp_model.fit(touched.wrap(batches), epochs=epochs, callbacks=callbacks, verbose=config.verbose)
    trained["fed"].append(training.dp_model.batching)  # read by fit from the data itself (Poisson only if verified)


def _evaluate_period(config: PipelineConfig, data: _Data, training: _Training, index: int, timer) -> dict:
    """Period `index`'s row of the report: the model after it, evaluated on the next day."""
    period = data.periods[index]
    following = data.periods[index + 1] if index + 1 < len(data.periods) else data.final_eval
    metrics = criteo_eval.evaluate(training.model, criteo_data.eval_dataset(following))
    _log(config, f"period {index + 1}: AUC {metrics['auc']:.4f} on {following.files}")
    return {"period": index + 1, "train_files": period.files, "eval_files": following.files} | {
        "train_rows": period.size,
        "streamed": period.streaming,
        "steps": len(timer.durations),
        **metrics,
    }


def _sampler(data: _Data, infos: list) -> dict:
    """How the training batches were drawn (in the report: which sampler, and what streaming cost)."""
    streamed = [p.streaming for p in data.periods]
    poisson = infos[0].batching == "poisson"
    if not poisson:
        kind = "shuffled fixed-size batches (NOT Poisson)"
    elif all(streamed):
        kind = "streaming exact Poisson (tfdp_embed.data.streaming_poisson_batches)"
    elif not any(streamed):
        kind = "in-memory exact Poisson (tfdp_embed.data.poisson_batches)"
    else:
        kind = "exact Poisson: in memory for small periods, streaming for large ones"
    return {
        "sampler": kind,
        "streaming": [bool(s) for s in streamed],
        "streaming_mode": None,  # filled by run()
        "batches_per_pass": [i.batches_per_pass if i.streaming else None for i in infos],
        "passes_per_epoch": [criteo_data.passes_per_epoch(i) for i in infos],
    }


def _privacy(config: PipelineConfig, data: _Data, training: _Training, trained: dict) -> dict:
    """The privacy report: sequential (one period) or parallel composition over periods (worst period's ledger)."""
    mechanism = training.mechanism
    steps = int(mechanism.steps.numpy()) if config.mechanism != "none" else len(trained["timer"].durations)
    return criteo_report.run_privacy_report(
        training.plan,
        budget=training.budget,
        dataset_size=data.rows,
        batching=_run_batching(trained["fed"], with_details=len(trained["infos"]) == 1),
        steps=steps,
        steps_by_period=trained["steps_by_period"],
    )


def _run_batching(fed: list, *, with_details: bool):
    """The least private batching fed over the periods (what the report may claim).

    Without details (several periods) the sampler's `BatchingInfo` is dropped: its
    N and q are one period's, the report's are the run's.
    """
    worst = max(fed, key=lambda f: 0 if f.verified_poisson else 1 if f.claims_poisson else 2)
    return worst if with_details else dataclasses.replace(worst, info=None)


@dataclasses.dataclass
class _Release:
    """Stage 5's output: what was released, and the released model's evaluation."""

    output_calibration: criteo_calibration.OutputCalibration | None
    privacy: dict
    serving: CTRServingModule
    saved_model: str
    final: dict


def _model_config(config: PipelineConfig, data: _Data) -> CTRModelConfig:
    """The pCTR model's shape for the data's vocabularies and the CLI's widths."""
    return CTRModelConfig.from_vocab_sizes(
        data.vocab,
        hidden_units=config.hidden_units,
        architecture=config.model,
        embedding_dims=None if config.embedding_dim is None else (config.embedding_dim,) * len(CAT_FEATURES),
    )


def _calibrate(config: PipelineConfig, data: _Data, training: _Training):
    """The DP output calibration (`calibration.py`), when the plan gives it a share of epsilon."""
    epsilon = criteo_privacy.output_calibration_epsilon(training.plan)
    if not epsilon > 0:
        return None
    calibration = criteo_calibration.calibrate_output(
        training.model,
        [criteo_data.eval_dataset(period) for period in data.periods],
        epsilon=epsilon,
        seed=None if config.seed is None else config.seed * 7919 + 1,
    )
    _log(config, f"output calibration: bias shifted by {calibration.shift:+.3f} (eps_c {calibration.epsilon:g})")
    return calibration


def _release(
    config: PipelineConfig, data: _Data, model_config: CTRModelConfig, training: _Training, trained: dict
) -> _Release:
    """Stage 5: flush owed noise, DP output calibration, privacy report, export, evaluate the released model."""
    mechanism, model = training.mechanism, training.model
    release_ready(training.dp_model)
    if hasattr(mechanism, "detach"):  # LazyDP: flushed and done; later passes run without read hooks
        mechanism.detach()
    output_calibration = _calibrate(config, data, training)
    privacy = _privacy(config, data, training, trained)
    serving = CTRServingModule(model, model_config)
    saved_model = os.path.join(config.out, "saved_model")
    export_saved_model(
        training.dp_model, saved_model, serving_module=serving, signatures={"serving_default": serving.serve},
        report=privacy,
    )  # fmt: skip
    final = criteo_eval.evaluate(model, criteo_data.eval_dataset(data.final_eval))
    return _Release(output_calibration, privacy, serving, saved_model, final)


def _warnings(config: PipelineConfig, final: dict) -> list:
    if math.isfinite(final["logloss"]):
        return []
    return [
        "Training diverged: the released model gives non-finite predictions (AUC is meaningless). "
        f"Lower --learning-rate (now {config.learning_rate:g}) or --momentum (now {config.momentum:g})."
    ]


def _settings_report(config: PipelineConfig, data: _Data, sampler: dict) -> dict:
    """The report's `training` and `data` entries: what the run was asked to do, on which files."""
    training = {
        "epochs": config.epochs,
        "max_steps": config.max_steps,
        "batch": config.batch,
        "learning_rate": config.learning_rate,
        "momentum": config.momentum,
        "optimizer": "keras.optimizers.legacy.SGD",
        "seed": config.seed,
    }
    files = {
        "train_files": data.train_files,
        "eval_files": data.eval_files,
        "synthetic": None if data.synthetic is None else dataclasses.asdict(data.synthetic),
        "vocabulary": f"hash size {config.hash_size}" if config.hash_size else "DP-FEST Table 3",
        **sampler,
        "stream_buffer_rows": config.stream_buffer_rows,
    }
    return {"training": training, "data": files}


def _report(
    config: PipelineConfig, data: _Data, model_config: CTRModelConfig, training: _Training, trained: dict,
    released: _Release, *, started: float, train_seconds: float,
) -> dict:  # fmt: skip
    """Stage 6: `report.json`, the privacy report plus the run's metrics, data, timings and settings."""
    final, output_calibration = released.final, released.output_calibration
    sampler = _sampler(data, trained["infos"]) | {"streaming_mode": config.streaming}
    settings = _settings_report(config, data, sampler)
    report = dict(released.privacy)
    report.update(
        warnings=_warnings(config, final),
        auc=final["auc"],
        logloss=final["logloss"],
        eval_rows=final["examples"],
        eval_click_rate=final["click_rate"],
        eval_mean_prediction=final["mean_prediction"],
        rows_read=data.rows,
        eval_rows_read=data.final_eval.size,
        rows_skipped=_skipped(*data.periods, data.final_eval),
        median_step_s=trained["timer"].median(),
        train_seconds=train_seconds,
        total_seconds=time.perf_counter() - started,
        periods=trained["periods"],
        model=model_config.get_config(),
        training=settings["training"],
        data=settings["data"],
        sampler=sampler["sampler"],
        output_calibration=None if output_calibration is None else output_calibration.report(),
        saved_model=released.saved_model,
        **criteo_training.gradient_size(training.mechanism, training.tables, touched=trained["touched"]),
        not_released=not_released_note(
            ["its metrics (auc, logloss, eval_*, periods)", "for eana and lazy, gradient_size_* (rows touched)"],
            release="saved_model/",
        ),
    )
    return report


def run(config: PipelineConfig) -> PipelineResult:
    """Runs the pipeline (read -> plan -> build -> train -> release); writes `config.out/report.json`.

    Raises:
      CriteoFormatError: unreadable input (names file and line).
      ValueError: settings the data cannot support (e.g. batch larger than the data).
      PrivacyBudgetExceededError: the budget allows no training step.
    """
    started = time.perf_counter()
    os.makedirs(config.out, exist_ok=True)
    data = _read(config)
    model_config = _model_config(config, data)
    plan, counts = _plan(config, data)
    training = _build(config, model_config, plan, counts)
    trained = _train(config, data, model_config, training)
    train_seconds = time.perf_counter() - started
    released = _release(config, data, model_config, training, trained)
    report = _report(
        config, data, model_config, training, trained, released, started=started, train_seconds=train_seconds
    )
    criteo_report.write_report(os.path.join(config.out, "report.json"), report)
    return PipelineResult(report=report, model=training.model, model_config=model_config, serving=released.serving)


__all__ = ["PipelineResult", "run"]
