"""Is the released model any good, and was the data clean? The checks behind the reports' `warnings`.

Each pipeline compares the model it releases with references on the SAME
evaluation data, and warns when the model does not beat them:

* Criteo (click model): log loss >= the base-rate log loss (predicting the
  click rate for every row) or AUC <= 0.5 + `AUC_MARGIN` (a random ranking);
* MovieLens and sequential (full ranking of all items): a metric below the
  popularity ranking (items by their training count), or not above chance
  (a random ranking) by `CHANCE_MARGIN`;
* a training loss stuck at its initial value: ln(#items) for a softmax over
  all items, i.e. the model never moved from uniform predictions.

Data problems are counted and warned about too: rows dropped by Criteo's
`--skip-bad-rows` above `SKIPPED_ROWS_THRESHOLD` of a period's lines, and
duplicated (user, movie) ratings in MovieLens. Duplicates are not checked
where they are meaningful data: a sequential user may consume an item again,
and two Criteo impressions may have identical fields.

Privacy: every number here comes from the evaluation split, the exact
training counts (popularity) or the un-noised data, so it goes into the
operator's `report.json` (marked not released), never into the
`privacy_report.json` shipped with the model.

Example:
    >>> references, warnings = ranking_references(
    ...     {"recall@10": 0.02}, {"chance": {"recall@10": 0.01}, "popularity": {"recall@10": 0.05}},
    ...     keys=("recall@10",), what="test examples")
    >>> references["beats_chance"], references["beats_popularity"], warnings[0][:46]
    (True, False, 'The model does not beat the popularity ranking')

References: Ji et al., "A Critical Study on Data Leakage in Recommender
System Offline Evaluation", 2020 (popularity as the reference); Ponomareva et
al., "How to DP-fy ML", JAIR 2023, §5.3 (report the non-private baseline).
"""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

AUC_MARGIN = 0.01
"""A click model's AUC must exceed 0.5 by this much (a random ranking has 0.5)."""
LOGLOSS_MARGIN = 0.001
"""A click model's log loss must be below the base rate's by this share of it."""
CHANCE_MARGIN = 0.1
"""A ranking metric must exceed chance by this share of chance (a random ranking's expected value)."""
STUCK_LOSS_TOLERANCE = 0.02
"""A final training loss within this share of its initial value (e.g. ln(#items)) is stuck."""
SKIPPED_ROWS_THRESHOLD = 0.01
"""`--skip-bad-rows` dropping more than this share of a file's lines is warned about."""


def beats(value, reference, *, higher_is_better: bool = True, margin: float = 0.0) -> bool | None:
    """Whether `value` is better than `reference` by more than `margin` (absolute); None when either is undefined."""
    if not _finite(value) or not _finite(reference):
        return None if not _finite(reference) else False  # a NaN model (diverged) beats nothing
    return value > reference + margin if higher_is_better else value < reference - margin


def click_references(final: Mapping) -> tuple[dict, list]:
    """Criteo's `references` entry and warnings: the model's log loss and AUC against the base rate and chance.

    Args:
      final: `criteo.evaluation.evaluate`'s dict on the final evaluation data.

    Returns:
      `(references, warnings)`; an undefined AUC (one class only) is not compared, nor the log loss then
      (the base rate's is 0 there, unbeatable).
    """
    base, one_class = final.get("base_rate_logloss"), bool(final.get("auc_note"))
    references = {
        "evaluated_on": f"the final evaluation data ({final.get('examples')} rows)",
        "base_rate_logloss": base,
        "chance_auc": 0.5,
        "beats_base_rate": None
        if one_class
        else beats(final.get("logloss"), base, higher_is_better=False, margin=LOGLOSS_MARGIN * (base or 0.0)),
        "beats_chance": None if one_class else beats(final.get("auc"), 0.5, margin=AUC_MARGIN),
    }
    warnings = []
    if references["beats_base_rate"] is False:
        warnings.append(
            f"The model does not beat the base rate: log loss {final.get('logloss'):.4g} >= {base:.4g}, the log loss "
            "of predicting the click rate for every row. It learned nothing usable; check the learning rate, the "
            "epochs and the noise."
        )
    if references["beats_chance"] is False:
        warnings.append(
            f"The model does not beat chance: AUC {final.get('auc'):.4g} <= {0.5 + AUC_MARGIN:g} (a random ranking "
            "has 0.5). It ranks clicks no better than a coin; check the learning rate, the epochs and the noise."
        )
    return references, warnings


def ranking_references(metrics: Mapping, baselines: Mapping, *, keys: Sequence[str], what: str) -> tuple[dict, list]:
    """`references` entry and warnings of a full-ranking model against `baselines["chance"]` and `["popularity"]`.

    Args:
      metrics: the model's metrics on the evaluation data (`keys` among them).
      baselines: `{"chance": {...}, "popularity": {...}}` on the same data (`tfdp_embed.metrics.baselines`).
      keys: the metrics compared, e.g. ("ndcg@10", "hit@10").
      what: the evaluation data, in words ("1,234 test examples").
    """
    references: dict = {
        "evaluated_on": what,
        "model": {key: metrics.get(key) for key in keys},
        "chance": {key: baselines["chance"].get(key) for key in keys},
        "popularity": {key: baselines["popularity"].get(key) for key in keys},
    }
    warnings = []
    for name, margin, words in (
        ("popularity", 0.0, "ranking every query by the items' training counts"),
        ("chance", CHANCE_MARGIN, f"a random ranking; needed: more than {1 + CHANCE_MARGIN:g}x it"),
    ):
        lost = _lost(metrics, baselines[name], keys, margin)
        references[f"beats_{name}"] = not lost
        if lost:
            numbers = ", ".join(f"{k} {_number(metrics.get(k))} vs {_number(baselines[name].get(k))}" for k in lost)
            warnings.append(
                f"The model does not beat the {name} ranking ({words}) on the {what}: {numbers}. "
                "Do not ship it; train longer, with more data, a larger learning rate or less noise."
            )
    return references, warnings


def _lost(metrics: Mapping, reference: Mapping, keys: Sequence[str], relative_margin: float) -> list:
    """The metrics of `keys` on which the model does not beat `reference` (by `relative_margin` x the reference)."""
    margins = {k: relative_margin * reference[k] if _finite(reference.get(k)) else 0.0 for k in keys}
    saturated = {k for k in keys if _finite(reference.get(k)) and reference[k] >= 1.0}  # no model can beat 1
    return [
        k for k in keys if k not in saturated and beats(metrics.get(k), reference.get(k), margin=margins[k]) is False
    ]


def stuck_loss_warning(final_loss, initial_loss: float, *, initial: str) -> str | None:
    """A warning when `final_loss` stayed within `STUCK_LOSS_TOLERANCE` of `initial_loss` (named by `initial`)."""
    if not _finite(final_loss) or final_loss < (1.0 - STUCK_LOSS_TOLERANCE) * initial_loss:
        return None
    return (
        f"The training loss is stuck at its initial value: final {final_loss:.4g} vs {initial} = "
        f"{initial_loss:.4g} (uniform predictions). Training did not move the model; check the learning rate, the "
        "epochs and the noise."
    )


def uniform_softmax_loss(num_items: int) -> float:
    """ln(#items): the cross-entropy of uniform predictions over `num_items` items."""
    return math.log(max(int(num_items), 1))


def skipped_rows(stats: Mapping, files: Sequence[str]) -> dict:
    """`{"files", "lines", "skipped", "fraction"}` of one reader's `CriteoReadStats.as_dict()` (all its passes)."""
    lines, skipped = int(stats.get("lines", 0)), int(stats.get("total_skipped", 0))
    return {"files": list(files), "lines": lines, "skipped": skipped, "fraction": skipped / lines if lines else 0.0}


def skipped_rows_warning(entry: Mapping, *, flag: str = "--skip-bad-rows") -> str | None:
    """A warning when `entry` (`skipped_rows`) dropped more than `SKIPPED_ROWS_THRESHOLD` of its lines."""
    if entry["fraction"] <= SKIPPED_ROWS_THRESHOLD:
        return None
    return (
        f"{', '.join(entry['files'])}: {flag} skipped {entry['skipped']} of {entry['lines']} rows "
        f"({100 * entry['fraction']:.3g}%, more than {100 * SKIPPED_ROWS_THRESHOLD:g}%); the model trained or was "
        "evaluated on what was left. Check the file's format (rows_skipped in report.json says why)."
    )


def duplicate_pairs(timelines: Iterable[np.ndarray]) -> tuple[int, int]:
    """`(duplicates, rows)`: (user, item) rows beyond the first of each pair, over each user's item timeline."""
    duplicates = rows = 0
    for timeline in timelines:
        timeline = np.asarray(timeline)
        rows += timeline.size
        duplicates += timeline.size - np.unique(timeline).size
    return int(duplicates), int(rows)


def duplicates_warning(duplicates: int, rows: int, *, path: str, what: str, kept: str) -> str | None:
    """A warning naming `path` when it holds duplicated `what` rows (`kept` says what the run did with them)."""
    if duplicates == 0:
        return None
    return f"{path}: {duplicates} of {rows} rows repeat an earlier {what}; {kept}"


def print_warnings(warnings: Iterable[str], *, program: str) -> None:
    """Prints each warning on stderr, one line each, `program: WARNING: ...` (also the report's `warnings`)."""
    for warning in warnings:
        print(f"{program}: WARNING: {warning}", file=sys.stderr)


FAIL_ON_WARNINGS_STATUS = 3
"""The exit status of a run with `--fail-on-warnings` whose report has warnings (1: error, 2: bad flags)."""


def add_fail_on_warnings_flag(parser) -> None:
    """`--fail-on-warnings`, shared by the pipelines' command lines."""
    parser.add_argument(
        "--fail-on-warnings",
        action="store_true",
        help=f"exit with status {FAIL_ON_WARNINGS_STATUS} when the report has warnings (the release and "
        "report.json are written all the same), e.g. to stop a scheduled job from shipping a bad model",
    )


def exit_status(warnings: Sequence[str], *, fail_on_warnings: bool, program: str, report: str) -> int:
    """0, or `FAIL_ON_WARNINGS_STATUS` (with one line on stderr) when `fail_on_warnings` and there are `warnings`."""
    if not (fail_on_warnings and warnings):
        return 0
    print(
        f"{program}: error: --fail-on-warnings: the report has {len(warnings)} warning(s) (above; its "
        f"`warnings` in {report}); the release was written, exit status {FAIL_ON_WARNINGS_STATUS}.",
        file=sys.stderr,
    )
    return FAIL_ON_WARNINGS_STATUS


def _finite(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _number(value) -> str:
    return f"{value:.4g}" if _finite(value) else str(value)


__all__ = [
    "beats",
    "click_references",
    "duplicate_pairs",
    "duplicates_warning",
    "print_warnings",
    "ranking_references",
    "skipped_rows",
    "skipped_rows_warning",
    "FAIL_ON_WARNINGS_STATUS",
    "add_fail_on_warnings_flag",
    "exit_status",
    "stuck_loss_warning",
    "uniform_softmax_loss",
]
