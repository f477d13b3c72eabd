"""The privacy report as text: what a person reads at the end of a run (the JSON stays the record).

    print(format_report(plan.report(dp_model=dp, ledger=budget.ledger, dataset_size=n)))

    == privacy report ==
    guarantee          (2.99949, 5e-05)-differential privacy, add-or-remove-one-example adjacency, ...
    mechanism          lazy (differentially private)
    epsilon / delta    2.999 / 5e-05 (target 3)
    accountant         PLD
    noise multiplier   0.6286; clip norm 1
    sampling           poisson (verified), q = 0.0128, expected batch 256 of N = 20000
    steps              78 (0.998 epochs)

A user-level run (`poisson_user_batches`) adds, after sampling:

    privacy unit       user: 943 users, at most 32 examples per user per step
    caveats:
      - ...

A pipeline adds its own lines (`details`), e.g. its metrics; a run
report's `not_released` note and `warnings` come last.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

_WIDTH = 19  # label column (a longer label is followed by one space)


def format_report(report: Mapping, *, title: str = "privacy report", details: Mapping | None = None) -> str:
    """A privacy report (or a run report holding one) as aligned lines of text.

    Args:
      report: a dict from `accounting.privacy_report`, `RunPlan.report` or
        `read_privacy_report`, or a pipeline's run report built on one.
      title: the heading line's title.
      details: more lines after the privacy statement, label -> value
        (e.g. {"AUC / log loss": "0.71 / 0.44"}); None values are skipped.

    Returns:
      The guarantee line, mechanism (and whether it is DP), epsilon/delta
      (and the target), accountant, noise multipliers and clip norm,
      sampling and batching, steps, composition and assumptions when there
      are any, `details`, the caveats, the not-released note and warnings.
    """
    lines = [f"== {title} =="]
    for label, value in [*_privacy_lines(report), *(details or {}).items()]:
        if value is not None:
            lines.append(f"{label:<{_WIDTH - 1}} {value}")
    lines += ["caveats:"] + [f"  - {caveat}" for caveat in report.get("caveats", [])]
    if report.get("not_released"):
        lines.append(f"not released: {report['not_released']}")
    lines += [f"WARNING: {warning}" for warning in report.get("warnings", [])]
    return "\n".join(lines)


def _privacy_lines(report: Mapping) -> list:
    is_dp = bool(report.get("is_dp"))
    assumptions = report.get("assumptions") or []
    return [
        ("guarantee", report.get("guarantee")),
        ("mechanism", f"{report.get('mechanism')} ({'' if is_dp else 'NOT '}differentially private)"),
        ("epsilon / delta", _epsilon(report)),
        ("accountant", str(report.get("accountant", "n/a")).upper()),
        ("noise multiplier", _noise(report)),
        ("sampling", _sampling(report)),
        ("privacy unit", _user_unit(report)),
        ("steps", _steps(report)),
        ("composition", report.get("composition")),
        ("assumptions", "; ".join(assumptions) if assumptions else None),
        ("attacker TPR", _attacker(report)),
        ("mu-GDP", _gdp(report)),
    ]


def _attacker(report: Mapping) -> str | None:
    """The guarantee as a membership test's best TPR at each FPR (the tighter PLD rows where there are some)."""
    bound = report.get("attacker_bound") or {}
    rows = bound.get("pld_bounds") or bound.get("bounds")
    if not report.get("is_dp") or not rows:
        return None
    return ", ".join(f"<= {row['max_tpr']:.3g} at FPR {row['fpr']:g}" for row in rows) + " (a bound)"


def _gdp(report: Mapping) -> str | None:
    gdp = (report.get("attacker_bound") or {}).get("gdp_clt")
    if not report.get("is_dp") or not gdp:
        return None
    return f"mu ~ {gdp['mu']:.3g} (central-limit approximation, not a bound)"


def _epsilon(report: Mapping) -> str:
    epsilon, delta = report.get("epsilon"), report.get("delta")
    if epsilon is None:
        nominal = report.get("nominal_epsilon_not_dp")
        text = "n/a (no DP guarantee" + (f"; nominal {_number(nominal)}, NOT a guarantee)" if nominal else ")")
    else:
        text = _number(epsilon)
    text += f" / {_number(delta)}"
    target = report.get("target_epsilon", (report.get("extra") or {}).get("plan", {}).get("target_epsilon"))
    if target is not None:
        text += f" (target {_number(target)})"
    if report.get("delta_with_truncation") is not None:
        text += f"; delta with batch truncation {_number(report['delta_with_truncation'])}"
    return text


def _noise(report: Mapping) -> str:
    main = report.get("noise_multiplier")
    others = {
        key: value
        for key, value in (report.get("noise_multipliers") or {}).items()
        if key != "noise_multiplier" and value is not None
    }
    text = _number(main)
    if others:
        text += " (" + ", ".join(f"{key} {_number(value)}" for key, value in others.items()) + ")"
    if report.get("l2_norm_clip") is not None:
        text += f"; clip norm {_number(report['l2_norm_clip'])}"
    return text


def _sampling(report: Mapping) -> str:
    text = f"{report.get('batching', 'n/a')}"
    if report.get("batching_source"):
        text += f" ({report['batching_source']})"
    if report.get("sampling_probability") is not None:
        text += f", q = {_number(report['sampling_probability'])}"
    if report.get("expected_batch_size") is not None and report.get("dataset_size") is not None:
        released = (report.get("dataset_size_release") or {}).get("noise_multiplier") is not None
        n = f"N~ = {report['dataset_size']} (N released with DP)" if released else f"N = {report['dataset_size']}"
        text += f", expected batch {_number(report['expected_batch_size'])} of {n}"
    return text


def _user_unit(report: Mapping) -> str | None:
    """The unit line of a user-level report (N, q and the batch are then in users); None otherwise."""
    if report.get("max_examples_per_unit") is None:
        return None
    if report.get("unit_declared_by_caller"):
        return f"{report.get('privacy_unit')}: {report.get('num_units')} users, one example each (all of a user's data)"
    return (
        f"{report.get('privacy_unit')}: {report.get('num_units')} users, at most "
        f"{report['max_examples_per_unit']} examples per user per step"
    )


def _steps(report: Mapping) -> str:
    steps, epochs = report.get("steps"), report.get("epochs")
    return f"{steps}" + ("" if epochs is None else f" ({_number(epochs)} epochs)")


def _number(value) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return f"{value:.4g}"
    return "n/a" if value is None else str(value)


__all__ = ["format_report"]
