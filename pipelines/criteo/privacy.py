"""Privacy side of the Criteo pipeline: the CLI's privacy flags as one `tfdp_embed.plan_run` call.

The library plans the run (`tfdp_embed.planning`): sigma for (epsilon,
delta), q = B / N and T steps; AdaFEST's split by `--adafest-ratio`; EANA's
nominal sigma. What this pipeline adds are its releases and its periods:

* the DP output calibration (`calibration.py`, a Laplace histogram,
  pure DP) spends `--calibration-fraction` of epsilon, by basic composition;
* fest and adafest+ select rows with DP top-k (`--selection-fraction` of
  epsilon, pure DP); fest re-selects from running counts once per streaming
  period (DP-FEST §4.3), each selection spending its share / periods;
* `--streaming-periods`: one period per training day, composed in parallel
  (`tfdp_embed.accounting.periods` holds the argument).

References: DP-FEST (NeurIPS 2023) §3.1-3.3, §4.3, App. C.3-C.4, D.1;
LazyDP (ASPLOS 2024) §5; EANA (RecSys 2022) §3.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import cast

import numpy as np

from tfdp_embed import Release, ReleasedDatasetSize, RunPlan, mechanisms, plan_run
from tfdp_embed.accounting import AccountingPeriod

MECHANISM_NAMES = tuple(mechanisms.MECHANISMS)
OUTPUT_CALIBRATION = "output_calibration"


@dataclasses.dataclass(frozen=True)
class PrivacySettings:
    """What the CLI says about privacy (static values only).

    Attributes:
      mechanism: one of `MECHANISM_NAMES`.
      epsilon: target epsilon (> 0) of the released model (nominal for eana).
      delta: target delta in (0, 1).
      l2_norm_clip: per-example gradient clip norm C.
      accountant: "pld" or "rdp".
      selection_fraction: share of epsilon spent on the DP top-k selection
        (fest, adafest+), in (0, 1).
      top_fraction: fraction of each table's rows the selection keeps (fest, adafest+).
      top_min_rows: every table keeps at least min(V, top_min_rows) rows (fest, adafest+): with 1, a
        3-row table keeps one row at any fraction below 2/3; DP-FEST's top-k over all buckets
        (App. B.1) keeps the small, frequent tables whole.
      adafest_ratio: sigma1 / sigma2 (adafest, adafest+); App. D.1 tunes 0.1..10.
      adafest_threshold: tau; None means `threshold_sigmas * sigma1 * C1`.
      threshold_sigmas: default tau in units of the contribution-map noise std.
      contribution_clip: C1 of the contribution map.
      calibration_fraction: share of epsilon for the DP output calibration
        (`calibration.py`), in [0, 1); 0 turns it off.
      seed: noise seed (None: OS entropy; ints are for tests and reproducible runs).
    """

    mechanism: str
    epsilon: float | None
    delta: float | None
    l2_norm_clip: float = 1.0
    accountant: str = "pld"
    selection_fraction: float = 0.1
    top_fraction: float = 0.1
    top_min_rows: int = 1
    adafest_ratio: float = 1.0
    adafest_threshold: float | None = None
    threshold_sigmas: float = 2.0
    contribution_clip: float = 1.0
    calibration_fraction: float = 0.0
    seed: int | None = None


def selects_rows(name: str) -> bool:
    """True for mechanisms that make a DP selection from bucket counts (their class takes `selection_epsilon`)."""
    return "selection_epsilon" in mechanisms.options(name, counts=True)


def plan(
    settings: PrivacySettings,
    *,
    periods: Sequence[AccountingPeriod],
    counts: Mapping[str, np.ndarray] | None = None,
    released: ReleasedDatasetSize | None = None,
    table_parts: Mapping[str, Sequence[int]] | None = None,
) -> RunPlan:
    """The run's `RunPlan`: the mechanism for `settings`, calibrated over `periods`.

    Args:
      settings: the privacy settings (delta resolved).
      periods: one `AccountingPeriod` per streaming period (one for a plain run).
      counts: {table layer name: bucket counts} for mechanisms that select
        rows (`selects_rows`): the non-private frequencies the DP selection is made from.
      released: N~ of the periods (`release_dataset_size`), charged to the budget (not for "none").
      table_parts: {table layer name: its features' vocabularies} for stacked tables (`top_rows`).

    Raises:
      ValueError: a selecting mechanism without `counts`, or a target the accountant cannot meet.
    """
    name = settings.mechanism
    if selects_rows(name) and counts is None:
        raise ValueError(f"Mechanism {name!r} selects rows from bucket counts; `counts` is required.")
    releases = [Release.dataset_size(released)] if released is not None and name != "none" else []
    if name != "none" and settings.calibration_fraction > 0:
        releases.append(
            Release(OUTPUT_CALIBRATION, epsilon_share=settings.calibration_fraction, seeded=settings.seed is not None)
        )
    if selects_rows(name):
        reselects = mechanisms.capabilities_of(mechanisms.mechanism_class(name)).reselects
        count = len(periods) if reselects else 1  # fest re-selects each period; adafest+ selects once
        releases.append(Release.selection(settings.selection_fraction, count=count))
    return plan_run(
        name,
        target_epsilon=settings.epsilon,
        target_delta=cast(float, settings.delta),  # resolved by the caller (see Args)
        accountant=settings.accountant,
        periods=periods,
        l2_norm_clip=settings.l2_norm_clip,
        releases=releases,
        seed=settings.seed,
        **_mechanism_options(settings, counts, table_parts),
    )


def _mechanism_options(settings: PrivacySettings, counts, table_parts=None) -> dict:
    """The CLI's mechanism flags, for the mechanisms that take them."""
    accepted = mechanisms.options(settings.mechanism, counts=counts is not None)
    flags = dict(counts=counts, contribution_clip=settings.contribution_clip, threshold=settings.adafest_threshold)
    flags.update(top_rows(settings, counts, table_parts))
    options = {k: v for k, v in flags.items() if k in accepted}
    if "contribution_noise_multiplier" in accepted:
        options.update(ratio=settings.adafest_ratio, threshold_sigmas=settings.threshold_sigmas)
    return options


def top_rows(settings: PrivacySettings, counts, table_parts: Mapping[str, Sequence[int]] | None = None) -> dict:
    """`{"top_fraction": f}`, or with `top_min_rows` > 1 `{"top_k": {table: k}}`, k = max(floor(f V), min(V, m)).

    V = len(counts[table]) is the table's vocabulary (public), so k is too. A stack of
    tables (`table_parts[table]`: its features' vocabularies) keeps the sum of its
    features' k: as many rows as unstacked, chosen by one top-k over all its buckets.
    """
    if settings.top_min_rows <= 1 or counts is None:
        return {"top_fraction": settings.top_fraction}
    ks = {}
    for name, vector in counts.items():
        sizes = (table_parts or {}).get(name, [len(vector)])
        ks[name] = sum(
            max(1, math.floor(settings.top_fraction * size), min(size, settings.top_min_rows)) for size in sizes
        )
    return {"top_k": ks}


def output_calibration_epsilon(run: RunPlan) -> float:
    """eps_c of the DP output calibration (0 when it is off)."""
    names = [r.name for r in run.releases]
    return run.release(OUTPUT_CALIBRATION).epsilon if OUTPUT_CALIBRATION in names else 0.0


__all__ = [
    "MECHANISM_NAMES",
    "OUTPUT_CALIBRATION",
    "PrivacySettings",
    "output_calibration_epsilon",
    "plan",
    "selects_rows",
    "top_rows",
]
