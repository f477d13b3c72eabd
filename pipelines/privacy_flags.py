"""The privacy flags the three pipeline command lines share, defined once.

`--mechanism`, `--epsilon` (with `--noise-multiplier` as its exclusive
alternative where a pipeline takes a given sigma), `--delta`, the per-example
clip norm and `--accountant`; each pipeline passes its own choices and
defaults. `check_privacy_flags` does the checks argparse types cannot
express (`--delta` in (0, 1)).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from pipelines import cli_types

ACCOUNTANTS = ("pld", "rdp")


def add_privacy_flags(
    parser,
    *,
    mechanisms: Sequence[str],
    mechanism_default: str | None,
    mechanism_help: str | None = None,
    epsilon_default: float | None = None,
    epsilon_help: str = "target epsilon",
    allow_inf_epsilon: bool = False,
    noise_multiplier_help: str | None = None,
    delta_help: str = "target delta in (0, 1) (default 1/N)",
    clip_flag: str = "--clip",
    clip_default: float = 1.0,
    clip_help: str | None = None,
) -> None:
    """Adds the shared privacy flags to `parser` (an `ArgumentParser` or an argument group).

    Args:
      parser: where the flags go.
      mechanisms: the `--mechanism` choices.
      mechanism_default: its default; None makes `--mechanism` required.
      mechanism_help, epsilon_help, delta_help, clip_help: the flags' help.
      epsilon_default: `--epsilon`'s default (None: not given).
      allow_inf_epsilon: `--epsilon inf` means non-private.
      noise_multiplier_help: adds `--noise-multiplier` (sigma, >= 0), exclusive with `--epsilon`.
      clip_flag, clip_default: the clip norm's flag name and default.
    """
    parser.add_argument(
        "--mechanism",
        choices=tuple(mechanisms),
        default=mechanism_default,
        required=mechanism_default is None,
        help=mechanism_help,
    )
    target = parser
    if noise_multiplier_help is not None:
        target = parser.add_mutually_exclusive_group()
        target.add_argument("--noise-multiplier", type=cli_types.non_negative_float, help=noise_multiplier_help)
    epsilon_type = cli_types.positive(float, allow_inf=allow_inf_epsilon)
    target.add_argument("--epsilon", type=epsilon_type, default=epsilon_default, help=epsilon_help)
    parser.add_argument("--delta", type=float, help=delta_help)
    parser.add_argument(clip_flag, type=cli_types.positive(float), default=clip_default, help=clip_help)
    parser.add_argument("--accountant", choices=ACCOUNTANTS, default="pld", help="privacy accountant")


def check_privacy_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exits with status 2 (`parser.error`) on a `--delta` outside (0, 1)."""
    if args.delta is not None and not 0 < args.delta < 1:
        parser.error(f"--delta must lie in (0, 1); received {args.delta!r}.")


__all__ = ["ACCOUNTANTS", "add_privacy_flags", "check_privacy_flags"]
