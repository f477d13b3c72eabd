"""The Criteo pipeline's command line: flags -> `PipelineConfig`, then `run`.

Exit status: 0 on success, 2 for bad flags (argparse names the flag), 1 for
input or settings the run cannot use (bad data, a privacy-contract
violation, a target the accountant cannot meet, an `--out` that cannot be
written), 3 when `--fail-on-warnings` is given and the report has warnings.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from pipelines import audit_canaries, cli_types, input_files, quality, run_limits
from pipelines.criteo import audit as criteo_audit
from pipelines.criteo import beam as criteo_beam
from pipelines.criteo import data as criteo_data
from pipelines.criteo import defaults as criteo_defaults
from pipelines.criteo import privacy as criteo_privacy
from pipelines.criteo import report as criteo_report
from pipelines.criteo.config import (
    DEFAULT_CALIBRATION_FRACTION,
    DEFAULT_EPSILON,
    DEFAULT_MECHANISM,
    PipelineConfig,
)
from pipelines.criteo.pipeline import run
from pipelines.privacy_flags import add_privacy_flags, check_privacy_flags
from tfdp_embed import PrivacyContractError
from tfdp_embed.data.criteo import CriteoFormatError
from tfdp_embed.data.criteo.layout import FORMATS
from tfdp_embed.keras2.models import ARCHITECTURES


def _units(text):
    try:
        units = tuple(int(u) for u in text.split(",") if u.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints like 598,598; received {text!r}") from None
    if not units or min(units) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive ints like 598,598; received {text!r}")
    return units


def build_parser() -> argparse.ArgumentParser:
    """The `python -m pipelines.criteo` parser: data, privacy and training flags, and `--out`."""
    p = argparse.ArgumentParser(
        prog="python -m pipelines.criteo",
        description="Train the DP-FEST pCTR model on Criteo TSV with a DP mechanism; export a SavedModel.",
    )
    _add_data_flags(p.add_argument_group("data"))
    _add_privacy_flags(p.add_argument_group("privacy"))
    _add_training_flags(p.add_argument_group("training"))
    p.add_argument("--out", required=True, help="output directory (report.json, saved_model/)")
    quality.add_fail_on_warnings_flag(p)
    run_limits.add_max_hours_flag(p)
    return p


def _add_data_flags(data) -> None:
    """Which files, how to read them, and the default synthetic data."""
    _add_file_flags(data)
    _add_streaming_flags(data)
    _add_hashing_flags(data)
    _add_synthetic_flags(data)


def _add_file_flags(data) -> None:
    """The training and evaluation files (or Beam shards) and their text layout."""
    data.add_argument(
        "--train",
        nargs="+",
        metavar="FILE",
        help="training files (Criteo TSV or CSV, see --format; .gz ok), in day order; default: generated synthetic data",
    )
    data.add_argument(
        "--beam-shards",
        metavar="DIR",
        help="train on the Poisson batches of `python -m tfdp_embed_beam` (its --output): q, epochs, steps, N and "
        "the cap come from its manifest.json (instead of --train; --eval as with --train, default: the synthetic "
        "data's evaluation day)",
    )
    data.add_argument("--eval", nargs="+", metavar="FILE", help="evaluation files, as --train (required with it)")
    data.add_argument("--skip-bad-rows", action="store_true", help="skip and count malformed rows instead of failing")
    data.add_argument(
        "--format",
        choices=FORMATS,
        default="auto",
        help="text layout of --train/--eval: tsv (Criteo's: tab-separated label,I1..I13,C1..C26, no header), csv "
        "(comma-separated, optional header line and leading Id column, as DeepCTR's criteo_sample.txt), or auto "
        "(default: per file, from its first line); integers may be written as integral floats (260.0)",
    )


def _add_streaming_flags(data) -> None:
    """Streaming periods, and whether and how a period's rows are streamed from the files."""
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
        f"independent of the rows, the files read once per epoch, the sampled rows spilled to --spill-dir), or "
        "stream periods above "
        f"{criteo_data.STREAMING_ROW_THRESHOLD:,} rows (auto, default)",
    )
    data.add_argument(
        "--stream-buffer-rows",
        type=cli_types.positive(int),
        default=criteo_data.DEFAULT_STREAM_BUFFER_ROWS,
        help="streaming: rows of training batches held at once (one spill bucket) (default %(default)s, ~170 MB)",
    )
    data.add_argument(
        "--spill-dir",
        metavar="DIR",
        help="streaming: local directory for the epoch's sampled rows (about one copy of the rows as binary; "
        "default: the system temp directory)",
    )


def _add_hashing_flags(data) -> None:
    """The hash buckets of the categorical features."""
    data.add_argument(
        "--hash-size",
        type=cli_types.positive(int),
        help="hash buckets per categorical feature (default: DP-FEST Table 3 vocabularies capped at "
        "max(1000, N/10) buckets, N the training rows, in whole decades)",
    )
    data.add_argument(
        "--vocabulary",
        choices=("scaled", "table3"),
        default="scaled",
        help="scaled: DP-FEST Table 3 capped by the row count (the --hash-size default); table3: Table 3's "
        "sizes uncapped, whatever the row count (exclusive with --hash-size)",
    )


def _add_synthetic_flags(data) -> None:
    """The size of the default synthetic data."""
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


def _add_privacy_flags(priv) -> None:
    """The mechanism, the target (epsilon, delta), and how epsilon is shared out."""
    add_privacy_flags(
        priv,
        mechanisms=criteo_privacy.MECHANISM_NAMES,
        mechanism_default=DEFAULT_MECHANISM,
        mechanism_help="noise mechanism (default %(default)s; eana is NOT DP, none is non-private)",
        epsilon_default=DEFAULT_EPSILON,
        epsilon_help=f"target epsilon (default {DEFAULT_EPSILON})",
        delta_help="target delta in (0, 1) (default 1/N, N = training rows)",
        clip_default=criteo_defaults.DEFAULT_CLIP,
        clip_help="per-example L2 clip norm C (default %(default)s; the default learning rate is scaled by 1/C, so "
        "a larger C adds no noise per step and clips fewer examples)",
    )
    priv.add_argument(
        "--fixed-size-batches",
        action="store_true",
        help="shuffled fixed-size batches instead of Poisson sampling (the report says the guarantee assumes Poisson)",
    )
    priv.add_argument(
        "--lookahead",
        action="store_true",
        help="LazyDP only: catch up the next batch's rows after each step (one-batch lookahead). Off by "
        "default: on CPU it does not make the step faster and its trace adds ~1.5 s to the first step",
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
        "--top-min-rows",
        type=cli_types.positive(int),
        default=1,
        help="fest/adafest+: every table keeps at least min(V, this) rows (default %(default)s; e.g. 1000 keeps "
        "tables of up to 1,000 rows whole, as a top-k over all tables' buckets would)",
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
        help="share of epsilon for the DP output calibration after training (Laplace histogram of logits; fixes "
        "the clipping bias of the mean prediction, see pipelines/criteo/calibration.py); 0 turns it off. Default "
        f"{DEFAULT_CALIBRATION_FRACTION}, skipped (its epsilon given to training) when its noise, known in advance, "
        "is too large to help; a value given here always runs",
    )


def _add_model_flags(train) -> None:
    """The pCTR model's shape: architecture, tower, table widths and their stacking."""
    train.add_argument(
        "--model",
        choices=ARCHITECTURES,
        default="mlp",
        help="mlp: DP-FEST App. D.1; dcn: DCN-v2 cross layers + the same tower",
    )
    train.add_argument(
        "--hidden-units",
        type=_units,
        help="ReLU tower widths (default by training rows N: 64,32 below 1e5; 256,128 below 1e6; 512,256,128 "
        "below 1e7; 598,598,598,598 (DP-FEST) above)",
    )
    train.add_argument(
        "--embedding-dim", type=cli_types.positive(int), help="one width for every table instead of int(2 V^0.25)"
    )
    train.add_argument(
        "--no-stack-tables",
        dest="stack_tables",
        action="store_false",
        help="one table variable per feature (default: the tables of one width share one variable, so a step does "
        "one lookup, noise and update per width group; DP-FEST then selects top-k over each group's buckets)",
    )


def _add_training_flags(train) -> None:
    """Steps, batches, optimizer, model shape, seed and verbosity."""
    train.add_argument(
        "--epochs",
        type=cli_types.positive(int),
        help=f"passes over each period (default {PipelineConfig.epochs}; with --beam-shards, the manifest's)",
    )
    train.add_argument(
        "--batch",
        type=cli_types.positive(int),
        help="expected batch size B, q = B/N (default: N/16 rounded to a power of two, within [32, 2048])",
    )
    train.add_argument(
        "--max-steps",
        type=cli_types.positive(int),
        help="at most this many steps per period (the noise is calibrated for the steps that run; for quick runs)",
    )
    train.add_argument(
        "--learning-rate",
        type=cli_types.positive(float),
        help="SGD learning rate (default: min(1.0, B x 0.3/512) / C, the linear scaling rule; none uses C = "
        f"{criteo_defaults.DEFAULT_CLIP:g}, so its steps are the default DP steps without noise)",
    )
    train.add_argument(
        "--momentum", type=float, default=PipelineConfig.momentum, help="SGD momentum in [0, 1) (default %(default)s)"
    )
    _add_model_flags(train)
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
    audit_canaries.add_flag(train)


def parse_args(argv: Sequence[str] | None = None) -> PipelineConfig:
    """Parses and validates the flags; exits with a message naming the bad flag."""
    parser = build_parser()
    a = parser.parse_args(argv)
    _check_files(parser, a)
    _check_values(parser, a)
    criteo_audit.check_flags(parser, a)
    manifest = _check_beam(parser, a) if a.beam_shards else None
    return _config(a, manifest)


def _check_files(parser: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """`--train`/`--eval` come together, exist, and suit the streaming flags."""
    if a.train and not a.eval:
        parser.error("--eval is required with --train (the AUC is measured on it).")
    if a.eval and not (a.train or a.beam_shards):
        parser.error("--eval needs --train (without --train the synthetic data brings its own evaluation day).")
    for path in (a.train or []) + (a.eval or []):
        input_files.check_path(parser, path, "--train/--eval")
    if a.streaming_periods and a.train and len(a.train) < 2:
        parser.error(
            f"--streaming-periods needs at least 2 --train day files (one per period); received {len(a.train)}."
        )
    if a.fixed_size_batches and a.streaming == "on" and a.batch and a.stream_buffer_rows < a.batch:
        parser.error("--fixed-size-batches with --streaming on needs --stream-buffer-rows >= --batch (shuffle buffer).")


def _check_values(parser: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Ranges argparse's types cannot express, and epsilon's shares leaving some for training."""
    check_privacy_flags(parser, a)
    run_limits.check_epochs(parser, a.epochs, a.max_steps)
    a.max_hours = run_limits.check_max_hours(parser, a.max_hours)
    if not 0 < a.selection_fraction < 1:
        parser.error(f"--selection-fraction must lie in (0, 1); received {a.selection_fraction!r}.")
    a.calibration_auto = a.calibration_fraction is None
    if a.calibration_auto:
        a.calibration_fraction = DEFAULT_CALIBRATION_FRACTION
    if not 0 <= a.calibration_fraction < 0.5:
        parser.error(f"--calibration-fraction must lie in [0, 0.5); received {a.calibration_fraction!r}.")
    if criteo_privacy.selects_rows(a.mechanism) and a.selection_fraction + a.calibration_fraction >= 1:
        parser.error(
            "--selection-fraction + --calibration-fraction must be < 1 (the rest of epsilon pays for training)."
        )
    if a.vocabulary == "table3" and a.hash_size is not None:
        parser.error(f"--vocabulary table3 and --hash-size {a.hash_size} exclude each other; give one.")
    if not 0 < a.top_fraction <= 1:
        parser.error(f"--top-fraction must lie in (0, 1]; received {a.top_fraction!r}.")
    if not 0 <= a.momentum < 1:
        parser.error(f"--momentum must lie in [0, 1); received {a.momentum!r}.")
    if a.adafest_threshold is not None and not a.adafest_threshold >= 0:
        parser.error(f"--adafest-threshold must be >= 0; received {a.adafest_threshold!r}.")


def _check_beam(parser: argparse.ArgumentParser, a: argparse.Namespace) -> dict:
    """The Beam job's manifest; the flags must not contradict it, nor ask what its shards cannot give."""
    try:
        manifest = criteo_beam.read_manifest(a.beam_shards)
    except ValueError as error:
        parser.error(f"--beam-shards: {error}")
    problems = criteo_beam.conflicts(
        manifest,
        train=a.train,
        epochs=a.epochs,
        batch=a.batch,
        fixed_size_batches=a.fixed_size_batches,
        streaming_periods=a.streaming_periods,
        mechanism=a.mechanism,
        skip_bad_rows=a.skip_bad_rows,
        format=a.format,
        calibration_fraction=None if a.calibration_auto else a.calibration_fraction,
    )
    if problems:
        parser.error(" ".join(problems))
    a.calibration_fraction, a.calibration_auto = 0.0, False  # it would read the training files (beam.py)
    return manifest


def _privacy_settings(a: argparse.Namespace) -> criteo_privacy.PrivacySettings:
    return criteo_privacy.PrivacySettings(
        mechanism=a.mechanism,
        epsilon=a.epsilon,
        delta=a.delta,
        l2_norm_clip=a.clip,
        accountant=a.accountant,
        selection_fraction=a.selection_fraction,
        top_fraction=a.top_fraction,
        top_min_rows=a.top_min_rows,
        adafest_ratio=a.adafest_ratio,
        adafest_threshold=a.adafest_threshold,
        contribution_clip=a.contribution_clip,
        calibration_fraction=a.calibration_fraction,
        seed=a.seed,
    )


def _config(a: argparse.Namespace, manifest: dict | None = None) -> PipelineConfig:
    """The validated flags as a `PipelineConfig` (learning rate and synthetic data resolved)."""
    synthetic = criteo_data.SyntheticSpec(
        train_rows=a.synthetic_rows,
        eval_rows=a.synthetic_eval_rows,
        days=3 if a.streaming_periods else 1,
        seed=0 if a.seed is None else a.seed,
    )
    return PipelineConfig(
        out=a.out,
        train=tuple(a.train or ()),
        beam_shards=a.beam_shards,
        eval=tuple(a.eval or ()),
        mechanism=a.mechanism,
        epsilon=a.epsilon,
        delta=a.delta,
        epochs=manifest["epochs"] if manifest else a.epochs or PipelineConfig.epochs,
        batch=criteo_beam.expected_batch(manifest) if manifest else a.batch,
        streaming_periods=a.streaming_periods,
        streaming=a.streaming,
        stream_buffer_rows=a.stream_buffer_rows,
        spill_dir=a.spill_dir,
        max_steps=a.max_steps,
        model=a.model,
        seed=a.seed,
        skip_bad_rows=a.skip_bad_rows,
        format=a.format,
        calibration_auto=a.calibration_auto,
        fixed_size_batches=a.fixed_size_batches,
        lookahead=a.lookahead,
        hash_size=a.hash_size,
        table3_vocabulary=a.vocabulary == "table3",
        hidden_units=a.hidden_units,
        embedding_dim=a.embedding_dim,
        stack_tables=a.stack_tables,
        learning_rate=a.learning_rate,
        momentum=a.momentum,
        privacy=_privacy_settings(a),
        synthetic=synthetic,
        verbose=a.verbose,
        audit_canaries=a.audit_canaries,
        fail_on_warnings=a.fail_on_warnings,
        max_hours=a.max_hours,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit status (2 for bad flags, 1 for bad data, 3 for a report with warnings
    under --fail-on-warnings)."""
    config = parse_args(argv)
    try:
        report = run(config).report  # a failed run leaves `--out` as it was (`pipelines.output_dir`)
    except (CriteoFormatError, PrivacyContractError, ValueError) as error:
        message = error.message(cli=True) if isinstance(error, CriteoFormatError) else str(error)
        print(f"python -m pipelines.criteo: error: {message}", file=sys.stderr)
        return 1
    if "audit" in report:  # an audit run: no model, no metrics
        print(audit_canaries.summary_line(report["audit"]))
    else:
        print(criteo_report.format_report(report))
    program, path = "python -m pipelines.criteo", os.path.join(config.out, "report.json")
    quality.print_warnings(report.get("warnings", []), program=program)
    print(f"report: {path}")
    return quality.exit_status(
        report.get("warnings", []), fail_on_warnings=config.fail_on_warnings, program=program, report=path
    )


__all__ = ["build_parser", "main", "parse_args"]
