"""The reports of a Criteo run: the privacy report and `report.json`.

The privacy report is `tfdp_embed.accounting.privacy_report` over the run's
`PrivacyLedger` (the `PrivacyBudget` callback's: the DP top-k selections as
setup events, then one event per step), so epsilon is what `dp_accounting`
says about everything the run did. `report.json` is the privacy report plus
the pipeline's own fields (AUC, rows, timings, gradient size).

References: DP-FEST §4 (AUC, gradient-size reduction); Ponomareva et al.,
"How to DP-fy ML", JAIR 2023, §5.3 (what a privacy statement reports).
"""

from __future__ import annotations

import json
import math
import os

from tfdp_embed.accounting import privacy_report, write_privacy_report

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


def run_privacy_report(
    *,
    mechanism,
    settings,
    calibration,
    ledger,
    sampling_probability: float,
    dataset_size: int,
    batching,
    steps: int,
    streaming_periods: int,
    epsilon: float | None = None,
    period_ledgers: list | None = None,
    period_epsilons: list | None = None,
    worst_period: int | None = None,
) -> dict:
    """The privacy report of the run (`privacy_report.json` beside the SavedModel).

    Args:
      mechanism: the trained mechanism.
      settings: `criteo_privacy.PrivacySettings`.
      calibration: `criteo_privacy.Calibration`.
      ledger: the `PrivacyLedger` of the run, or None (non-private run).
      sampling_probability: q (largest over periods).
      dataset_size: training rows N.
      batching: a `BatchingInfo` or "poisson" / "fixed_shuffled".
      steps: steps run.
      streaming_periods: number of periods (1 for a plain run).
      epsilon: several periods: the run's epsilon (the largest period's,
        parallel composition; see `criteo_privacy`), instead of `ledger`.
      period_ledgers: several periods: each period's `PrivacyLedger`.
      period_epsilons: several periods: each period's epsilon.
      worst_period: index of the period whose epsilon is the run's.
    """
    extra = {
        "calibration": {
            "target_epsilon": settings.epsilon,
            "target_delta": settings.delta,
            "accountant": settings.accountant,
            "noise_multiplier": calibration.noise_multiplier,
            "contribution_noise_multiplier": calibration.contribution_noise_multiplier,
            "gradient_noise_multiplier": calibration.gradient_noise_multiplier,
            "selection_epsilon": calibration.selection_epsilon,
            "selection_epsilon_per_selection": calibration.selection_epsilon_per_selection,
            "output_calibration_epsilon": calibration.calibration_epsilon,
        },
        "streaming_periods": streaming_periods,
    }
    report = privacy_report(
        mechanism=mechanism,
        delta=settings.delta,
        sampling_probability=sampling_probability,
        dataset_size=int(dataset_size),
        ledger=ledger if mechanism.is_dp else None,
        epsilon=epsilon if mechanism.is_dp else None,
        steps=None if (ledger is not None and mechanism.is_dp) else int(steps),
        accountant=settings.accountant,
        batching=batching,
        extra=extra,
    )
    if streaming_periods > 1 and period_ledgers is not None:
        report["composition"] = "parallel over streaming periods"
        report["ledger"] = json.loads(period_ledgers[worst_period].to_json())
        report["period_accounting"] = [
            {"period": i + 1, "epsilon": eps, "steps": ledger.steps, "ledger": json.loads(ledger.to_json())}
            for i, (ledger, eps) in enumerate(zip(period_ledgers, period_epsilons))
        ]
        report["caveats"].append(
            f"Streaming periods ({streaming_periods}): parallel composition. Each row is in one day (one "
            "period), so epsilon is the largest period's, not the sum: each period is charged its own "
            "steps at its own sampling rate plus every DP selection of the run (running counts put a day's "
            f"rows into every later selection). Worst period: {worst_period + 1}. Metrics measured between "
            "periods on raw evaluation rows are not covered by the guarantee."
        )
    elif streaming_periods > 1:
        report["composition"] = "none (non-private run)"
    else:
        report["composition"] = "sequential"
    if calibration.calibration_epsilon > 0:
        report["caveats"].append(
            f"Output calibration: after training, the click logit's bias was shifted so that the mean prediction "
            f"matches a DP estimate of the click rate (Laplace histogram of logits and click count, "
            f"({calibration.calibration_epsilon:.4g}, 0)-DP, in the ledger as a Laplace event; training was "
            "calibrated for the rest of epsilon). It corrects DP-SGD's clipping bias of the mean prediction; "
            "the AUC is unchanged."
        )
    if mechanism.name == "eana":
        report["caveats"].append(
            f"The noise multiplier {calibration.noise_multiplier:.4g} is what dense DP-SGD would need "
            f"for epsilon={settings.epsilon:g} at delta={settings.delta:.3g}; EANA with it has no such guarantee."
        )
    report["target_epsilon"] = settings.epsilon if mechanism.name != "none" else None
    return report


def write_report(path: str, report: dict) -> str:
    """Writes `report.json` (non-finite floats as strings, like the privacy report)."""
    return write_privacy_report(path, report)


def read_report(path: str) -> dict:
    with open(os.fspath(path), encoding="utf-8") as f:
        return json.load(f)


def format_report(report: dict) -> str:
    """The human-readable summary printed at the end of a run."""
    eps, delta, step = report.get("epsilon"), report.get("delta"), report.get("median_step_s")
    skipped = report.get("rows_skipped", {})
    private = "differentially private" if report["is_dp"] else "NOT differentially private"
    epsilon = "n/a" if eps is None else _number(eps)
    rows = f"{report['rows_read']} / {sum(skipped.values())}" + (f" {skipped}" if any(skipped.values()) else "")
    lines = [
        "== privacy report ==",
        f"mechanism            {report['mechanism']} ({private})",
        f"guarantee            {report.get('guarantee')}",
        f"epsilon              {epsilon} (target {report.get('target_epsilon')})",
        f"delta                {'n/a' if delta is None else _number(delta)}",
        f"accountant           {report.get('accountant')}",
        f"noise multiplier     {_noise(report)}",
        f"sampling             {report.get('batching')}, q = {_number(report.get('sampling_probability'))}",
        f"sampler              {report.get('sampler')}{_passes(report)}",
        f"composition          {report.get('composition')}",
        f"steps                {report.get('steps')}",
        f"rows read / skipped  {rows}",
        f"AUC / log loss       {_number(report['auc'])} / {_number(report['logloss'])} on {report['eval_rows']} rows",
        f"mean prediction      {_number(report.get('eval_mean_prediction'))} (click rate "
        f"{_number(report.get('eval_click_rate'))}){_calibration(report)}",
        f"gradient size        {_reduction(report)}",
        f"median step          {'n/a' if step is None else f'{step * 1000:.1f} ms'}",
        f"saved model          {report['saved_model']} (privacy_report.json beside it)",
        "caveats:",
    ] + [f"  - {c}" for c in report.get("caveats", [])]
    lines += [f"WARNING: {w}" for w in report.get("warnings", [])]
    return "\n".join(lines)


def _passes(report: dict) -> str:
    data = report.get("data") or {}
    passes = [p for p in data.get("passes_per_epoch") or [] if p]
    return f"; reads the training files {max(passes)}x per epoch" if passes else ""


def _calibration(report: dict) -> str:
    calibration = report.get("output_calibration")
    if not calibration:
        return ""
    return f"; output bias shifted by {calibration['shift']:+.3f} (DP, eps {_number(calibration['epsilon'])})"


def _noise(report: dict) -> str:
    effective = (report.get("noise_multipliers") or {}).get("effective_noise_multiplier")
    text = _number(report.get("noise_multiplier"))
    return text if effective is None else f"{text} (gradient); {_number(effective)} effective per step"


def _number(value) -> str:
    if isinstance(value, (int, float)) and math.isfinite(value):
        return f"{value:.4g}"
    return str(value)


def _reduction(report: dict) -> str:
    reduction = report.get("gradient_size_reduction")
    if reduction is None:
        return report.get("gradient_size_basis", "n/a")
    return f"{reduction:.3g}x smaller than dense DP-SGD ({report.get('gradient_size_basis')})"


__all__ = ["REQUIRED_KEYS", "format_report", "read_report", "run_privacy_report", "write_report"]
