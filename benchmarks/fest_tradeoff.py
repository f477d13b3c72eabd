"""DP-FEST Figure 3 on synthetic Criteo at Table 3's vocabulary sizes: best gradient-size reduction vs allowed AUC loss.

    python -m benchmarks.fest_tradeoff --grid small --rows 20000 --eval-rows 5000      # quick look
    nice -n 10 python -m benchmarks.fest_tradeoff --grid full --rows 1000000 --eval-rows 100000 \\
        --work /tmp/fest_tradeoff --results-md benchmarks/RESULTS.md
    python -m benchmarks.fest_tradeoff --real ../shared/data/criteo --grid small      # direction only

Data: the synthetic Criteo generator (`tfdp_embed.data.criteo`) at DP-FEST
Table 3's full vocabularies (338,782 rows over 26 tables), `--rows` training
rows of one day and `--eval-rows` of the following day (daily drift 0.05),
written once under `--work`. `--real DIR` uses DIR/train.tsv and DIR/dev.tsv
(the 7,200-row Kaggle sample, with `benchmarks.criteo_realdata`'s settings
for that size); its rows are labelled "direction only".

Runs (each `pipelines.criteo` in this process, one after the other, its
report.json kept under `--work`, so an interrupted grid resumes): per epsilon
(delta = 1/N), LazyDP (exact: its model is dense DP-SGD's, its gradient is
dense-equivalent, reduction 1), DP-FEST over k (`--top-fraction` of every
table), DP-AdaFEST over sigma1/sigma2 x tau, DP-AdaFEST+ over tau x k. Model:
DP-FEST App. D.1 (embedding widths int(2 V^0.25), 4 x 598 ReLU, batch 2,048).

Curve (Figure 3): for each allowed AUC loss L, the largest gradient-size
reduction of a mechanism's runs with AUC >= AUC(LazyDP) - L. The table's
"best" rows at L = 0.005 and 0.01 are chosen privately with
`tfdp_embed.select_privately` (Papernot & Steinke 2022: a geometric number
of runs, mean = the grid's size, candidates drawn uniformly; score = log10
reduction when the AUC loss is within L, else -1), with the grid's one run
per setting standing in for every draw of it; the search's epsilon is stated.

References: DP-FEST (Ghazi et al., NeurIPS 2023) §4.2, Figure 3, App. D.1,
Table 3; Papernot & Steinke, ICLR 2022.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import time

import numpy as np

from benchmarks import outputs
from benchmarks.machine import machine_info

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOSSES = (0.0, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05)
REPORTED_LOSSES = (0.005, 0.01)
GRIDS = {  # mechanism -> list of extra flags, per grid size
    "small": {
        "lazy": [()],
        "fest": [("--top-fraction", f) for f in ("0.1", "0.01")],
        "adafest": [("--adafest-ratio", r, "--adafest-threshold", t) for r in ("1", "10") for t in ("1", "10")],
        "adafest+": [("--adafest-ratio", "5", "--adafest-threshold", t, "--top-fraction", "0.1") for t in ("1", "10")],
    },
    "full": {
        "lazy": [()],
        "fest": [("--top-fraction", f) for f in ("0.3", "0.1", "0.03", "0.01", "0.003", "0.001")],
        "adafest": [
            ("--adafest-ratio", r, "--adafest-threshold", t)
            for r in ("1", "5", "10")
            for t in ("0.5", "1", "5", "10", "20", "50", "100")
        ],
        "adafest+": [
            ("--adafest-ratio", "5", "--adafest-threshold", t, "--top-fraction", f)
            for t in ("1", "10", "50")
            for f in ("0.3", "0.1")
        ],
    },
}
SYNTHETIC_SETTINGS = ["--batch", "2048", "--epochs", "1", "--accountant", "pld", "--verbose", "0"]
REAL_SETTINGS = [
    "--hash-size", "1000", "--hidden-units", "64,32", "--batch", "512", "--epochs", "5",
    "--learning-rate", "0.3", "--momentum", "0.9", "--accountant", "pld", "--verbose", "0",
]  # fmt: skip


def schedule(grid: str, epsilons) -> list[tuple]:
    """(epsilon, mechanism, flags) in run order: the small grid first (LazyDP first per epsilon), then the rest."""
    order = []
    for name in ("small", grid) if grid != "small" else ("small",):
        for eps in epsilons:
            for mech, settings in GRIDS[name].items():
                order += [(eps, mech, flags) for flags in settings if (eps, mech, flags) not in order]
    return order


def synthetic_files(work: str, rows: int, eval_rows: int, seed: int) -> tuple[list, list]:
    """Writes (once) one training day and the following evaluation day at Table 3's full vocabularies."""
    from pipelines.criteo import data as criteo_data

    directory = os.path.join(work, f"data_r{rows}_e{eval_rows}_s{seed}")
    done = os.path.join(directory, "files.json")
    if os.path.exists(done):
        with open(done) as f:
            files = json.load(f)
        return files["train"], files["eval"]
    spec = criteo_data.SyntheticSpec(train_rows=rows, eval_rows=eval_rows, vocab_scale=1.0, seed=seed)
    train, evaluation = criteo_data.write_default_data(directory, spec)
    with open(done, "w") as f:
        json.dump({"train": train, "eval": evaluation}, f)
    return train, evaluation


def run_one(a, train, evaluation, mechanism: str, epsilon: float, flags: tuple) -> dict | None:
    """One pipeline run (skipped when its report exists); its summary row, or None if it failed."""
    from pipelines import criteo

    tag = "_".join(x.strip("-") for x in flags)
    out = os.path.join(a.work, f"{a.label}_{mechanism}_eps{epsilon:g}{'_' + tag if tag else ''}_s{a.seed}")
    path = os.path.join(out, "report.json")
    if not os.path.exists(path):
        argv = [
            "--train", *train, "--eval", *evaluation, "--mechanism", mechanism, "--epsilon", f"{epsilon:g}",
            "--seed", str(a.seed), "--out", out, *(REAL_SETTINGS if a.real else SYNTHETIC_SETTINGS), *flags,
        ]  # fmt: skip
        print(f"[fest_tradeoff] {mechanism} eps={epsilon:g} {' '.join(flags)}", flush=True)
        started = time.perf_counter()
        try:
            criteo.run(criteo.parse_args(argv))
        except (
            ValueError,
            RuntimeError,
            OSError,
            ArithmeticError,
        ) as err:  # a failed setting is listed as missing, never filled in
            print(f"[fest_tradeoff]   failed: {type(err).__name__}: {err}", flush=True)
            return None
        print(f"[fest_tradeoff]   done in {time.perf_counter() - started:.0f} s", flush=True)
    with open(path) as f:
        report = json.load(f)
    reduction = 1.0 if mechanism == "lazy" else report.get("gradient_size_reduction")
    return {
        "mechanism": mechanism, "epsilon_target": epsilon, "flags": list(flags), "auc": report["auc"],
        "epsilon": report["epsilon"], "delta": report["delta"], "noise_multiplier": report["noise_multiplier"],
        "gradient_size_reduction": reduction, "steps": report["steps"], "median_step_s": report.get("median_step_s"),
        "ledger": report.get("ledger"),
    }  # fmt: skip


def best_reduction(rows: list, baseline_auc: float, loss: float) -> dict | None:
    """The run with the largest reduction among those with AUC >= baseline - loss (non-private pick, the curve)."""
    ok = [r for r in rows if r["gradient_size_reduction"] and r["auc"] >= baseline_auc - loss]
    return max(ok, key=lambda r: r["gradient_size_reduction"]) if ok else None


def private_pick(rows: list, baseline_auc: float, loss: float, *, delta: float, seed: int) -> dict:
    """`select_privately` over one mechanism's grid: which setting it releases and what the search costs."""
    from tfdp_embed import select_privately
    from tfdp_embed.accounting.ledger import PrivacyLedger

    def event_of(row):
        return PrivacyLedger.from_json(json.dumps(row["ledger"])).as_event()

    def train(row):
        feasible = row["gradient_size_reduction"] and row["auc"] >= baseline_auc - loss
        return row, math.log10(row["gradient_size_reduction"]) if feasible else -1.0

    event = dominating_event([event_of(row) for row in rows])
    result = select_privately(rows, train, run_event=event, mean_runs=float(len(rows)), target_delta=delta, rng=seed)
    chosen = result.model
    return {
        "flags": None if chosen is None else chosen["flags"],
        "auc": None if chosen is None else chosen["auc"],
        "reduction": None if chosen is None or result.score < 0 else chosen["gradient_size_reduction"],
        "runs": result.runs,
        "search_epsilon": result.epsilon,
        "run_epsilon_rdp": _rdp_epsilon(event, delta),
    }


def dominating_event(events: list):
    """The event whose RDP is at least every other's at every order (each run is then no costlier).

    A run drawn uniformly from candidates is a mixture; its Renyi divergence is at most the largest of
    theirs (quasi-convexity), so the dominating event bounds every draw. DP-FEST's selection event depends
    on k, so its candidates differ; none dominating all is refused.
    """
    import dp_accounting

    def curve(event):
        accountant = dp_accounting.rdp.RdpAccountant()
        accountant.compose(event)
        return np.asarray(accountant._rdp)  # noqa: SLF001 (the per-order RDP; no public accessor)

    curves = [curve(e) for e in events]
    top = int(np.argmax([c.sum() for c in curves]))
    if any(np.any(c > curves[top] * (1 + 1e-12)) for c in curves):
        raise ValueError("No candidate's event dominates the others' at every RDP order; cannot bound the search.")
    return events[top]


def _rdp_epsilon(event, delta: float) -> float:
    from tfdp_embed.accounting import compute_epsilon

    return compute_epsilon(event, target_delta=delta, accountant="rdp")


def summarize(a, rows: list) -> dict:
    out = {"curves": {}, "picks": [], "baseline": {}}
    for eps in a.epsilons:
        here = [r for r in rows if r["epsilon_target"] == eps]
        lazy = [r for r in here if r["mechanism"] == "lazy"]
        if not lazy:
            continue
        base = lazy[0]["auc"]
        out["baseline"][f"{eps:g}"] = base
        for mech in ("fest", "adafest", "adafest+"):
            grid = [r for r in here if r["mechanism"] == mech and r["gradient_size_reduction"]]
            if not grid:
                continue
            curve = [(loss, (best_reduction(grid, base, loss) or {}).get("gradient_size_reduction")) for loss in LOSSES]
            out["curves"][f"{mech} eps={eps:g}"] = curve
            for loss in REPORTED_LOSSES:
                best = best_reduction(grid, base, loss)
                pick = private_pick(grid, base, loss, delta=grid[0]["delta"], seed=a.seed)
                out["picks"].append({"mechanism": mech, "epsilon": eps, "loss": loss, "lazy_auc": base,
                                     "grid_size": len(grid), "best": best and _short(best), "private": pick})  # fmt: skip
    return out


def _short(row: dict) -> dict:
    return {k: row[k] for k in ("flags", "auc", "gradient_size_reduction")}


def plot(a, summary: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(a.epsilons), figsize=(5 * len(a.epsilons), 3.8), squeeze=False)
    colors = {"fest": "tab:blue", "adafest": "tab:red", "adafest+": "tab:green"}
    for ax, eps in zip(axes[0], a.epsilons):
        for mech, color in colors.items():
            curve = summary["curves"].get(f"{mech} eps={eps:g}")
            if curve:
                xs = [loss for loss, red in curve if red]
                ax.plot(xs, [red for _, red in curve if red], "o-", color=color, label=mech)
        ax.set_xscale("symlog", linthresh=1e-3)
        ax.set_yscale("log")
        ax.set_xlabel("allowed AUC loss vs LazyDP (= dense DP-SGD)")
        ax.set_ylabel("best gradient-size reduction (x)")
        ax.set_title(f"{a.label}, eps = {eps:g}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown(a, rows: list, summary: dict, missing: list, info: dict, command: str) -> str:
    title = (
        "real 7,200-row Criteo sample, DIRECTION ONLY"
        if a.real
        else f"synthetic Criteo, Table 3 vocabularies, {a.rows:,} rows"
    )
    lines = [
        "", f"## fest_tradeoff: DP-FEST Figure 3 ({title})", "",
        f"Date: {info['date_utc']}. Command: `{command}`. Commit: {info.get('git', {}).get('commit', '?')}.",
        f"Machine: {info['nproc']} cores ({info['cpu_model']}), load at start {info['load_average_at_start']} "
        "(shared with other jobs).", "",
        "| eps | mechanism | settings | AUC | AUC loss vs LazyDP | gradient-size reduction | eps spent |",
        "|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in rows:
        base = summary["baseline"].get(f"{r['epsilon_target']:g}")
        loss = "-" if base is None else f"{base - r['auc']:+.4f}"
        red = "n/a" if r["gradient_size_reduction"] is None else f"{r['gradient_size_reduction']:.3g}"
        lines.append(f"| {r['epsilon_target']:g} | {r['mechanism']} | {' '.join(r['flags']) or 'default'} "
                     f"| {r['auc']:.4f} | {loss} | {red} | {r['epsilon']:.3f} |")  # fmt: skip
    lines += ["", "Best reduction within an allowed AUC loss (grid max = the curve; private = `select_privately`):", "",
              "| eps | mechanism | loss <= | grid best (settings, AUC, reduction) | private pick (settings, AUC, reduction) "
              "| runs drawn | search eps (RDP) | one run eps (RDP) |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for p in summary["picks"]:
        best = p["best"]
        grid = "none within the loss" if not best else (
            f"{' '.join(best['flags'])}, {best['auc']:.4f}, {best['gradient_size_reduction']:.3g}")  # fmt: skip
        q = p["private"]
        pick = (
            "nothing within the loss"
            if q["reduction"] is None
            else f"{' '.join(q['flags'])}, {q['auc']:.4f}, {q['reduction']:.3g}"
        )
        lines.append(f"| {p['epsilon']:g} | {p['mechanism']} | {p['loss']} | {grid} | {pick} | {q['runs']} "
                     f"| {q['search_epsilon']:.2f} | {q['run_epsilon_rdp']:.2f} |")  # fmt: skip
    if missing:
        lines += ["", f"Did not run or failed (not estimated): {'; '.join(missing)}."]
    return "\n".join(lines + [""])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fest_tradeoff", description=__doc__.split("\n")[0])
    p.add_argument("--grid", choices=tuple(GRIDS), default="small")
    p.add_argument("--epsilons", type=lambda s: [float(x) for x in s.split(",")], default=[1.0, 3.0])
    p.add_argument("--rows", type=int, default=20_000, help="synthetic training rows (the issue asks >= 1e6)")
    p.add_argument("--eval-rows", type=int, default=5_000, help="synthetic rows of the following day")
    p.add_argument("--real", help="directory with train.tsv and dev.tsv (the 7,200-row sample): direction only")
    p.add_argument("--work", default="/tmp/fest_tradeoff")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--summarize", action="store_true", help="only rebuild the table from finished runs")
    p.add_argument("--results-md", default="", help="append the section to this RESULTS.md ('' to skip)")
    p.add_argument("--json", default=outputs.AUTO)
    p.add_argument("--png", default=outputs.AUTO)
    a = p.parse_args(argv)
    a.label = "real" if a.real else f"synthetic{a.rows}"
    tag = f"{a.label}-{a.grid}-eps{'-'.join(f'{e:g}' for e in a.epsilons)}"
    outputs.resolve(p, a, benchmark="fest_tradeoff", tag=tag, files={"json": ".json", "png": ".png"})
    os.makedirs(a.work, exist_ok=True)
    info = machine_info(ROOT)
    if a.real:
        train, evaluation = [os.path.join(a.real, "train.tsv")], [os.path.join(a.real, "dev.tsv")]
    else:
        train, evaluation = synthetic_files(a.work, a.rows, a.eval_rows, a.seed)
    rows, missing = [], []
    for eps, mech, flags in schedule(a.grid, a.epsilons):
        row = run_one(a, train, evaluation, mech, eps, flags) if not a.summarize else _load(a, mech, eps, flags)
        (rows.append(row) if row else missing.append(f"{mech} eps={eps:g} {' '.join(flags)}".strip()))
    summary = summarize(a, rows)
    command = "python -m benchmarks.fest_tradeoff " + shlex.join(argv if argv is not None else sys.argv[1:])
    text = markdown(a, rows, summary, missing, info, command)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            slim = [{k: v for k, v in r.items() if k != "ledger"} for r in rows]
            json.dump({"command": command, "machine": info, "rows": slim, "missing": missing, **summary}, f, indent=1,
                      default=str)  # fmt: skip
    if a.png:
        plot(a, summary, a.png)
    if a.results_md:
        outputs.append_section(a.results_md, text, files=(a.json, a.png))
    return 0


def _load(a, mechanism, epsilon, flags) -> dict | None:
    tag = "_".join(x.strip("-") for x in flags)
    out = os.path.join(a.work, f"{a.label}_{mechanism}_eps{epsilon:g}{'_' + tag if tag else ''}_s{a.seed}")
    if not os.path.exists(os.path.join(out, "report.json")):
        return None
    return run_one(a, None, None, mechanism, epsilon, flags)


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
