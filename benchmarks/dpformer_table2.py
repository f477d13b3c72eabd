"""DPFormer Table 2 on Amazon Games: vanilla Transformer vs DPFormer at epsilon 5, 8, 10 (+ non-private).

    python -m benchmarks.dpformer_table2 --data ../shared/data/sasrec/amazon_games.txt \\
        --work /tmp/dpformer_table2 --epochs 1 --batch 256 --max-len 20 --lr 3e-3 --dropout 0.2

Each (model, epsilon) is one `python -m pipelines.sequential` run in its own
process, one after the other (`--parallel N`: up to N at once, which makes
each run's step time longer on a small machine), with the same settings; its `report.json` is kept under `--work`, so an
interrupted benchmark resumes where it stopped and `--summarize` rebuilds
the table from whatever finished. The summary goes to `--json`, a PNG of
NDCG@10 vs epsilon (`--png`; both default to new files of this run under
`benchmarks/results/`); `make results` regenerates `benchmarks/RESULTS.md`
from the JSON files (`--results-md` naming another page appends the
section). Runs that did not finish are listed as missing,
never filled in. The section states the item-frequency source each run's
report.json records (the frequencies feed Re-Attention, `--popularity-prior`
and `--head-items`).

Paper (DPFormer Table 2, NDCG@10 / HIT@10 in %, 100 epochs, tuned lr and batch):
    eps 5: Transformer 1.37 / 2.47, DPFormer 1.64 / 3.01
    eps 8: Transformer 1.54 / 2.77, DPFormer 1.98 / 3.70
    eps 10: Transformer 1.57 / 2.83, DPFormer 1.99 / 3.73

References: DPFormer §5, Table 2, App. A.9.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shlex
import subprocess
import sys
import time

from benchmarks import outputs
from benchmarks.machine import machine_info

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAPER = {  # epsilon -> model -> (NDCG@10 %, HIT@10 %)
    5.0: {"transformer": (1.37, 2.47), "dpformer": (1.64, 3.01)},
    8.0: {"transformer": (1.54, 2.77), "dpformer": (1.98, 3.70)},
    10.0: {"transformer": (1.57, 2.83), "dpformer": (1.99, 3.73)},
}
MODELS = ("transformer", "dpformer")


def _runs(epsilons, seeds=(None,), reference=True):
    """(model, epsilon, seed) per run: per seed, both models at every epsilon, then the non-private reference."""
    runs = [(model, eps, seed) for seed in seeds for eps in epsilons for model in reversed(MODELS)]
    return runs + ([("transformer", float("inf"), seeds[0])] if reference else [])


def _run_dir(work, model, eps, seed=None):
    name = f"{model}_eps{'inf' if eps == float('inf') else f'{eps:g}'}"
    return os.path.join(work, name if seed is None else f"{name}_seed{seed}")


def _pipeline_args(a, model, eps, out, seed=None):
    args = [
        "--data",
        a.data,
        "--model",
        model,
        "--epsilon",
        "inf" if eps == float("inf") else f"{eps:g}",
        "--epochs",
        str(a.epochs),
        "--batch",
        str(a.batch),
        "--max-len",
        str(a.max_len),
        "--lr",
        str(a.lr),
        "--dropout",
        str(a.dropout),
        "--out",
        out,
        "--verbose",
        "1",
    ]
    if a.delta is not None:
        args += ["--delta", str(a.delta)]
    if seed is not None:
        args += ["--seed", str(seed)]
    if a.popularity_prior:
        args += ["--popularity-prior"]
    if a.head_items is not None:
        args += ["--head-items", str(a.head_items)]
    if a.frequencies_file is not None:
        args += ["--frequencies", "public", "--frequencies-file", a.frequencies_file]
    elif a.frequency_epsilon_share is not None and eps != float("inf"):
        args += ["--frequency-epsilon-share", str(a.frequency_epsilon_share)]
    return args


def run_one(a, model, eps, seed=None) -> dict | None:
    """Runs one configuration in a child process (progress bar to its log); returns its report or None."""
    out = _run_dir(a.work, model, eps, seed)
    report_path = os.path.join(out, "report.json")
    if os.path.exists(report_path):
        print(f"[table2] {model} eps={eps:g}: already done ({report_path})", flush=True)
    else:
        os.makedirs(out, exist_ok=True)
        cmd = [sys.executable, "-m", "pipelines.sequential", *_pipeline_args(a, model, eps, out, seed)]
        print(f"[table2] {model} eps={eps:g}: {shlex.join(cmd)}  (log: {out}/log.txt)", flush=True)
        start = time.time()
        with open(os.path.join(out, "log.txt"), "w") as log:
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
        with open(os.path.join(out, "peak_rss_mb.txt"), "w") as f:
            f.write(f"{usage.ru_maxrss / 1024:.0f}\n")
        print(f"[table2] {model} eps={eps:g}: exit {proc.returncode} after {time.time() - start:.0f} s", flush=True)
        if proc.returncode != 0:
            return None
    return _load(out)


def _load(out) -> dict | None:
    path = os.path.join(out, "report.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        report = json.load(f)
    rss = os.path.join(out, "peak_rss_mb.txt")
    report["peak_rss_mb"] = None
    if os.path.exists(rss):
        with open(rss) as f:
            report["peak_rss_mb"] = float(f.read())
    return report


def summarize(a, reports: dict) -> dict:
    rows, missing = [], []
    for model, eps, seed in _runs(a.epsilons, a.seeds, a.reference):
        r = reports.get((model, eps, seed))
        label = "non-private" if eps == float("inf") else f"{eps:g}"
        if r is None:
            missing.append(f"{model} eps={label}" + ("" if seed is None else f" seed={seed}"))
            continue
        rows.append(
            {
                "model": model,
                "seed": seed,
                "epsilon_target": label,
                "epsilon_spent": r.get("epsilon"),
                "delta": r.get("delta"),
                "noise_multiplier": r.get("noise_multiplier"),
                "steps": r.get("steps"),
                "item_frequencies": _frequencies(r),
                "ndcg@10_pct": 100 * r["ndcg@10"],
                "hit@10_pct": 100 * r["hit@10"],
                "valid_ndcg@10_pct": 100 * r["validation"]["ndcg@10"],
                "valid_hit@10_pct": 100 * r["validation"]["hit@10"],
                "test_users": r["test"]["users"],
                "paper_ndcg@10_pct": PAPER.get(eps, {}).get(model, (None, None))[0],
                "paper_hit@10_pct": PAPER.get(eps, {}).get(model, (None, None))[1],
                "wall_seconds": r.get("wall_seconds"),
                "median_step_s": r.get("median_step_s"),
                "peak_rss_mb": r.get("peak_rss_mb"),
                "loss_per_epoch": r.get("loss_per_epoch"),
            }
        )
    return {"rows": rows, "missing": missing}


def _frequencies(report: dict) -> str:
    """How a run got its item frequencies, in a few words (from its report)."""
    info = report.get("extra", {}).get("item_frequencies") or {}
    if not info.get("dp_event"):
        return info.get("source", "unknown")
    text = f"{info['source']} z={info['noise_multiplier']:.3g}"
    if info.get("release_epsilon") is not None:
        text += f", eps {info['release_epsilon']:.3g} ({100 * info['epsilon_share']:.3g}%)"
    return text


def popularity_baseline(data_path: str, max_len: int) -> dict:
    """NDCG@10 / HIT@10 of ranking every item by its training-target count (NON-private reference)."""
    import numpy as np

    from tfdp_embed.data.sequences import load_sequences
    from tfdp_embed.metrics.ranking import ranking_metrics, target_ranks

    data = load_sequences(data_path, max_len=max_len)
    counts = np.bincount(data.train_targets[data.train_targets > 0], minlength=data.num_items + 1).astype(np.float32)
    ranks = [
        target_ranks(np.broadcast_to(counts, (len(t), counts.size)), t).numpy()
        for t in np.array_split(data.test_targets, max(1, len(data.test_targets) // 2000))
    ]
    metrics = ranking_metrics(np.concatenate(ranks), 10)
    return {"ndcg@10_pct": 100 * metrics["ndcg@10"], "hit@10_pct": 100 * metrics["hit@10"], "users": metrics["users"]}


def plot(summary, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for model, color in (("transformer", "tab:blue"), ("dpformer", "tab:red")):
        ours = [
            (float(r["epsilon_target"]), r["ndcg@10_pct"])
            for r in summary["rows"]
            if r["model"] == model and r["epsilon_target"] != "non-private"
        ]
        if ours:
            ax.plot(*zip(*sorted(ours)), "o-", color=color, label=f"{model} (ours)")
        paper = sorted((eps, PAPER[eps][model][0]) for eps in PAPER)
        ax.plot(*zip(*paper), "s--", color=color, alpha=0.5, label=f"{model} (paper Table 2)")
    ref = [r for r in summary["rows"] if r["epsilon_target"] == "non-private"]
    if ref:
        ax.axhline(ref[0]["ndcg@10_pct"], color="gray", ls=":", label="non-private Transformer (ours)")
    if summary.get("popularity"):
        ax.axhline(summary["popularity"]["ndcg@10_pct"], color="k", ls="-.", lw=0.8, label="popularity (non-private)")
    ax.set_xlabel("epsilon")
    ax.set_ylabel("NDCG@10 (%), all items ranked")
    ax.set_title("Amazon Games, next-item prediction")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown(a, summary, info, command) -> str:
    lines = [
        "",
        "## dpformer_table2: DPFormer Table 2 (Amazon Games), vanilla Transformer vs DPFormer",
        "",
        f"Date: {info['date_utc']}. Command: `{command}`",
        *([a.note] if a.note else []),
        f"Machine: {info['nproc']} cores ({info['cpu_model']}), {info['memory_total_gb']} GB; load average at start "
        f"{info['load_average_at_start']} (shared with other engineers' jobs); {a.parallel} run(s) at a time. "
        f"Versions: {info['versions']}.",
        f"Settings (same for every run): {a.epochs} epoch(s), expected batch {a.batch} (Poisson over users), max length "
        f"{a.max_len}, peak lr {a.lr} (Adam, weight decay 1e-5, 20% warm-up then linear decay), dropout {a.dropout}, "
        "clip 1.0, d=64, 1 head, 2 blocks, shared input/output item table, delta = 1/N (N = 31,013 users), PLD "
        f"accountant, user-level DP, {frequency_words(summary['rows'])}, effective-error scale 1"
        + (
            "; every model adds the fixed log item-frequency prior to its logits (`--popularity-prior`: the same "
            "frequencies, not trained)"
            if a.popularity_prior
            else ""
        )
        + (
            f"; the item table has rows for the {a.head_items:,} most frequent items only (`--head-items`, chosen "
            "with the same frequencies), every other item shares one row and is told apart by its prior; the "
            "loss is still the softmax over all items, and all items are ranked. "
            if a.head_items
            else ". "
        )
        + "Metrics: test users (last item), ALL 23,715 items ranked, history items kept, pessimistic ties; seeds: "
        + ", ".join("unset" if s is None else str(s) for s in a.seeds)
        + ".",
        "",
        "| model | eps target | eps spent | sigma | steps | item frequencies | NDCG@10 % | HIT@10 % | paper NDCG/HIT % "
        "| valid NDCG/HIT % | wall s | median step s | peak RSS MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in summary["rows"]:
        paper = "-" if r["paper_ndcg@10_pct"] is None else f"{r['paper_ndcg@10_pct']:.2f} / {r['paper_hit@10_pct']:.2f}"
        spent = "n/a" if r["epsilon_spent"] is None else f"{r['epsilon_spent']:.3f}"
        model = r["model"] if r.get("seed") is None else f"{r['model']} (seed {r['seed']})"
        lines.append(
            f"| {model} | {r['epsilon_target']} | {spent} | {r['noise_multiplier']:.4g} | {r['steps']} "
            f"| {r['item_frequencies']} "
            f"| {r['ndcg@10_pct']:.2f} | {r['hit@10_pct']:.2f} | {paper} "
            f"| {r['valid_ndcg@10_pct']:.2f} / {r['valid_hit@10_pct']:.2f} | {r['wall_seconds']:.0f} "
            f"| {r['median_step_s']:.2f} | {r['peak_rss_mb'] if r['peak_rss_mb'] is not None else 'not measured'} |"
        )
    lines += [
        "",
        f"Tuning: {a.tuning}",
        "Tuning would cost privacy budget: releasing the best of K tuned DP runs is, by basic composition, "
        "K x epsilon; with Papernot & Steinke 2022 (random search with a random number of runs) about 3 x epsilon, "
        "so a tuned eps=8 row would really be an eps~24 model (`tfdp_embed.select_privately` accounts for it).",
        f"The paper trains 100 epochs with tuned lr/batch on a GPU; these rows train {a.epochs} epoch(s) on 2 shared "
        "CPU cores.",
    ]
    if summary.get("popularity"):
        pop = summary["popularity"]
        lines += [
            "",
            f"Reference: ranking every item by its training-target count (popularity, NON-private): NDCG@10 "
            f"{pop['ndcg@10_pct']:.2f} %, HIT@10 {pop['hit@10_pct']:.2f} % on the same {pop['users']} test users.",
        ]
    if summary["missing"]:
        lines += [
            "",
            f"Missing (did not finish in the time available; not estimated): {', '.join(summary['missing'])}.",
        ]
    png = outputs.shown_path(a.png) if a.png else "not written"
    data = outputs.shown_path(a.json) if a.json else "not written"
    lines += ["", f"Plot: `{png}`; data: `{data}`.", ""]
    return "\n".join(lines)


def frequency_words(rows: list) -> str:
    """The item-frequency sources the runs' report.json files record, in words."""
    sources = sorted({str(r.get("item_frequencies") or "not recorded") for r in rows})
    words = "item frequencies: " + (" / ".join(sources) or "no finished run") + " (as each run's report.json records)"
    if any(source.startswith("public") for source in sources):
        words += (
            "; 'public' frequencies are a privacy assumption (DPFormer Remark A.2): when they were computed from "
            "the training data the rows are NOT a valid DP result"
        )
    return words


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.dpformer_table2", description=__doc__.split("\n")[0])
    p.add_argument("--data", default=os.path.join(ROOT, "..", "shared", "data", "sasrec", "amazon_games.txt"))
    p.add_argument("--work", default="/tmp/dpformer_table2", help="one run directory per configuration")
    p.add_argument("--epsilons", type=lambda s: [float(x) for x in s.split(",")], default=[8.0, 5.0, 10.0])
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--max-len", type=int, default=20)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--dropout", type=float, default=0.2)
    p.add_argument("--delta", type=float)
    p.add_argument("--seed", type=int, help="one seed for every run (see --seeds)")
    p.add_argument(
        "--seeds",
        type=lambda s: [int(x) for x in s.split(",")],
        help="run every (model, epsilon) once per seed (run directories get a _seedS suffix)",
    )
    p.add_argument(
        "--no-reference", dest="reference", action="store_false", help="skip the non-private Transformer run"
    )
    p.add_argument(
        "--popularity-prior", action="store_true", help="every run adds the log item-frequency prior to its logits"
    )
    p.add_argument(
        "--head-items",
        type=int,
        help="every run trains table rows for the K most frequent items only (see the pipeline)",
    )
    p.add_argument(
        "--frequency-epsilon-share",
        type=float,
        help="share of each run's epsilon for the DP item-frequency release (default: the pipeline's, 0.1)",
    )
    p.add_argument(
        "--frequencies-file",
        help="public item frequencies ('item_id frequency' lines) instead of the DP release; only for frequencies "
        "independent of the training data (the report's guarantee is then conditional on them)",
    )
    p.add_argument("--parallel", type=int, default=1, help="runs at once (each is one process)")
    p.add_argument(
        "--tuning",
        default="none: every setting was fixed before the first run and used for all runs.",
        help="what was tuned before these runs and on what (written into the RESULTS.md section)",
    )
    p.add_argument("--summarize", action="store_true", help="only rebuild the table from finished runs")
    p.add_argument("--note", default="", help="a line added under the command (e.g. the command that ran the runs)")
    p.add_argument("--results-md", default="", help="append the section to this RESULTS.md ('' to skip)")
    p.add_argument("--json", default=outputs.AUTO, help="'auto': a new file under benchmarks/results/; '' skips")
    p.add_argument("--png", default=outputs.AUTO, help="'auto': a new file under benchmarks/results/; '' skips")
    a = p.parse_args(argv)
    epsilons = "-".join(f"{e:g}" for e in a.epsilons)
    if a.seeds is not None and a.seed is not None:
        p.error("--seed and --seeds exclude each other.")
    a.seeds = a.seeds or [a.seed]
    outputs.resolve(
        p,
        a,
        benchmark="dpformer_table2",
        tag=f"eps{epsilons}-ep{a.epochs}-b{a.batch}",
        files={"json": ".json", "png": ".png"},
    )
    if a.frequencies_file is not None and a.frequency_epsilon_share is not None:
        p.error(
            "--frequencies-file (public frequencies) and --frequency-epsilon-share (a DP release) exclude each other."
        )
    if not os.path.exists(a.data):
        print(f"data file not found: {a.data} (../shared/data is needed for this benchmark)", file=sys.stderr)
        return 2
    info = machine_info(ROOT)
    runs = _runs(a.epsilons, a.seeds, a.reference)
    if a.summarize:
        reports = {run: _load(_run_dir(a.work, *run)) for run in runs}
    else:  # DPFormer first within each seed (the goal), so an interrupted run leaves pairs
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.parallel)) as pool:
            reports = dict(zip(runs, pool.map(lambda run: run_one(a, *run), runs)))
    summary = summarize(a, reports)
    summary["popularity"] = popularity_baseline(a.data, a.max_len)
    command = "python -m benchmarks.dpformer_table2 " + shlex.join(argv if argv is not None else sys.argv[1:])
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"command": command, "machine": info, "settings": vars(a), **summary}, f, indent=2, default=str)
    if a.png:
        plot(summary, a.png)
    text = markdown(a, summary, info, command)
    print(text)
    if a.results_md:
        outputs.append_section(a.results_md, text, files=(a.json, a.png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
