"""How long privacy planning takes before the first training step: calibration and the budget's step count.

Two runs a user meets first, with (q, T) as their code computes them:

  * readme: the README example, `plan_run("lazy", ...)` at epsilon 3, delta
    1/n, n = 20,000, batch 256, 1 epoch (q = 0.0128, T = 78);
  * criteo: the Criteo pipeline's default, `plan_run("adafest", ...)` at
    epsilon 3 with the pipeline's 5% output-calibration share, delta 1/N,
    N = 200,000 rows, batch 2,048, 2 epochs (q = B / N, T = epochs x round(N / B) = 196).

Per run, in a fresh process (no memo carried over), each timed in wall seconds:
  plan: `plan_run` (calibrates sigma, builds the mechanism);
  budget: `plan.budget().on_train_begin()` (the step count that fits);
  final epsilon: the budget's epsilon once the planned T steps are in its ledger
    (what `on_epoch_end` computes after the last epoch).
It also checks the guarantee on the exact (default) PLD grid, with
`dp_accounting` directly: eps(sigma, T) <= target, and eps(max_steps) <=
target < eps(max_steps + 1).

`--baseline DIR` also times a checkout of an earlier commit (e.g. a `git
worktree` of it), the same way, in processes whose `tfdp_embed` is that
checkout's. Outputs: `--json`, `--png` (median seconds per phase, this
checkout vs the baseline; both default to new files under
`benchmarks/results/`); `make results` regenerates `benchmarks/RESULTS.md`
from the JSON files (`--results-md` naming another page appends the section).

Run:
    git worktree add /tmp/base 972fed9
    python -m benchmarks.calibration_time --baseline /tmp/base --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = ("readme", "criteo")
PHASES = ("plan", "budget", "final_epsilon")


def case_settings(case: str) -> dict:
    """The plan_run arguments of a case (see the module docstring)."""
    if case == "readme":
        n, batch, epochs = 20_000, 256, 1
        q = batch / n
        return dict(
            mechanism="lazy", target_epsilon=3.0, target_delta=1 / n, sampling_probability=q, steps=round(epochs / q)
        )
    if case == "criteo":
        n, batch, epochs = 200_000, 2_048, 2
        return dict(
            mechanism="adafest",
            target_epsilon=3.0,
            target_delta=1 / n,
            sampling_probability=batch / n,
            steps=epochs * round(n / batch),
            output_calibration_share=0.05,
            contribution_clip=1.0,
            ratio=1.0,
            threshold_sigmas=2.0,
        )
    raise ValueError(f"unknown case {case!r}; allowed: {CASES}")


def measure(case: str) -> dict:
    """One case in this process: the phases' wall seconds and the exact-grid checks."""
    import dp_accounting

    from tfdp_embed import Release, plan_run

    settings = case_settings(case)
    options = dict(settings)
    name, share = options.pop("mechanism"), options.pop("output_calibration_share", None)
    releases = [Release("output_calibration", epsilon_share=share)] if share else []
    started = time.perf_counter()
    plan = plan_run(name, releases=releases, seed=0, **options)
    planned = time.perf_counter()
    budget = plan.budget()
    budget.on_train_begin()
    counted = time.perf_counter()
    step = budget.mechanism.step_event(settings["sampling_probability"])
    budget.ledger.record_steps(step, settings["steps"])
    final_epsilon = budget.spent_epsilon()
    ended = time.perf_counter()

    def exact(steps: int) -> float:
        events = [*plan.events, dp_accounting.SelfComposedDpEvent(step, steps)]
        accountant = dp_accounting.pld.PLDAccountant()  # the default grid, 1e-4
        return float(accountant.compose(dp_accounting.ComposedDpEvent(events)).get_epsilon(settings["target_delta"]))

    target, k = settings["target_epsilon"], budget.max_steps
    return {
        "case": case,
        "seconds": {"plan": planned - started, "budget": counted - planned, "final_epsilon": ended - counted},
        "noise_multiplier": plan.noise_multiplier,
        "max_steps": k,
        "final_epsilon": final_epsilon,
        "exact_epsilon_at_max_steps": exact(k),
        "exact_epsilon_at_max_steps_plus_1": exact(k + 1),
        "guarantee_holds": exact(k) <= target < exact(k + 1),
    }


def run_worker(checkout: str, case: str) -> dict:
    """`measure(case)` in a fresh process whose `tfdp_embed` is `checkout`'s."""
    env = dict(os.environ, PYTHONPATH=checkout, TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--worker", case],
        cwd=checkout,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def summarise(runs: list) -> dict:
    """Median (min, max) seconds per phase over repeats, and the first run's numbers."""
    first = dict(runs[0])
    first["seconds"] = {
        phase: {
            "median_s": statistics.median(r["seconds"][phase] for r in runs),
            "min_s": min(r["seconds"][phase] for r in runs),
            "max_s": max(r["seconds"][phase] for r in runs),
        }
        for phase in PHASES
    }
    first["guarantee_holds"] = all(r["guarantee_holds"] for r in runs)
    return first


def markdown_section(document: dict) -> str:
    m, v = document["machine"], document["machine"]["versions"]
    lines = [
        f"## calibration_time — {m['date_utc']} — seconds of privacy planning before the first step, "
        "this checkout vs the baseline",
        "",
        f"- Command: `{document['command']}`",
        f"- Machine: {m['cpu_model']}, nproc {m['nproc']}, {m['memory_total_gb']} GiB RAM, GPU: "
        f"{', '.join(m['gpus']) or 'none (CPU only)'}; 1-min load average {m['load_average_at_start'][0]} at start, "
        f"{m.get('load_average_at_end', ['not measured'])[0]} at end (shared machine: wall times are inflated by "
        "other processes).",
        f"- Versions: Python {v['python']}, tensorflow {v['tensorflow']}, dp-accounting {v['dp-accounting']}. "
        f"Library commit `{m['git']['commit'][:12]}`; uncommitted library files at start: "
        f"{', '.join(m['git']['uncommitted_library_files']) or 'none'}. Baseline: "
        f"{document['baseline'] or 'none'}.",
        f"- Protocol: each (checkout, case) {document['settings']['repeats']}x in a fresh process; median (min–max) "
        "wall seconds. **plan** = `plan_run` (calibrates sigma); **budget** = `plan.budget().on_train_begin()`; "
        "**final ε** = the budget's epsilon with the T planned steps in its ledger (the last `on_epoch_end`). "
        "**exact** = `dp_accounting` PLD on the default grid (1e-4): eps(k) ≤ target < eps(k + 1) for the "
        "budget's k.",
        "",
        "| case | checkout | σ | plan | budget | final ε | k (steps fit) | exact ε(k) / ε(k+1) | guarantee |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in document["rows"]:
        s = row["seconds"]
        cells = " | ".join(f"{s[p]['median_s']:.2f} s ({s[p]['min_s']:.2f}–{s[p]['max_s']:.2f})" for p in PHASES)
        lines.append(
            f"| {row['case']} | {row['checkout']} | {row['noise_multiplier']:.6f} | {cells} | {row['max_steps']} | "
            f"{row['exact_epsilon_at_max_steps']:.5f} / {row['exact_epsilon_at_max_steps_plus_1']:.5f} | "
            f"{'holds' if row['guarantee_holds'] else 'VIOLATED'} |"
        )
    lines.append("")
    return "\n".join(lines)


def plot(document: dict, path: str) -> None:
    """Stacked bars: median seconds of each phase, per case and checkout."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = document["rows"]
    fig, ax = plt.subplots(figsize=(7, 3.5), dpi=120)
    labels = [f"{r['case']}\n{r['checkout']}" for r in rows]
    left = [0.0] * len(rows)
    for phase in PHASES:
        widths = [r["seconds"][phase]["median_s"] for r in rows]
        ax.barh(labels, widths, left=left, label=phase.replace("_", " "))
        left = [a + b for a, b in zip(left, widths)]
    ax.set_xlabel("seconds of privacy accounting (median): plan + budget before the first step, final ε after the last")
    ax.set_title(f"Privacy planning time — {document['machine']['date_utc'][:10]}", fontsize=9)
    ax.invert_yaxis()
    ax.legend(fontsize=8)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def parse_args(argv):
    from benchmarks import outputs

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {CASES}")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", default=None, help="a checkout of an earlier commit to time the same way")
    parser.add_argument("--json", default=outputs.AUTO, help="'auto': a new file under benchmarks/results/")
    parser.add_argument("--png", default=outputs.AUTO, help="'auto': a new file under benchmarks/results/; '' skips")
    parser.add_argument("--results-md", default=outputs.RESULTS_MD, help="RESULTS.md to append to ('' to skip)")
    args = parser.parse_args(argv)
    args.cases = args.cases.split(",")
    if args.repeats < 1 or not set(args.cases) <= set(CASES):
        parser.error(f"--repeats must be >= 1 and --cases a subset of {CASES}")
    if args.baseline is not None and not os.path.isdir(os.path.join(args.baseline, "tfdp_embed")):
        parser.error(f"--baseline {args.baseline!r} is not a checkout (no tfdp_embed/ in it)")
    outputs.resolve(
        parser, args, benchmark="calibration_time", tag="-".join(args.cases), files={"json": ".json", "png": ".png"}
    )
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        print(json.dumps(measure(argv[1])))
        return 0
    args = parse_args(argv)
    from benchmarks import outputs
    from benchmarks.machine import machine_info

    machine = machine_info(REPO)
    checkouts = [("this", REPO)] + ([("baseline", os.path.abspath(args.baseline))] if args.baseline else [])
    rows = []
    for case in args.cases:
        for label, checkout in checkouts:
            runs = [run_worker(checkout, case) for _ in range(args.repeats)]
            rows.append({"checkout": label, **summarise(runs), "runs": runs})
            print(json.dumps({k: rows[-1][k] for k in ("case", "checkout", "seconds", "guarantee_holds")}))
    machine["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    baseline = None
    if args.baseline:
        commit = subprocess.run(["git", "-C", args.baseline, "rev-parse", "HEAD"], capture_output=True, text=True)
        baseline = f"commit `{commit.stdout.strip()[:12]}`"
    document = {
        "command": "python -m benchmarks.calibration_time " + shlex.join(argv),
        "settings": {"cases": {c: case_settings(c) for c in args.cases}, "repeats": args.repeats},
        "baseline": baseline,
        "machine": machine,
        "rows": rows,
    }
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=1)
    if args.png:
        plot(document, args.png)
    section = markdown_section(document)
    print(section)
    if args.results_md:
        outputs.append_section(args.results_md, section, files=(args.json, args.png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
