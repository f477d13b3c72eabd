"""Input-pipeline throughput of one DP epoch over a Criteo TSV: one-pass spill vs multi-pass vs a plain read.

    python -m benchmarks.streaming [--rows 1000000,10000000] [--batch 2048] [--repeats 3]

For each row count N it times, in one process and interleaved (the order
rotates between repeats), the full iteration of:

* `plain`: `criteo_dataset(file, batch_size=8192)`, parse only: the limit.
* `one_pass`: parse + exact Poisson sampling + batching with
  `one_pass_poisson_batches` (q = B / N, round(N / B) batches; the file
  read once, the sampled rows spilled to `--spill-dir` and read back).
* `multi_pass`: the same with `streaming_poisson_batches`, G =
  `--buffer-rows` // B batches per pass (the file read ceil(round(N/B) / G) times).

Throughput is N / seconds of one epoch (input rows per second); the
table gives medians over `--repeats` after a warm-up epoch of each method
on a small file, and each method's median ratio to the plain read of the
same repeat. Peak RSS is the process's VmHWM while the method ran (reset
through /proc/self/clear_refs before each run; TensorFlow included) and
its growth over the RSS at the start of the run. Disk: bytes the spill wrote.

Data: TSV files from the repository's generator
(`tfdp_embed.data.write_synthetic_criteo`, vocabulary scale 0.1, seed 0),
cached under `--workdir` (default /work/runs/stream_data), never in the
repository.

Writes a table to stdout, `--json`, `--png` (rows/s vs N) and appends a
section "streaming" to `--results-md` (`benchmarks/RESULTS.md`).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from collections.abc import Sequence

from benchmarks import cli_args, outputs
from benchmarks.machine import machine_info

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = ("plain", "one_pass", "multi_pass")
_READ_BATCH = 8192


def data_file(workdir: str, rows: int) -> str:
    """The generator's file of `rows` rows under `workdir` (written once, then reused)."""
    from tfdp_embed.data import write_synthetic_criteo

    directory = os.path.join(workdir, outputs.short_number(rows))
    path = os.path.join(directory, "day_0")
    if not os.path.exists(path):
        print(f"writing {rows:,} synthetic rows to {path} ...", flush=True)
        write_synthetic_criteo(directory, num_rows=rows, seed=0, vocab_scale=0.1)
    return path


def epoch(method: str, path: str, rows: int, *, batch: int, buffer_rows: int, spill_dir: str, seed: int) -> dict:
    """One epoch of `method` over `path`: seconds, rows in the batches, spill bytes, peak RSS."""
    from tfdp_embed.data import CriteoReadStats, criteo_dataset, one_pass_poisson_batches, streaming_poisson_batches

    source = criteo_dataset([path], batch_size=_READ_BATCH, stats=CriteoReadStats())
    q = batch / rows
    info = None
    if method == "one_pass":
        dataset, info = one_pass_poisson_batches(
            source, sampling_probability=q, num_examples=rows, seed=seed, spill_dir=spill_dir,
            bucket_rows=buffer_rows, source_batched=True,
        )  # fmt: skip
    elif method == "multi_pass":
        dataset, info = streaming_poisson_batches(
            source, sampling_probability=q, num_examples=rows, batches_per_pass=max(1, buffer_rows // batch),
            seed=seed, source_batched=True,
        )  # fmt: skip
    else:
        dataset = source
    start_rss = _reset_peak_rss()
    started = time.perf_counter()
    sampled = batches = 0
    for _, labels in dataset:
        sampled += int(labels.shape[0])
        batches += 1
    seconds = time.perf_counter() - started
    spill = getattr(info, "spill", None)
    passes = 1
    if method == "multi_pass":
        passes = -(-info.batches_per_epoch // min(info.batches_per_pass, info.batches_per_epoch))
    return {
        "seconds": seconds,
        "rows_per_s": rows / seconds,
        "batches": batches,
        "sampled_rows": sampled,
        "passes": passes,
        "spill_bytes": spill.bytes_written if spill is not None else 0,
        "largest_bucket_records": spill.largest_bucket_records if spill is not None else None,
        "peak_rss_bytes": _peak_rss(),
        "start_rss_bytes": start_rss,
    }


def _status_kb(field: str) -> int:
    with open("/proc/self/status", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _reset_peak_rss() -> int:
    """Resets VmHWM to the current RSS (Linux clear_refs "5"); returns the current RSS in bytes."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="utf-8") as handle:
            handle.write("5")
    except OSError:
        pass  # no reset: the peak is then the process's so far (an upper bound)
    return _status_kb("VmRSS") * 1024


def _peak_rss() -> int:
    return _status_kb("VmHWM") * 1024


def summarise(runs: list[dict]) -> list[dict]:
    """Per (rows, method): medians over repeats, the median per-repeat ratio to plain, the largest peak RSS."""
    out = []
    for rows in sorted({r["rows"] for r in runs}):
        plain = {r["repeat"]: r["rows_per_s"] for r in runs if r["rows"] == rows and r["method"] == "plain"}
        for method in METHODS:
            mine = [r for r in runs if r["rows"] == rows and r["method"] == method]
            if not mine:
                continue
            ratios = [r["rows_per_s"] / plain[r["repeat"]] for r in mine if r["repeat"] in plain]
            out.append(
                {
                    "rows": rows,
                    "method": method,
                    "repeats": len(mine),
                    "rows_per_s": statistics.median(r["rows_per_s"] for r in mine),
                    "ratio_to_plain": statistics.median(ratios) if ratios else None,
                    "passes": mine[0]["passes"],
                    "peak_rss_bytes": max(r["peak_rss_bytes"] for r in mine),
                    "rss_growth_bytes": max(r["peak_rss_bytes"] - r["start_rss_bytes"] for r in mine),
                    "spill_bytes": mine[0]["spill_bytes"],
                }
            )
    return out


def table(summary: list[dict]) -> str:
    head = "| rows | method | file reads | rows/s (median) | / plain | peak RSS GiB | RSS growth MiB | spill MiB | repeats |"
    lines = [head, "|" + "---|" * 9]
    for s in summary:
        ratio = "—" if s["ratio_to_plain"] is None else f"{s['ratio_to_plain']:.2f}x"
        lines.append(
            f"| {s['rows']:,} | {s['method']} | {s['passes']} | {s['rows_per_s']:,.0f} | {ratio} | "
            f"{s['peak_rss_bytes'] / 2**30:.2f} | {s['rss_growth_bytes'] / 2**20:,.0f} | "
            f"{s['spill_bytes'] / 2**20:,.0f} | {s['repeats']} |"
        )
    return "\n".join(lines)


def plot(summary: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for method in METHODS:
        points = [(s["rows"], s["rows_per_s"]) for s in summary if s["method"] == method]
        if points:
            ax.plot(*zip(*points), marker="o", label=method)
    ax.set_xscale("log")
    ax.set_xlabel("rows N")
    ax.set_ylabel("input rows / s (one epoch, median)")
    ax.set_title("One DP epoch's input pipeline (parse + sample + batch)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown(summary: list[dict], *, command: str, info: dict, args, minutes: float) -> str:
    v = info["versions"]
    one = [s for s in summary if s["method"] == "one_pass" and s["ratio_to_plain"] is not None]
    verdict = ", ".join(f"{s['ratio_to_plain']:.2f}x at N={s['rows']:,}" for s in one) or "not measured"
    return "\n".join(
        [
            f"## streaming — {info['date_utc']} — one DP epoch's input pipeline: one-pass spill vs multi-pass vs plain read",
            "",
            f"- Command: `nice -n 10 {command}` ({minutes:.1f} min wall in all).",
            f"- Machine: {info['cpu_model']}, nproc {info['nproc']}, {info['memory_total_gb']} GiB RAM, 2-core shared "
            f"CPU, under load from other jobs (load average at start {info['load_average_at_start']}); no GPU.",
            f"- Versions: tensorflow {v.get('tensorflow')}, numpy {v.get('numpy')}; commit "
            f"{info['git'].get('commit', '?')}.",
            f"- Workload: batch B = {args.batch} (q = B / N, round(N / B) Poisson batches), read chunks of "
            f"{_READ_BATCH} rows, spill bucket / multi-pass buffer {args.buffer_rows:,} rows, spill on local disk "
            f"(`{args.spill_dir}`). Medians of {args.repeats} repeats after one warm-up epoch per method, all "
            "in one process, methods interleaved; the ratio is the median over repeats of method / plain.",
            f"- Goal >= 0.5x the plain read, flat in N. One-pass measured: {verdict}.",
            "",
            table(summary),
            "",
            f"Plot: `{outputs.shown_path(args.png) if args.png else 'not written'}`. "
            f"JSON: `{outputs.shown_path(args.json) if args.json else 'not written'}`.",
            "",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
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
    parser.add_argument("--json", default=outputs.AUTO, help="'auto': a new file under benchmarks/results/")
    parser.add_argument("--png", default=outputs.AUTO, help="'auto': a new file under benchmarks/results/; '' skips")
    parser.add_argument("--results-md", default=outputs.RESULTS_MD, help="'' to skip")
    args = parser.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    if not set(methods) <= set(METHODS) or "plain" not in methods:
        parser.error(f"--methods must include plain and be among {METHODS}; received {args.methods!r}.")
    if os.path.abspath(args.workdir).startswith(ROOT + os.sep):
        parser.error("--workdir must lie outside the repository (the data files are large).")
    args.spill_dir = args.spill_dir or os.path.join(args.workdir, "spill")
    os.makedirs(args.spill_dir, exist_ok=True)
    outputs.resolve(
        parser, args, benchmark="streaming", tag=f"rows{outputs.range_tag(args.rows)}",
        files={"json": ".json", "png": ".png"},
    )  # fmt: skip
    command = "python -m benchmarks.streaming " + shlex.join(argv if argv is not None else sys.argv[1:])
    info = machine_info(ROOT)
    started = time.perf_counter()
    common = dict(batch=args.batch, buffer_rows=args.buffer_rows, spill_dir=args.spill_dir)
    warm = data_file(args.workdir, args.warmup_rows)
    for method in methods:
        epoch(method, warm, args.warmup_rows, **common, seed=args.seed)
    runs = []
    for rows in args.rows:
        path = data_file(args.workdir, rows)
        for repeat in range(args.repeats):
            order = methods[repeat % len(methods) :] + methods[: repeat % len(methods)]
            for method in order:
                result = epoch(method, path, rows, **common, seed=args.seed + repeat)
                runs.append({"rows": rows, "method": method, "repeat": repeat} | result)
                print(
                    f"{rows:>11,} {method:10} repeat {repeat}: {result['rows_per_s']:,.0f} rows/s, "
                    f"{result['seconds']:.1f} s, peak {result['peak_rss_bytes'] / 2**30:.2f} GiB",
                    flush=True,
                )
    minutes = (time.perf_counter() - started) / 60
    summary = summarise(runs)
    print(table(summary))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": command, "machine": info, "summary": summary, "runs": runs}, f, indent=2)
    if args.png:
        plot(summary, args.png)
    if args.results_md:
        section = markdown(summary, command=command, info=info, args=args, minutes=minutes)
        outputs.append_section(args.results_md, section, files=(args.json, args.png))
    print(f"{len(runs)} epochs in {minutes:.1f} min; JSON {args.json}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
