"""Step time of every mechanism on BENCHMARKS.md's reference workload, against the fast non-private step.

    python -m benchmarks.step_time --mechanisms none,dense,tfp_keras_sgd,eana,lazy,fest,adafest \\
        --vocab 100000,1000000,10000000 --dim 64 --batch 1024 --steps 30

Workload: one `vocab x dim` float32 table, 4 ids per example mean-pooled
(uniform ids, or Zipf with `--zipf A`), Dense(64, relu) -> Dense(1),
logistic loss, batch 1024, legacy SGD (lr 0.1). Ids are pre-generated
so input generation is not timed; by default no batch is used twice (the
rows of a recently used batch would still be in cache), the plain step of
`ratio_to_none` included: it draws from its own batches.

Mechanisms:
  none            plain tf.function step: tape.gradient, the table gradient
                  stays `IndexedSlices`, `keras.optimizers.legacy.SGD`
                  (keras Embedding + mean pooling). The baseline.
  dpmodel_none    `DPModel` with `NonPrivate` (our wrapper's overhead).
  tfp_keras_sgd   tensorflow-privacy 0.9's DPKerasSGDOptimizer; the number
                  of microbatches is the largest power of two whose dense
                  per-microbatch jacobian fits `--tfp-jacobian-gb` (recorded).
  any name in tfdp_embed.mechanisms.MECHANISMS (dense, eana, lazy, fest,
                  adafest, ...): `DPModel.train_step` under `tf.function`.
                  `lazy` catches rows up in the embedding's read hook, just
                  before the lookup reads them (one fused op). Names not in
                  MECHANISMS are recorded as "not measured".
  lazy_lookahead  LazyDP with the one-batch lookahead (`DPModel(lookahead=
                  True)`, the next batch's ids with each batch): the next
                  batch's rows are caught up at the end of each step.

  adafest@R       DP-AdaFEST with tau chosen per vocabulary so that R rows are
                  expected to survive by noise alone (`--adafest-noise-rows R`,
                  `adafest.threshold_for_noise_rows`), run whenever `adafest`
                  is: with the fixed `--adafest-threshold` the noise-only rows
                  grow as p V, and so does the step; both rows are recorded.

Timing: median, p10 and p90 of `--steps` steps after `--warmup` steps; a
mechanism stops early, after at least one timed step, once its timed steps
exceed `--max-seconds-per-mechanism` (the number timed is recorded). Every
mechanism's process also times the plain step on the *same* model,
alternating one mechanism step with one plain step: `ratio_to_none` is the
mechanism's median over that interleaved plain median (same process, same
load); `ratio_to_none_row` divides by the `none` row of the same vocabulary.

Processes: `--isolation mechanism` (default) runs each (vocab, mechanism)
in its own subprocess, so an OOM loses one row and `peak_rss_mb` is that
mechanism's process peak (VmHWM; it includes TensorFlow itself, ~0.6 GB,
and the table, which is written in 2^18-row chunks so that its creation
adds no table-sized temporaries: TF's CPU allocator never returns those);
`--isolation vocab` runs all mechanisms of one vocabulary in one process,
one after the other (VmHWM is reset before each, but memory an earlier
mechanism did not return counts). A watchdog kills a worker whose RSS passes
`--max-rss-gb`, or when the machine's MemAvailable drops below
`--min-available-gb`, or after `--worker-timeout-s`; its rows are
"not measured" with that reason. Nothing is ever estimated.

Speed-up vs dense: for every sparse mechanism and vocabulary, the median
`dense` step (our DP-SGD, with the fast Gaussian op) and the median
`tfp_keras_sgd` step (tensorflow-privacy's DPKerasSGDOptimizer, the peer
dense DP-SGD) over the mechanism's median, when those rows were measured in
the same run; "not measured" otherwise.

Front ends: `--front-end keras2` (default) runs everything under tf-keras
with `keras.optimizers.legacy.SGD`; `keras3` under Keras 3 (`import keras`)
with `keras.optimizers.SGD` (momentum 0; `tfp_keras_sgd` and
`lazy_lookahead` are tf-keras only and recorded as not measured); `both`
times each mechanism under both on the same workload, by default in one
process per mechanism and repeat with the two front ends' steps alternated
(`--pairing steps`; each front end's peak RSS is VmHWM reset before building
it), or in two processes back to back (`--pairing processes`), the order
alternating per repeat, and reports per mechanism Keras 3 ÷ tf-keras of the
DP step and of the plain step, each front end's DP ÷ non-private ratio and
peak RSS (`front_end_comparison` in the JSON, `benchmarks/step_time_compare.py`).
Keras 3 rows are labelled "[Keras 3]".

Outputs: a table on stdout, `--json` (results + machine + settings), a
log-log plot `--png` (both default to new files of this run under
`benchmarks/results/`, see `benchmarks/outputs.py`); `make results`
regenerates `benchmarks/RESULTS.md` from the JSON files (`--results-md` naming
another page appends a Markdown section under its "New measurements" heading).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks import cli_args, machine, outputs
from benchmarks.plot_step_time import plot_step_time
from benchmarks.step_time_compare import comparison_lines, comparison_table, front_end_comparison

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MECHANISMS = "none,dense,tfp_keras_sgd,eana,lazy,fest,adafest"
# Fields every result row has (the JSON schema the smoke test checks; rows carry more).
RESULT_KEYS = (
    "mechanism",
    "vocab",
    "dim",
    "batch",
    "zipf",
    "median_step_s",
    "p10_step_s",
    "p90_step_s",
    "steps_timed",
    "ratio_to_none",
    "peak_rss_mb",
    "notes",
)


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def parse_args(argv: list[str]) -> argparse.Namespace:
    total_gb = (machine.meminfo_kb("MemTotal") or 8 * 2**20) / 2**20
    parser = argparse.ArgumentParser(prog="python -m benchmarks.step_time", description=__doc__.splitlines()[0])
    parser.add_argument("--mechanisms", type=_names, default=_names(DEFAULT_MECHANISMS))
    parser.add_argument("--vocab", type=cli_args.ints, default=cli_args.ints("100000,1000000,10000000"))
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per mechanism (>= 30 for results)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--zipf", type=float, default=None, help="Zipf exponent A (> 0); uniform ids when absent")
    parser.add_argument("--json", default=outputs.AUTO, help="'auto': a new file under benchmarks/results/")
    parser.add_argument("--results-md", default=outputs.RESULTS_MD, help="'' to skip")
    parser.add_argument("--png", default=outputs.AUTO, help="'auto': a new file under benchmarks/results/; '' to skip")
    parser.add_argument("--max-seconds-per-mechanism", type=float, default=120.0)
    parser.add_argument("--isolation", choices=("mechanism", "vocab"), default="mechanism")
    parser.add_argument(
        "--front-end",
        choices=("keras2", "keras3", "both"),
        default="keras2",
        help="tf-keras (legacy SGD), Keras 3 (keras.optimizers.SGD), or both side by side (Keras 3 ÷ tf-keras)",
    )
    parser.add_argument(
        "--pairing",
        choices=("steps", "processes"),
        default="steps",
        help="with --front-end both: both front ends in one process per mechanism, steps alternated (steps), "
        "or one process per front end, back to back (processes)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="processes per (vocab, mechanism), round-robin; rows report medians over them (BENCHMARKS.md: repeat)",
    )
    parser.add_argument("--max-rss-gb", type=float, default=round(max(1.0, total_gb - 3.0), 1))
    parser.add_argument("--min-available-gb", type=float, default=1.0)
    parser.add_argument("--worker-timeout-s", type=float, default=1800.0)
    parser.add_argument(
        "--num-batches", type=int, default=0, help="pre-generated batches, half per stream; 0: enough that none repeats"
    )
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--l2-norm-clip", type=float, default=1.0)
    parser.add_argument("--noise-multiplier", type=float, default=1.0)
    parser.add_argument("--fest-top-k", type=int, default=4096, help="DP-FEST rows kept (min with vocab)")
    parser.add_argument("--fest-selection-epsilon", type=float, default=0.1)
    parser.add_argument("--adafest-ratio", type=float, default=5.0, help="sigma1/sigma2 (paper: 5 or 10 best)")
    parser.add_argument("--adafest-contribution-clip", type=float, default=1.0)
    parser.add_argument("--adafest-threshold", type=float, default=19.0)
    parser.add_argument(
        "--adafest-noise-rows",
        type=float,
        default=1000.0,
        help="also time adafest@R: tau per vocabulary with R expected noise-only rows (0: off)",
    )
    parser.add_argument("--tfp-microbatches", default="auto")
    parser.add_argument("--tfp-jacobian-gb", type=float, default=6.0)
    parser.add_argument("--note", default="", help="free text added to the RESULTS.md section")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 1:
        parser.error("--steps and --warmup must be >= 1")
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if args.zipf is not None and args.zipf <= 0:
        parser.error("--zipf must be > 0")
    if args.adafest_noise_rows < 0:
        parser.error("--adafest-noise-rows must be >= 0 (0 turns the adafest@R rows off)")
    ids = f"zipf{args.zipf:g}" if args.zipf else "uniform"
    ids += "" if args.front_end == "keras2" else f"-{args.front_end}"
    outputs.resolve(
        parser,
        args,
        benchmark="step_time",
        tag=f"{ids}-{outputs.range_tag(args.vocab)}",
        files={"json": ".json", "png": ".png"},
    )
    return args


# -- running workers ------------------------------------------------------------


def _tail(path: str, lines: int = 3) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = [line.strip() for line in handle if line.strip() and "cuInit" not in line]
    except OSError:
        return ""
    return " | ".join(text[-lines:])[:400]


def run_worker(spec: dict, workdir: str, args: argparse.Namespace, tag: str) -> dict:
    """Runs one worker process under the memory/time watchdog; returns its report plus process facts."""
    spec_path = os.path.join(workdir, f"{tag}.spec.json")
    out_path = os.path.join(workdir, f"{tag}.out.json")
    log_path = os.path.join(workdir, f"{tag}.log")
    with open(spec_path, "w", encoding="utf-8") as handle:
        json.dump(spec, handle)
    load_before = [round(x, 2) for x in os.getloadavg()]
    library = machine.tree_digest(os.path.join(REPO, "tfdp_embed"))
    start = time.monotonic()
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.step_time_worker", spec_path, out_path],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    killed, max_rss_kb, min_available_kb = None, 0, None
    limit_kb, floor_kb = args.max_rss_gb * 2**20, args.min_available_gb * 2**20
    while True:
        pid, status, rusage = os.wait4(proc.pid, 0 if killed else os.WNOHANG)
        if pid:
            break
        rss = machine.status_kb("VmRSS", proc.pid)
        max_rss_kb = max(max_rss_kb, rss)
        available = machine.meminfo_kb("MemAvailable")
        if available is not None:
            min_available_kb = available if min_available_kb is None else min(min_available_kb, available)
        if rss > limit_kb:
            killed = f"killed by the memory guard: worker RSS {rss / 2**20:.2f} GB > --max-rss-gb {args.max_rss_gb:g}"
        elif available is not None and available < floor_kb:
            killed = (
                f"killed by the memory guard: MemAvailable {available / 2**20:.2f} GB < --min-available-gb "
                f"{args.min_available_gb:g} (worker RSS {rss / 2**20:.1f} GB)"
            )
        elif time.monotonic() - start > args.worker_timeout_s:
            killed = f"killed after --worker-timeout-s {args.worker_timeout_s:g}"
        if killed:
            proc.kill()
            continue
        time.sleep(0.2)
    proc.returncode = os.waitstatus_to_exitcode(status)
    report = {"results": []}
    if os.path.exists(out_path):
        with open(out_path, encoding="utf-8") as handle:
            report = json.load(handle)
    report["process"] = {
        "tag": tag,
        "mechanisms": spec["mechanisms"],
        "vocab": spec["vocab"],
        "exit_code": proc.returncode,
        "killed": killed,
        "wall_s": round(time.monotonic() - start, 1),
        "ru_maxrss_mb": round(rusage.ru_maxrss / 1024, 1),
        "polled_max_rss_mb": round(max_rss_kb / 1024, 1),
        "min_mem_available_gb": None if min_available_kb is None else round(min_available_kb / 2**20, 2),
        "library_tree_sha1": library,
        "load_average_before": load_before,
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "log_tail": _tail(log_path),
        "tf_devices": report.get("tf_devices", []),
        "registered_mechanisms": report.get("registered_mechanisms"),
        "fused_ops": report.get("fused_ops"),
    }
    done = {r["mechanism"] for r in report["results"]}
    missing = [m for m in spec["mechanisms"] if m not in done]
    if missing:
        if killed:
            reason = killed
        elif proc.returncode < 0:
            name = signal.Signals(-proc.returncode).name
            reason = f"worker died with {name}" + (" (likely the kernel OOM killer)" if name == "SIGKILL" else "")
        else:
            reason = f"worker exited with code {proc.returncode}"
        tail = report["process"]["log_tail"]
        running = report.get("running")
        for name in missing:
            why = reason if name == running or running is None else f"not reached: {reason} while running {running}"
            report["results"].append(
                {
                    "mechanism": name,
                    "median_step_s": None,
                    "p10_step_s": None,
                    "p90_step_s": None,
                    "steps_timed": 0,
                    "peak_rss_mb": round(rusage.ru_maxrss / 1024, 1) if name == running or running is None else None,
                    "not_measured": why,
                    "notes": f"not measured: {why}" + (f" (log: {tail})" if tail and not killed else ""),
                }
            )
    return report


def tfp_microbatches(setting: str, *, vocab: int, dim: int, batch: int, jacobian_gb: float) -> int:
    """`--tfp-microbatches`: an int, or "auto" = the largest power of two dividing the batch whose
    dense per-microbatch table jacobian (m x vocab x dim float32) fits in `jacobian_gb`."""
    if setting != "auto":
        return int(setting)
    per = vocab * dim * 4
    m = 1
    while m * 2 <= batch and batch % (m * 2) == 0 and m * 2 * per <= jacobian_gb * 2**30:
        m *= 2
    return m


_MEMORY_FAILURES = ("memory guard", "SIGKILL", "out of memory", "ResourceExhausted", "MemoryError")


def _run_group(spec: dict, workdir: str, args: argparse.Namespace, tag: str, processes: list) -> list:
    """Runs one worker; with `--tfp-microbatches auto`, a lone tfp_keras_sgd that runs out of
    memory is retried with half the microbatches, down to 1 (every attempt is recorded)."""
    attempts = []
    while True:
        report = run_worker(spec, workdir, args, tag)
        processes.append(report["process"])
        results = report["results"]
        retry = (
            spec["mechanisms"] == ["tfp_keras_sgd"]
            and args.tfp_microbatches == "auto"
            and spec["tfp_microbatches"] > 1
            and results
            and any(word in (results[0].get("not_measured") or "") for word in _MEMORY_FAILURES)
        )
        if not retry:
            break
        attempts.append((spec["tfp_microbatches"], results[0]["not_measured"]))
        spec = {**spec, "tfp_microbatches": spec["tfp_microbatches"] // 2}
        tag = f"{tag}_m{spec['tfp_microbatches']}"
        print(f"    (retrying tfp_keras_sgd with {spec['tfp_microbatches']} microbatches)", flush=True)
    if attempts:
        tried = ", ".join(str(m) for m, _ in attempts)
        for result in results:
            result["failed_attempts"] = [f"{m} microbatches: {why}" for m, why in attempts]
            result["notes"] = "; ".join(
                filter(None, [result.get("notes", ""), f"auto: {tried} microbatches ran out of memory first"])
            )
    return results


def _base_spec(args: argparse.Namespace) -> dict:
    keys = (
        "dim",
        "batch",
        "zipf",
        "seed",
        "num_batches",
        "warmup",
        "steps",
        "max_seconds_per_mechanism",
        "l2_norm_clip",
        "noise_multiplier",
        "fest_top_k",
        "fest_selection_epsilon",
        "adafest_ratio",
        "adafest_contribution_clip",
        "adafest_threshold",
    )
    return {key: getattr(args, key) for key in keys}


def front_ends(setting: str) -> list[str]:
    """`--front-end`: the front ends to run, tf-keras first ("both": keras2 and keras3)."""
    return ["keras2", "keras3"] if setting == "both" else [setting]


def _run_front_end(args, base_spec: dict, vocab: int, group: list, repeat: int, fe: str, workdir, processes) -> list:
    """One worker: the mechanisms of `group` at `vocab` under front end `fe` (plus adafest@R); its rows.

    `fe` "both": one worker runs both front ends (`step_time_worker.measure_pair`), tf-keras built first
    in even repeats; a row lost with the worker is "not measured" under each front end.
    """
    tag = f"v{vocab}_{'_'.join(group)}".replace("+", "plus")[:80] + (f"_r{repeat}" if repeat else "")
    tag += "" if args.front_end == "keras2" else f"_{fe}"
    label = f" (repeat {repeat + 1} of {args.repeats})" if args.repeats > 1 else ""
    label += "" if args.front_end == "keras2" else f" [{fe}]"
    print(f"[step_time] vocab {vocab:,}: {', '.join(group)}{label} ...", flush=True)
    base_spec = {**base_spec, "front_end": fe}
    if fe == "both":
        base_spec["pair_order"] = front_ends("both")[:: 1 if repeat % 2 == 0 else -1]
    spec = {**base_spec, "vocab": vocab, "mechanisms": group}
    spec["tfp_microbatches"] = tfp_microbatches(
        args.tfp_microbatches, vocab=vocab, dim=args.dim, batch=args.batch, jacobian_gb=args.tfp_jacobian_gb
    )
    results = _run_group(spec, workdir, args, tag, processes)
    if "adafest" in group and args.adafest_noise_rows > 0:
        results = results + _run_adafest_budget(base_spec, vocab, workdir, args, processes)
    if fe == "both":
        results = [r if r.get("front_end") else {**r, "front_end": f} for r in results for f in _lost_as(r)]
    for result in results:
        result.update(
            vocab=vocab, dim=args.dim, batch=args.batch, zipf=args.zipf, front_end=result.get("front_end", fe)
        )
        result["process_ru_maxrss_mb"] = processes[-1]["ru_maxrss_mb"]
        print("    " + format_line(result), flush=True)
    return results


def _lost_as(row: dict) -> list:
    """The front ends a row of a "both" worker stands for: its own, or both for a row the worker lost."""
    return [row["front_end"]] if row.get("front_end") else front_ends("both")


def collect(args: argparse.Namespace, workdir: str) -> tuple[list, list]:
    """Runs every (vocab, mechanism, front end) and returns (result rows, worker process facts).

    With `--front-end both`, each mechanism's tf-keras and Keras 3 run in one worker, their steps
    alternated (`--pairing steps`), or in two processes back to back (`--pairing processes`); tf-keras
    first in even repeats and Keras 3 first in odd ones.
    """
    rows, processes = [], []
    base_spec, names = _base_spec(args), front_ends(args.front_end)
    for vocab in args.vocab:
        groups = [[m] for m in args.mechanisms] if args.isolation == "mechanism" else [list(args.mechanisms)]
        runs: dict = {}  # (front end, mechanism) -> its rows, one per repeat (round-robin over the mechanisms)
        for repeat in range(args.repeats):
            for group in groups:
                in_one = args.front_end == "both" and args.pairing == "steps"
                for fe in ["both"] if in_one else names if repeat % 2 == 0 else names[::-1]:
                    for result in _run_front_end(args, base_spec, vocab, group, repeat, fe, workdir, processes):
                        runs.setdefault((result["front_end"], result["mechanism"]), []).append(result)
        vocab_rows = sorted((merge_repeats(rows) for rows in runs.values()), key=lambda r: names.index(r["front_end"]))
        for fe in names:
            _add_ratios([r for r in vocab_rows if r["front_end"] == fe])
        for result in vocab_rows:
            for key in RESULT_KEYS:
                result.setdefault(key, None)
        rows.extend(vocab_rows)
    return rows, processes


def adafest_budget_name(rows: float) -> str:
    """Row label of DP-AdaFEST with tau set for `rows` expected noise-only rows."""
    return f"adafest@{rows:g}"


def adafest_budget_threshold(args: argparse.Namespace, vocab: int) -> float:
    """tau for `--adafest-noise-rows` at this vocabulary (sigma1 from the benchmark's sigma and ratio)."""
    from tfdp_embed.mechanisms.adafest import (
        split_noise_multiplier,
        threshold_for_noise_rows,
    )

    sigma1, _ = split_noise_multiplier(args.noise_multiplier, ratio=args.adafest_ratio)
    return threshold_for_noise_rows(
        vocabulary_size=vocab,
        expected_noise_rows=args.adafest_noise_rows,
        contribution_clip=args.adafest_contribution_clip,
        contribution_noise_multiplier=sigma1,
    )


def _run_adafest_budget(base_spec: dict, vocab: int, workdir: str, args: argparse.Namespace, processes: list) -> list:
    """DP-AdaFEST with tau from `adafest_budget_threshold`, in its own worker, relabelled adafest@R."""
    name = adafest_budget_name(args.adafest_noise_rows)
    if args.adafest_noise_rows > vocab / 2:
        why = f"--adafest-noise-rows {args.adafest_noise_rows:g} is more than half of the {vocab:,} rows (tau would be < 0)"
        row = {
            "mechanism": name,
            "median_step_s": None,
            "p10_step_s": None,
            "p90_step_s": None,
            "steps_timed": 0,
            "peak_rss_mb": None,
            "not_measured": why,
            "notes": f"not measured: {why}",
        }
        row.update(vocab=vocab, dim=args.dim, batch=args.batch, zipf=args.zipf)
        print("    " + format_line(row), flush=True)
        return [row]
    tau = adafest_budget_threshold(args, vocab)
    print(f"[step_time] vocab {vocab:,}: {name} (tau {tau:.4g}) ...", flush=True)
    spec = {**base_spec, "vocab": vocab, "mechanisms": ["adafest"], "adafest_threshold": tau, "tfp_microbatches": 1}
    rows = _run_group(spec, workdir, args, f"v{vocab}_adafest_at_{args.adafest_noise_rows:g}", processes)
    for result in rows:
        result.update(vocab=vocab, dim=args.dim, batch=args.batch, zipf=args.zipf, mechanism=name)
        result["adafest_threshold"] = tau
        result["adafest_expected_noise_rows"] = args.adafest_noise_rows
        result["process_ru_maxrss_mb"] = processes[-1]["ru_maxrss_mb"]
        result["notes"] = "; ".join(
            filter(
                None, [f"tau={tau:.4g} for {args.adafest_noise_rows:g} expected noise-only rows", result.get("notes")]
            )
        )
        print("    " + format_line(result), flush=True)
    return rows


# Rows that are not sparse mechanisms (no speed-up vs dense is computed for them).
_NOT_SPARSE = ("none", "dpmodel_none", "dense", "tfp_keras_sgd")


def speedups_vs_dense(rows: list) -> list:
    """Per vocabulary and sparse mechanism: median dense step / median step, and the same for tfp_keras_sgd.

    Returns:
      dicts with mechanism, vocab, median_step_s, dense_over_mechanism and
      tfp_keras_sgd_over_mechanism (None when either median was not measured
      in this run), in the order of `rows`.
    """
    medians = {(r.get("front_end"), r["vocab"], r["mechanism"]): r.get("median_step_s") for r in rows}
    out = []
    for r in rows:
        if r["mechanism"] in _NOT_SPARSE:
            continue
        median = r.get("median_step_s")
        entry = {"mechanism": r["mechanism"], "vocab": r["vocab"], "median_step_s": median}
        if r.get("front_end", "keras2") != "keras2":
            entry["front_end"] = r["front_end"]
        for peer in ("dense", "tfp_keras_sgd"):
            base = medians.get((r.get("front_end"), r["vocab"], peer))
            entry[f"{peer}_over_mechanism"] = base / median if base and median else None
        out.append(entry)
    return out


def speedup_table(rows: list) -> str:
    """Markdown table of `speedups_vs_dense(rows)` ("not measured" where a median is missing)."""
    lines = [
        "| mechanism | vocab | median step | dense ÷ mechanism | tfp_keras_sgd ÷ mechanism |",
        "|---|---:|---:|---:|---:|",
    ]
    for e in speedups_vs_dense(rows):
        cells = [
            "not measured" if e[f"{peer}_over_mechanism"] is None else fmt_ratio(e[f"{peer}_over_mechanism"])
            for peer in ("dense", "tfp_keras_sgd")
        ]
        lines.append(f"| {row_label(e)} | {e['vocab']:,} | {fmt_time(e['median_step_s'])} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def _same_process_ratios(r: dict) -> tuple:
    """(wall, CPU) ratio of a row to the plain step timed in its own process (None where not measured)."""
    if r["mechanism"] == "none":
        return (1.0 if r.get("median_step_s") else None), (1.0 if r.get("cpu_median_step_s") else None)
    median, base = r.get("median_step_s"), r.get("none_in_process_median_s")
    cpu, cpu_base = r.get("cpu_median_step_s"), r.get("none_in_process_cpu_median_s")
    return (median / base if median and base else None), (cpu / cpu_base if cpu and cpu_base else None)


def _median(values: list):
    values = [v for v in values if v is not None]
    return float(statistics.median(values)) if values else None


def merge_repeats(runs: list) -> dict:
    """One row from `--repeats` processes of one mechanism.

    Times (median, p10, p90, the in-process plain medians) are medians over
    the processes; `ratio_to_none` and `cpu_ratio_to_none` are the medians
    of the per-process same-process ratios (each process's own ratio, never
    one process's time over another's plain step), kept per process in
    `ratio_to_none_runs` / `cpu_ratio_to_none_runs` and summarised in the
    notes; `steps_timed` is the total and `peak_rss_mb` the maximum.
    """
    if len(runs) == 1:
        return runs[0]
    measured = [r for r in runs if r.get("median_step_s")]
    if not measured:
        return runs[0]
    row = dict(measured[0])
    for key in (
        "median_step_s",
        "p10_step_s",
        "p90_step_s",
        "none_in_process_median_s",
        "cpu_median_step_s",
        "none_in_process_cpu_median_s",
    ):
        row[key] = _median([r.get(key) for r in measured])
    for key in ("median_step_s", "cpu_median_step_s", "none_in_process_median_s", "none_in_process_cpu_median_s"):
        row[f"{key}_runs"] = [r.get(key) for r in runs]  # per process, in repeat order (None: not measured)
    row["steps_timed"] = sum(int(r.get("steps_timed") or 0) for r in measured)
    row["peak_rss_mb"] = max((r.get("peak_rss_mb") or 0) for r in measured) or None
    ratios = [_same_process_ratios(r) for r in measured]
    row["ratio_to_none_runs"] = [w for w, _ in ratios]
    row["cpu_ratio_to_none_runs"] = [c for _, c in ratios]
    row["processes"] = len(runs)
    notes = [n for n in (measured[0].get("notes") or "").split("; ") if n]
    if row["mechanism"] != "none":
        shown = ", ".join(fmt_ratio(w) for w in sorted(w for w in row["ratio_to_none_runs"] if w is not None))
        notes.insert(0, f"{len(measured)} processes, × none (same process) each: {shown}")
    failed = [r for r in runs if not r.get("median_step_s")]
    if failed:
        notes.append(
            f"{len(failed)} of {len(runs)} processes not measured: {failed[0].get('not_measured') or failed[0].get('notes')}"
        )
    row["notes"] = "; ".join(notes)
    return row


def _add_ratios(rows: list) -> None:
    none_row = next((r for r in rows if r["mechanism"] == "none" and r.get("median_step_s")), None)
    for r in rows:
        median = r.get("median_step_s")
        wall, cpu = _same_process_ratios(r)
        if r.get("ratio_to_none_runs"):  # merged repeats: the median of the per-process ratios
            wall, cpu = _median(r["ratio_to_none_runs"]), _median(r["cpu_ratio_to_none_runs"])
        r["ratio_to_none"] = wall
        r["cpu_ratio_to_none"] = cpu
        r["ratio_to_none_row"] = median / none_row["median_step_s"] if median and none_row else None


# -- reporting ------------------------------------------------------------------
def row_label(r: dict) -> str:
    """The mechanism, with "[Keras 3]" for a Keras 3 row (tf-keras rows: the mechanism alone)."""
    return r["mechanism"] + (" [Keras 3]" if r.get("front_end") == "keras3" else "")


def fmt_time(seconds) -> str:
    if seconds is None:
        return "not measured"
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    return f"{seconds * 1e3:.2f} ms" if seconds < 0.1 else f"{seconds * 1e3:.0f} ms"


def fmt_ratio(ratio) -> str:
    if ratio is None:
        return "—"
    return f"{ratio:.2f}×" if ratio < 10 else f"{ratio:,.0f}×"


def format_line(r: dict) -> str:
    ratio = r.get("ratio_to_none")
    if ratio is None and r.get("median_step_s") and r.get("none_in_process_median_s"):
        ratio = r["median_step_s"] / r["none_in_process_median_s"]
    cpu_ratio = r.get("cpu_ratio_to_none")
    if cpu_ratio is None and r.get("cpu_median_step_s") and r.get("none_in_process_cpu_median_s"):
        cpu_ratio = r["cpu_median_step_s"] / r["none_in_process_cpu_median_s"]
    return (
        f"{r['mechanism']:<14} {fmt_time(r.get('median_step_s')):>13}  steps {r.get('steps_timed', 0):>3}  "
        f"ratio {fmt_ratio(ratio):>8}  cpu ratio {fmt_ratio(cpu_ratio):>8}  rss {r.get('peak_rss_mb') or 0:>8.0f} MB  {r.get('notes', '')}"
    )


def markdown_table(rows: list) -> str:
    lines = [
        "| mechanism | vocab | median step | p10 – p90 | steps timed | × none (same process) | × none, CPU time (same process) | × `none` row | peak RSS | notes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        measured = r.get("median_step_s") is not None
        spread = f"{fmt_time(r['p10_step_s'])} – {fmt_time(r['p90_step_s'])}" if measured else "—"
        rss = f"{r['peak_rss_mb'] / 1024:.2f} GB" if r.get("peak_rss_mb") else "—"
        notes = (r.get("notes") or "").replace("|", "/")
        lines.append(
            f"| {row_label(r)} | {r['vocab']:,} | {fmt_time(r.get('median_step_s'))} | {spread} | "
            f"{r.get('steps_timed', 0)} | {fmt_ratio(r.get('ratio_to_none'))} | "
            f"{fmt_ratio(r.get('cpu_ratio_to_none'))} | "
            f"{fmt_ratio(r.get('ratio_to_none_row'))} | {rss} | {notes} |"
        )
    return "\n".join(lines)


def markdown_section(document: dict) -> str:
    m, s = document["machine"], document["settings"]
    v = m["versions"]
    ids = f"Zipf ids (a = {s['zipf']:g})" if s["zipf"] else "uniform ids"
    gpu = ", ".join(m["gpus"]) if m["gpus"] else "none (CPU only)"
    uncommitted = m["git"]["uncommitted_library_files"]
    loads = [p["load_average_before"][0] for p in document["processes"]] + [m["load_average_at_start"][0]]
    busy = m["busy_processes_at_start"]
    trees = sorted({p.get("library_tree_sha1") for p in document["processes"]})
    quiet = max(loads) < 0.5 * max(1, m["nproc"] or 1)
    lines = [
        f"## step_time — {m['date_utc']} — {ids}, dim {s['dim']}, batch {s['batch']}",
        "",
        f"- Command: `{document['command']}`",
        f"- Machine: {m['cpu_model']}, nproc {m['nproc']}, {m['memory_total_gb']} GiB RAM, GPU: {gpu}.",
        f"- Versions: Python {v['python']}, tensorflow {v['tensorflow']}, tf-keras {v['tf-keras']}, "
        f"dp-accounting {v['dp-accounting']}, tensorflow-privacy {v['tensorflow-privacy']}, numpy {v['numpy']}.",
        f"- Library: commit `{m['git']['commit'][:12]}`"
        + (f"; uncommitted library files at start: {', '.join(uncommitted)}" if uncommitted else ", clean")
        + (
            f"; the library sources **changed during the run** ({len(trees)} versions of tfdp_embed/ "
            "across the worker processes, see `library_tree_sha1` in the JSON)."
            if len(trees) > 1
            else "; unchanged during the run (one tfdp_embed/ source digest across all workers)."
        ),
        f"- Load: 1-min load average {m['load_average_at_start'][0]} at start, "
        f"{min(loads):.2f}–{max(loads):.2f} before the workers, {document['load_average_at_end'][0]} at end"
        + (
            " — the machine was **not quiet**: other processes were running during this run"
            + (f" (at start: {'; '.join(busy)})" if busy else "")
            + ". Compare ratios, not absolute times."
            if not quiet
            else " (quiet)."
        ),
        f"- Protocol: median of up to {s['steps']} timed steps after {s['warmup']} warm-up steps, "
        f"≤ {s['max_seconds_per_mechanism']:g} s of timed steps per mechanism; isolation: one process per "
        f"{s['isolation']}; "
        + (
            f"{s['repeats']} processes per mechanism and vocabulary, run round-robin: times are medians over "
            "the processes and each ratio is the median of the per-process same-process ratios (listed in the "
            "notes); "
            if s.get("repeats", 1) > 1
            else ""
        )
        + (
            f"{s['num_batches']} pre-generated batches cycled"
            if s["num_batches"]
            else "pre-generated batches, none used twice"
        )
        + '. "× none (same process)" divides by '
        'the plain step timed on the same model in the same process, alternating step by step; "× `none` row" '
        'divides by the `none` row; "× none, CPU time" is the same ratio of median process CPU '
        "time per step (all threads; steadier than wall time when other processes compete for the cores). "
        "Peak RSS is the process VmHWM: ~0.6 GB of TensorFlow + the table "
        "(written in 2^18-row chunks, no table-sized init temporaries) + whatever the step allocates "
        "(TF's CPU allocator keeps freed memory resident).",
        "- Hyperparameters: "
        + "; ".join(
            [f"C = {s['l2_norm_clip']:g}, σ = {s['noise_multiplier']:g}, " + _sgd_text(s.get("front_end", "keras2"))]
            + sorted(
                {
                    f"{r['mechanism']}: {r['hyperparameters']}"
                    for r in document["results"]
                    if r.get("hyperparameters")
                    and (r["mechanism"] in ("fest", "adafest") or r["mechanism"].startswith("adafest@"))
                }
            )
        )
        + ".",
    ]
    fused = sorted({p.get("fused_ops") for p in document["processes"] if p.get("fused_ops")})
    if fused:
        lines.append(f"- Fused ops (tfdp_embed.ops, sparse_rows): {'; '.join(fused)}.")
    lazy = [r for r in document["results"] if r.get("lazy_history_bytes_per_row")]
    if lazy:
        r = lazy[0]
        lines.append(f"- LazyDP history: {r['lazy_history_dtype']}, {r['lazy_history_bytes_per_row']} bytes per row.")
    if document.get("note"):
        lines.append(f"- Note: {document['note']}")
    lines += ["", markdown_table(document["results"]), ""]
    lines += comparison_lines(document.get("front_end_comparison") or [], pairing=s.get("pairing", "processes"))
    if speedups_vs_dense(document["results"]):
        lines += [
            (
                "Speed-up vs dense DP-SGD (median dense step ÷ median mechanism step, same run; `dense` is ours, "
                "with the fast Gaussian op; `tfp_keras_sgd` is tensorflow-privacy's DPKerasSGDOptimizer):"
            ),
            "",
            speedup_table(document["results"]),
            "",
        ]
    if document.get("json"):
        lines += [f"JSON: `{outputs.shown_path(document['json'])}`."]
    if document.get("png"):
        lines += [f"Plot: `{outputs.shown_path(document['png'])}`."]
    return "\n".join(lines + [""])


def _sgd_text(front_end: str) -> str:
    return {
        "keras2": "legacy SGD lr 0.1",
        "keras3": "Keras 3 keras.optimizers.SGD lr 0.1 (momentum 0)",
        "both": "lr 0.1: tf-keras legacy SGD, Keras 3 keras.optimizers.SGD (momentum 0)",
    }[front_end]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    info = machine.machine_info(REPO)
    document = {
        "benchmark": "step_time",
        "command": "python -m benchmarks.step_time " + shlex.join(argv),
        "machine": info,
        "settings": {k: v for k, v in vars(args).items() if k not in ("json", "results_md", "png", "note")},
        "note": args.note,
    }
    with tempfile.TemporaryDirectory(prefix="step_time_") as workdir:
        rows, processes = collect(args, workdir)
    document["processes"] = processes
    document["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    devices = sorted({d for p in processes for d in p.get("tf_devices", [])})
    document["results"] = rows
    document["png"] = os.path.abspath(args.png) if args.png else None
    document["json"] = os.path.abspath(args.json) if args.json else None
    if devices:
        info["tf_devices"] = devices
    document["speedups_vs_dense"] = speedups_vs_dense(rows)
    document["front_end_comparison"] = front_end_comparison(rows)
    print()
    print(markdown_table(rows))
    if document["speedups_vs_dense"]:
        print()
        print(speedup_table(rows))
    if document["front_end_comparison"]:
        print()
        print(comparison_table(document["front_end_comparison"]))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=1)
            handle.write("\n")
    if args.png:
        plot_step_time([{**r, "mechanism": row_label(r)} for r in rows], args.png, title=_plot_title(document))
    if args.results_md:
        outputs.append_section(args.results_md, markdown_section(document), files=(args.json, args.png))
    return 0


def _plot_title(document: dict) -> str:
    s, m = document["settings"], document["machine"]
    ids = f"Zipf a={s['zipf']:g}" if s["zipf"] else "uniform ids"
    return f"Step time, dim {s['dim']}, batch {s['batch']}, {ids} — {m['nproc']} cores, {m['date_utc'][:10]}"


if __name__ == "__main__":
    sys.exit(main())
