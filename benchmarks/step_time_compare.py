"""`step_time --front-end both`: the Keras 3 DP step against the tf-keras DP step on the same model.

For every (vocabulary, mechanism) measured under both front ends: the two
median steps, Keras 3 ÷ tf-keras (the median over repeats of each repeat's
ratio: of the two front ends' steps alternated in one process with
`--pairing steps`, of two back-to-back processes with `--pairing processes`;
wall and CPU time), the same ratio for the plain step timed beside each DP
step on its own model (the DPEmbedding model), each front end's DP ÷
non-private ratio (same process), and each front end's peak RSS.
Issue 29's target: Keras 3 within 1.1× of tf-keras. No TensorFlow import here.
"""

from __future__ import annotations

import statistics

TARGET = 1.1
PAIRING = {
    "steps": "both front ends in one process, their steps alternated",
    "processes": "two back-to-back processes",
}


def _per_process(row: dict, key: str) -> list:
    """A row's per-process values of `key` in repeat order (one value when the row is one process)."""
    return row.get(f"{key}_runs") or [row.get(key)]


def _paired_ratio(keras3: dict, keras2: dict, key: str):
    """(median over repeats of keras3 / keras2 of `key`, the per-repeat ratios); None where unmeasured."""
    pairs = zip(_per_process(keras3, key), _per_process(keras2, key))
    ratios = [a / b for a, b in pairs if a and b]
    return (float(statistics.median(ratios)) if ratios else None), ratios


def compare_entry(keras2: dict, keras3: dict) -> dict:
    """One mechanism and vocabulary under both front ends (see the module docstring)."""
    wall, wall_runs = _paired_ratio(keras3, keras2, "median_step_s")
    cpu, _ = _paired_ratio(keras3, keras2, "cpu_median_step_s")
    base = "median_step_s" if keras2["mechanism"] == "none" else "none_in_process_median_s"
    plain, _ = _paired_ratio(keras3, keras2, base)
    return {
        "mechanism": keras2["mechanism"],
        "vocab": keras2["vocab"],
        "keras2_median_step_s": keras2.get("median_step_s"),
        "keras3_median_step_s": keras3.get("median_step_s"),
        "keras3_over_keras2": wall,
        "keras3_over_keras2_runs": wall_runs,
        "keras3_over_keras2_cpu": cpu,
        "plain_keras3_over_keras2": plain,
        "keras2_plain_step_s": keras2.get(base),
        "keras3_plain_step_s": keras3.get(base),
        "keras2_ratio_to_none": keras2.get("ratio_to_none"),
        "keras3_ratio_to_none": keras3.get("ratio_to_none"),
        "keras2_peak_rss_mb": keras2.get("peak_rss_mb"),
        "keras3_peak_rss_mb": keras3.get("peak_rss_mb"),
        "within_target": None if wall is None else wall <= TARGET,
        "keras3_not_measured": keras3.get("not_measured"),
    }


def front_end_comparison(rows: list) -> list:
    """`compare_entry` for every (vocab, mechanism) with a tf-keras and a Keras 3 row, in tf-keras row order."""
    keras3 = {(r["vocab"], r["mechanism"]): r for r in rows if r.get("front_end") == "keras3"}
    return [
        compare_entry(r, keras3[(r["vocab"], r["mechanism"])])
        for r in rows
        if r.get("front_end", "keras2") == "keras2" and (r["vocab"], r["mechanism"]) in keras3
    ]


def _times(value) -> str:
    return "—" if value is None else f"{value:.2f}×"


def _ms(seconds) -> str:
    return "not measured" if seconds is None else f"{seconds * 1e3:.2f} ms"


def _gb(mb) -> str:
    return "—" if not mb else f"{mb / 1024:.2f} GB"


def comparison_table(entries: list) -> str:
    """Markdown: one line per mechanism and vocabulary (not measured under Keras 3: the reason)."""
    lines = [
        "| mechanism | vocab | tf-keras step | Keras 3 step | Keras 3 ÷ tf-keras (per repeat) | same, CPU time | "
        "plain step, Keras 3 ÷ tf-keras | DP ÷ non-private, tf-keras | DP ÷ non-private, Keras 3 | "
        "peak RSS tf-keras | peak RSS Keras 3 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for e in entries:
        runs = ", ".join(f"{r:.2f}" for r in e["keras3_over_keras2_runs"])
        ratio = _times(e["keras3_over_keras2"]) + (f" ({runs})" if len(e["keras3_over_keras2_runs"]) > 1 else "")
        if e["keras3_over_keras2"] is None and e.get("keras3_not_measured"):
            ratio = f"not measured: {e['keras3_not_measured']}".replace("|", "/")[:160]
        lines.append(
            f"| {e['mechanism']} | {e['vocab']:,} | {_ms(e['keras2_median_step_s'])} | "
            f"{_ms(e['keras3_median_step_s'])} | {ratio} | {_times(e['keras3_over_keras2_cpu'])} | "
            f"{_times(e['plain_keras3_over_keras2'])} | {_times(e['keras2_ratio_to_none'])} | "
            f"{_times(e['keras3_ratio_to_none'])} | {_gb(e['keras2_peak_rss_mb'])} | {_gb(e['keras3_peak_rss_mb'])} |"
        )
    return "\n".join(lines)


def comparison_lines(entries: list, *, pairing: str = "steps") -> list[str]:
    """The RESULTS section's paragraph and table (empty without entries)."""
    if not entries:
        return []
    over = [f"{e['mechanism']} ({_times(e['keras3_over_keras2'])})" for e in entries if e["within_target"] is False]
    verdict = (
        f"Over the {TARGET:g}× target: {', '.join(over)}." if over else f"Every measured mechanism within {TARGET:g}×."
    )
    return [
        "Keras 3 vs tf-keras, same model (Keras 3 ÷ tf-keras: median over repeats of each repeat's ratio, "
        + PAIRING[pairing]
        + "; the plain step is the one timed beside each DP step on the same "
        "DPEmbedding model, except for `none`, which is keras.layers.Embedding's plain step; DP ÷ non-private "
        f"is each front end's same-process ratio). {verdict}",
        "",
        comparison_table(entries),
        "",
    ]


__all__ = ["TARGET", "compare_entry", "comparison_lines", "comparison_table", "front_end_comparison"]
