"""The `python -m pipelines.movielens` command line: flags, `parse_args`, `main`."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from pipelines import audit_canaries, cli_types, quality, run_limits
from pipelines.movielens import privacy as movielens_privacy
from pipelines.movielens import units as movielens_units
from pipelines.movielens import vocabulary as movielens_vocabulary
from pipelines.movielens.config import (
    DEFAULT_DATA_PATH,
    DEFAULT_LEARNING_RATES,
    LARGE_NOISE_LEARNING_RATE,
    SMALL_SIGMA_FOR_PLD,
    MovieLensConfig,
)
from pipelines.movielens.pipeline import train_and_evaluate
from pipelines.movielens.report import format_report
from pipelines.privacy_flags import add_privacy_flags, check_privacy_flags
from tfdp_embed.data.movielens import (
    MovieLensFormatError,
)


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
    _add_vocabulary_flags(p)
    _add_unit_flags(p)
    p.add_argument(
        "--batch-size",
        type=cli_types.positive(int),
        help=f"expected Poisson batch size: examples (default 256) at example level, users (default "
        f"{movielens_units.DEFAULT_USERS_PER_BATCH}) at user level",
    )
    p.add_argument(
        "--learning-rate",
        type=cli_types.positive(float),
        help=f"SGD rate (default {DEFAULT_LEARNING_RATES}; {LARGE_NOISE_LEARNING_RATE} for noised runs "
        f"with --epsilon or a noise multiplier >= {SMALL_SIGMA_FOR_PLD})",
    )
    p.add_argument("--momentum", type=cli_types.non_negative_float, default=0.9)
    p.add_argument("--embedding-dim", type=cli_types.positive(int), default=32)
    p.add_argument("--context-length", type=cli_types.positive(int), default=20)
    p.add_argument(
        "--seed",
        type=int,
        help="seed for init, batches and noise (default: OS entropy)",
    )
    p.add_argument("--k", type=cli_types.positive(int), default=10, help="top-k of the exported signature")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    run_limits.add_max_hours_flag(p)
    audit_canaries.add_flag(p)
    quality.add_fail_on_warnings_flag(p)
    return p


def _add_unit_flags(p: argparse.ArgumentParser) -> None:
    """What one neighbouring dataset adds or removes: a user's whole timeline (default) or one example."""
    p.add_argument(
        "--privacy-unit",
        choices=movielens_units.PRIVACY_UNITS,
        help="user (default): Poisson over users, each bringing at most K of their examples per step "
        "(user-level DP); example: one (context, label) example (the report adds the group-privacy epsilon of a "
        "user; the default with --audit-canaries, whose canaries are examples of no user)",
    )
    p.add_argument(
        "--max-examples-per-user",
        type=cli_types.positive(int),
        metavar="K",
        help="user level: the most examples a sampled user brings to a step (a public choice; default: "
        f"released with DP, the power-of-two bucket edge of the {movielens_units.K_QUANTILE:g} quantile of "
        f"examples per user, noise z {movielens_units.K_NOISE_MULTIPLIER:g}, charged to the run's epsilon)",
    )


def _add_vocabulary_flags(p: argparse.ArgumentParser) -> None:
    """How movies are numbered: a catalogue, or (dense / lazy without one) the DP movie-set release."""
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


def _add_privacy_flags(p: argparse.ArgumentParser) -> None:
    """The mechanism and its noise: a given sigma or a target epsilon (exclusive), and delta."""
    add_privacy_flags(
        p,
        mechanisms=(*movielens_privacy.MECHANISM_NAMES, *movielens_privacy.REFUSED_MECHANISMS),  # refused: one line
        mechanism_default=None,
        noise_multiplier_help="sigma (e.g. EANA's 0.01 or 0.001)",
        epsilon_help="target epsilon (sigma calibrated; nominal for eana)",
        delta_help="delta in (0, 1) (default 1/N, N training examples)",
        clip_flag="--l2-norm-clip",
    )


def parse_args(argv: Sequence[str] | None = None) -> tuple:
    """(MovieLensConfig, out_dir) from command-line flags; exits with status 2 on bad flags."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.mechanism in movielens_privacy.REFUSED_MECHANISMS:
        parser.error(f"--mechanism {args.mechanism}: {movielens_privacy.REFUSED_MECHANISMS[args.mechanism]}")
    if args.mechanism != "none" and args.noise_multiplier is None and args.epsilon is None:
        parser.error(f"--mechanism {args.mechanism} needs --noise-multiplier or --epsilon")
    if args.mechanism == "none" and (args.noise_multiplier is not None or args.epsilon is not None):
        parser.error("--mechanism none takes neither --noise-multiplier nor --epsilon")
    if args.vocabulary_epsilon_share is not None and not 0 < args.vocabulary_epsilon_share < 1:
        parser.error(f"--vocabulary-epsilon-share must lie in (0, 1); received {args.vocabulary_epsilon_share}")
    if args.privacy_unit is None:
        args.privacy_unit = movielens_units.EXAMPLE if args.audit_canaries else movielens_units.USER
    if args.audit_canaries and args.privacy_unit == movielens_units.USER:
        parser.error("--audit-canaries inserts canary examples of no user: it runs with --privacy-unit example")
    if args.max_examples_per_user is not None and args.privacy_unit != movielens_units.USER:
        parser.error("--max-examples-per-user bounds a user's examples: it needs --privacy-unit user")
    check_privacy_flags(parser, args)
    audit_canaries.check_flag(parser, args.audit_canaries)
    run_limits.check_epochs(parser, args.epochs)
    config = MovieLensConfig(
        data_path=args.data,
        item_catalogue=None if args.item_catalogue == "none" else args.item_catalogue,
        mechanism=args.mechanism,
        noise_multiplier=args.noise_multiplier,
        epsilon=args.epsilon,
        delta=args.delta,
        l2_norm_clip=args.l2_norm_clip,
        epochs=args.epochs,
        privacy_unit=args.privacy_unit,
        max_examples_per_user=args.max_examples_per_user,
        batch_size=args.batch_size or _default_batch_size(args.privacy_unit),
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
        audit_canaries=args.audit_canaries,
        fail_on_warnings=args.fail_on_warnings,
        max_hours=run_limits.check_max_hours(parser, args.max_hours),
    )
    return config, args.out


def _default_batch_size(unit: str) -> int:
    return movielens_units.DEFAULT_USERS_PER_BATCH if unit == movielens_units.USER else 256


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit status (2 for bad flags, 1 for bad data or settings, 3 for a report with
    warnings under --fail-on-warnings)."""
    config, out = parse_args(argv)
    try:
        result = train_and_evaluate(config, out_dir=out)
    except (FileNotFoundError, MovieLensFormatError, ValueError) as error:  # `out` left as it was
        print(f"python -m pipelines.movielens: error: {error}", file=sys.stderr)
        return 1
    print(format_report(result.report))
    if "audit" in result.report:
        print(audit_canaries.summary_line(result.report["audit"]))
    program, path = "python -m pipelines.movielens", os.path.join(out, "report.json")
    warnings = result.report.get("warnings", [])
    quality.print_warnings(warnings, program=program)
    print(f"report: {path}")
    return quality.exit_status(warnings, fail_on_warnings=config.fail_on_warnings, program=program, report=path)
