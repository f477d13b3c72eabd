"""Plots of step_time JSON files: step time, or DP / non-private ratio, against vocabulary size.

    python -m benchmarks.plot_step_time RUN.json [OUT.png]
    python -m benchmarks.plot_step_time --ratios OUT.png RUN.json[:mechanism,...] [RUN2.json[:...] ...]

The first form redraws one run's log-log plot of step time (OUT defaults to
the JSON's path with `.png`: the plot beside its data, never another run's
file). The second draws "× none (same process)" per mechanism and vocabulary
from one or more runs, each file contributing the mechanisms listed after
its colon (all of them when none are listed); every point is labelled with
its run's date. Rows that were not measured are left out of their line
(never drawn as an estimate).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

_STYLE = {
    "none": dict(color="black", linestyle="-", marker="o"),
    "dpmodel_none": dict(color="gray", linestyle="--", marker="o"),
    "dense": dict(color="tab:red", linestyle="-", marker="s"),
    "tfp_keras_sgd": dict(color="tab:brown", linestyle="-", marker="D"),
    "eana": dict(color="tab:blue", linestyle="-", marker="^"),
    "lazy": dict(color="tab:orange", linestyle="-", marker="v"),
    "fest": dict(color="tab:green", linestyle="-", marker="<"),
    "adafest": dict(color="tab:purple", linestyle="-", marker=">"),
    "adafest+": dict(color="tab:pink", linestyle="-", marker="P"),
}
_OTHER_COLORS = ("tab:olive", "tab:cyan", "tab:gray", "gold", "navy")


def plot_step_time(rows: list, path: str, *, title: str = "Step time") -> None:
    """Writes the PNG at `path` from result rows (dicts with mechanism, vocab, median/p10/p90_step_s)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    mechanisms = list(dict.fromkeys(r["mechanism"] for r in rows))
    for name in mechanisms:
        points = sorted(
            (r["vocab"], r["median_step_s"], r.get("p10_step_s"), r.get("p90_step_s"))
            for r in rows
            if r["mechanism"] == name and r.get("median_step_s")
        )
        if not points:
            continue
        x = [p[0] for p in points]
        y = [p[1] for p in points]
        low = [max(0.0, p[1] - (p[2] or p[1])) for p in points]
        high = [max(0.0, (p[3] or p[1]) - p[1]) for p in points]
        style = _STYLE.get(name) or dict(
            color=_OTHER_COLORS[mechanisms.index(name) % len(_OTHER_COLORS)], marker="x", linestyle=":"
        )
        ax.errorbar(x, y, yerr=[low, high], label=name, capsize=3, linewidth=1.5, **style)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("vocabulary size (rows)")
    ax.set_ylabel("median step time (s); bars: p10–p90")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", ncol=2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_ratios(series: list, path: str, *, title: str) -> None:
    """Writes the PNG at `path`: one line per (mechanism, run) of "× none (same process)" against vocabulary.

    Args:
      series: (label, [(vocab, ratio), ...]) pairs; the y axis is logarithmic when the ratios span over 20x.
      path: the PNG to write.
      title: the figure title.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    ratios = [r for _, points in series for _, r in points]
    seen = set()
    for index, (label, points) in enumerate(series):
        name = label.split(" ")[0]
        style = dict(_STYLE.get(name) or dict(color=_OTHER_COLORS[index % len(_OTHER_COLORS)], marker="x"))
        style["linestyle"] = ":" if name in seen else style.get("linestyle", "-")  # a second run of one mechanism
        seen.add(name)
        x, y = zip(*sorted(points))
        ax.plot(x, y, label=label, linewidth=1.5, **style)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    if ratios and max(ratios) / max(min(ratios), 1e-9) > 20:
        ax.set_yscale("log")
    ax.set_xlabel("vocabulary size (rows)")
    ax.set_ylabel("median DP step ÷ non-private step (same process)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", ncol=2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def ratio_series(specs: list[str]) -> list:
    """'RUN.json:lazy,fest' specs -> [('lazy (2026-11-21T17:29Z)', [(vocab, ratio), ...]), ...]."""
    series = []
    for spec in specs:
        path, _, names = spec.rpartition(":") if ".json:" in spec else (spec, "", "")
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
        rows = [r for r in document["results"] if r.get("ratio_to_none") and r["mechanism"] != "none"]
        wanted = [n for n in names.split(",") if n] or list(dict.fromkeys(r["mechanism"] for r in rows))
        date = str(document.get("machine", {}).get("date_utc", ""))[:16] + "Z"
        for name in wanted:
            points = [(r["vocab"], r["ratio_to_none"]) for r in rows if r["mechanism"] == name]
            if points:
                series.append((f"{name} ({date})", points))
    return series


def _title(document: dict) -> str:
    settings, info = document.get("settings", {}), document.get("machine", {})
    ids = f"Zipf a={settings['zipf']:g}" if settings.get("zipf") else "uniform ids"
    return (
        f"Step time, dim {settings.get('dim')}, batch {settings.get('batch')}, {ids} — "
        f"{info.get('nproc')} cores, {str(info.get('date_utc', ''))[:10]}"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plot_step_time", description=__doc__.splitlines()[0])
    parser.add_argument("--ratios", metavar="OUT.png", help="draw × none (same process) of the runs given")
    parser.add_argument("--title", default="DP step ÷ non-private step, same process")
    parser.add_argument("inputs", nargs="+", help="RUN.json [OUT.png], or with --ratios RUN.json[:mechanism,...] ...")
    args = parser.parse_args(argv)
    if args.ratios:
        plot_ratios(ratio_series(args.inputs), args.ratios, title=args.title)
        return 0
    if len(args.inputs) > 2:
        parser.error(f"expected RUN.json [OUT.png]; received {len(args.inputs)} paths")
    source = args.inputs[0]
    out = args.inputs[1] if len(args.inputs) == 2 else os.path.splitext(source)[0] + ".png"
    with open(source, encoding="utf-8") as handle:
        document = json.load(handle)
    plot_step_time(document["results"], out, title=_title(document))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
