"""Log-log plot of step time against vocabulary size, one line per mechanism.

    python -m benchmarks.plot_step_time benchmarks/step_time.json benchmarks/step_time.png

Rows that were not measured are left out of their line (never drawn as an estimate).
"""

from __future__ import annotations

import json
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


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m benchmarks.plot_step_time STEP_TIME.json OUT.png", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as handle:
        document = json.load(handle)
    settings, info = document.get("settings", {}), document.get("machine", {})
    ids = f"Zipf a={settings['zipf']:g}" if settings.get("zipf") else "uniform ids"
    title = (
        f"Step time, dim {settings.get('dim')}, batch {settings.get('batch')}, {ids} — "
        f"{info.get('nproc')} cores, {str(info.get('date_utc', ''))[:10]}"
    )
    plot_step_time(document["results"], argv[1], title=title)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
