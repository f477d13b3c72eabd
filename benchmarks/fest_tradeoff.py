"""DP-FEST Figure 3 on synthetic Criteo at Table 3's vocabulary sizes: best gradient-size reduction vs allowed AUC loss.

    python -m benchmarks.fest_tradeoff --grid small --rows 20000 --eval-rows 5000      # quick look
    nice -n 10 python -m benchmarks.fest_tradeoff --grid issue --rows 1000000 --eval-rows 100000 \\
        --work /tmp/fest_tradeoff --results-md benchmarks/RESULTS.md                     # 20 runs, ~80 min
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
table), DP-AdaFEST over sigma1/sigma2 x tau, DP-AdaFEST+ over tau x k. Grids:
`small` (a look), `issue` (what issue 20 names, sized for about 90 min on one
core at 10^6 rows; the run count and expected time are printed first), `full`
(App. D.1's whole tau range). Model: DP-FEST App. D.1 (embedding widths
int(2 V^0.25), 4 x 598 ReLU, batch 2,048).

Like with like: every mechanism runs the same model and optimizer (clip 1,
legacy SGD, learning rate 1.0, momentum 0.9, pinned here rather than left to
the pipeline's data-scaled defaults), and a kept report run with other
settings is refused (`check_kept`). LazyDP is dense momentum SGD exactly;
DP-FEST sends every selected row every step, so its momentum is dense on the
selected subspace; DP-AdaFEST sends only the surviving rows, so the legacy
optimizer's sparse momentum skips the others (the paper's Algorithm 1 is
plain SGD). What each sparse mechanism pays besides sparsity is its own
privacy split: DP-AdaFEST's gradient noise is sigma2 = sigma sqrt(1 +
(sigma2/sigma1)^2), sqrt(2) sigma at ratio 1, on every variable; DP-FEST's
pure-DP top-k adds Gumbel noise of scale k_f / eps_f per table, which at
these vocabularies exceeds most counts, and `--top-fraction` alone keeps
max(1, fraction x V_f) rows of every table, so a 3-row table keeps one. The
`issue` grid adds `--top-min-rows 1000` (tables of up to 1,000 rows kept
whole, as the paper's top-k over all tables' buckets would keep these
frequent rows). `benchmarks/archive/RESULTS-2026-11-26.md` ("why every sparse run lost") has the diagnostic runs.

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
    # What issue 20 names, sized for about 90 min on one core at 10^6 rows (~4 min a run):
    # per epsilon LazyDP, dense DP-SGD, DP-FEST at 2 k, DP-AdaFEST at sigma1/sigma2 in {1, 5, 10} x 2 tau, DP-AdaFEST+.
    "issue": {
        "lazy": [()],
        "dense": [()],  # dense DP-SGD itself: LazyDP must match its AUC (exact, same noise in distribution)
        "fest": [("--top-fraction", f, "--top-min-rows", "1000") for f in ("0.1", "0.01")],
        "adafest": [("--adafest-ratio", r, "--adafest-threshold", t) for r in ("1", "5", "10") for t in ("10", "50")],
        "adafest+": [
            ("--adafest-ratio", "10", "--adafest-threshold", "10", "--top-fraction", "0.1", "--top-min-rows", "1000")
        ],
    },
}
MINUTES_PER_RUN_AT_1E6 = 4.0  # one run at 10^6 rows (488 steps) on one shared core; scales with the rows
# Every model and optimizer setting is pinned (the pipeline's data-scaled defaults would change with --rows; its
# vocabulary cap, from a row estimate, falls to 10^4 just under 10^6 rows): Table 3 uncapped, App. D.1's tower,
# clip 1, SGD 1.0 with momentum 0.9, the same for every mechanism (see the docstring).
SYNTHETIC_SETTINGS = [
    "--vocabulary", "table3", "--hidden-units", "598,598,598,598", "--clip", "1", "--learning-rate", "1.0", "--momentum", "0.9",
    "--batch", "2048", "--epochs", "1", "--accountant", "pld", "--verbose", "0",
]  # fmt: skip
REAL_SETTINGS = [
    "--hash-size", "1000", "--hidden-units", "64,32", "--clip", "1", "--batch", "512", "--epochs", "5",
    "--learning-rate", "0.3", "--momentum", "0.9", "--accountant", "pld", "--verbose", "0",
]  # fmt: skip


def schedule(grid: str, epsilons) -> list[tuple]:
    """(epsilon, mechanism, flags) in run order, LazyDP first per epsilon; `full` runs the small grid first."""
    order = []
    for name in ("small", grid) if grid == "full" else (grid,):
        for eps in epsilons:
            for mech, settings in GRIDS[name].items():
                order += [(eps, mech, flags) for flags in settings if (eps, mech, flags) not in order]
    return order


def expected_minutes(runs: int, rows: int) -> float:
    """Rough wall time of `runs` pipeline runs at `rows` training rows (one shared core; steps scale with rows)."""
    return runs * MINUTES_PER_RUN_AT_1E6 * max(rows, 1) / 1e6


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

    out = _run_dir(a, mechanism, epsilon, flags)
    path = os.path.join(out, "report.json")
    if not os.path.exists(path):
        argv = [
            "--train",
            *train,
            "--eval",
            *evaluation,
            "--mechanism",
            mechanism,
            "--epsilon",
            f"{epsilon:g}",
            "--seed",
            str(a.seed),
            "--out",
            out,
            *(REAL_SETTINGS if a.real else SYNTHETIC_SETTINGS),
            *flags,
        ]
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
    check_kept(report, REAL_SETTINGS if a.real else SYNTHETIC_SETTINGS, path)
    reduction = 1.0 if mechanism in ("lazy", "dense") else report.get("gradient_size_reduction")
    return {
        "mechanism": mechanism,
        "epsilon_target": epsilon,
        "flags": list(flags),
        "auc": report["auc"],
        "epsilon": report["epsilon"],
        "delta": report["delta"],
        "noise_multiplier": report["noise_multiplier"],
        "gradient_size_reduction": reduction,
        "steps": report["steps"],
        "median_step_s": report.get("median_step_s"),
        "ledger": report.get("ledger"),
    }


def check_kept(report: dict, settings: list, path: str) -> None:
    """Refuses a kept report run with other model or optimizer settings than `settings` (a `--work` of an older grid).

    Raises:
      ValueError: naming the report, the setting, what it ran with and what the grid runs now.
    """
    from tfdp_embed.data.criteo import CRITEO_VOCAB_SIZES

    wanted = dict(zip(settings[::2], settings[1::2]))
    training, model = report.get("training", {}), report.get("model", {})
    if wanted.get("--vocabulary") == "table3" and model.get("vocab_sizes") != list(CRITEO_VOCAB_SIZES.values()):
        raise ValueError(
            f"{path} was run with vocabularies {model.get('vocab_sizes')}, not DP-FEST Table 3's "
            f"{list(CRITEO_VOCAB_SIZES.values())}. Use another --work (or remove that run)."
        )
    kept = {
        "--momentum": training.get("momentum"),
        "--learning-rate": training.get("learning_rate"),
        "--clip": report.get("l2_norm_clip"),
        "--hidden-units": ",".join(str(u) for u in model.get("hidden_units", ())),
    }
    for flag, value in kept.items():
        if flag not in wanted or value is None:
            continue
        same = value == wanted[flag] if flag == "--hidden-units" else float(value) == float(wanted[flag])
        if not same:
            raise ValueError(
                f"{path} was run with {flag} {value}; this grid runs {flag} {wanted[flag]}. "
                "Use another --work (or remove that run) so that every row of the table has the same settings."
            )


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
                out["picks"].append(
                    {
                        "mechanism": mech,
                        "epsilon": eps,
                        "loss": loss,
                        "lazy_auc": base,
                        "grid_size": len(grid),
                        "best": best and _short(best),
                        "private": pick,
                    }
                )
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
        "",
        f"## fest_tradeoff: DP-FEST Figure 3 ({title})",
        "",
        f"Date: {info['date_utc']}. Command: `{command}`. Commit: {info.get('git', {}).get('commit', '?')}.",
        f"Machine: {info['nproc']} cores ({info['cpu_model']}), load at start {info['load_average_at_start']} "
        "(shared with other jobs).",
        "",
        "| eps | mechanism | settings | AUC | AUC loss vs LazyDP | gradient-size reduction | eps spent |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        base = summary["baseline"].get(f"{r['epsilon_target']:g}")
        loss = "-" if base is None else f"{base - r['auc']:+.4f}"
        red = "n/a" if r["gradient_size_reduction"] is None else f"{r['gradient_size_reduction']:.3g}"
        lines.append(
            f"| {r['epsilon_target']:g} | {r['mechanism']} | {' '.join(r['flags']) or 'default'} "
            f"| {r['auc']:.4f} | {loss} | {red} | {r['epsilon']:.3f} |"
        )
    lines += [
        "",
        "Best reduction within an allowed AUC loss (grid max = the curve; private = `select_privately`):",
        "",
        "| eps | mechanism | loss <= | grid best (settings, AUC, reduction) | private pick (settings, AUC, reduction) "
        "| runs drawn | search eps (RDP) | one run eps (RDP) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in summary["picks"]:
        best = p["best"]
        grid = (
            "none within the loss"
            if not best
            else (f"{' '.join(best['flags'])}, {best['auc']:.4f}, {best['gradient_size_reduction']:.3g}")
        )
        q = p["private"]
        pick = (
            "nothing within the loss"
            if q["reduction"] is None
            else f"{' '.join(q['flags'])}, {q['auc']:.4f}, {q['reduction']:.3g}"
        )
        lines.append(
            f"| {p['epsilon']:g} | {p['mechanism']} | {p['loss']} | {grid} | {pick} | {q['runs']} "
            f"| {q['search_epsilon']:.2f} | {q['run_epsilon_rdp']:.2f} |"
        )
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
    order = schedule(a.grid, a.epsilons)
    if not a.summarize:
        todo = sum(not os.path.exists(os.path.join(_run_dir(a, m, e, f), "report.json")) for e, m, f in order)
        minutes = expected_minutes(todo, 7_200 if a.real else a.rows)
        print(
            f"[fest_tradeoff] grid {a.grid}: {len(order)} runs, {todo} to do, about {minutes:.0f} min "
            f"(~{MINUTES_PER_RUN_AT_1E6:g} min a run at 10^6 rows, scaled with the rows)",
            flush=True,
        )
    rows, missing = [], []
    for eps, mech, flags in order:
        row = run_one(a, train, evaluation, mech, eps, flags) if not a.summarize else _load(a, mech, eps, flags)
        (rows.append(row) if row else missing.append(f"{mech} eps={eps:g} {' '.join(flags)}".strip()))
    summary = summarize(a, rows)
    command = "python -m benchmarks.fest_tradeoff " + shlex.join(argv if argv is not None else sys.argv[1:])
    text = markdown(a, rows, summary, missing, info, command)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            slim = [{k: v for k, v in r.items() if k != "ledger"} for r in rows]
            json.dump(
                {"command": command, "machine": info, "rows": slim, "missing": missing, **summary},
                f,
                indent=1,
                default=str,
            )
    if a.png:
        plot(a, summary, a.png)
    if a.results_md:
        outputs.append_section(a.results_md, text, files=(a.json, a.png))
    return 0


def _run_dir(a, mechanism: str, epsilon: float, flags: tuple) -> str:
    tag = "_".join(x.strip("-") for x in flags)
    return os.path.join(a.work, f"{a.label}_{mechanism}_eps{epsilon:g}{'_' + tag if tag else ''}_s{a.seed}")


def _load(a, mechanism, epsilon, flags) -> dict | None:
    if not os.path.exists(os.path.join(_run_dir(a, mechanism, epsilon, flags), "report.json")):
        return None
    return run_one(a, None, None, mechanism, epsilon, flags)


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
