"""What a DP checkpoint costs: save and restore time, size, and what flushing LazyDP would add.

Workload (BENCHMARKS.md's model): one `vocab x dim` float32 table, 4 uniform
ids per example, mean-pooled, Dense(64, relu) -> Dense(1), batch 1024,
LazyDP with legacy SGD momentum 0.9 (so the checkpoint holds the table, its
momentum slot, the per-row history and the per-step noise sums).

Per vocabulary size, in one process, `--repeats` rounds of:
  2 training steps (every row then owes noise again), then side by side
  * save: `TrainingCheckpoint.save` (TensorFlow write + manifest: setup
    signature + SHA-256 of the files), and the manifest part alone;
  * plain write: `tf.train.Checkpoint(model, optimizer).write` of the same
    model (no mechanism state, no manifest): the non-DP baseline;
  * restore: `TrainingCheckpoint.restore` (manifest + checksum checks, the
    slot-creating zero step, `tf.train.Checkpoint.restore`);
  * plain read: the baseline checkpoint read back;
  * flush: `LazyDP.flush()`, i.e. what "flush before every checkpoint"
    (the design this library did NOT choose, see
    `tfdp_embed.checkpointing.training_state`) would add to every save.
Medians and min/max over the rounds; bytes on disk; peak RSS of the process.
Outputs: `--json`, `--png` (median seconds per operation and vocabulary;
both default to new files of this run under `benchmarks/results/`);
`make results` regenerates `benchmarks/RESULTS.md` from the JSON files
(`--results-md` naming another page appends the section).

Run:
    python -m benchmarks.checkpoint_time --vocab 100000,1000000 --repeats 5

References: LazyDP (ASPLOS 2024) §5.2 (deferred noise; flush before release).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import sys
import tempfile
import time

from benchmarks import outputs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TIMINGS = ("save", "save_manifest", "plain_write", "restore", "plain_read", "flush")


def _dir_bytes(paths) -> int:
    return sum(os.path.getsize(p) for p in paths)


def measure(vocab: int, args) -> dict:
    """One vocabulary size: `args.repeats` rounds of the timings above."""
    import numpy as np

    from tfdp_embed import DPEmbedding, DPModel, keras, tf
    from tfdp_embed.checkpointing.position import DataPosition
    from tfdp_embed.keras2.checkpointing import TrainingCheckpoint
    from tfdp_embed.keras2.checkpointing import manifest as manifest_lib
    from tfdp_embed.mechanisms import LazyDP

    keras.utils.set_random_seed(args.seed)
    ids_in = keras.Input((4,), dtype="int32")
    hidden = DPEmbedding(vocab, args.dim, combiner="mean", name="table")(ids_in)
    hidden = keras.layers.Dense(64, activation="relu")(hidden)
    model = keras.Model(ids_in, keras.layers.Dense(1)(hidden))
    rng = np.random.default_rng(args.seed)
    ids = rng.integers(0, vocab, (args.batch * 2, 4)).astype("int32")
    labels = rng.integers(0, 2, (args.batch * 2, 1)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((ids, labels)).batch(args.batch)
    mechanism = LazyDP(l2_norm_clip=1.0, noise_multiplier=1.0, seed=args.seed)
    dp = DPModel(model, mechanism=mechanism, expected_batch_size=float(args.batch))
    dp.compile(
        optimizer=keras.optimizers.legacy.SGD(0.1, momentum=0.9),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
    )
    times = {name: [] for name in _TIMINGS}
    sizes = {}
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        ckpt = TrainingCheckpoint(os.path.join(tmp, "dp"), dp_model=dp, max_to_keep=1)
        plain = tf.train.Checkpoint(model=model, optimizer=dp.optimizer)
        plain_prefix = os.path.join(tmp, "plain", "ckpt")
        steps = 0
        for _ in range(args.repeats):
            dp.fit(data, epochs=1, verbose=0)  # 2 steps: every row owes noise again
            steps += 2
            position = DataPosition(steps, 0, steps, None)
            start = time.perf_counter()
            prefix = ckpt.save(position=position)
            times["save"].append(time.perf_counter() - start)
            start = time.perf_counter()
            manifest_lib.describe_files(prefix)
            manifest_lib.describe_training_state(dp)
            times["save_manifest"].append(time.perf_counter() - start)
            start = time.perf_counter()
            written = plain.write(plain_prefix)
            times["plain_write"].append(time.perf_counter() - start)
            start = time.perf_counter()
            ckpt.restore(prefix)
            times["restore"].append(time.perf_counter() - start)
            start = time.perf_counter()
            plain.read(written).assert_consumed()
            times["plain_read"].append(time.perf_counter() - start)
            start = time.perf_counter()
            mechanism.flush()
            times["flush"].append(time.perf_counter() - start)
            sizes = {
                "dp_checkpoint_bytes": _dir_bytes(
                    os.path.join(os.path.dirname(prefix), name) for name in manifest_lib.checkpoint_files(prefix)
                ),
                "manifest_bytes": os.path.getsize(manifest_lib.manifest_path(prefix)),
                "plain_checkpoint_bytes": _dir_bytes(
                    os.path.join(os.path.dirname(written), name) for name in manifest_lib.checkpoint_files(written)
                ),
            }
    row = {"vocab": vocab, "dim": args.dim, "table_bytes": vocab * args.dim * 4, **sizes}
    for name, values in times.items():
        row[name] = {"median_s": statistics.median(values), "min_s": min(values), "max_s": max(values)}
    row["save_over_plain_write"] = row["save"]["median_s"] / row["plain_write"]["median_s"]
    row["restore_over_plain_read"] = row["restore"]["median_s"] / row["plain_read"]["median_s"]
    row["flush_over_save"] = row["flush"]["median_s"] / row["save"]["median_s"]
    row["peak_rss_mb_process"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return row


def fmt_bytes(value) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value} B"


def _cell(timing: dict) -> str:
    return f"{timing['median_s']:.3g} s ({timing['min_s']:.3g}–{timing['max_s']:.3g})"


def markdown_section(document: dict) -> str:
    s, m = document["settings"], document["machine"]
    v = m["versions"]
    lines = [
        f"## checkpoint_time — {m['date_utc']} — LazyDP checkpoint save/restore vs a plain tf.train.Checkpoint, "
        f"dim {s['dim']}, batch {s['batch']}",
        "",
        f"- Command: `{document['command']}`",
        f"- Machine: {m['cpu_model']}, nproc {m['nproc']}, {m['memory_total_gb']} GiB RAM, GPU: "
        f"{', '.join(m['gpus']) or 'none (CPU only)'}; 1-min load average {m['load_average_at_start'][0]} at start, "
        f"{m.get('load_average_at_end', ['not measured'])[0]} at end (shared machine: wall times are inflated "
        "by other processes; ratios are taken side by side in one process).",
        f"- Versions: Python {v['python']}, tensorflow {v['tensorflow']}, tf-keras {v['tf-keras']}, "
        f"dp-accounting {v['dp-accounting']}, numpy {v['numpy']}. Library commit `{m['git']['commit'][:12]}`; "
        f"uncommitted library files at start: {', '.join(m['git']['uncommitted_library_files']) or 'none'}.",
        f"- Protocol: per vocabulary, {s['repeats']} rounds of (2 LazyDP training steps, then save, plain write, "
        "restore, plain read, flush); median (min–max) wall seconds. **save** = `TrainingCheckpoint.save` "
        "(TF write of model + optimizer + mechanism state + ledger/position, then the manifest: setup "
        "signature and SHA-256 of every file); **manifest** = that manifest work alone; **plain write/read** = "
        "`tf.train.Checkpoint(model, optimizer)` of the same model, no mechanism state, no checks; **restore** = "
        "`TrainingCheckpoint.restore` (manifest and checksum verification, slot-creating zero step, restore); "
        "**flush** = `LazyDP.flush()` after 2 steps (every row owes noise): the per-checkpoint cost of flushing "
        "before writing, which this library does not do. Peak RSS is the process's (all sizes so far).",
        "",
        "| vocab | table | DP ckpt / plain ckpt on disk | save | manifest | plain write | restore | plain read "
        "| flush (not done) | save/plain | restore/plain | flush/save | peak RSS |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in document["rows"]:
        if "error" in r:
            lines.append(f"| {r['vocab']:,} | failed: {r['error'][:150]} |||||||||||| ")
            continue
        lines.append(
            f"| {r['vocab']:,} | {fmt_bytes(r['table_bytes'])} | {fmt_bytes(r['dp_checkpoint_bytes'])} / "
            f"{fmt_bytes(r['plain_checkpoint_bytes'])} | {_cell(r['save'])} | {_cell(r['save_manifest'])} | "
            f"{_cell(r['plain_write'])} | {_cell(r['restore'])} | {_cell(r['plain_read'])} | {_cell(r['flush'])} | "
            f"{r['save_over_plain_write']:.2f}× | {r['restore_over_plain_read']:.2f}× | {r['flush_over_save']:.2f}× | "
            f"{r['peak_rss_mb_process'] / 1024:.2f} GB |"
        )
    lines.append("")
    return "\n".join(lines)


_OPERATIONS = (
    ("save", "save (DP)"),
    ("plain_write", "plain write"),
    ("restore", "restore (DP)"),
    ("plain_read", "plain read"),
    ("flush", "flush (not done)"),
)


def plot(document: dict, path: str) -> None:
    """Bar chart: median seconds (min-max as error bars) of each operation, one group per vocabulary."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in document["rows"] if "error" not in r]
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    width = 0.8 / len(_OPERATIONS)
    for index, (key, label) in enumerate(_OPERATIONS):
        x = [i + (index - (len(_OPERATIONS) - 1) / 2) * width for i in range(len(rows))]
        median = [r[key]["median_s"] for r in rows]
        low = [r[key]["median_s"] - r[key]["min_s"] for r in rows]
        high = [r[key]["max_s"] - r[key]["median_s"] for r in rows]
        ax.bar(x, median, width, yerr=[low, high], capsize=2, label=label)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"{r['vocab']:,} rows" for r in rows])
    ax.set_yscale("log")
    ax.set_ylabel("seconds (median; bars: min–max)")
    m = document["machine"]
    ax.set_title(
        f"LazyDP checkpoint vs plain tf.train.Checkpoint — {m['nproc']} cores, {m['date_utc'][:10]}", fontsize=9
    )
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", default="100000,1000000", help="comma-separated table sizes")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--tmp", default=None, help="directory for the checkpoints (default: system temp)")
    parser.add_argument("--json", default=outputs.AUTO, help="'auto': a new file under benchmarks/results/")
    parser.add_argument("--png", default=outputs.AUTO, help="'auto': a new file under benchmarks/results/; '' skips")
    parser.add_argument("--results-md", default=outputs.RESULTS_MD, help="RESULTS.md to append to ('' to skip)")
    args = parser.parse_args(argv)
    args.vocab = [int(float(v)) for v in args.vocab.split(",")]
    if args.repeats < 1 or args.dim < 1 or args.batch < 1 or min(args.vocab) < 1:
        parser.error("--repeats, --dim, --batch and every --vocab must be >= 1")
    outputs.resolve(
        parser,
        args,
        benchmark="checkpoint_time",
        tag=outputs.range_tag(args.vocab),
        files={"json": ".json", "png": ".png"},
    )
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    from tqdm import tqdm

    from benchmarks.machine import machine_info

    machine = machine_info(REPO)
    rows = []
    for vocab in tqdm(args.vocab, desc="checkpoint_time", unit="size"):
        try:
            row = measure(vocab, args)
        except Exception as error:  # noqa: BLE001 - one failed size is reported, not fatal
            row = {"vocab": vocab, "error": f"{type(error).__name__}: {error}"}
        rows.append(row)
        tqdm.write(json.dumps({k: row.get(k) for k in ("vocab", "save", "restore", "flush", "error")}))
    machine["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    document = {
        "command": "python -m benchmarks.checkpoint_time " + shlex.join(argv),
        "settings": {k: v for k, v in vars(args).items() if k not in ("json", "png", "results_md")},
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
