"""The Criteo pipeline's run, stage by stage: read -> plan -> build -> train -> release -> report.

Each stage is one function below; `run` calls them in order and writes
`report.json`. What each stage does, and why, is in the package docstring
(`pipelines.criteo`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from typing import Any

from pipelines import input_files, quality, run_limits
from pipelines.criteo import audit as criteo_audit
from pipelines.criteo import beam as criteo_beam
from pipelines.criteo import calibration as criteo_calibration
from pipelines.criteo import data as criteo_data
from pipelines.criteo import defaults as criteo_defaults
from pipelines.criteo import divergence
from pipelines.criteo import evaluation as criteo_eval
from pipelines.criteo import privacy as criteo_privacy
from pipelines.criteo import report as criteo_report
from pipelines.criteo import training as criteo_training
from pipelines.criteo.config import PipelineConfig
from pipelines.output_dir import Staging, staged_release
from pipelines.step_timer import StepTimer
from pipelines.stop_after import StopAfter
from tfdp_embed import DPEmbedding, ReleasedDatasetSize, RunPlan, export_saved_model, keras, release_dataset_size, tf
from tfdp_embed.accounting import AccountingPeriod
from tfdp_embed.accounting.report import not_released_note
from tfdp_embed.data.criteo import CAT_FEATURES, resolve_vocab_sizes
from tfdp_embed.data.criteo.text import estimate_rows
from tfdp_embed.keras2.callbacks import PrivacyBudget
from tfdp_embed.keras2.export import release_ready
from tfdp_embed.keras2.models import CTRModelConfig, CTRServingModule, build_ctr_model
from tfdp_embed.keras2.models.ctr import ctr_embedding_dims, table_counts, table_ids_fn, table_layout
from tfdp_embed.mechanisms import capabilities_of


@dataclasses.dataclass
class PipelineResult:
    """What `run` produced: the report and, for in-process use, the trained objects.

    Attributes:
      report: the dict written to `report.json`.
      model: the trained (flushed) Keras pCTR model.
      model_config: its `CTRModelConfig`.
      serving: the exported `CTRServingModule` (its `serve` was traced by the export); None (and no
        model) for an audit run (`--audit-canaries`), which exports nothing.
    """

    report: dict
    model: object
    model_config: CTRModelConfig
    serving: CTRServingModule | None


def _log(config: PipelineConfig, message: str) -> None:
    if config.verbose:
        print(f"[criteo] {message}", flush=True)


def _skipped(*periods) -> dict:
    total: dict[str, int] = {}
    for period in periods:
        for reason, count in period.stats.as_dict()["skipped"].items():
            total[reason] = total.get(reason, 0) + int(count)
    return total


def _layer_counts(model_config: CTRModelConfig, counts: dict) -> dict:
    """`{table layer name: bucket counts}`: a stack's are its features' counts end to end (top-k over all)."""
    return table_counts(model_config, counts)


@dataclasses.dataclass
class _Data:
    """Stage 1's output: the files and their periods (in memory or streaming)."""

    train_files: list
    eval_files: list
    synthetic: criteo_data.SyntheticSpec | None
    vocab: dict
    periods: list  # one `criteo_data.Period` per streaming period (one without streaming)
    final_eval: criteo_data.Period
    rows_estimate: int | None = None  # the estimate the default vocabulary was sized for
    chosen: criteo_defaults.Chosen | None = None  # set by `_choose`
    beam_manifest: dict | None = None  # --beam-shards: the Beam job's manifest (the one period is its shards)
    released: ReleasedDatasetSize | None = None  # N~ of each period (`_release_size`): what plans and reports use

    @property
    def rows(self) -> int:
        """The exact N: for the samplers only, never a report, a log line or a decision."""
        return sum(p.size for p in self.periods)

    @property
    def release(self) -> ReleasedDatasetSize:
        """`released`, once stage 1 (`_release_size`) has set it."""
        assert self.released is not None, "stage 1 (_release_size) sets `released`"
        return self.released

    @property
    def released_rows(self) -> int:
        """N~, the number of training rows released with DP."""
        return self.release.value


@dataclasses.dataclass
class _Training:
    """Stage 3's output: the model, its tables, the privacy plan (its mechanism), the DP wrapper and the budget."""

    model: Any  # a Keras model
    tables: list
    plan: RunPlan
    dp_model: Any  # a DPModel
    budget: PrivacyBudget | None  # one period: the sequential budget; several: None (`plan.budget(period=i)` each)
    counts: dict | None
    calibration_skipped: dict | None = None  # why the output calibration did not run, when it was asked for
    table_ids: Any = None  # features -> {table layer name: ids}: LazyDP's lookahead (`ctr.table_ids_fn`)

    @property
    def mechanism(self):
        return self.plan.mechanism


def _read(config: PipelineConfig) -> _Data:
    """Stage 1: default data if needed, then read (or scan, when streaming) and validate every file."""
    if config.fixed_vocabulary:  # the flags fix the tables: refused before any file is written or read
        _check_table_memory(config, _vocabulary(config, None))
    if config.beam_shards:
        return _read_beam(config)
    train_files, eval_files, synthetic = list(config.train), list(config.eval), None
    if not train_files:
        synthetic = config.synthetic
        _log(
            config, f"no --train: writing synthetic Criteo data to {config.out}/data ({dataclasses.asdict(synthetic)})"
        )
        train_files, eval_files = criteo_data.write_default_data(os.path.join(config.out, "data"), synthetic)
    _check_text(train_files + eval_files)
    rows_estimate = None if config.fixed_vocabulary else estimate_rows(train_files)
    vocab = _vocabulary(config, rows_estimate)
    if not config.fixed_vocabulary:  # scaled to the rows: known now
        _check_table_memory(config, vocab)
    read: dict[str, Any] = dict(
        vocab_sizes=vocab, skip_bad_rows=config.skip_bad_rows, streaming=config.streaming, format=config.format
    )
    selecting = criteo_privacy.selects_rows(config.mechanism)
    groups = [[f] for f in train_files] if config.streaming_periods else [train_files]
    periods = [criteo_data.open_period(files, **read, count_buckets=selecting) for files in groups]
    final_eval = criteo_data.open_period(eval_files, **read)
    data = _Data(train_files, eval_files, synthetic, vocab, periods, final_eval, rows_estimate)
    data.released = _release_size(config, data)
    streamed = sum(p.streaming for p in periods)
    _log(
        config,
        f"read {data.released_rows} training rows (N~, released with DP) from {len(train_files)} file(s) ({streamed} of {len(periods)} period(s) "
        f"streamed), {data.final_eval.size} for evaluation",
    )
    return data


def _check_text(paths: list) -> None:
    """Binary garbage refused naming its line (`input_files.check_text`); a UTF-8 BOM is read past by the reader."""
    for path in paths:
        input_files.check_text(path, what="Criteo rows (label, I1..I13, C1..C26), tab- or comma-separated")


def _release_size(config: PipelineConfig, data: _Data) -> ReleasedDatasetSize:
    """N~ of each period (one Gaussian draw each, one ledger event): q, delta, T and the reports use it, never N."""
    return release_dataset_size([p.size for p in data.periods], seed=config.seed)


def _vocabulary(config: PipelineConfig, rows: int | None) -> dict:
    """The hash vocabulary: fixed by the flags, else DP-FEST Table 3 capped for about `rows` rows."""
    return resolve_vocab_sizes(None, config.hash_size) if config.fixed_vocabulary else criteo_defaults.vocabulary(rows)


def _check_table_memory(config: PipelineConfig, vocab: dict) -> None:
    """Refuses (ValueError) embedding tables larger than this machine's memory, before the files are read."""
    sizes = [int(vocab[name]) for name in CAT_FEATURES]
    dims = [config.embedding_dim] * len(sizes) if config.embedding_dim else ctr_embedding_dims(sizes)
    source = f"--hash-size {config.hash_size}" if config.hash_size else f"--vocabulary {_vocabulary_flag(config)}"
    run_limits.check_memory(
        4 * sum(v * d for v, d in zip(sizes, dims)),
        what=f"The {len(sizes)} embedding tables ({sum(sizes):,} rows from {source}, float32)",
        fix="lower --hash-size or --embedding-dim",
    )


def _vocabulary_flag(config: PipelineConfig) -> str:
    return "table3" if config.table3_vocabulary else "scaled"


def _read_beam(config: PipelineConfig) -> _Data:
    """Stage 1 with `--beam-shards`: the manifest is the training period; the evaluation files are read as usual."""
    manifest = criteo_beam.read_manifest(config.beam_shards)
    criteo_beam.check(config, manifest)
    eval_files, synthetic = list(config.eval), None
    if not eval_files:  # the default data's evaluation day only (it does not depend on the training rows)
        synthetic = dataclasses.replace(config.synthetic, train_rows=config.synthetic.days)
        _log(config, f"no --eval: writing the synthetic evaluation day to {config.out}/data")
        train, eval_files = criteo_data.write_default_data(os.path.join(config.out, "data"), synthetic)
        for path in train:
            os.remove(path)
    rows = int(manifest["num_examples"])
    vocab = _vocabulary(config, rows)
    if not config.fixed_vocabulary:
        _check_table_memory(config, vocab)
    period = criteo_beam.training_period(config.beam_shards, manifest, vocab)
    final_eval = criteo_data.open_period(
        eval_files,
        vocab_sizes=vocab,
        skip_bad_rows=config.skip_bad_rows,
        streaming=config.streaming,
        format=config.format,
    )
    data = _Data(list(manifest.get("inputs") or []), eval_files, synthetic, vocab, [period], final_eval, rows)
    data.beam_manifest = manifest
    data.released = _release_size(config, data)
    _log(
        config,
        f"Beam shards {config.beam_shards}: {data.released_rows} training rows (N~, released with DP), q {manifest['sampling_probability']:.4g}, "
        f"{manifest['epochs']} epoch(s) of {manifest['batches_per_epoch']} steps; {final_eval.size} rows for evaluation",
    )
    return data


def _choose(config: PipelineConfig, data: _Data) -> tuple[PipelineConfig, criteo_defaults.Chosen]:
    """Stage 1b: batch, tower, learning rate (and, in `_read`, vocabulary) from N where the flags left them unset."""
    clip, smallest = _settings(config, data).l2_norm_clip, min(data.release.values)
    chosen = criteo_defaults.resolve(
        mechanism=config.mechanism,
        clip=clip,
        rows=data.released_rows,
        smallest_period=smallest,
        batch=config.batch,
        hidden=config.hidden_units,
        lr=config.learning_rate,
        hash_size=config.hash_size,
        table3_vocabulary=config.table3_vocabulary,
        rows_estimate=data.rows_estimate,
    )
    config = dataclasses.replace(
        config, batch=chosen.batch, hidden_units=chosen.hidden_units, learning_rate=chosen.learning_rate
    )
    _log(config, chosen.describe())
    for period, size in zip(data.periods, data.release.values):
        if config.batch > size:
            raise ValueError(
                f"`--batch` {config.batch} is larger than the {size} training rows (released with DP) of "
                f"{period.files}; allowed: 1..{size}."
            )
    return config, chosen


def _periods(config: PipelineConfig, data: _Data) -> list:
    """Per period q_p = B / N_p and T_p = epochs x batches per epoch (at most `--max-steps`)."""
    if data.beam_manifest is not None:
        settings = _settings(config, data)
        return [
            criteo_beam.accounting_period(
                data.beam_manifest, max_steps=config.max_steps, accountant=settings.accountant
            )
        ]
    periods = []
    for index in range(len(data.periods)):  # from N~_p: q_p = B / N~_p
        size = data.release.values[index]
        per_epoch = size // config.batch if config.fixed_size_batches else max(1, round(size / config.batch))
        steps = config.epochs * per_epoch
        if config.max_steps is not None:
            steps = min(steps, config.max_steps)
        what = f"`--epochs` {config.epochs:,} x {per_epoch:,} batches per epoch (N~ / `--batch`) of period {index + 1}"
        run_limits.check_steps(steps, what=what, fix="lower --epochs, raise --batch or give --max-steps")
        periods.append(AccountingPeriod(data.release.sampling_probability(config.batch, index), steps))
    return periods


def _check_time(config: PipelineConfig, data: _Data, model_config: CTRModelConfig) -> None:
    """Refuses (ValueError), before any calibration or selection, a run estimated above `--max-hours`."""
    if not config.max_hours:
        return
    steps = sum(period.steps for period in _periods(config, data))
    capped = "" if config.max_steps is None else f", at most --max-steps {config.max_steps:,} per period"
    run_limits.check_time(
        criteo_training.forward_backward(model_config),
        batch=int(config.batch or 1),
        steps=steps,
        max_hours=config.max_hours,
        what=f"`--epochs` {config.epochs:,} x N~ / `--batch` {config.batch:,} over {len(data.periods)} period(s){capped}",
        fix="lower --epochs or --max-steps, or raise --batch",
    )


def _settings(config: PipelineConfig, data: _Data) -> criteo_privacy.PrivacySettings:
    """The privacy settings with delta resolved (1/N by default)."""
    settings = config.privacy or criteo_privacy.PrivacySettings(
        mechanism=config.mechanism, epsilon=config.epsilon, delta=None
    )
    return dataclasses.replace(settings, delta=config.delta if config.delta is not None else data.release.delta())


def _calibration_decision(config: PipelineConfig, data: _Data, settings) -> tuple:
    """The settings without the output calibration when its public noise level says it cannot help, and why."""
    fraction = settings.calibration_fraction
    if config.beam_shards and settings.mechanism != "none":
        return dataclasses.replace(settings, calibration_fraction=0.0), {
            "skipped": True,
            "reason": criteo_beam.CALIBRATION_REASON,
        }
    if settings.mechanism == "none" or not fraction > 0 or not config.calibration_auto:
        return settings, None
    epsilon = fraction * settings.epsilon
    reason = criteo_calibration.skip_reason(data.released_rows, epsilon)
    if reason is None:
        return settings, None
    _log(config, f"output calibration skipped: {reason}")
    skipped = {
        "skipped": True,
        "reason": reason,
        "epsilon_to_training": epsilon,
        "laplace_scale": criteo_calibration.L1_SENSITIVITY / epsilon,
        "subset_rows": criteo_calibration.subset_rows(data.released_rows, epsilon),
        "expected_click_rate_error": criteo_calibration.expected_click_rate_error(data.released_rows, epsilon),
        "max_click_rate_error": criteo_calibration.MAX_CLICK_RATE_ERROR,
    }
    return dataclasses.replace(settings, calibration_fraction=0.0), skipped


def _plan(
    config: PipelineConfig, data: _Data, model_config: CTRModelConfig
) -> tuple[RunPlan, dict | None, dict | None]:
    """Stage 2: bucket counts for a DP selection, then the privacy plan (`criteo_privacy.plan`).

    One period: sequential accounting of its T steps. Several: parallel
    composition over periods (`tfdp_embed.accounting.periods`), sigma =
    max_p sigma(q_p, T_p), every DP selection charged to every period.
    The output calibration is left out of the plan (its epsilon goes to
    training) when its noise is too large to help (`calibration.skip_reason`).
    """
    settings, skipped = _calibration_decision(config, data, _settings(config, data))
    counts = criteo_data.bucket_counts(data.periods[0]) if criteo_privacy.selects_rows(settings.mechanism) else None
    plan = criteo_privacy.plan(
        settings,
        periods=_periods(config, data),
        counts=None if counts is None else _layer_counts(model_config, counts),
        released=data.released,
        table_parts={
            name: [model_config.vocab_by_feature[f] + 1 for f in group]
            for name, group in table_layout(model_config).items()
        },
    )
    composition = "parallel over periods, " if plan.parallel else ""
    _log(
        config,
        f"mechanism {settings.mechanism}: noise multiplier {plan.noise_multiplier:.4g} for "
        f"epsilon {settings.epsilon:g}, delta {settings.delta:.3g}, {composition}q {plan.sampling_probability:.4g}, "
        f"{plan.steps} steps",
    )
    return plan, counts, skipped


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
        lookahead=config.lazy_lookahead,
    )
    budget = plan.budget() if plan.mechanism_name != "none" and not plan.parallel else None
    return _Training(model, tables, plan, dp_model, budget, counts, table_ids=table_ids_fn(model_config))


def _train(config: PipelineConfig, data: _Data, model_config: CTRModelConfig, training: _Training) -> dict:
    """Stage 4: fit period by period (DP-FEST re-selects from running counts; each period evaluated on the next day).

    Raises:
      TrainingDivergedError: a non-finite training loss, or (mechanism none only) an exploding one (`divergence.py`).
    """
    trained: dict[str, Any] = {
        "timer": StepTimer(training.plan.steps if config.verbose else None, program=PROGRAM),
        "infos": [],
        "fed": [],
        "periods": [],
        "monitor": divergence.DivergenceMonitor(),
    }
    touched = criteo_data.TouchedRows(dict(zip(CAT_FEATURES, model_config.dims)))
    counts = training.counts
    for index, period in enumerate(data.periods):
        if index > 0 and capabilities_of(training.mechanism).reselects:
            counts = criteo_data.bucket_counts(period, counts=counts)
            training.mechanism.reselect(_layer_counts(model_config, counts))
        _fit_period(config, data, training, index, touched, trained)
        if len(data.periods) > 1:
            trained["periods"].append(_evaluate_period(config, data, training, index, trained["timer"]))
    steps_by_period = [p["steps"] for p in trained["periods"]]
    steps_by_period = [b - a for a, b in zip([0] + steps_by_period[:-1], steps_by_period)]
    return trained | {"touched": touched.mean(), "steps_by_period": steps_by_period}


def _fit_period(config: PipelineConfig, data: _Data, training: _Training, index: int, touched, trained: dict) -> None:
    """Fits period `index` for its planned steps on its own batches, charging the budget that covers it."""
    period, steps, several = data.periods[index], training.plan.periods[index].steps, len(data.periods) > 1
    batches, info = _batches(config, data, training, index)
    trained["infos"].append(info)
    if several:
        rows = data.release.values[index]
        _log(config, f"streaming period {index + 1}/{len(data.periods)}: {period.files[0]} ({rows} rows, N~)")
    callbacks = [trained["timer"], StopAfter(steps)]
    if config.mechanism == "none":  # under DP, stopping on the un-noised training loss is outside the guarantee
        callbacks.append(trained["monitor"])  # a DP run is checked on the held-out evaluation rows instead
    if training.budget is not None:
        callbacks.append(training.budget)
    elif several and config.mechanism != "none":
        callbacks.append(training.plan.budget(period=index))  # parallel composition: this period's own ledger
    epochs, monitor = math.ceil(steps / info.batches_per_epoch), trained["monitor"]
    # The Beam shards are one dataset of all E T steps, read once: `steps_per_epoch` keeps one iterator.
    per_epoch = info.batches_per_epoch if data.beam_manifest is not None else None
    try:
        with period.stats.python_errors():
            training.dp_model.fit(
                touched.wrap(batches),
                epochs=epochs,
                steps_per_epoch=per_epoch,
                callbacks=callbacks,
                verbose=config.verbose,
            )
    except tf.errors.InvalidArgumentError as error:  # DPModel refuses to clip a non-finite loss
        if divergence.NON_FINITE_LOSS not in str(error):
            raise
        monitor.problem = "a per-example training loss became NaN or Inf"
    if monitor.problem:
        raise divergence.TrainingDivergedError(f"Training diverged: {monitor.problem}. {_advice(config, data)}")
    trained["fed"].append(training.dp_model.batching)  # read by fit from the data itself (Poisson only if verified)


def _batches(config: PipelineConfig, data: _Data, training: _Training, index: int):
    """Period `index`'s training batches and their `BatchingInfo` (the Beam job's shards, or sampled here).

    The shards can be read once, and `DPModel.prepare` reads a few batches
    (build, per-example contract check): it gets a reader of its own.
    """
    if data.beam_manifest is not None:
        lookahead = config.lazy_lookahead
        shards = functools.partial(
            criteo_beam.train_batches, config.beam_shards, data.vocab, lookahead=lookahead, table_ids=training.table_ids
        )
        training.dp_model.prepare(shards()[0])
        return shards()
    return criteo_data.train_batches(
        data.periods[index],
        batch_size=config.batch,
        poisson=not config.fixed_size_batches,
        lookahead=config.lazy_lookahead,
        table_ids=training.table_ids,
        seed=None if config.seed is None else config.seed * 1009 + index,
        stream_buffer_rows=config.stream_buffer_rows,
        spill_dir=config.spill_dir,
        sampling_probability=training.plan.periods[index].sampling_probability,  # B / N~_p, the plan's q
    )


def _advice(config: PipelineConfig, data: _Data) -> str:
    chosen = data.chosen.chosen if data.chosen is not None else ()
    return divergence.advice(learning_rate=config.learning_rate, momentum=config.momentum, chosen=chosen)


def _evaluate_period(config: PipelineConfig, data: _Data, training: _Training, index: int, timer) -> dict:
    """Period `index`'s row of the report: the model after it, evaluated on the next day."""
    period = data.periods[index]
    following = data.periods[index + 1] if index + 1 < len(data.periods) else data.final_eval
    metrics = criteo_eval.evaluate(training.model, criteo_data.eval_dataset(following))
    _log(config, f"period {index + 1}: AUC {criteo_report.number(metrics['auc'])} on {following.files}")
    return {"period": index + 1, "train_files": period.files, "eval_files": following.files} | {
        "train_rows": data.release.values[index],  # N~_p
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
    elif all(i.sampler == criteo_beam.SAMPLER for i in infos):
        kind = criteo_beam.SAMPLER_DESCRIPTION
    elif all(streamed) and all(i.sampler == "one_pass_spill" for i in infos):
        kind = "streaming exact Poisson, one pass + disk spill (tfdp_embed.data.one_pass_poisson_batches)"
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
        "passes_per_epoch": [0 if i.sampler == criteo_beam.SAMPLER else criteo_data.passes_per_epoch(i) for i in infos],
    }


def _privacy(config: PipelineConfig, data: _Data, training: _Training, trained: dict) -> dict:
    """The privacy report: sequential (one period) or parallel composition over periods (worst period's ledger)."""
    mechanism = training.mechanism
    steps = int(mechanism.steps.numpy()) if config.mechanism != "none" else len(trained["timer"].durations)
    return criteo_report.run_privacy_report(
        training.plan,
        budget=training.budget,
        dataset_size=data.release,  # N~ (and the periods' N~_p), never the exact rows
        batching=_run_batching(trained["fed"], with_details=len(trained["infos"]) == 1),
        steps=steps,
        steps_by_period=trained["steps_by_period"],
        seeded_sampler=bool((data.beam_manifest or {}).get("seeded")),
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
        stack_tables=config.stack_tables,
    )


_CALIBRATION_READ_ROWS = 1 << 15  # rows per batch the calibration's subset is drawn from (a few thousand kept)


def _calibrate(config: PipelineConfig, data: _Data, training: _Training):
    """The DP output calibration (`calibration.py`), when the plan gives it a share of epsilon."""
    epsilon = criteo_privacy.output_calibration_epsilon(training.plan)
    if not epsilon > 0:
        return None
    calibration = criteo_calibration.calibrate_output(
        training.model,
        [criteo_data.row_batches(period, _CALIBRATION_READ_ROWS) for period in data.periods],
        epsilon=epsilon,
        rows=data.released_rows,
        seed=None if config.seed is None else config.seed * 7919 + 1,
    )
    _log(
        config,
        f"output calibration: bias shifted by {calibration.shift:+.3f} (eps_c {calibration.epsilon:g}, "
        f"a subset of about {calibration.subset_rows or data.released_rows:,} training rows read)",
    )
    return calibration


def _calibration_report(calibration: criteo_calibration.OutputCalibration) -> dict:
    """The calibration's fields, without the subset's actual size (un-noised: N itself when every row is read)."""
    return calibration.report() | {"rows_read": "not released (an un-noised count of training rows)"}


def _release(
    config: PipelineConfig, data: _Data, model_config: CTRModelConfig, training: _Training, trained: dict
) -> _Release:
    """Stage 5: flush owed noise, DP output calibration, evaluate, privacy report, export.

    Raises:
      TrainingDivergedError: the released model diverged or collapsed (checked before export: nothing is written).
    """
    mechanism, model = training.mechanism, training.model
    release_ready(training.dp_model)
    if capabilities_of(mechanism).read_hooks:  # LazyDP: flushed and done; later passes run without read hooks
        mechanism.detach()
    output_calibration = _calibrate(config, data, training)
    final = criteo_eval.evaluate(model, criteo_data.eval_dataset(data.final_eval))
    problem = divergence.released_model_problem(final)
    if problem:
        raise divergence.TrainingDivergedError(f"Training diverged: {problem}. {_advice(config, data)}")
    privacy = _privacy(config, data, training, trained)
    serving = CTRServingModule(model, model_config)
    saved_model = os.path.join(config.out, "saved_model")
    export_saved_model(
        training.dp_model,
        saved_model,
        serving_module=serving,
        signatures={"serving_default": serving.serve},
        report=privacy,
    )
    return _Release(output_calibration, privacy, serving, saved_model, final)


def _quality(data: _Data, final: dict) -> dict:
    """The report's comparison with the references (`pipelines.quality`), rows skipped per file, and the warnings."""
    references, warnings = quality.click_references(final)
    skipped = [quality.skipped_rows(p.stats.as_dict(), p.files) for p in (*data.periods, data.final_eval)]
    warnings += [w for w in map(quality.skipped_rows_warning, skipped) if w]
    note = [final["auc_note"] + "."] if final.get("auc_note") else []
    return {"warnings": note + warnings, "references": references, "rows_skipped_by_file": skipped}


def _settings_report(config: PipelineConfig, data: _Data, sampler: dict) -> dict:
    """The report's `training` and `data` entries: what the run was asked to do, on which files."""
    training = {
        "epochs": config.epochs,
        "max_steps": config.max_steps,
        "batch": config.batch,
        "learning_rate": config.learning_rate,
        "momentum": config.momentum,
        "optimizer": "keras.optimizers.legacy.SGD",
        "seeded": config.seed is not None,  # the seed itself is written nowhere
    }
    files = {
        "train_files": data.train_files,
        "eval_files": data.eval_files,
        "synthetic": None if data.synthetic is None else dataclasses.asdict(data.synthetic),
        "vocabulary": data.chosen.vocabulary
        if data.chosen
        else ("DP-FEST Table 3 (uncapped)" if config.table3_vocabulary else f"hash size {config.hash_size}"),
        **sampler,
        "stream_buffer_rows": config.stream_buffer_rows,
        "spill_dir": config.spill_dir,
    }
    if data.beam_manifest is not None:
        files["beam_shards"] = criteo_beam.report_entry(config.beam_shards, data.beam_manifest)
    return {"training": training, "data": files}


def _report(
    config: PipelineConfig,
    data: _Data,
    model_config: CTRModelConfig,
    training: _Training,
    trained: dict,
    released: _Release,
    *,
    started: float,
    train_seconds: float,
) -> dict:
    """Stage 6: `report.json`, the privacy report plus the run's metrics, data, timings and settings."""
    final, output_calibration = released.final, released.output_calibration
    sampler = _sampler(data, trained["infos"]) | {"streaming_mode": config.streaming}
    settings = _settings_report(config, data, sampler)
    report, skipped = dict(released.privacy), training.calibration_skipped
    report.update(
        **_quality(data, final),
        auc=final["auc"],
        auc_note=final["auc_note"],
        logloss=final["logloss"],
        base_rate_logloss=final["base_rate_logloss"],
        eval_rows=final["examples"],
        eval_click_rate=final["click_rate"],
        eval_mean_prediction=final["mean_prediction"],
        rows_read=data.released_rows,  # N~: the exact count is not released
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
        output_calibration=_calibration_report(output_calibration) if output_calibration else skipped,
        defaults=data.chosen.report() if data.chosen is not None else None,
        saved_model=released.saved_model,
        **criteo_training.gradient_size(training.mechanism, training.tables, touched=trained["touched"]),
        not_released=not_released_note(
            [
                "its metrics (auc, logloss, eval_*, periods, references)",
                "rows_skipped_by_file",
                "for eana and lazy, gradient_size_* (rows touched)",
            ],
            release="saved_model/",
        ),
    )
    return report


def run(config: PipelineConfig) -> PipelineResult:
    """Runs the pipeline (read -> plan -> build -> train -> release); writes `config.out/report.json`.

    Settings left unset (batch, hidden units, learning rate, hash size) are
    chosen from the data size (`defaults.py`) and logged.

    The release appears at `config.out` whole or not at all (`pipelines.output_dir`): the run writes
    into `OUT.partial-PID`, published once the SavedModel, its privacy report and `report.json` exist.

    Raises:
      CriteoFormatError: unreadable input (names file and line).
      ValueError: settings the data cannot support (e.g. batch larger than the data, more steps than
        `run_limits.MAX_STEPS`, tables larger than the memory); `OutputBusyError` (a ValueError): another
        run writes `config.out`.
      TrainingDivergedError: training diverged (nothing exported; `divergence.py`).
      PrivacyBudgetExceededError: the budget allows no training step.
    """
    required = AUDIT_FILES if config.audit_canaries else RELEASE_FILES  # an audit run exports no model
    with staged_release(config.out, required=required) as staging:
        return _run(dataclasses.replace(config, out=staging.path), staging)


RELEASE_FILES = ("saved_model/saved_model.pb", "saved_model/privacy_report.json", "report.json")
"""What `--out` holds once published (`pipelines.output_dir`)."""
AUDIT_FILES = ("report.json",)
"""What an audit run (`--audit-canaries`) publishes: its report, no model."""
PROGRAM = "python -m pipelines.criteo"


def _run(config: PipelineConfig, staging: Staging) -> PipelineResult:
    """The stages, writing into `config.out` (the staging directory); the report names the published paths."""
    started = time.perf_counter()
    data = _read(config)
    config, data.chosen = _choose(config, data)
    model_config = _model_config(config, data)
    _check_time(config, data, model_config)
    plan, counts, calibration_skipped = _plan(config, data, model_config)
    staging.budget.start(plan, program=PROGRAM)  # OUT.budget.jsonl: this run's epsilon counts from now
    if config.audit_canaries:  # trains with canaries, reports the bound, exports nothing (`criteo/audit.py`)
        return _audit(config, data, model_config, plan, staging, started=started)
    training = _build(config, model_config, plan, counts)
    training.calibration_skipped = calibration_skipped
    trained = _train(config, data, model_config, training)
    train_seconds = time.perf_counter() - started
    released = _release(config, data, model_config, training, trained)
    report = _report(
        config, data, model_config, training, trained, released, started=started, train_seconds=train_seconds
    )
    report["earlier_runs"] = staging.budget.spent(report)
    report = staging.published(report)
    criteo_report.write_report(os.path.join(config.out, "report.json"), report)
    return PipelineResult(report=report, model=training.model, model_config=model_config, serving=released.serving)


def _audit(
    config: PipelineConfig, data: _Data, model_config: CTRModelConfig, plan: RunPlan, staging: Staging, *, started
) -> PipelineResult:
    """An audit run's result: the planned guarantee, the `audit` field, `released: false`; no model."""
    audit = criteo_audit.run(config, data.periods[0], model_config, plan)
    report = plan.report(dataset_size=data.release, steps=plan.steps, batching="poisson")  # audit_run's batches
    report.update(
        audit=audit,
        released=False,
        rows_read=data.released_rows,  # N~: the exact count is not released
        model=model_config.get_config(),
        total_seconds=time.perf_counter() - started,
    )
    report["earlier_runs"] = staging.budget.spent(report)
    report = staging.published(report)
    criteo_report.write_report(os.path.join(config.out, "report.json"), report)
    return PipelineResult(report=report, model=None, model_config=model_config, serving=None)


__all__ = ["PipelineResult", "run"]
