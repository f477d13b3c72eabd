"""Peak memory of the Criteo pipeline vs rows in the training file: streaming vs in memory.

    python -m benchmarks.criteo_memory [--rows 100000,1000000,4000000] [--mechanisms adafest,lazy]

For each row count, mechanism and `--streaming {off,on}` it runs the whole
pipeline (`python -m pipelines.criteo`: read or scan, calibrate, build,
a few training steps, export, evaluate) in a fresh child process and
records the child's peak resident memory (`ru_maxrss` from `os.wait4` of
that child: its VmHWM, TensorFlow included) and its wall time. In memory the
rows are held as numpy arrays plus TensorFlow's copy for sampling; streaming
holds G x B rows of batches (`--stream-buffer-rows`) and the bucket counts,
so its peak should not grow with the rows.

Data: synthetic Criteo rows from the bundled generator
(`tfdp_embed.data.write_synthetic_criteo`, vocabulary scale 0.1), written
under `--workdir` (default /tmp, never the repository). Writing rows takes
about as long as reading them, so the generator writes one block of
`--block-rows` rows and larger files repeat that block (the reader, the
sampler and the memory they use do not depend on the values).

Settings: hash size 1,000 per feature, embedding width 4, one hidden layer
of 16 units (a small model, so that the data dominates what grows), batch
1,024, `--max-steps` training steps (the noise is calibrated for them), RDP
accounting, streaming with G = `--stream-buffer-rows` // 1,024 batches per
pass (one pass over the file covers the steps).

Writes a table to stdout, `--json`, `--png` (peak RSS vs rows, log-log; both
default to new files of this run under `benchmarks/results/`); `make results`
regenerates `benchmarks/RESULTS.md` from the JSON files (`--results-md` naming
another page appends the section "criteo_memory").
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence

from benchmarks import cli_args, outputs
from benchmarks.machine import machine_info

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS = [
    "--hash-size", "1000", "--embedding-dim", "4", "--hidden-units", "16", "--batch", "1024", "--epochs", "1",
    "--accountant", "rdp", "--verbose", "0", "--seed", "0", "--epsilon", "3",
]  # fmt: skip
_CHILD_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_USE_LEGACY_KERAS": "1"}


def write_files(workdir: str, rows: Sequence[int], block_rows: int, eval_rows: int) -> tuple[dict, str]:
    """Writes `{rows: training file}` (repeats of one generated block) and an evaluation file."""
    from tfdp_embed.data import write_synthetic_criteo

    block_dir, eval_dir = os.path.join(workdir, "block"), os.path.join(workdir, "eval")
    block = write_synthetic_criteo(block_dir, num_rows=block_rows, seed=0, vocab_scale=0.1)[0]
    evaluation = write_synthetic_criteo(eval_dir, num_rows=2 * eval_rows, seed=0, vocab_scale=0.1, days=2)[1]
    with open(block, "rb") as f:
        lines = f.read().splitlines(keepends=True)
    files = {}
    for n in rows:
        path = os.path.join(workdir, f"train_{n}.tsv")
        with open(path, "wb") as out:
            left = n
            while left > 0:
                take = min(left, len(lines))
                out.writelines(lines[:take])
                left -= take
        files[n] = path
    return files, evaluation


def measure(argv: list[str], timeout: float) -> dict:
    """Runs `python -m pipelines.criteo argv` in a child; its own peak RSS (`os.wait4` on that child), wall and CPU time."""
    env = dict(os.environ, PYTHONPATH=ROOT, **_CHILD_ENV)
    started = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "pipelines.criteo", *argv],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = started + timeout
    while True:
        pid, status, usage = os.wait4(child.pid, os.WNOHANG)
        if pid == child.pid:
            break
        if time.perf_counter() > deadline:
            child.kill()
            os.wait4(child.pid, 0)
            child.returncode = -9
            return {"error": f"timed out after {timeout:.0f} s"}
        time.sleep(0.2)
    child.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - started
    if child.returncode != 0:
        return {"error": f"exit status {child.returncode} (rerun the command by hand to see why)"}
    return {"wall_s": wall, "peak_rss_bytes": usage.ru_maxrss * 1024, "cpu_s": usage.ru_utime + usage.ru_stime}


def table(results: list[dict]) -> str:
    lines = [
        "| rows | mechanism | --streaming | peak RSS | wall | CPU | batches per pass (G) | passes per epoch | sampler |",
        "|---:|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['rows']:,} | {r['mechanism']} | {r['streaming']} | not measured ({r['error']}) |||||")
            continue
        lines.append(
            f"| {r['rows']:,} | {r['mechanism']} | {r['streaming']} | {r['peak_rss_bytes'] / 2**30:.2f} GiB | "
            f"{r['wall_s']:.0f} s | {r['cpu_s']:.0f} s | {r['batches_per_pass'] or '—'} | {r['passes_per_epoch']} | "
            f"{r['sampler']} |"
        )
    return "\n".join(lines)


def plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    keys = sorted({(r["mechanism"], r["streaming"]) for r in results})
    for mechanism, streaming in keys:
        points = sorted(
            (r["rows"], r["peak_rss_bytes"] / 2**30)
            for r in results
            if (r["mechanism"], r["streaming"]) == (mechanism, streaming) and "error" not in r
        )
        if points:
            style = "-o" if streaming == "on" else "--s"
            label = f"{mechanism}, {'streaming' if streaming == 'on' else 'in memory'}"
            ax.plot(*zip(*points), style, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("rows in the training file")
    ax.set_ylabel("peak RSS of the pipeline process (GiB)")
    ax.set_title("Criteo pipeline: peak memory vs training rows")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def markdown(results: list[dict], *, command: str, info: dict, args, minutes: float, png: str, json_path: str) -> str:
    v = info["versions"]
    ok = [r for r in results if "error" not in r]

    def peaks(streaming):
        return [r["peak_rss_bytes"] / 2**30 for r in ok if r["streaming"] == streaming]

    on, off = peaks("on"), peaks("off")
    summary = []
    if on:
        summary.append(f"streaming peak RSS {min(on):.2f}–{max(on):.2f} GiB over all row counts")
    if off:
        summary.append(f"in memory {min(off):.2f}–{max(off):.2f} GiB")
    machine = (
        f"- Machine: {info['cpu_model']}, nproc {info['nproc']}, {info['memory_total_gb']} GiB RAM, no GPU used; "
        f"load average at start {info['load_average_at_start']} (shared machine: wall and CPU times are "
        "inflated by other jobs; peak RSS is not)."
    )
    versions = (
        f"- Versions: Python {v.get('python')}, tensorflow {v.get('tensorflow')}, tf-keras {v.get('tf-keras')}, "
        f"dp-accounting {v.get('dp-accounting')}, numpy {v.get('numpy')}; commit {info['git'].get('commit', '?')}"
        f"{' (uncommitted library changes)' if info['git'].get('uncommitted_library_files') else ''}."
    )
    workload = (
        f"- Workload: one child process per cell, `python -m pipelines.criteo --train FILE --eval EVAL "
        f"--mechanism M --streaming S --max-steps {args.max_steps} --stream-buffer-rows {args.stream_buffer_rows} "
        f"{' '.join(SETTINGS)}`; peak RSS is that child's `ru_maxrss` (VmHWM), TensorFlow and the model "
        f"included. Training files: the synthetic generator's first {args.block_rows:,} rows (vocabulary "
        f"scale 0.1), repeated up to the row count; evaluation: {args.eval_rows:,} rows of the next day."
    )
    result = (
        f"- Measured: {'; '.join(summary) or 'nothing'}. By design, in memory the rows are numpy arrays (~320 "
        "bytes of features per row) plus TensorFlow's copy for sampling; streaming holds G x B rows of batches "
        "and the bucket counts, whatever the file length. The price of streaming is reading: a Poisson epoch of "
        "round(N / B) batches reads the file ceil(round(N / B) / G) times, plus one validating scan."
    )
    lines = [
        f"## criteo_memory — {info['date_utc']} — peak RSS vs training rows, streaming vs in memory",
        "",
        f"- Command: `{command}` ({minutes:.1f} min wall in all).",
        machine,
        versions,
        workload,
        result,
        "",
        table(results),
        "",
        f"Plot: `{png}`. JSON: `{json_path}`.",
        "",
    ]
    return "\n".join(lines)


def _rows_read_problem(report: dict, n: int) -> str | None:
    """Why `report.json` does not show the `n` rows written as read, or None.

    `rows_read` is N~ (released with Gaussian noise of sd `noise_multiplier`, the exact count is never written),
    so it is accepted within 6 sd of `n` (a missing file or block of rows is far outside that).
    """
    sd = (report.get("dataset_size_release") or {}).get("noise_multiplier", 0.0)
    if abs(report["rows_read"] - n) > 6 * sd:
        return f"read {report['rows_read']} rows (N~, noise sd {sd:g}), expected {n}"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.criteo_memory", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--rows", type=cli_args.ints, default=(100_000, 1_000_000, 4_000_000), help="training rows per file"
    )
    parser.add_argument("--mechanisms", default="adafest,lazy")
    parser.add_argument("--modes", default="off,on", help="--streaming values to compare")
    parser.add_argument("--max-steps", type=int, default=3)
    parser.add_argument("--stream-buffer-rows", type=int, default=1 << 15)
    parser.add_argument("--block-rows", type=int, default=200_000)
    parser.add_argument("--eval-rows", type=int, default=2_000)
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds per child run")
    parser.add_argument(
        "--deadline-minutes",
        type=float,
        help="start no new cell after this many minutes; the rest is recorded as not measured",
    )
    parser.add_argument("--workdir", default="/tmp/tfdp_criteo_memory")
    parser.add_argument("--keep-files", action="store_true")
    parser.add_argument("--json", default=outputs.AUTO, help="'auto': a new file under benchmarks/results/")
    parser.add_argument("--png", default=outputs.AUTO, help="'auto': a new file under benchmarks/results/; '' skips")
    parser.add_argument("--results-md", default=outputs.RESULTS_MD, help="'' to skip")
    args = parser.parse_args(argv)
    outputs.resolve(
        parser,
        args,
        benchmark="criteo_memory",
        tag=f"rows{outputs.range_tag(args.rows)}",
        files={"json": ".json", "png": ".png"},
    )
    if os.path.abspath(args.workdir).startswith(ROOT + os.sep):
        parser.error("--workdir must lie outside the repository (the data files are large).")
    command = "python -m benchmarks.criteo_memory " + shlex.join(argv if argv is not None else sys.argv[1:])
    info = machine_info(ROOT)
    started = time.perf_counter()
    os.makedirs(args.workdir, exist_ok=True)
    print(f"writing synthetic files to {args.workdir} ...", flush=True)
    files, evaluation = write_files(args.workdir, args.rows, args.block_rows, args.eval_rows)
    # Mechanism by mechanism: with a deadline, the first mechanism's full row sweep comes first.
    cells = [(n, m, s) for m in args.mechanisms.split(",") for n in args.rows for s in args.modes.split(",")]
    results = []
    try:
        from tqdm import tqdm
    except ImportError:  # progress as plain lines
        tqdm = None
    progress = tqdm(cells, desc="criteo_memory", unit="run") if tqdm else cells
    for n, mechanism, streaming in progress:
        out = os.path.join(args.workdir, f"out_{n}_{mechanism}_{streaming}")
        argv_ = [
            "--train",
            files[n],
            "--eval",
            evaluation,
            "--mechanism",
            mechanism,
            "--streaming",
            streaming,
            "--max-steps",
            str(args.max_steps),
            "--stream-buffer-rows",
            str(args.stream_buffer_rows),
            "--out",
            out,
            *SETTINGS,
        ]
        result = {"rows": n, "mechanism": mechanism, "streaming": streaming}
        if args.deadline_minutes is not None and time.perf_counter() - started > 60 * args.deadline_minutes:
            results.append(result | {"error": f"skipped: past --deadline-minutes {args.deadline_minutes:g}"})
            continue
        result |= measure(argv_, args.timeout)
        if "error" not in result:
            with open(os.path.join(out, "report.json")) as f:
                report = json.load(f)
            data = report["data"]
            result |= {
                "rows_read": report["rows_read"],
                "steps": report["steps"],
                "epsilon": report["epsilon"],
                "sampler": report["sampler"],
                "streamed": data["streaming"][0],
                "batches_per_pass": data["batches_per_pass"][0],
                "passes_per_epoch": data["passes_per_epoch"][0],
                "median_step_s": report["median_step_s"],
            }
            problem = _rows_read_problem(report, n)
            if problem:
                result["error"] = problem
        shutil.rmtree(out, ignore_errors=True)
        results.append(result)
        line = f"{n:>9,} {mechanism:8} streaming={streaming:3} " + (
            f"peak {result['peak_rss_bytes'] / 2**30:.2f} GiB, {result['wall_s']:.0f} s"
            if "error" not in result
            else result["error"]
        )
        (progress.write if tqdm else print)(line)
    minutes = (time.perf_counter() - started) / 60
    if not args.keep_files:
        shutil.rmtree(args.workdir, ignore_errors=True)
    print(table(results))
    outputs.write_run(
        args,
        {"command": command, "machine": info, "results": results},
        plot=lambda path: plot(results, path),
        section=lambda **paths: markdown(results, command=command, info=info, args=args, minutes=minutes, **paths),
    )
    print(f"{len(results)} runs in {minutes:.1f} min; JSON {args.json}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
