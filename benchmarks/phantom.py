"""Phantom Clipping vs brute-force per-example gradients vs non-private, on a SASRec-like model.

    python -m benchmarks.phantom --vocab 1000,10000,24000 --batch 32,128,256 --positions all,last

Model (dim 64, sequence length 50): a shared `SharedEmbedding(V, 64)` item
table + a learned positional `DPEmbedding(50, 64)`, Dense(64, relu) ->
Dense(64) -> LayerNormalization, then the same item table as the output
projection, softmax cross-entropy over ALL V items (no sampled negatives),
one loss per sequence (mean over its scored positions). `--positions all`
scores every position (SASRec training, logits `[B, 50, V]`); `last` scores
the last position only (DPFormer App. A.2 eq. 12, logits `[B, V]`).

Methods, each on its own copy of the same model, legacy SGD (lr 0.1):
  non_private   plain `tf.function` step: tape.gradient of the mean loss.
  phantom       `DPModel` + `MECHANISMS["dense"]` (C = 1, sigma = 1): Phantom
                Clipping for the shared table, ghost norms for the rest,
                Gaussian noise on every coordinate.
  brute_force   per-example gradients of every variable by `tf.vectorized_map`
                over the batch (`[B, V, 64]` for the table), norms, clip,
                sum, the same noise: what Phantom Clipping avoids.

Protocol: one worker process per (positions, V), batch sizes ascending.
At each batch size (fresh models and steps), a memory phase
runs each method's warm-up steps (tracing included) in the order above
with the process's VmHWM reset before each (`peak RSS`; `step extra` =
peak minus the RSS just before: for phantom and brute_force, the memory
beyond what the non-private step, run first, left resident; TF keeps freed
memory), then a timing phase runs `--steps`
rounds, each round one step of every method in turn (side by side, same
load): medians, p10-p90, and ratios to the non-private median of the
same process. A method whose memory estimate (below) exceeds `--max-gb`
is not run and says what it would need; a watchdog kills a worker whose
RSS passes `--max-gb` + 1.5 GB. Estimates are used only to skip:

    model methods: 0.7 GB + 4 x B x Q x V float32 (logits, softmax, gradients; Q scored positions)
    brute force:   0.7 GB + 2 x B x Q x V + 3.5 x B x V x d float32 (per-example table gradients
                   and temporaries; 3.5 is the largest peak / (B V d) seen in the first run,
                   where 2 let B = 256, V = 24,000 reach the watchdog)

Outputs: a table on stdout, `--json`, and a PNG (`--png`) of step time, and
of the memory each DP method adds over the non-private step, against batch
size (`--json` and `--png` default to new files of this run under
`benchmarks/results/`); `make results` regenerates `benchmarks/RESULTS.md`
from the JSON files (`--results-md` naming another page appends the section).

References: DPFormer (Zhao et al.) §3.2, Fig. 3 and App. A.2 (Phantom Clipping;
"DP at 0.68x non-private throughput"); BENCHMARKS.md (protocol).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

from benchmarks import cli_args, machine, outputs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = ("non_private", "phantom", "brute_force")
LEARNING_RATE = 0.1
_BASE_GB = 0.7  # TensorFlow + the model, measured RSS before any step is ~0.6-0.7 GB


# -- estimates (used only to decide what not to run) ---------------------------------
def scored_positions(positions: str, length: int) -> int:
    return length if positions == "all" else 1


def estimate_gb(method: str, *, vocab: int, batch: int, length: int, dim: int, positions: str) -> float:
    logits = batch * scored_positions(positions, length) * vocab * 4 / 2**30
    if method == "brute_force":
        return _BASE_GB + 2.0 * logits + 3.5 * batch * vocab * dim * 4 / 2**30
    return _BASE_GB + 4.0 * logits


# -- worker: builds the three steps and measures them ----------------------------------
def _worker(spec_path: str, out_path: str) -> int:
    """Measures every batch size of one (positions, V), smallest first, in this process."""
    with open(spec_path, encoding="utf-8") as handle:
        spec = json.load(handle)
    report = {"results": {}, "phantom_routed_to": None}
    for batch, methods in spec["configs"]:
        report["running"] = batch
        _write(out_path, report)
        report["results"][str(batch)] = _measure_batch(spec, batch, methods, report, out_path)
        gc.collect()
    report["running"] = None
    _write(out_path, report)
    return 0


def _measure_batch(spec: dict, batch: int, methods: list, report: dict, out_path: str) -> dict:
    """Builds the methods' steps at one batch size; memory phase, then interleaved timing."""
    import numpy as np

    from tfdp_embed.keras2._keras import keras, tf
    from tfdp_embed.keras2.layers.embedding import DPEmbedding
    from tfdp_embed.keras2.layers.shared_embedding import SharedEmbedding
    from tfdp_embed.keras2.training import DPModel
    from tfdp_embed.mechanisms import MECHANISMS
    from tfdp_embed.ops import fast_normal

    vocab, length, dim = spec["vocab"], spec["length"], spec["dim"]
    last_only = spec["positions"] == "last"
    clip, sigma = spec["l2_norm_clip"], spec["noise_multiplier"]
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=keras.losses.Reduction.NONE)

    def build():
        keras.utils.set_random_seed(spec["seed"])
        items = SharedEmbedding(vocab, dim, padding_id=0, name="items")
        positions = DPEmbedding(length, dim, name="positions")
        ids = keras.Input((length,), dtype="int32")
        where = tf.range(length)[None, :] + tf.zeros_like(ids)
        hidden = items(ids) + positions(where)
        hidden = keras.layers.Dense(dim, activation="relu")(hidden)
        hidden = keras.layers.Dense(dim)(hidden)
        hidden = keras.layers.LayerNormalization()(hidden)
        if last_only:
            hidden = hidden[:, -1]
        return keras.Model(ids, items(hidden, mode="logits"))

    def per_example_loss(model, ids, labels):
        loss = loss_fn(labels, model(ids, training=True))
        return tf.reduce_mean(loss, axis=-1) if not last_only else loss

    rng = np.random.default_rng(spec["seed"] + batch)
    batches = []
    for _ in range(4):
        seq = rng.integers(1, vocab, (batch, length + 1)).astype("int32")
        labels = seq[:, -1] if last_only else seq[:, 1:]
        batches.append((tf.constant(seq[:, :-1]), tf.constant(labels)))

    steps = {}
    if "non_private" in methods:
        np_model = build()
        np_optimizer = keras.optimizers.legacy.SGD(LEARNING_RATE)

        @tf.function
        def non_private(ids, labels):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(per_example_loss(np_model, ids, labels))
            variables = np_model.trainable_variables
            np_optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
            return loss

        steps["non_private"] = non_private

    if "phantom" in methods:
        dp_model = build()
        mechanism = MECHANISMS["dense"](l2_norm_clip=clip, noise_multiplier=sigma, seed=spec["seed"])
        dp = DPModel(dp_model, mechanism=mechanism, expected_batch_size=batch)
        dp.compile(
            optimizer=keras.optimizers.legacy.SGD(LEARNING_RATE),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        dp.prepare()
        routed = dp.registry.lookup(dp_model.get_layer("items"))
        report["phantom_routed_to"] = f"{routed.__module__}.{routed.__name__}"
        dp_step = tf.function(dp.train_step)
        steps["phantom"] = lambda ids, labels: dp_step((ids, labels))["loss"]

    if "brute_force" in methods:
        bf_model = build()
        bf_optimizer = keras.optimizers.legacy.SGD(LEARNING_RATE)
        generator = tf.random.Generator.from_seed(spec["seed"])

        @tf.function
        def brute_force(ids, labels):
            variables = bf_model.trainable_variables

            def one_example(args):
                x, y = args
                with tf.GradientTape() as tape:
                    loss = per_example_loss(bf_model, x[None], y[None])[0]
                return [tf.convert_to_tensor(g) for g in tape.gradient(loss, variables)]

            per_example = tf.vectorized_map(one_example, (ids, labels))  # [B, *v.shape] each
            squared = tf.add_n([tf.reduce_sum(tf.square(tf.reshape(g, [batch, -1])), 1) for g in per_example])
            factors = clip / tf.maximum(tf.sqrt(squared), clip)
            grads = [
                (tf.tensordot(factors, g, 1) + fast_normal.normal(generator, tf.shape(v), sigma * clip)) / batch
                for g, v in zip(per_example, variables)
            ]
            bf_optimizer.apply_gradients(zip(grads, variables))
            return tf.reduce_mean(squared)

        steps["brute_force"] = brute_force

    def run(name, i):
        start = time.perf_counter()
        np.asarray(steps[name](*batches[i % len(batches)]))
        return time.perf_counter() - start

    results = {}
    report["results"][str(batch)] = results
    for name in steps:  # memory phase: warm-up (tracing included), VmHWM reset per method
        gc.collect()
        reset = machine.reset_peak_rss()
        before = machine.status_kb("VmRSS") / 1024
        warm = [run(name, i) for i in range(spec["warmup"])]
        results[name] = {
            "peak_rss_mb": round(machine.status_kb("VmHWM") / 1024, 1),
            "rss_before_mb": round(before, 1),
            "peak_scope": "method (VmHWM reset)" if reset else "process (VmHWM reset refused)",
            "warmup_s": [round(t, 3) for t in warm],
        }
        _write(out_path, report)
    times = {name: [] for name in steps}
    deadline = time.monotonic() + spec["max_seconds"]
    for i in range(spec["steps"]):  # timing phase: one step of every method per round
        for name in steps:
            times[name].append(run(name, spec["warmup"] + i))
        if time.monotonic() > deadline:
            break
    for name, t in times.items():
        t = np.asarray(t)
        results[name].update(
            median_step_s=float(np.median(t)),
            p10_step_s=float(np.percentile(t, 10)),
            p90_step_s=float(np.percentile(t, 90)),
            steps_timed=int(t.size),
        )
    _write(out_path, report)
    return results


def _write(path: str, report: dict) -> None:
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(report, handle)
    os.replace(path + ".tmp", path)


# -- driver ----------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.phantom", description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=cli_args.ints, default=cli_args.ints("1000,10000,24000"))
    parser.add_argument("--batch", type=cli_args.ints, default=cli_args.ints("32,128,256"))
    parser.add_argument("--positions", default="all,last", help="'all', 'last' or both, comma-separated")
    parser.add_argument("--length", type=int, default=50)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument(
        "--steps",
        type=int,
        default=10,
        help="timed rounds (one step of each method per round)",
    )
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=90.0,
        help="timed seconds per configuration",
    )
    parser.add_argument(
        "--max-gb",
        type=float,
        default=4.0,
        help="skip a method whose estimate exceeds this",
    )
    parser.add_argument("--l2-norm-clip", type=float, default=1.0)
    parser.add_argument("--noise-multiplier", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=outputs.AUTO, help="'auto': a new file under benchmarks/results/; '' skips")
    parser.add_argument("--png", default=outputs.AUTO, help="'auto': a new file under benchmarks/results/; '' skips")
    parser.add_argument("--results-md", default=outputs.RESULTS_MD, help="'' to skip")
    parser.add_argument("--note", default="", help="free text added to the RESULTS.md section")
    parser.add_argument("--worker", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.positions = [p.strip() for p in args.positions.split(",") if p.strip()]
    if not args.positions or any(p not in ("all", "last") for p in args.positions):
        parser.error(f"--positions must list 'all' and/or 'last'; received {args.positions}")
    if args.steps < 1 or args.warmup < 1:
        parser.error("--steps and --warmup must be >= 1")
    if not args.worker:
        outputs.resolve(
            parser,
            args,
            benchmark="phantom",
            tag=f"v{outputs.range_tag(args.vocab)}-{'-'.join(args.positions)}",
            files={"json": ".json", "png": ".png"},
        )
    return args


def run_vocab(args, *, positions: str, vocab: int, workdir: str) -> list:
    """One worker process for one (positions, V), batch sizes ascending; one row per (B, method)."""
    rows, configs = [], []
    for batch in sorted(args.batch):
        shape = {
            "vocab": vocab,
            "batch": batch,
            "length": args.length,
            "dim": args.dim,
            "positions": positions,
        }
        methods = []
        for method in METHODS:
            need = estimate_gb(method, **shape)
            row = {"method": method, **shape, "estimate_gb": round(need, 2)}
            if need > args.max_gb:
                row["not_measured"] = f"not run: would need ~{need:.1f} GB (> --max-gb {args.max_gb:g})"
            else:
                methods.append(method)
            rows.append(row)
        if methods:
            configs.append((batch, methods))
    if not configs:
        return rows
    tag = f"{positions}_v{vocab}"
    spec_path, out_path, log_path = (os.path.join(workdir, f"{tag}.{x}") for x in ("spec.json", "out.json", "log"))
    spec = {
        "vocab": vocab,
        "length": args.length,
        "dim": args.dim,
        "positions": positions,
        "configs": configs,
        "steps": args.steps,
        "warmup": args.warmup,
        "max_seconds": args.max_seconds,
        "l2_norm_clip": args.l2_norm_clip,
        "noise_multiplier": args.noise_multiplier,
        "seed": args.seed,
    }
    with open(spec_path, "w", encoding="utf-8") as handle:
        json.dump(spec, handle)
    limit_kb = (args.max_gb + 1.5) * 2**20
    load = round(os.getloadavg()[0], 2)
    start = time.monotonic()
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.phantom", "--worker", spec_path, out_path],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        killed = None
        while proc.poll() is None:
            rss = machine.status_kb("VmRSS", proc.pid)
            if rss > limit_kb:
                killed = f"killed by the memory guard at {rss / 2**20:.1f} GB RSS"
                proc.kill()
                proc.wait()
                break
            time.sleep(0.2)
    report = {"results": {}}
    if os.path.exists(out_path):
        with open(out_path, encoding="utf-8") as handle:
            report = json.load(handle)
    wall = round(time.monotonic() - start, 1)
    for row in rows:
        if row.get("not_measured"):
            continue
        got = report["results"].get(str(row["batch"]), {}).get(row["method"])
        if got is None or "median_step_s" not in got:
            why = killed or f"worker exited with code {proc.returncode}: {_tail(log_path)}"
            if report.get("running") not in (None, row["batch"]):
                why = f"not reached ({why} at B={report['running']})"
            row["not_measured"] = f"not measured: {why}"
            row.update(got or {})
            continue
        row.update(got, load_average_before_worker=load, worker_wall_s=wall)
        if row["method"] == "phantom":
            row["registry_function"] = report.get("phantom_routed_to")
    for batch in args.batch:
        same = [r for r in rows if r["batch"] == batch]
        base = next(
            (r for r in same if r["method"] == "non_private" and r.get("median_step_s")),
            None,
        )
        for row in same:
            if base and row.get("median_step_s"):
                row["ratio_to_non_private"] = row["median_step_s"] / base["median_step_s"]
    return rows


def _tail(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            lines = [x.strip() for x in handle if x.strip() and "cuInit" not in x and "cuda" not in x]
    except OSError:
        return ""
    return " | ".join(lines[-2:])[:300]


def _fmt_time(seconds) -> str:
    if seconds is None:
        return "—"
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def markdown_table(rows: list) -> str:
    lines = [
        (
            "| scored | V | B | method | median step | p10 – p90 | steps | × non-private (same process) "
            "| throughput vs non-private | peak RSS | step extra | notes |"
        ),
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        scored = f"all {r['length']}" if r["positions"] == "all" else "last"
        if r.get("median_step_s") is None:
            lines.append(
                f"| {scored} | {r['vocab']:,} | {r['batch']} | {r['method']} | not measured | | | | | "
                f"| | {r.get('not_measured', '')} |"
            )
            continue
        ratio = r.get("ratio_to_non_private")
        lines.append(
            f"| {scored} | {r['vocab']:,} | {r['batch']} | {r['method']} | {_fmt_time(r['median_step_s'])} "
            f"| {_fmt_time(r['p10_step_s'])} – {_fmt_time(r['p90_step_s'])} | {r['steps_timed']} "
            f"| {ratio:.2f}× | {1 / ratio:.2f}× | {r['peak_rss_mb'] / 1024:.2f} GB "
            f"| {(r['peak_rss_mb'] - r['rss_before_mb']) / 1024:.2f} GB | |"
        )
    return "\n".join(lines)


def markdown_section(document: dict) -> str:
    m, s = document["machine"], document["settings"]
    v = m["versions"]
    loads = [r["load_average_before_worker"] for r in document["results"] if "load_average_before_worker" in r]
    uncommitted = m["git"]["uncommitted_library_files"]
    lines = [
        (
            f"## phantom — {m['date_utc']} — Phantom Clipping vs brute force vs non-private, "
            f"SASRec-like, dim {s['dim']}, L {s['length']}"
        ),
        "",
        f"- Command: `{document['command']}`",
        f"- Machine: {m['cpu_model']}, nproc {m['nproc']}, {m['memory_total_gb']} GiB RAM, GPU: "
        + (", ".join(m["gpus"]) if m["gpus"] else "none (CPU only)")
        + ".",
        (
            f"- Versions: Python {v['python']}, tensorflow {v['tensorflow']}, tf-keras "
            f"{v['tf-keras']}, dp-accounting {v['dp-accounting']}, numpy {v['numpy']}."
        ),
        f"- Library: commit `{m['git']['commit'][:12]}`"
        + (f"; uncommitted library files at start: {', '.join(uncommitted)}." if uncommitted else ", clean."),
        f"- Load: 1-min load average {m['load_average_at_start'][0]} at start, "
        + (f"{min(loads):.2f}–{max(loads):.2f} before the workers, " if loads else "")
        + f"{document['load_average_at_end'][0]} at end (2 cores shared with other engineers' jobs: compare "
        "ratios measured in one process, not absolute times).",
        (
            "- Model: SharedEmbedding(V, d) items + DPEmbedding(L, d) positions, Dense(d, relu), "
            "Dense(d), LayerNorm, shared-table logits over all V items; softmax cross-entropy, one "
            f'loss per sequence. "scored all {s["length"]}": every position predicts the next item '
            f'(logits [B, {s["length"]}, V]); "last": the last position only (DPFormer eq. 12, '
            "logits [B, V])."
        ),
        (
            '- Methods: non_private = plain tf.function step; phantom = DPModel + MECHANISMS["dense"] '
            f"(C = {s['l2_norm_clip']:g}, σ = {s['noise_multiplier']:g}; the table is routed to "
            f"`{document.get('phantom_registry_function')}`); brute_force = per-example gradients of "
            "all variables by tf.vectorized_map ([B, V, d] for the table), clip, sum, same noise. "
            "Legacy SGD lr 0.1."
        ),
        (
            "- Protocol: one process per (scored, V), batch sizes ascending, fresh models per B; "
            f"{s['warmup']} warm-up steps per method with VmHWM reset before each (peak RSS; "
            f'"step extra" = peak − RSS just before the method: methods run non_private, phantom, '
            "brute_force in that order, so for the last two it is what they needed beyond what the "
            f"non-private step left resident), then up to {s['steps']} rounds of one "
            f"step per method in turn (≤ {s['max_seconds']:g} s per B); medians, ratios to the "
            "non-private median of the same process. Methods whose estimate exceeds "
            f"{s['max_gb']:g} GB were not run (estimate formula in benchmarks/phantom.py; used only "
            "to skip)."
        ),
    ]
    if document.get("note"):
        lines.append(f"- Note: {document['note']}")
    lines += [
        "",
        markdown_table(document["results"]),
        "",
    ]
    if document.get("png"):
        lines += [f"Plot: `{os.path.relpath(document['png'], REPO)}`.", ""]
    return "\n".join(lines)


def plot(rows: list, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scored = list(dict.fromkeys(r["positions"] for r in rows))
    fig, axes = plt.subplots(len(scored), 2, figsize=(11, 4.2 * len(scored)), dpi=110, squeeze=False)
    colors = {"non_private": "black", "phantom": "tab:blue", "brute_force": "tab:red"}
    vocabs = sorted({r["vocab"] for r in rows})
    styles = dict(zip(vocabs, ["-", "--", ":", "-."] * 3))
    for row_axes, positions in zip(axes, scored):
        for method in METHODS:
            for vocab in vocabs:
                points = sorted(
                    (
                        r["batch"],
                        r["median_step_s"],
                        (r["peak_rss_mb"] - r["rss_before_mb"]) / 1024,
                    )
                    for r in rows
                    if r["positions"] == positions
                    and r["method"] == method
                    and r["vocab"] == vocab
                    and r.get("median_step_s")
                )
                if not points:
                    continue
                b, t, mem = zip(*points)
                kw = {
                    "color": colors[method],
                    "linestyle": styles[vocab],
                    "marker": "o",
                    "label": f"{method}, V={vocab:,}",
                }
                row_axes[0].plot(b, t, **kw)
                if method != "non_private":  # its "extra" is over the previous batch size's leftovers
                    row_axes[1].plot(b, mem, **kw)
        label = "every position scored" if positions == "all" else "last position scored"
        row_axes[0].set(
            xscale="log",
            yscale="log",
            xlabel="batch size",
            ylabel="median step (s)",
            title=label,
        )
        row_axes[1].set(
            xscale="log",
            xlabel="batch size",
            ylabel="GB beyond the non-private step's memory",
            title=f"{label}: memory added (peak − RSS before)",
        )
        for ax in row_axes:
            ax.grid(True, which="both", alpha=0.3)
        row_axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.worker:
        return _worker(*args.worker)

    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        tqdm = None
    document = {
        "benchmark": "phantom",
        "command": "python -m benchmarks.phantom " + shlex.join(argv),
        "machine": machine.machine_info(REPO),
        "settings": {k: v for k, v in vars(args).items() if k not in ("json", "png", "results_md", "worker", "note")},
        "note": args.note,
    }
    configs = [(p, v) for p in args.positions for v in args.vocab]
    rows = []
    progress = tqdm(configs, desc="phantom", unit="process") if tqdm else configs
    with tempfile.TemporaryDirectory(prefix="phantom_") as workdir:
        for positions, vocab in progress:
            if tqdm:
                progress.set_postfix_str(f"scored {positions}, V={vocab}, B={args.batch}")
            rows += run_vocab(args, positions=positions, vocab=vocab, workdir=workdir)
    document["results"] = rows
    document["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    routed = {r.get("registry_function") for r in rows if r.get("registry_function")}
    document["phantom_registry_function"] = ", ".join(sorted(routed)) or None
    document["png"] = os.path.abspath(args.png) if args.png else None
    print()
    print(markdown_table(rows))
    measured = [r for r in rows if r["method"] == "phantom" and r.get("ratio_to_non_private")]
    if measured:
        best = min(measured, key=lambda r: r["ratio_to_non_private"])
        worst = max(measured, key=lambda r: r["ratio_to_non_private"])
        print(
            f"\nphantom throughput vs non-private: {1 / worst['ratio_to_non_private']:.2f}×–"
            f"{1 / best['ratio_to_non_private']:.2f}× over {len(measured)} configurations (paper: 0.68×)"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=1)
            handle.write("\n")
    if args.png:
        plot(
            rows,
            args.png,
            f"Phantom Clipping, dim {args.dim}, L {args.length} — "
            f"{document['machine']['nproc']} cores, {document['machine']['date_utc'][:10]}",
        )
    if args.results_md:
        outputs.append_section(args.results_md, markdown_section(document), files=(args.json, args.png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
