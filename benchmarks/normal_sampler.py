"""Gaussian sampler throughput: ns per float32, TF's samplers vs numpy vs tfdp_embed's op.

    python -m benchmarks.normal_sampler --sizes 262144,4194304 --repeats 40 \\
        --results-md benchmarks/RESULTS.md

Samplers (each TF one inside its own `tf.function`, key/seed drawn from a
`tf.random.Generator` *inside* the function so nothing is constant-folded):
  tf_generator_normal   tf.random.Generator.normal
  tf_stateless_normal   tf.random.stateless_normal, seed = generator.make_seeds()
  numpy_standard_normal numpy.random.default_rng().standard_normal(n, float32)
                        (ziggurat, one thread, outside TensorFlow)
  fast_normal[isa]      tfdp_embed.ops.fast_normal.normal (Philox4x32-10 +
                        Box-Muller op); isa=auto plus every forced path the CPU
                        supports (avx512, avx2, portable)
  fill_floor            tf.fill with a generator-drawn value: allocating and
                        writing the output alone (the floor for any sampler)

Timing: `--warmup` calls, then `--repeats` rounds; each round calls every
sampler once, in a fresh random order, so all see the same machine load
(the machine is shared). Reported: median, p10, p90 ns per float, and the
ratio of tf_generator_normal's median to each median.

Outputs: a table on stdout, `--json` (rows, command, machine) and `--png`
(median ns per float per sampler; both default to new files of this run
under `benchmarks/results/`); `make results` regenerates
`benchmarks/RESULTS.md` from the JSON files, and `--results-md` naming another
page appends one section (a single write, after re-reading the file) with the
date, command, machine (nproc, CPU model, load average at start and end) and
versions.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import outputs
from tfdp_embed.keras2._keras import tf
from tfdp_embed.ops import fast_normal

REPO = Path(__file__).resolve().parents[1]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _cpu_flags() -> set:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _mem_gib() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    return "unknown"


def _git(*args) -> str:
    try:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30)
        return out.stdout if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def _command(argv: list) -> str:
    """The command line, with --note texts (printed below the table) elided."""
    shown, skip = [], False
    for arg in argv:
        if skip:
            shown.append("'…'")
            skip = False
        elif arg == "--note":
            shown.append(arg)
            skip = True
        elif arg.startswith("--note="):
            shown.append("--note='…'")
        else:
            shown.append(shlex.quote(arg))
    return "python -m benchmarks.normal_sampler " + " ".join(shown)


def _load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def _busy_processes(limit: int = 4) -> str:
    """The other processes using the most CPU now (ps), as 'pcpu% command' strings."""
    try:
        out = subprocess.run(
            ["ps", "-eo", "pid=,pcpu=,args=", "--sort=-pcpu"], capture_output=True, text=True, timeout=20
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    rows = []
    for line in out.splitlines():
        parts = line.split(None, 2)
        if len(parts) < 3 or int(parts[0]) == os.getpid() or parts[2].startswith("ps "):
            continue
        if float(parts[1]) < 10.0 or len(rows) >= limit:
            break
        rows.append(f"{float(parts[1]):.0f}% {parts[2][:80]}")
    return "; ".join(rows) or "none above 10% CPU"


def make_samplers(n: int, isas: list) -> dict:
    gen = tf.random.Generator.from_non_deterministic_state()

    @tf.function
    def tf_generator_normal():
        return gen.normal([n], dtype=tf.float32)

    @tf.function
    def tf_stateless_normal():
        return tf.random.stateless_normal([n], seed=gen.make_seeds(1)[:, 0], dtype=tf.float32)

    @tf.function
    def fill_floor():
        return tf.fill([n], tf.cast(gen.uniform_full_int([], tf.int64), tf.float32))

    rng = np.random.default_rng()
    samplers = {
        "tf_generator_normal": tf_generator_normal,
        "tf_stateless_normal": tf_stateless_normal,
        "numpy_standard_normal": lambda: rng.standard_normal(n, dtype=np.float32),
        "fill_floor": fill_floor,
    }
    if fast_normal.available():
        samplers["fast_normal[auto]"] = tf.function(lambda: fast_normal.normal(gen, [n], 1.0))
        for isa in isas:

            def forced(isa=isa):
                key = gen.uniform_full_int([2], tf.int64)
                return fast_normal.fast_normal([n], key, 1.0, isa=isa)

            samplers[f"fast_normal[{isa}]"] = tf.function(forced)
    return samplers


def measure(samplers: dict, warmup: int, repeats: int) -> dict:
    for fn in samplers.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in samplers}
    names = list(samplers)
    for _ in range(repeats):
        random.shuffle(names)
        for name in names:
            start = time.perf_counter()
            samplers[name]()
            times[name].append(time.perf_counter() - start)
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="262144,4194304", help="floats per call, comma-separated")
    parser.add_argument("--repeats", type=int, default=40, help="timed rounds (>= 30 for the protocol)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--results-md", default=None, help="append a section to this Markdown file")
    parser.add_argument("--json", default=outputs.AUTO, help="'auto': a new file under benchmarks/results/; '' skips")
    parser.add_argument("--png", default=outputs.AUTO, help="'auto': a new file under benchmarks/results/; '' skips")
    parser.add_argument("--note", action="append", default=[], help="free text added to the section (repeatable)")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    outputs.resolve(
        parser, args, benchmark="normal_sampler", tag=outputs.range_tag(sizes), files={"json": ".json", "png": ".png"}
    )

    flags = _cpu_flags()
    isas = [
        isa
        for isa, flag in (("avx512", "avx512f"), ("avx2", "avx2"), ("portable", None))
        if flag is None or flag in flags
    ]
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    load_start = _load()
    busy_start = _busy_processes()
    reason = fast_normal.unavailable_reason()

    rows = []
    for n in sizes:
        times = measure(make_samplers(n, isas), args.warmup, args.repeats)
        ref = float(np.median(times["tf_generator_normal"]))
        for name, ts in times.items():
            ns = np.asarray(ts) * 1e9 / n
            rows.append(
                {
                    "n": n,
                    "sampler": name,
                    "median": float(np.median(ns)),
                    "p10": float(np.percentile(ns, 10)),
                    "p90": float(np.percentile(ns, 90)),
                    "ms": float(np.median(ts)) * 1e3,
                    "speedup": ref / float(np.median(ts)),
                    "timed": len(ts),
                }
            )
    load_end = _load()

    header = "| floats/call | sampler | median ns/float | p10 – p90 ns/float | median ms/call | speed-up vs tf_generator_normal |"
    lines = [header, "|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['n']:,} | {r['sampler']} | {r['median']:.2f} | {r['p10']:.2f} – {r['p90']:.2f} | "
            f"{r['ms']:.3f} | {r['speedup']:.1f}× |"
        )
    table = "\n".join(lines)
    print(table)
    print(f"load average (1/5/15 min): start {load_start}, end {load_end}; nproc {os.cpu_count()}")
    if reason:
        print(f"fast_normal unavailable: {reason}")

    command = _command(argv if argv is not None else sys.argv[1:])
    if args.json:
        document = {
            "benchmark": "normal_sampler",
            "command": command,
            "date_utc": started,
            "cpu_model": _cpu_model(),
            "nproc": os.cpu_count(),
            "isas": isas,
            "load_average_at_start": load_start,
            "load_average_at_end": load_end,
            "versions": {"python": platform.python_version(), "tensorflow": tf.__version__, "numpy": np.__version__},
            "commit": _git("rev-parse", "HEAD").strip() or "unknown",
            "fast_normal_unavailable": reason,
            "rows": rows,
        }
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=1)
    if args.png:
        plot(rows, args.png, title=f"Gaussian sampling, ns per float32 — {os.cpu_count()} cores, {started[:10]}")
    if args.results_md:
        dirty = [line[3:] for line in _git("status", "--porcelain", "--", "tfdp_embed").splitlines() if line.strip()]
        threads = tf.config.threading.get_intra_op_parallelism_threads()
        section = "\n".join(
            [
                f"## normal_sampler — {started} — exact Gaussian sampling, ns per float32",
                "",
                f"- Command: `{command}`",
                f"- Machine: {_cpu_model()}, nproc {os.cpu_count()}, {_mem_gib()} RAM; CPU flags used: "
                f"{', '.join(i for i in isas if i != 'portable') or 'none'}; GPU: not used (CPU kernel only).",
                f"- Load average (1/5/15 min): {load_start} at start, {load_end} at end — the machine was shared "
                "(2 cores, other engineers' jobs): compare the ratios, measured round-robin in one process. "
                f"Busiest other processes at start: {busy_start}.",
                f"- Versions: Python {platform.python_version()}, tensorflow {tf.__version__}, numpy {np.__version__}; "
                f"TF intra-op threads: {threads or f'default ({os.cpu_count()})'}.",
                f"- Library: commit `{_git('rev-parse', '--short=12', 'HEAD').strip() or 'unknown'}`"
                + (f"; uncommitted library files: {', '.join(dirty)}" if dirty else "")
                + ".",
                f"- Protocol: {args.warmup} warm-up calls each, then {args.repeats} rounds calling every sampler once "
                "in random order; TF samplers inside `tf.function` with the key/seed drawn from a `tf.random.Generator` "
                "in the function (no constant folding); numpy outside TF, one thread.",
                "- fast_normal: Philox4x32-10 + Box-Muller, float32 log/sin/cos within 1.7 ulp of double libm, "
                "outputs within 3.5 ulp of the float64 transform (tfdp_embed/ops/README.md); [auto] = widest ISA.",
                *([f"- fast_normal not measured: {reason}"] if reason else []),
                "",
                table,
                "",
                *[f"{note}\n" for note in args.note],  # "(--note)" texts, verbatim
            ]
        )
        outputs.append_section(args.results_md, section, files=(args.json, args.png))
        print(f"appended to {args.results_md}")
    return 0


def plot(rows: list, path: str, *, title: str) -> None:
    """Horizontal bars: median ns per float per sampler (p10-p90 as error bars), one panel per size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r["n"] for r in rows})
    fig, axes = plt.subplots(1, len(sizes), figsize=(5 * len(sizes), 4), dpi=120, squeeze=False)
    for ax, n in zip(axes[0], sizes):
        mine = [r for r in rows if r["n"] == n]
        y = range(len(mine))
        ax.barh(
            y,
            [r["median"] for r in mine],
            xerr=[[r["median"] - r["p10"] for r in mine], [r["p90"] - r["median"] for r in mine]],
            capsize=2,
            color="tab:blue",
        )
        ax.set_yticks(list(y))
        ax.set_yticklabels([r["sampler"] for r in mine], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("ns per float32 (median; bars p10–p90)")
        ax.set_title(f"{n:,} floats per call", fontsize=9)
        ax.grid(True, axis="x", alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
