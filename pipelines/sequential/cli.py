"""The `python -m pipelines.sequential` command line: flags, `parse_args`, `main`."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Sequence

from pipelines import cli_types, input_files, quality, run_limits
from pipelines.privacy_flags import add_privacy_flags, check_privacy_flags
from pipelines.sequential import privacy as sequential_privacy
from pipelines.sequential import vocabulary as sequential_vocabulary
from pipelines.sequential.config import MECHANISM_NAMES, MODELS, SequentialConfig
from pipelines.sequential.pipeline import run
from pipelines.sequential.report import (
    format_summary,
)
from tfdp_embed.data.sequence_files import LAYOUTS
from tfdp_embed.data.sequences import (
    SequenceFormatError,
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pipelines.sequential",
        description="Train a next-item Transformer (or DPFormer) with user-level DP; report NDCG@10/HIT@10.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    _add_data_flags(p)
    p.add_argument("--model", choices=MODELS, default="dpformer", help="transformer: vanilla; dpformer: + Re-Attention")
    add_privacy_flags(
        p,
        mechanisms=MECHANISM_NAMES,
        mechanism_default="dense",
        mechanism_help="dense: DP-SGD; none: non-private",
        epsilon_default=8.0,
        epsilon_help="target epsilon (inf: non-private)",
        allow_inf_epsilon=True,
        delta_help="target delta in (0, 1) (default 1/N, N = users)",
        clip_help="per-user L2 clip norm C",
    )
    p.add_argument("--epochs", type=cli_types.positive(int), default=5)
    p.add_argument(
        "--max-steps",
        type=cli_types.positive(int),
        help="stop after this many steps (noise calibrated for exactly these; default epochs x round(N / B))",
    )
    p.add_argument("--batch", type=cli_types.positive(int), default=256, help="expected (Poisson) batch size B = qN")
    p.add_argument("--lr", type=cli_types.positive(float), default=3e-3, help="peak Adam learning rate")
    p.add_argument("--weight-decay", type=float, default=1e-5, help="Adam weight decay (DPFormer: 1e-5)")
    p.add_argument(
        "--adam-epsilon",
        type=cli_types.positive(float),
        default=1e-7,
        help="Adam's epsilon (Keras default 1e-7); near the per-coordinate noise std it damps steps on noise-only coordinates",
    )
    p.add_argument("--warmup-fraction", type=float, default=0.2, help="share of steps with linear warm-up")
    p.add_argument(
        "--max-len", type=cli_types.positive(int), default=50, help="sequence length L (most recent items kept)"
    )
    p.add_argument("--dim", type=cli_types.positive(int), default=64)
    p.add_argument("--blocks", type=cli_types.positive(int), default=2)
    p.add_argument("--dropout", type=float, default=0.5, help="dropout rate (DPFormer: 0.5 on Amazon)")
    _add_frequency_flags(p)
    _add_vocabulary_flags(p)
    p.add_argument("--eval-batch", type=cli_types.positive(int), default=512)
    p.add_argument(
        "--max-eval-users", type=cli_types.positive(int), help="evaluate only the first N users (quick runs)"
    )
    p.add_argument("--seed", type=int, help="seed for sampling, init and noise (tests/reproductions only)")
    p.add_argument("--verbose", type=int, choices=(0, 1, 2), default=1, help="Keras progress bar (1), per epoch (2)")
    quality.add_fail_on_warnings_flag(p)
    run_limits.add_max_hours_flag(p)
    return p


def _add_data_flags(p: argparse.ArgumentParser) -> None:
    """The sequence file, its layout, and where the run writes."""
    p.add_argument(
        "--data",
        required=True,
        help="sequence file, time-ordered per user: 'user item' per line (SASRec) or 'user item item ...' (S3-Rec)",
    )
    p.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="auto",
        help="--data layout: pairs = 'user item' per line; sequences = one user per line 'user item item ...'; "
        "auto = sequences if the first line has more than 2 fields",
    )
    p.add_argument("--out", required=True, help="output directory (report.json, saved_model/)")


def _add_frequency_flags(p: argparse.ArgumentParser) -> None:
    """Where the item frequencies come from, and what they feed (Re-Attention's errors, prior, head rows)."""
    p.add_argument(
        "--frequencies",
        choices=sequential_privacy.SOURCES,
        default="private",
        help="item frequencies (Re-Attention, --popularity-prior, --head-items): private = the training data's "
        "counts released with DP and charged to the budget; public = read from --frequencies-file",
    )
    p.add_argument(
        "--frequencies-file",
        help="public item frequencies, lines 'item_id frequency' (share of users in [0, 1]; '#' comments); "
        "must be independent of the training data (the report's guarantee is conditional on it)",
    )
    p.add_argument(
        "--frequency-epsilon-share",
        type=float,
        help="share of --epsilon the private count release is sized for, in (0, 1) "
        f"(default {sequential_privacy.DEFAULT_FREQUENCY_EPSILON_SHARE})",
    )
    p.add_argument(
        "--frequency-noise-multiplier",
        type=cli_types.positive(float),
        help="z of the private count release (instead of --frequency-epsilon-share)",
    )
    p.add_argument("--frequency-mechanism", choices=("gaussian", "laplace"), default="gaussian")
    p.add_argument(
        "--error-scale", type=cli_types.positive(float), default=1.0, help="multiplies every effective error"
    )
    p.add_argument(
        "--popularity-prior",
        action="store_true",
        help="add log p_i (the run's item frequencies, public or released) to every logit; not trained, no extra privacy cost",
    )
    p.add_argument(
        "--head-items",
        type=cli_types.positive(int),
        help="train rows only for the K most frequent items (the run's frequencies); the rest share one row "
        "(default: every item has its own row)",
    )


def _add_vocabulary_flags(p: argparse.ArgumentParser) -> None:
    """Which item ids the model knows: a DP vocabulary of the data's items, or a public catalogue."""
    p.add_argument(
        "--item-catalogue",
        help="public list of item ids, one per line ('#' comments): the ids the model knows, nothing spent "
        "(the guarantee then assumes the list independent of the training data); default: the data's item set "
        "released with DP (Gaussian thresholding, unit = user)",
    )
    p.add_argument(
        "--vocabulary-epsilon-share",
        type=float,
        help=f"share of --epsilon the item-set release is sized for, in (0, 1) "
        f"(default {sequential_vocabulary.DEFAULT_EPSILON_SHARE})",
    )
    p.add_argument(
        "--vocabulary-max-items",
        type=cli_types.positive(int),
        default=sequential_vocabulary.DEFAULT_MAX_ITEMS_PER_USER,
        help="D0: each user's most recent distinct items counted in the item-set release",
    )


def parse_args(argv: Sequence[str] | None = None) -> SequentialConfig:
    parser = build_parser()
    a = parser.parse_args(argv)
    _check_flags(parser, a)
    fields = {field.name for field in dataclasses.fields(SequentialConfig)}
    return SequentialConfig(learning_rate=a.lr, **{name: value for name, value in vars(a).items() if name in fields})


def _check_flags(parser: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Exits with status 2 on files that do not exist and values argparse's types cannot check."""
    input_files.check_path(parser, a.data, "--data")
    check_privacy_flags(parser, a)
    run_limits.check_epochs(parser, a.epochs, a.max_steps)
    a.max_hours = run_limits.check_max_hours(parser, a.max_hours)
    if not 0 <= a.dropout < 1:
        parser.error(f"--dropout must lie in [0, 1); received {a.dropout!r}.")
    if not 0 <= a.warmup_fraction < 1:
        parser.error(f"--warmup-fraction must lie in [0, 1); received {a.warmup_fraction!r}.")
    if a.max_len < 2:
        parser.error(f"--max-len must be >= 2; received {a.max_len}.")
    try:
        sequential_privacy.check_frequency_options(
            frequencies=a.frequencies,
            frequencies_file=a.frequencies_file,
            epsilon_share=a.frequency_epsilon_share,
            noise_multiplier=a.frequency_noise_multiplier,
        )
    except ValueError as error:
        parser.error(str(error))
    for flag, path in (("--item-catalogue", a.item_catalogue), ("--frequencies-file", a.frequencies_file)):
        if path is not None:
            input_files.check_path(parser, path, flag)
    if a.vocabulary_epsilon_share is not None and not 0 < a.vocabulary_epsilon_share < 1:
        parser.error(f"--vocabulary-epsilon-share must lie in (0, 1); received {a.vocabulary_epsilon_share!r}.")


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns 0, 2 for bad flags (argparse), 1 for bad data or settings, 3 for a report with
    warnings under --fail-on-warnings."""
    config = parse_args(argv)
    try:
        report = run(config).report
    except (SequenceFormatError, ValueError) as error:  # `config.out` left as it was
        print(f"python -m pipelines.sequential: error: {error}", file=sys.stderr)
        return 1
    print(format_summary(report))
    program, path = "python -m pipelines.sequential", os.path.join(config.out, "report.json")
    quality.print_warnings(report.get("warnings", []), program=program)
    print(f"report: {path}")
    return quality.exit_status(
        report.get("warnings", []), fail_on_warnings=config.fail_on_warnings, program=program, report=path
    )
