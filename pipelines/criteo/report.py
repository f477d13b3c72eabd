"""The reports of a Criteo run: the privacy report and `report.json`.

The privacy report is the run plan's (`tfdp_embed.RunPlan.report`) over the
run's `PrivacyLedger` (the `PrivacyBudget` callback's: the output calibration
and the DP top-k selections as setup events, then one event per step; per
period under parallel composition), so epsilon is what `dp_accounting` says
about everything the run did. `report.json` is the privacy report plus
the pipeline's own fields (AUC, rows, timings, gradient size).

References: DP-FEST §4 (AUC, gradient-size reduction); Ponomareva et al.,
"How to DP-fy ML", JAIR 2023, §5.3 (what a privacy statement reports).
"""

from __future__ import annotations

import json
import math
import os

from pipelines.criteo.privacy import output_calibration_epsilon
from tfdp_embed import ReleasedDatasetSize, RunPlan, accounting
from tfdp_embed.accounting import write_privacy_report
from tfdp_embed.accounting.report import add_seed_caveat

REQUIRED_KEYS = (
    "auc",
    "logloss",
    "mechanism",
    "epsilon",
    "delta",
    "noise_multiplier",
    "noise_multipliers",
    "steps",
    "sampling_probability",
    "rows_read",
    "rows_skipped",
    "gradient_size_reduction",
    "median_step_s",
)
"""Keys every `report.json` has (values may be null where they do not apply)."""


NO_USER_ID_CAVEAT = (
    "Example-level DP: the Criteo files carry no user id, so the unit is one impression and user-level DP "
    "cannot be run. A person with many impressions is protected only by group privacy: for n impressions the "
    "guarantee weakens to about (n eps, n e^((n-1) eps) delta) (Dwork & Roth 2014, Thm 2.2), which is "
    "vacuous for heavy users."
)


def run_privacy_report(
    plan: RunPlan,
    *,
    budget,
    dataset_size: ReleasedDatasetSize | int,
    batching,
    steps: int,
    steps_by_period: list | None = None,
    seeded_sampler: bool = False,
) -> dict:
    """The privacy report of the run (`privacy_report.json` beside the SavedModel): `plan.report` plus Criteo's notes.

    Args:
      plan: the run's `tfdp_embed.RunPlan`.
      budget: the `PrivacyBudget` of a one-period run (its ledger is reported), else None.
      dataset_size: N~, the training rows released with DP (per period).
      batching: what the periods were fed (`DPModel.batching`, the least private).
      steps: steps run.
      steps_by_period: several periods: the steps each ran (parallel composition).
      seeded_sampler: the batches came from a seeded sampler the batching does not show (a seeded Beam job).
    """
    ledger = budget.ledger if budget is not None and plan.is_dp else None
    report = plan.report(
        dataset_size=dataset_size,
        batching=batching,
        ledger=ledger,
        steps=None if ledger is not None else steps,
        steps_by_period=steps_by_period if plan.parallel else None,
        extra={"streaming_periods": len(plan.periods)},
        privacy_unit="example: one training row (one impression)",
    )
    report["caveats"].append(NO_USER_ID_CAVEAT)
    if seeded_sampler and "the batch sampler" not in report["seeded"]:
        if report["seeded"]:
            report["seeded"].append("the batch sampler")
        else:
            add_seed_caveat(report, report["caveats"], ["the batch sampler"])
    if "composition" not in report:
        report["composition"] = "none (non-private run)" if plan.parallel else "sequential"
    eps_c = output_calibration_epsilon(plan)
    if eps_c > 0:
        report["caveats"].append(
            f"Output calibration: after training, the click logit's bias was shifted so that the mean prediction "
            f"matches a DP estimate of the click rate (Laplace histogram of logits and click count on a "
            f"random subset of the training rows, each row read with a fixed probability, ({eps_c:.4g}, 0)-DP, in the ledger as a Laplace event; training was "
            "calibrated for the rest of epsilon). It corrects DP-SGD's clipping bias of the mean prediction; "
            "the AUC is unchanged."
        )
    report["target_epsilon"] = plan.target_epsilon if plan.mechanism_name != "none" else None
    return report


def write_report(path: str, report: dict) -> str:
    """Writes `report.json`; an undefined number (NaN) is null, with its reason beside it where one applies."""
    return write_privacy_report(path, _nan_to_none(report))


def _nan_to_none(value):
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_nan_to_none(v) for v in value]
    return value


def read_report(path: str) -> dict:
    with open(os.fspath(path), encoding="utf-8") as f:
        return json.load(f)


def format_report(report: dict) -> str:
    """The human-readable summary printed at the end of a run: the library's privacy lines, then Criteo's own."""
    step, skipped = report.get("median_step_s"), report.get("rows_skipped", {})
    rows = f"{report['rows_read']} / {sum(skipped.values())}" + (f" {skipped}" if any(skipped.values()) else "")
    details = {
        "sampler": f"{report.get('sampler')}{_passes(report)}",
        "rows read / skipped": rows,
        "settings": _settings(report),
        "AUC / log loss": f"{_auc(report)} / {number(report['logloss'])} on {report['eval_rows']} rows (base-rate "
        f"log loss {number(report.get('base_rate_logloss'))})",
        "mean prediction": f"{number(report.get('eval_mean_prediction'))} (click rate "
        f"{number(report.get('eval_click_rate'))}){_calibration(report)}",
        "gradient size": _reduction(report),
        "median step": "n/a" if step is None else f"{step * 1000:.1f} ms",
        "saved model": f"{report['saved_model']} (privacy_report.json beside it)",
    }
    return accounting.format_report(report, details=details)


def _passes(report: dict) -> str:
    data = report.get("data") or {}
    beam = data.get("beam_shards")
    if beam:
        seeded = ", seeded (the guarantee excludes whoever knows the seed)" if beam.get("seeded") else ""
        return f"; manifest {beam['manifest']}{seeded}"
    passes = [p for p in data.get("passes_per_epoch") or [] if p]
    return f"; reads the training files {max(passes)}x per epoch" if passes else ""


def _settings(report: dict) -> str:
    defaults = report.get("defaults") or {}
    values, chosen = defaults.get("values") or {}, defaults.get("chosen_from_data") or []
    parts = [
        f"{name.replace('_', ' ')} {','.join(map(str, v)) if isinstance(v, list) else v}"
        + (" (chosen)" if name in chosen else "")
        for name, v in values.items()
    ]
    return "; ".join(parts) or "n/a"


def _auc(report: dict) -> str:
    if report.get("auc") is None and report.get("auc_note"):
        return f"n/a ({report['auc_note']})"
    return number(report.get("auc"))


def _calibration(report: dict) -> str:
    calibration = report.get("output_calibration")
    if not calibration:
        return ""
    if calibration.get("skipped"):
        return f"; output calibration skipped: {calibration['reason']}"
    return f"; output bias shifted by {calibration['shift']:+.3f} (DP, eps {number(calibration['epsilon'])})"


def number(value) -> str:
    """`value` with 4 significant digits, or as it is (None, a string, a non-finite float)."""
    if isinstance(value, (int, float)) and math.isfinite(value):
        return f"{value:.4g}"
    return str(value)


def _reduction(report: dict) -> str:
    reduction = report.get("gradient_size_reduction")
    if reduction is None:
        return report.get("gradient_size_basis", "n/a")
    return f"{reduction:.3g}x smaller than dense DP-SGD ({report.get('gradient_size_basis')})"


__all__ = ["REQUIRED_KEYS", "format_report", "number", "read_report", "run_privacy_report", "write_report"]
