"""Criteo pCTR training with differential privacy, from raw TSV to a served SavedModel.

    python -m pipelines.criteo --train day_0 day_1 --eval day_2 --mechanism adafest \\
        --epsilon 3 --epochs 1 --batch 1024 --out saved_models/criteo [--streaming-periods] \\
        [--streaming {auto,on,off}]

With no `--train` it writes a small synthetic Criteo set (Table 3 vocabularies
x 0.1, Zipf frequencies, a learnable click signal) under `OUT/data` and
trains on it: `make run` runs exactly that and finishes in a few minutes on
2 cores.

What happens:
  1. read and validate the files (bad rows: an error naming file and line, or
     counted skips with `--skip-bad-rows`). `--streaming auto` (default)
     keeps a period of up to 10^6 rows in memory and streams larger ones:
     one validating scan counts the rows (and, for DP-FEST / AdaFEST+, the
     bucket counts), then exact Poisson batches are read from the files,
     G = `--stream-buffer-rows` // B batches per pass, so memory does not
     grow with the rows (`pipelines.criteo_data`);
  2. calibrate the noise for (epsilon, delta = 1/N by default), q = B / N and
     T = epochs x round(N / B) steps with `dp_accounting` (PLD); several
     streaming periods compose in parallel (`tfdp_embed.plan_run`, `pipelines.criteo_privacy`);
  3. train the DP-FEST App. D.1 pCTR model (or DCN-v2) with `DPModel` on
     Poisson-sampled batches (LazyDP: with the one-batch lookahead; DP-FEST and
     DP-AdaFEST+: DP top-k selection from bucket counts, DP-FEST re-selected
     from running counts each streaming period); training stops at the
     calibrated step count;
  4. with `--streaming-periods`, each training file is one period (a day):
     train on it, evaluate on the next day (DP-FEST §4.3);
  5. flush owed noise, then the DP output calibration (`--calibration-fraction`
     of epsilon, default 5%): shift the output bias so the mean prediction
     matches a DP estimate of the click rate, which corrects DP-SGD's
     clipping bias (`pipelines.criteo_calibration`);
  6. export `OUT/saved_model` (no optimizer or mechanism state;
     `serving_default` takes the raw Criteo fields as strings, see
     `tfdp_embed.models.ctr_serving`) with `privacy_report.json` beside it;
  7. write `OUT/report.json` (AUC, log loss, mean prediction, privacy, which
     sampler, rows read and skipped, gradient-size reduction, median step
     time) and print the privacy report.

References: DP-FEST (Ghazi et al., NeurIPS 2023) §4, App. D.1; LazyDP
(ASPLOS 2024) §5; EANA (RecSys 2022) §3.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
from collections.abc import Sequence

from pipelines import (
    cli_types,
    criteo_calibration,
    criteo_data,
    criteo_eval,
    criteo_privacy,
    criteo_report,
    criteo_training,
)
from tfdp_embed import DPEmbedding, PrivacyContractError, RunPlan, export_saved_model, keras
from tfdp_embed.accounting import Period, PrivacyBudget
from tfdp_embed.accounting.report import not_released_note
from tfdp_embed.data.criteo import (
    CAT_FEATURES,
    CriteoFormatError,
    resolve_vocab_sizes,
)
from tfdp_embed.export import release_ready
from tfdp_embed.models import (
    ARCHITECTURES,
    CTRModelConfig,
    CTRServingModule,
    build_ctr_model,
)

DEFAULT_MECHANISM = "adafest"
DEFAULT_EPSILON = 3.0
# SGD step sizes that train the default model on the default data (momentum
# 0.9, batch 2048): a DP step moves by (sum of clipped gradients + noise) / B,
# smaller than the non-private mean gradient, and takes a larger learning
# rate; 1.0 makes the non-private run diverge, 0.3 leaves DP runs undertrained.
DEFAULT_LEARNING_RATE = {"none": 0.3}
DEFAULT_DP_LEARNING_RATE = 1.0
DEFAULT_CALIBRATION_FRACTION = 0.05


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """Everything one run needs (the CLI flags, validated)."""

    out: str
    train: tuple = ()
    eval: tuple = ()
    mechanism: str = DEFAULT_MECHANISM
    epsilon: float = DEFAULT_EPSILON
    delta: float | None = None
    epochs: int = 2
    batch: int = 2048
    streaming_periods: bool = False
    streaming: str = "auto"
    stream_buffer_rows: int = criteo_data.DEFAULT_STREAM_BUFFER_ROWS
    max_steps: int | None = None
    model: str = "mlp"
    seed: int | None = None
    skip_bad_rows: bool = False
    fixed_size_batches: bool = False
    hash_size: int | None = None
    hidden_units: tuple = (598, 598, 598, 598)
    embedding_dim: int | None = None
    learning_rate: float = DEFAULT_DP_LEARNING_RATE
    momentum: float = 0.9
    privacy: criteo_privacy.PrivacySettings | None = None
    synthetic: criteo_data.SyntheticSpec = criteo_data.SyntheticSpec()
    verbose: int = 1


# -- command line -------------------------------------------------------------------
def _units(text):
    try:
        units = tuple(int(u) for u in text.split(",") if u.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints like 598,598; received {text!r}") from None
    if not units or min(units) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive ints like 598,598; received {text!r}")
    return units


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pipelines.criteo",
        description="Train the DP-FEST pCTR model on Criteo TSV with a DP mechanism; export a SavedModel.",
    )
    data = p.add_argument_group("data")
    data.add_argument(
        "--train",
        nargs="+",
        metavar="FILE",
        help="training TSV files (.gz ok), in day order; default: generated synthetic data",
    )
    data.add_argument("--eval", nargs="+", metavar="FILE", help="evaluation TSV files (required with --train)")
    data.add_argument("--skip-bad-rows", action="store_true", help="skip and count malformed rows instead of failing")
    data.add_argument(
        "--streaming-periods",
        action="store_true",
        help="one period per --train file: train on it, evaluate on the next day (DP-FEST §4.3)",
    )
    data.add_argument(
        "--streaming",
        choices=criteo_data.STREAMING_MODES,
        default="auto",
        help="keep a period's rows in memory (off), stream them from the files with exact Poisson batches (on: memory "
        f"independent of the rows, the files are read once per group of batches), or stream periods above "
        f"{criteo_data.STREAMING_ROW_THRESHOLD:,} rows (auto, default)",
    )
    data.add_argument(
        "--stream-buffer-rows",
        type=cli_types.positive(int),
        default=criteo_data.DEFAULT_STREAM_BUFFER_ROWS,
        help="streaming: rows of training batches held at once; G = this // batch batches per pass "
        "(default %(default)s, ~170 MB)",
    )
    data.add_argument(
        "--hash-size",
        type=cli_types.positive(int),
        help="hash buckets per categorical feature (default: DP-FEST Table 3 vocabularies)",
    )
    data.add_argument(
        "--synthetic-rows",
        type=cli_types.positive(int),
        default=criteo_data.SyntheticSpec.train_rows,
        help="training rows of the default synthetic data",
    )
    data.add_argument(
        "--synthetic-eval-rows",
        type=cli_types.positive(int),
        default=criteo_data.SyntheticSpec.eval_rows,
        help="evaluation rows of the default synthetic data",
    )
    priv = p.add_argument_group("privacy")
    priv.add_argument(
        "--mechanism",
        choices=criteo_privacy.MECHANISM_NAMES,
        default=DEFAULT_MECHANISM,
        help="noise mechanism (default %(default)s; eana is NOT DP, none is non-private)",
    )
    priv.add_argument(
        "--epsilon",
        type=cli_types.positive(float),
        default=DEFAULT_EPSILON,
        help=f"target epsilon (default {DEFAULT_EPSILON})",
    )
    priv.add_argument("--delta", type=float, help="target delta in (0, 1) (default 1/N, N = training rows)")
    priv.add_argument(
        "--clip", type=cli_types.positive(float), default=1.0, help="per-example L2 clip norm C (default %(default)s)"
    )
    priv.add_argument("--accountant", choices=("pld", "rdp"), default="pld")
    priv.add_argument(
        "--fixed-size-batches",
        action="store_true",
        help="shuffled fixed-size batches instead of Poisson sampling (the report says the guarantee assumes Poisson)",
    )
    priv.add_argument(
        "--selection-fraction",
        type=float,
        default=0.1,
        help="fest/adafest+: share of epsilon for the DP top-k selection, in (0, 1)",
    )
    priv.add_argument(
        "--top-fraction",
        type=float,
        default=0.1,
        help="fest/adafest+: fraction of each table kept by the selection, in (0, 1]",
    )
    priv.add_argument(
        "--adafest-ratio",
        type=cli_types.positive(float),
        default=criteo_privacy.PrivacySettings.adafest_ratio,
        help="adafest/adafest+: sigma1/sigma2 (App. D.1 tunes 0.1..10)",
    )
    priv.add_argument("--adafest-threshold", type=float, help="adafest/adafest+: tau (default 2 x sigma1 x C1)")
    priv.add_argument("--contribution-clip", type=cli_types.positive(float), default=1.0, help="adafest/adafest+: C1")
    priv.add_argument(
        "--calibration-fraction",
        type=float,
        default=DEFAULT_CALIBRATION_FRACTION,
        help="share of epsilon for the DP output calibration after training (Laplace histogram of logits; fixes "
        "the clipping bias of the mean prediction, see pipelines/criteo_calibration.py); 0 turns it off "
        "(default %(default)s)",
    )
    train = p.add_argument_group("training")
    train.add_argument(
        "--epochs",
        type=cli_types.positive(int),
        default=PipelineConfig.epochs,
        help="passes over each period (default %(default)s)",
    )
    train.add_argument(
        "--batch",
        type=cli_types.positive(int),
        default=PipelineConfig.batch,
        help="expected batch size B, q = B/N (default %(default)s)",
    )
    train.add_argument(
        "--max-steps",
        type=cli_types.positive(int),
        help="at most this many steps per period (the noise is calibrated for the steps that run; for quick runs)",
    )
    train.add_argument(
        "--learning-rate",
        type=cli_types.positive(float),
        help=f"SGD learning rate (default {DEFAULT_DP_LEARNING_RATE} for DP mechanisms, 0.3 for none)",
    )
    train.add_argument(
        "--momentum", type=float, default=PipelineConfig.momentum, help="SGD momentum in [0, 1) (default %(default)s)"
    )
    train.add_argument(
        "--model",
        choices=ARCHITECTURES,
        default="mlp",
        help="mlp: DP-FEST App. D.1; dcn: DCN-v2 cross layers + the same tower",
    )
    train.add_argument(
        "--hidden-units", type=_units, default=(598, 598, 598, 598), help="ReLU tower widths (default 598,598,598,598)"
    )
    train.add_argument(
        "--embedding-dim", type=cli_types.positive(int), help="one width for every table instead of int(2 V^0.25)"
    )
    train.add_argument(
        "--seed",
        type=int,
        help="seed for data sampling, init and noise (default: OS entropy; set it only for tests and reproductions)",
    )
    train.add_argument(
        "--verbose",
        type=int,
        choices=(0, 1, 2),
        default=1,
        help="Keras progress bar (1), one line per epoch (2), silent (0)",
    )
    p.add_argument("--out", required=True, help="output directory (report.json, saved_model/)")
    return p


def parse_args(argv: Sequence[str] | None = None) -> PipelineConfig:
    """Parses and validates the flags; exits with a message naming the bad flag."""
    parser = build_parser()
    a = parser.parse_args(argv)
    if a.train and not a.eval:
        parser.error("--eval is required with --train (the AUC is measured on it).")
    if a.eval and not a.train:
        parser.error("--eval needs --train (without --train the synthetic data brings its own evaluation day).")
    for path in (a.train or []) + (a.eval or []):
        if not os.path.exists(path):
            parser.error(f"file not found: {path!r} (given to --train/--eval).")
    if a.streaming_periods and a.train and len(a.train) < 2:
        parser.error(
            f"--streaming-periods needs at least 2 --train day files (one per period); received {len(a.train)}."
        )
    if a.fixed_size_batches and a.streaming == "on" and a.stream_buffer_rows < a.batch:
        parser.error("--fixed-size-batches with --streaming on needs --stream-buffer-rows >= --batch (shuffle buffer).")
    if a.delta is not None and not 0 < a.delta < 1:
        parser.error(f"--delta must lie in (0, 1); received {a.delta!r}.")
    if not 0 < a.selection_fraction < 1:
        parser.error(f"--selection-fraction must lie in (0, 1); received {a.selection_fraction!r}.")
    if not 0 <= a.calibration_fraction < 0.5:
        parser.error(f"--calibration-fraction must lie in [0, 0.5); received {a.calibration_fraction!r}.")
    if criteo_privacy.selects_rows(a.mechanism) and a.selection_fraction + a.calibration_fraction >= 1:
        parser.error(
            "--selection-fraction + --calibration-fraction must be < 1 (the rest of epsilon pays for training)."
        )
    if not 0 < a.top_fraction <= 1:
        parser.error(f"--top-fraction must lie in (0, 1]; received {a.top_fraction!r}.")
    if not 0 <= a.momentum < 1:
        parser.error(f"--momentum must lie in [0, 1); received {a.momentum!r}.")
    if a.adafest_threshold is not None and not a.adafest_threshold >= 0:
        parser.error(f"--adafest-threshold must be >= 0; received {a.adafest_threshold!r}.")
    privacy = criteo_privacy.PrivacySettings(
        mechanism=a.mechanism,
        epsilon=a.epsilon,
        delta=a.delta,
        l2_norm_clip=a.clip,
        accountant=a.accountant,
        selection_fraction=a.selection_fraction,
        top_fraction=a.top_fraction,
        adafest_ratio=a.adafest_ratio,
        adafest_threshold=a.adafest_threshold,
        contribution_clip=a.contribution_clip,
        calibration_fraction=a.calibration_fraction,
        seed=a.seed,
    )
    synthetic = criteo_data.SyntheticSpec(
        train_rows=a.synthetic_rows,
        eval_rows=a.synthetic_eval_rows,
        days=3 if a.streaming_periods else 1,
        seed=0 if a.seed is None else a.seed,
    )
    return PipelineConfig(
        out=a.out,
        train=tuple(a.train or ()),
        eval=tuple(a.eval or ()),
        mechanism=a.mechanism,
        epsilon=a.epsilon,
        delta=a.delta,
        epochs=a.epochs,
        batch=a.batch,
        streaming_periods=a.streaming_periods,
        streaming=a.streaming,
        stream_buffer_rows=a.stream_buffer_rows,
        max_steps=a.max_steps,
        model=a.model,
        seed=a.seed,
        skip_bad_rows=a.skip_bad_rows,
        fixed_size_batches=a.fixed_size_batches,
        hash_size=a.hash_size,
        hidden_units=a.hidden_units,
        embedding_dim=a.embedding_dim,
        learning_rate=a.learning_rate
        if a.learning_rate is not None
        else DEFAULT_LEARNING_RATE.get(a.mechanism, DEFAULT_DP_LEARNING_RATE),
        momentum=a.momentum,
        privacy=privacy,
        synthetic=synthetic,
        verbose=a.verbose,
    )


# -- the run ------------------------------------------------------------------------
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
    timer = criteo_training.StepTimer()
    periods_out, infos, period_budgets, fed = [], [], [], []
    touched = criteo_data.TouchedRows(dict(zip(CAT_FEATURES, model_config.dims)))
    counts = training.counts
    several = len(data.periods) > 1
    for index, (period, period_plan) in enumerate(zip(data.periods, training.plan.periods)):
        if index > 0 and config.mechanism == "fest":
            counts = criteo_data.bucket_counts(period, counts=counts)
            training.mechanism.reselect(_layer_counts(counts))
        batches, info = criteo_data.train_batches(
            period,
            batch_size=config.batch,
            poisson=not config.fixed_size_batches,
            lookahead=config.mechanism == "lazy",
            seed=None if config.seed is None else config.seed * 1009 + index,
            stream_buffer_rows=config.stream_buffer_rows,
        )
        infos.append(info)
        if several:
            _log(config, f"streaming period {index + 1}/{len(data.periods)}: {period.files[0]} ({period.size} rows)")
        callbacks = [timer, _StopAfter(period_plan.steps)]
        if training.budget is not None:
            callbacks.append(training.budget)
        elif several and config.mechanism != "none":
            period_budgets.append(training.plan.budget(period=index))
            callbacks.append(period_budgets[-1])
        epochs = math.ceil(period_plan.steps / info.batches_per_epoch)
        with period.stats.python_errors():
            training.dp_model.fit(touched.wrap(batches), epochs=epochs, callbacks=callbacks, verbose=config.verbose)
        fed.append(training.dp_model.batching)  # read by fit from the data itself (Poisson only if verified)
        if several:
            following = data.periods[index + 1] if index + 1 < len(data.periods) else data.final_eval
            metrics = criteo_eval.evaluate(training.model, criteo_data.eval_dataset(following))
            periods_out.append(
                {"period": index + 1, "train_files": period.files, "eval_files": following.files}
                | {"train_rows": period.size, "streamed": period.streaming, "steps": len(timer.durations), **metrics}
            )
            _log(config, f"period {index + 1}: AUC {metrics['auc']:.4f} on {following.files}")
    steps_by_period = [p["steps"] for p in periods_out]
    steps_by_period = [b - a for a, b in zip([0] + steps_by_period[:-1], steps_by_period)]
    return {
        "timer": timer,
        "infos": infos,
        "fed": fed,
        "touched": touched.mean(),
        "periods": periods_out,
        "steps_by_period": steps_by_period,
        "period_budgets": period_budgets,
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


def run(config: PipelineConfig) -> PipelineResult:
    """Runs the pipeline (read -> calibrate -> build -> train -> release); writes `config.out/report.json`.

    Raises:
      CriteoFormatError: unreadable input (names file and line).
      ValueError: settings the data cannot support (e.g. batch larger than the data).
      PrivacyBudgetExceededError: the budget allows no training step.
    """
    started = time.perf_counter()
    os.makedirs(config.out, exist_ok=True)
    data = _read(config)
    model_config = CTRModelConfig.from_vocab_sizes(
        data.vocab,
        hidden_units=config.hidden_units,
        architecture=config.model,
        embedding_dims=None if config.embedding_dim is None else (config.embedding_dim,) * len(CAT_FEATURES),
    )
    plan, counts = _plan(config, data)
    training = _build(config, model_config, plan, counts)
    trained = _train(config, data, model_config, training)
    train_seconds = time.perf_counter() - started

    # Stage 5, release: flush owed noise, DP output calibration, privacy report, export, evaluate.
    mechanism, model = training.mechanism, training.model
    release_ready(training.dp_model)
    output_calibration = None
    if criteo_privacy.output_calibration_epsilon(plan) > 0:
        output_calibration = criteo_calibration.calibrate_output(
            model,
            [criteo_data.eval_dataset(period) for period in data.periods],
            epsilon=criteo_privacy.output_calibration_epsilon(plan),
            seed=None if config.seed is None else config.seed * 7919 + 1,
        )
        _log(
            config,
            f"output calibration: bias shifted by {output_calibration.shift:+.3f} (eps_c {output_calibration.epsilon:g})",
        )
    privacy = _privacy(config, data, training, trained)
    serving = CTRServingModule(model, model_config)
    saved_model = os.path.join(config.out, "saved_model")
    export_saved_model(
        training.dp_model, saved_model, serving_module=serving, signatures={"serving_default": serving.serve},
        report=privacy,
    )  # fmt: skip
    if hasattr(mechanism, "detach"):  # LazyDP: flushed and done; evaluate without read hooks
        mechanism.detach()
    final = criteo_eval.evaluate(model, criteo_data.eval_dataset(data.final_eval))

    warnings = []
    if not math.isfinite(final["logloss"]):
        warnings.append(
            "Training diverged: the released model gives non-finite predictions (AUC is meaningless). "
            f"Lower --learning-rate (now {config.learning_rate:g}) or --momentum (now {config.momentum:g})."
        )
    sampler = _sampler(data, trained["infos"]) | {"streaming_mode": config.streaming}
    report = dict(privacy)
    report.update(
        warnings=warnings,
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
        training={
            "epochs": config.epochs,
            "max_steps": config.max_steps,
            "batch": config.batch,
            "learning_rate": config.learning_rate,
            "momentum": config.momentum,
            "optimizer": "keras.optimizers.legacy.SGD",
            "seed": config.seed,
        },
        data={
            "train_files": data.train_files,
            "eval_files": data.eval_files,
            "synthetic": None if data.synthetic is None else dataclasses.asdict(data.synthetic),
            "vocabulary": f"hash size {config.hash_size}" if config.hash_size else "DP-FEST Table 3",
            **sampler,
            "stream_buffer_rows": config.stream_buffer_rows,
        },
        sampler=sampler["sampler"],
        output_calibration=None if output_calibration is None else output_calibration.report(),
        saved_model=saved_model,
        **criteo_training.gradient_size(mechanism, training.tables, touched=trained["touched"]),
        not_released=not_released_note(
            ["its metrics (auc, logloss, eval_*, periods)", "for eana and lazy, gradient_size_* (rows touched)"],
            release="saved_model/",
        ),
    )
    criteo_report.write_report(os.path.join(config.out, "report.json"), report)
    return PipelineResult(report=report, model=model, model_config=model_config, serving=serving)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit status (2 for bad flags, 1 for bad data)."""
    config = parse_args(argv)
    try:
        report = run(config).report
    except (CriteoFormatError, PrivacyContractError, ValueError) as error:
        print(f"python -m pipelines.criteo: error: {error}", file=sys.stderr)
        return 1
    print(criteo_report.format_report(report))
    print(f"report: {os.path.join(config.out, 'report.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
