"""End-to-end wall time of the Criteo pipeline: each DP mechanism against the non-private run, side by side.

    python -m benchmarks.end_to_end [--mechanisms none,dense,lazy,...] [--repeats 1] [--train-rows 200000]

One invocation runs the whole pipeline (`python -m pipelines.criteo`:
write the default synthetic data, read, plan, build, train 1 epoch,
release: flush, DP output calibration, privacy report, export, evaluate)
for `none` and every DP mechanism it accepts, each in a fresh child process
(`benchmarks.end_to_end_worker`) with the same flags, repeats interleaved
(none, dense, ..., none, dense, ...) so that a change in the machine's load
hits every mechanism alike. Per run it records the child's wall time and
peak RSS (`os.wait4`), and the worker's stage timings: time to first step
(from `fit` to the end of the first batch: model preparation, the
per-example contract check, the budget's `on_train_begin` and tracing the
train step), planning (noise calibration, bucket counts), training, the
release (flush, output calibration, export, evaluation), the step count and
median step.

Prints a table with the ratios DP / none (medians over repeats), writes
`--json` and `--png` (stacked stage times per mechanism; by default new files
under `benchmarks/results/`); `make results` regenerates `benchmarks/RESULTS.md`
from the JSON files (`--results-md` naming another page appends the section).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

from benchmarks import outputs
from benchmarks.machine import machine_info

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MECHANISMS = ("none", "dense", "lazy", "eana", "fest", "adafest", "adafest+")
_CHILD_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_USE_LEGACY_KERAS": "1"}
# Stages shown in the table and the plot: (label, key in the worker's timings).
STAGES = (
    ("data", "read"),
    ("plan", "plan"),
    ("build", "build"),
    ("first step", "fit_start_to_first_step_s"),
    ("later steps", "later_steps_s"),
    ("release", "release"),
)


def measure(argv: list[str], timings_path: str, timeout: float) -> dict:
    """Runs the worker on `argv` in a child; its wall time, peak RSS and stage timings."""
    env = dict(os.environ, PYTHONPATH=ROOT, **_CHILD_ENV)
    command = [sys.executable, "-m", "benchmarks.end_to_end_worker", timings_path, "--", *argv]
    started = time.perf_counter()
    child = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = started + timeout
    while True:
        pid, status, usage = os.wait4(child.pid, os.WNOHANG)
        if pid == child.pid:
            break
        if time.perf_counter() > deadline:
            child.kill()
            os.wait4(child.pid, 0)
            return {"error": f"timed out after {timeout:.0f} s"}
        time.sleep(0.2)
    wall = time.perf_counter() - started
    stderr = child.stderr.read().decode(errors="replace") if child.stderr else ""
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        return {"error": f"exit status {code}: {stderr.strip().splitlines()[-1:] or ''}"}
    with open(timings_path) as handle:
        timings = json.load(handle)
    return {
        "wall_s": wall,
        "peak_rss_bytes": usage.ru_maxrss * 1024,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "retracing_warnings": stderr.count("triggered tf.function retracing"),
        **timings,
    }


def stage(result: dict, key: str) -> float | None:
    """A stage's seconds from one run's timings (top-level keys or the worker's `seconds`)."""
    if key in result:
        return result[key]
    return result.get("seconds", {}).get(key)


def summary(results: list[dict], mechanisms: Sequence[str]) -> dict:
    """Per mechanism: medians over repeats of wall, stages, median step and peak RSS."""
    rows = {}
    for mechanism in mechanisms:
        runs = [r for r in results if r["mechanism"] == mechanism and "error" not in r]
        if not runs:
            continue

        def median(key, runs=runs):
            values = [v for v in (stage(r, key) for r in runs) if v is not None]
            return statistics.median(values) if values else None

        rows[mechanism] = {
            "runs": len(runs),
            "wall_s": median("wall_s"),
            "median_step_s": median("median_step_s"),
            "steps": median("steps"),
            "peak_rss_bytes": median("peak_rss_bytes"),
            "stages": {label: median(key) for label, key in STAGES},
            "detail": {key: median(key) for key in sorted({k for r in runs for k in r.get("seconds", {})})},
            "retracing_warnings": max(r["retracing_warnings"] for r in runs),
        }
    return rows


def _ratio(value, base) -> str:
    return f"{value / base:.2f}×" if value is not None and base else "—"


def table(rows: dict) -> str:
    """Markdown table: wall, its ratio to none, stage seconds, median step and its ratio, peak RSS."""
    base = rows.get("none", {})
    header = "| mechanism | wall | ÷ none | " + " | ".join(label for label, _ in STAGES)
    header += " | steps | median step | ÷ none | peak RSS | retracing warnings |"
    lines = [header, "|---|" + "---:|" * (len(STAGES) + 7)]
    for mechanism, row in rows.items():
        stages = " | ".join("—" if v is None else f"{v:.1f} s" for v in row["stages"].values())
        step = row["median_step_s"]
        lines.append(
            f"| {mechanism} | {row['wall_s']:.1f} s | {_ratio(row['wall_s'], base.get('wall_s'))} | {stages} | "
            f"{row['steps']:.0f} | {'—' if step is None else f'{1000 * step:.0f} ms'} | "
            f"{_ratio(step, base.get('median_step_s'))} | {row['peak_rss_bytes'] / 2**30:.2f} GiB | "
            f"{row['retracing_warnings']} |"
        )
    return "\n".join(lines)


def detail_table(rows: dict) -> str:
    """Markdown table of every timed sub-stage (seconds, medians over repeats)."""
    keys = sorted({k for row in rows.values() for k in row["detail"]})
    lines = ["| stage | " + " | ".join(rows) + " |", "|---|" + "---:|" * len(rows)]
    for key in keys:
        cells = " | ".join(
            "—" if row["detail"].get(key) is None else f"{row['detail'][key]:.1f}" for row in rows.values()
        )
        lines.append(f"| {key} | {cells} |")
    return "\n".join(lines)


def plot(rows: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.2))
    names = list(rows)
    bottoms = [0.0] * len(names)
    for label, _ in STAGES:
        values = [rows[n]["stages"][label] or 0.0 for n in names]
        ax.bar(names, values, bottom=bottoms, label=label)
        bottoms = [b + v for b, v in zip(bottoms, values)]
    others = [max(0.0, rows[n]["wall_s"] - b) for n, b in zip(names, bottoms)]
    ax.bar(names, others, bottom=bottoms, label="start-up, imports, other", color="lightgrey")
    ax.set_ylabel("wall time of the pipeline process (s)")
    ax.set_title("Criteo pipeline end to end: where the time goes")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def markdown(rows: dict, *, command: str, info: dict, args, minutes: float, png: str, json_path: str) -> str:
    v = info["versions"]
    base = rows.get("none", {}).get("wall_s")
    ratios = ", ".join(f"{m} {rows[m]['wall_s'] / base:.2f}×" for m in rows if m != "none" and base)
    lines = [
        f"## end_to_end — {info['date_utc']} — Criteo pipeline wall time, DP ÷ non-private",
        "",
        f"- Command: `{command}` ({minutes:.1f} min wall in all).",
        f"- Machine: {info['cpu_model']}, nproc {info['nproc']}, 2-core shared CPU, under load from other jobs "
        f"(load average at start {info['load_average_at_start']}); no GPU used.",
        f"- Versions: tensorflow {v.get('tensorflow')}, tf-keras {v.get('tf-keras')}; commit "
        f"{info['git'].get('commit', '?')}"
        f"{' (uncommitted library changes)' if info['git'].get('uncommitted_library_files') else ''}.",
        f"- Workload: `python -m pipelines.criteo --epochs {args.epochs} --seed {args.seed} --synthetic-rows "
        f"{args.train_rows} --synthetic-eval-rows {args.eval_rows} --mechanism M` (pipeline defaults otherwise), "
        f"one fresh process per run, {args.repeats} repeat(s) interleaved; medians over repeats.",
        f"- Wall time DP ÷ none: {ratios or 'not measured'}.",
        "",
        table(rows),
        "",
        "Stage seconds (medians):",
        "",
        detail_table(rows),
        "",
        f"Plot: `{png}`. JSON: `{json_path}`.",
        "",
    ]
    return "\n".join(lines)


def _argv(args, mechanism: str, out: str) -> list[str]:
    return [
        "--mechanism",
        mechanism,
        "--epochs",
        str(args.epochs),
        "--seed",
        str(args.seed),
        "--synthetic-rows",
        str(args.train_rows),
        "--synthetic-eval-rows",
        str(args.eval_rows),
        "--verbose",
        "0",
        "--out",
        out,
        *shlex.split(args.extra),
    ]


def parse(argv: Sequence[str] | None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.end_to_end", description=__doc__.split("\n")[0])
    parser.add_argument("--mechanisms", default=",".join(MECHANISMS), help="comma-separated; none is always run")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--train-rows", type=int, default=200_000, help="rows of the default synthetic data")
    parser.add_argument("--eval-rows", type=int, default=20_000)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--extra", default="", help="more pipeline flags, the same for every run")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per child run")
    parser.add_argument("--workdir", default="/tmp/tfdp_end_to_end")
    parser.add_argument("--json", default=outputs.AUTO, help="'auto': a new file under benchmarks/results/")
    parser.add_argument("--png", default=outputs.AUTO, help="'auto': a new file under benchmarks/results/; '' skips")
    parser.add_argument("--results-md", default=outputs.RESULTS_MD, help="'' to skip")
    args = parser.parse_args(argv)
    mechanisms = [m for m in args.mechanisms.split(",") if m]
    args.mechanisms = ["none", *[m for m in mechanisms if m != "none"]]
    outputs.resolve(
        parser,
        args,
        benchmark="end_to_end",
        tag=f"rows{outputs.short_number(args.train_rows)}",
        files={"json": ".json", "png": ".png"},
    )
    if os.path.abspath(args.workdir).startswith(ROOT + os.sep):
        parser.error("--workdir must lie outside the repository.")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    command = "python -m benchmarks.end_to_end " + shlex.join(argv if argv is not None else sys.argv[1:])
    info = machine_info(ROOT)
    started = time.perf_counter()
    os.makedirs(args.workdir, exist_ok=True)
    results = []
    for repeat in range(args.repeats):
        for mechanism in args.mechanisms:
            out = os.path.join(args.workdir, f"{mechanism}_{repeat}")
            result = {"mechanism": mechanism, "repeat": repeat}
            result |= measure(_argv(args, mechanism, out), out + ".timings.json", args.timeout)
            shutil.rmtree(out, ignore_errors=True)
            results.append(result)
            line = result.get("error") or (
                f"wall {result['wall_s']:.1f} s, first step {result['fit_start_to_first_step_s']:.1f} s, "
                f"median step {1000 * (result['median_step_s'] or 0):.0f} ms, "
                f"peak {result['peak_rss_bytes'] / 2**30:.2f} GiB"
            )
            print(f"[{repeat + 1}/{args.repeats}] {mechanism:13} {line}", flush=True)
    minutes = (time.perf_counter() - started) / 60
    rows = summary(results, args.mechanisms)
    print(table(rows))
    print(detail_table(rows))
    outputs.write_run(
        args,
        {"command": command, "machine": info, "summary": rows, "results": results},
        plot=lambda path: plot(rows, path),
        section=lambda **paths: markdown(rows, command=command, info=info, args=args, minutes=minutes, **paths),
    )
    print(f"{len(results)} runs in {minutes:.1f} min; JSON {args.json}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
