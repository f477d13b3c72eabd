"""Input-pipeline throughput and memory of one DP epoch over a Criteo TSV: one-pass spill vs multi-pass vs plain read.

    python -m benchmarks.streaming [--rows 1000000,10000000] [--methods plain,one_pass] [--repeats 3]

For each row count N and each method, one fresh process
(`benchmarks.streaming_worker`) per repeat, methods in an order that
rotates between repeats, times one full epoch of:

* `plain`: `criteo_dataset(file, batch_size=8192)`, parse only: the limit.
* `one_pass`: parse + exact Poisson sampling + batching with
  `one_pass_poisson_batches` (q = B / N, round(N / B) batches; the file
  read once, the sampled rows spilled to `--spill-dir` and read back).
* `multi_pass`: the same with `streaming_poisson_batches`, G =
  `--buffer-rows` // B batches per pass (the file read ceil(round(N / B) / G) times).

A process per measurement so that its peak RSS is that method's at that N
alone (a process's heap does not shrink back after an earlier method ran
in it): RSS flat in N reads off the table. Each worker runs a warm-up
epoch on the warm-up file first. Throughput is N / seconds of the epoch;
the table gives medians over repeats and each method's median ratio to the
plain read of the same repeat, in wall time and in process CPU time (the
CPU ratio is steadier on a shared machine). Memory: the worker's lifetime
peak RSS (`ru_maxrss`), its RSS growth during the epoch, the largest spill
bucket held (records). Disk: bytes the spill wrote.

Long runs: data files are written by the generator in a child process,
streamed 64k rows at a time, with progress lines; pilots of each method on
the warm-up file give a time estimate before the long phases start
(`--estimate-only` stops there); workers print progress every `--progress-s`.

Data: TSV files from the repository's generator
(`tfdp_embed.data.write_synthetic_criteo`, vocabulary scale 0.1, seed 0),
cached under `--workdir` (default /work/runs/stream_data), never in the
repository.

Writes a table to stdout, `--json`, `--png` (rows/s and peak RSS vs N; by
default new files under `benchmarks/results/`); `make results` regenerates `benchmarks/RESULTS.md` from
the JSON files (`--results-md` naming another page appends the section
"streaming").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from benchmarks import cli_args, outputs
from benchmarks.machine import machine_info
from benchmarks.streaming_worker import READ_BATCH, file_reads

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = ("plain", "one_pass", "multi_pass")
_VOCAB_SCALE = 0.1


def data_file(workdir: str, rows: int, *, progress_s: float, bytes_per_row: float | None = None) -> str:
    """The generator's file of `rows` rows under `workdir`: written once, then reused."""
    directory = os.path.join(workdir, outputs.short_number(rows))
    path = os.path.join(directory, "day_0")
    if not os.path.exists(path):
        print(f"writing {rows:,} synthetic rows to {path} ...", flush=True)
        started = time.perf_counter()
        generate(directory, rows, progress_s=progress_s, bytes_per_row=bytes_per_row)
        print(f"wrote {os.path.getsize(path) / 2**30:.2f} GiB in {time.perf_counter() - started:,.0f} s", flush=True)
    return path


def generate(directory: str, rows: int, *, progress_s: float, bytes_per_row: float | None = None) -> float:
    """Writes `directory`/day_0; returns the generator's own seconds (process start excluded).

    The generator (`python -m tfdp_embed.data.criteo.synthetic`, a child
    process) streams 64k rows at a time into `<directory>.partial`, renamed
    when complete, so an interrupted run never leaves a short file to be
    reused; its progress (bytes on disk against `bytes_per_row` x rows) is
    printed every `progress_s` seconds.
    """
    partial = directory + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    command = [sys.executable, "-m", "tfdp_embed.data.criteo.synthetic", "--out", partial, "--rows", str(rows)]
    command += ["--seed", "0", "--vocab-scale", str(_VOCAB_SCALE)]
    started = time.perf_counter()
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(command, cwd=ROOT, env=_child_env(), stdout=subprocess.DEVNULL, stderr=errors)
        while True:
            try:
                proc.wait(timeout=progress_s)
                break
            except subprocess.TimeoutExpired:
                _print_generation_progress(os.path.join(partial, "day_0"), rows, bytes_per_row, started)
        errors.seek(0)
        stderr = errors.read().decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"the generator failed (exit {proc.returncode}): {stderr[-2000:]}")
    os.replace(partial, directory)
    reported = re.search(r"wrote \d+ rows in ([0-9.]+) s", stderr)
    return float(reported.group(1)) if reported else time.perf_counter() - started


def _print_generation_progress(path: str, rows: int, bytes_per_row: float | None, started: float) -> None:
    size = os.path.getsize(path) if os.path.exists(path) else 0
    elapsed = time.perf_counter() - started
    line = f"  [generate] {elapsed:,.0f} s: {size / 2**30:.2f} GiB written"
    if bytes_per_row and size:
        done = min(1.0, size / (bytes_per_row * rows))
        line += f" (~{done:.0%} of ~{bytes_per_row * rows / 2**30:.2f} GiB, ~{elapsed / done - elapsed:,.0f} s left)"
    print(line, flush=True)


def _child_env() -> dict:
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))


def measure(spec: dict, workdir: str, timeout_s: float) -> dict:
    """Runs one `benchmarks.streaming_worker` process; returns its result plus the process's peak RSS and wall.

    The worker's progress lines go to this process's stdout; its stderr (TensorFlow's logs) to a log file.
    """
    tag = f"{outputs.short_number(spec['rows'])}-{spec['method']}-{spec['label'].replace(' ', '_')}"
    spec_path, out_path = (os.path.join(workdir, f"{tag}.{ext}") for ext in ("spec.json", "out.json"))
    log_path = os.path.join(workdir, f"{tag}.log")
    with open(spec_path, "w", encoding="utf-8") as handle:
        json.dump(spec, handle)
    if os.path.exists(out_path):
        os.remove(out_path)
    started = time.monotonic()
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.streaming_worker", spec_path, out_path],
            cwd=ROOT,
            env=_child_env(),
            stderr=log,
        )
    killed = False
    while True:
        pid, status, rusage = os.wait4(proc.pid, 0 if killed else os.WNOHANG)
        if pid:
            break
        if time.monotonic() - started > timeout_s:
            proc.kill()
            killed = True
            continue
        time.sleep(0.5)
    code = os.waitstatus_to_exitcode(status)
    if code != 0 or not os.path.exists(out_path):
        with open(log_path, encoding="utf-8", errors="replace") as handle:
            tail = handle.read()[-2000:]
        why = f"killed after --worker-timeout-s {timeout_s:g}" if killed else f"exit {code}"
        raise RuntimeError(f"worker {tag} failed ({why}); log {log_path}:\n{tail}")
    with open(out_path, encoding="utf-8") as handle:
        result = json.load(handle)
    result["process_peak_rss_bytes"] = rusage.ru_maxrss * 1024
    result["process_wall_s"] = time.monotonic() - started
    result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    return result


def estimate_seconds(pilots: dict, rows: int, method: str, *, batch: int, buffer_rows: int) -> float:
    """Process wall seconds of one measurement, extrapolated from the method's pilot (linear in rows read)."""
    pilot = pilots[method]
    rows_read = rows * file_reads(method, rows, batch=batch, buffer_rows=buffer_rows)
    per_row = pilot["seconds"] / (pilot["rows"] * pilot["passes"])
    return pilot["process_wall_s"] - pilot["seconds"] + per_row * rows_read


def summarise(runs: list[dict]) -> list[dict]:
    """Per (rows, method): medians over repeats, median per-repeat ratios to plain (wall and CPU), largest peaks."""
    out = []
    for rows in sorted({r["rows"] for r in runs}):
        plain = {r["repeat"]: r for r in runs if r["rows"] == rows and r["method"] == "plain"}
        for method in METHODS:
            mine = [r for r in runs if r["rows"] == rows and r["method"] == method]
            if not mine:
                continue
            paired = [r for r in mine if r["repeat"] in plain]
            wall = [r["rows_per_s"] / plain[r["repeat"]]["rows_per_s"] for r in paired]
            cpu = [plain[r["repeat"]]["cpu_seconds"] / r["cpu_seconds"] for r in paired]
            out.append(
                {
                    "rows": rows,
                    "method": method,
                    "repeats": len(mine),
                    "rows_per_s": statistics.median(r["rows_per_s"] for r in mine),
                    "ratio_to_plain": statistics.median(wall) if wall else None,
                    "cpu_seconds": statistics.median(r["cpu_seconds"] for r in mine),
                    "cpu_ratio_to_plain": statistics.median(cpu) if cpu else None,
                    "passes": mine[0]["passes"],
                    "process_peak_rss_bytes": max(r["process_peak_rss_bytes"] for r in mine),
                    "epoch_rss_growth_bytes": max(r["epoch_peak_rss_bytes"] - r["rss_before_bytes"] for r in mine),
                    "largest_bucket_records": mine[0]["largest_bucket_records"],
                    "spill_bytes": mine[0]["spill_bytes"],
                }
            )
    return out


def table(summary: list[dict]) -> str:
    head = (
        "| rows | method | file reads | rows/s (median) | / plain (wall) | CPU s | plain CPU / CPU | process peak RSS "
        "MiB | epoch RSS growth MiB | largest bucket (records) | spill MiB | repeats |"
    )
    lines = [head, "|" + "---|" * 12]
    for s in summary:
        wall = "—" if s["ratio_to_plain"] is None else f"{s['ratio_to_plain']:.2f}x"
        cpu = "—" if s["cpu_ratio_to_plain"] is None else f"{s['cpu_ratio_to_plain']:.2f}x"
        bucket = "—" if s["largest_bucket_records"] is None else f"{s['largest_bucket_records']:,}"
        lines.append(
            f"| {s['rows']:,} | {s['method']} | {s['passes']} | {s['rows_per_s']:,.0f} | {wall} | "
            f"{s['cpu_seconds']:,.1f} | {cpu} | {s['process_peak_rss_bytes'] / 2**20:,.0f} | "
            f"{s['epoch_rss_growth_bytes'] / 2**20:,.0f} | {bucket} | {s['spill_bytes'] / 2**20:,.0f} | {s['repeats']} |"
        )
    return "\n".join(lines)


def plot(summary: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (speed, memory) = plt.subplots(1, 2, figsize=(11, 4))
    for method in METHODS:
        mine = [s for s in summary if s["method"] == method]
        if mine:
            rows = [s["rows"] for s in mine]
            speed.plot(rows, [s["rows_per_s"] for s in mine], marker="o", label=method)
            memory.plot(rows, [s["process_peak_rss_bytes"] / 2**20 for s in mine], marker="o", label=method)
    for ax, label in ((speed, "input rows / s (one epoch, median)"), (memory, "process peak RSS (MiB)")):
        ax.set_xscale("log")
        ax.set_xlabel("rows N")
        ax.set_ylabel(label)
        ax.legend()
    speed.set_title("One DP epoch's input pipeline (parse + sample + batch)")
    memory.set_title("Peak RSS of a fresh process per (N, method)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown(summary: list[dict], *, command: str, info: dict, args, minutes: float) -> str:
    v = info["versions"]
    one = [s for s in summary if s["method"] == "one_pass" and s["ratio_to_plain"] is not None]
    verdict = (
        ", ".join(
            f"{s['ratio_to_plain']:.2f}x wall, {s['cpu_ratio_to_plain']:.2f}x CPU at N={s['rows']:,}" for s in one
        )
        or "not measured"
    )
    return "\n".join(
        [
            f"## streaming — {info['date_utc']} — one DP epoch's input pipeline: one-pass spill vs multi-pass vs plain read",
            "",
            f"- Command: `{command}` ({minutes:.1f} min wall in all).",
            f"- Machine: {info['cpu_model']}, nproc {info['nproc']}, {info['memory_total_gb']} GiB RAM, "
            f"{args.machine_note} (load average at start {info['load_average_at_start']}); no GPU.",
            f"- Versions: tensorflow {v.get('tensorflow')}, numpy {v.get('numpy')}; commit "
            f"{info['git'].get('commit', '?')}.",
            f"- Workload: batch B = {args.batch} (q = B / N, round(N / B) Poisson batches), read chunks of "
            f"{READ_BATCH} rows, spill bucket / multi-pass buffer {args.buffer_rows:,} rows, spill on local disk "
            f"(`{args.spill_dir}`).",
            f"- Protocol: one fresh process per (N, method, repeat), {args.repeats} repeats, methods in rotating "
            "order; each process runs a warm-up epoch on the warm-up file, then one timed epoch. Ratios are medians "
            "over repeats of method / plain of the same repeat (wall rows/s; CPU: plain's process CPU seconds over "
            "the method's). Process peak RSS: the worker's `ru_maxrss` (imports, warm-up and epoch); epoch RSS "
            "growth: VmHWM during the epoch minus the RSS before it.",
            f"- Goal >= 0.5x the plain read, flat in N. One-pass measured: {verdict}.",
            "",
            table(summary),
            "",
        ]
    )


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.streaming", description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=cli_args.ints, default=(1_000_000, 10_000_000), help="rows per file")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--buffer-rows", type=int, default=1 << 19, help="spill bucket / multi-pass buffer rows")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup-rows", type=int, default=100_000)
    parser.add_argument("--workdir", default="/work/runs/stream_data")
    parser.add_argument("--spill-dir", default=None, help="default: WORKDIR/spill")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--progress-s", type=float, default=30.0, help="seconds between progress lines")
    parser.add_argument("--worker-timeout-s", type=float, default=7200.0)
    parser.add_argument("--machine-note", default="2-core shared CPU, under load from other jobs")
    parser.add_argument("--estimate-only", action="store_true", help="print the plan and its time estimate, then stop")
    parser.add_argument("--json", default=outputs.AUTO, help="'auto': a new file under benchmarks/results/")
    parser.add_argument("--png", default=outputs.AUTO, help="'auto': a new file under benchmarks/results/; '' skips")
    parser.add_argument("--results-md", default=outputs.RESULTS_MD, help="'' to skip")
    args = parser.parse_args(argv)
    args.methods = [m for m in args.methods.split(",") if m]
    if not set(args.methods) <= set(METHODS) or "plain" not in args.methods:
        parser.error(f"--methods must include plain and be among {METHODS}; received {args.methods!r}.")
    if os.path.abspath(args.workdir).startswith(ROOT + os.sep):
        parser.error("--workdir must lie outside the repository (the data files are large).")
    args.spill_dir = args.spill_dir or os.path.join(args.workdir, "spill")
    outputs.resolve(
        parser,
        args,
        benchmark="streaming",
        tag=f"rows{outputs.range_tag(args.rows)}",
        files={"json": ".json", "png": ".png"},
    )
    return args


def _plan(args, pilots: dict, missing: list, generation_rate: float) -> float:
    """Prints the time estimate of what is left (data to write, then the measurements); returns seconds."""
    total = sum(missing) / generation_rate if missing else 0.0
    lines = [f"  write {n:,} rows: ~{n / generation_rate / 60:,.1f} min" for n in missing]
    for rows in args.rows:
        for method in args.methods:
            seconds = estimate_seconds(pilots, rows, method, batch=args.batch, buffer_rows=args.buffer_rows)
            total += args.repeats * seconds
            lines.append(f"  {rows:,} {method}: {args.repeats} x ~{seconds / 60:,.1f} min")
    print(
        "estimate (linear in rows read, from the pilots at the warm-up size, so a method's fixed costs count as per "
        "row: high for one_pass; the load changes it):",
        flush=True,
    )
    print("\n".join(lines) + f"\n  total ~{total / 60:,.0f} min", flush=True)
    return total


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    command = "python -m benchmarks.streaming " + shlex.join(argv if argv is not None else sys.argv[1:])
    os.makedirs(args.spill_dir, exist_ok=True)
    logs = tempfile.mkdtemp(prefix="streaming_workers_", dir=args.workdir)
    info = machine_info(ROOT)
    started = time.perf_counter()
    warm = data_file(args.workdir, args.warmup_rows, progress_s=args.progress_s)
    missing = [n for n in args.rows if not os.path.exists(os.path.join(args.workdir, outputs.short_number(n), "day_0"))]
    generation_rate = _generation_rate(args.workdir, args.warmup_rows) if missing else 0.0
    bytes_per_row = os.path.getsize(warm) / args.warmup_rows
    common = dict(batch=args.batch, buffer_rows=args.buffer_rows, spill_dir=args.spill_dir, seed=args.seed)
    spec = dict(common, warmup_path=warm, warmup_rows=args.warmup_rows, progress_s=args.progress_s)
    pilots = {}
    for method in args.methods:
        pilot = spec | {"method": method, "path": warm, "rows": args.warmup_rows, "label": "pilot"}
        pilots[method] = measure(pilot, logs, args.worker_timeout_s) | {"rows": args.warmup_rows}
    _plan(args, pilots, missing, generation_rate)
    if args.estimate_only:
        shutil.rmtree(logs, ignore_errors=True)
        return 0
    runs = []
    for rows in args.rows:
        path = data_file(args.workdir, rows, progress_s=args.progress_s, bytes_per_row=bytes_per_row)
        for repeat in range(args.repeats):
            order = args.methods[repeat % len(args.methods) :] + args.methods[: repeat % len(args.methods)]
            for method in order:
                run = spec | {"method": method, "path": path, "rows": rows, "label": f"repeat {repeat}"}
                run["seed"] = args.seed + repeat
                result = measure(run, logs, args.worker_timeout_s)
                runs.append({"rows": rows, "method": method, "repeat": repeat} | result)
                print(
                    f"{rows:>11,} {method:10} repeat {repeat}: {result['rows_per_s']:,.0f} rows/s, "
                    f"{result['seconds']:.1f} s ({result['cpu_seconds']:.1f} CPU s), process peak "
                    f"{result['process_peak_rss_bytes'] / 2**20:,.0f} MiB, {time.perf_counter() - started:,.0f} s "
                    "since start",
                    flush=True,
                )
    shutil.rmtree(logs, ignore_errors=True)
    minutes = (time.perf_counter() - started) / 60
    summary = summarise(runs)
    print(table(summary))
    record = {"command": command, "machine": info, "summary": summary, "runs": runs, "pilots": pilots}
    outputs.write_run(
        args,
        record,
        plot=lambda path: plot(summary, path),
        section=lambda **_: markdown(summary, command=command, info=info, args=args, minutes=minutes),
    )
    print(f"{len(runs)} epochs in {minutes:.1f} min; JSON {args.json}", flush=True)
    return 0


def _generation_rate(workdir: str, rows: int) -> float:
    """Rows per second of the data generator on `rows` rows, in a scratch directory (its set-up included)."""
    scratch = tempfile.mkdtemp(prefix="generator_rate_", dir=workdir)
    try:
        return rows / generate(os.path.join(scratch, "data"), rows, progress_s=3600)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
