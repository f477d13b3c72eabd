"""MovieLens two-tower utility: precision@k / recall@k for SGD, DP-SGD, EANA and LazyDP on ml-100k.

    python -m benchmarks.movielens_utility [--epochs 5] [--epsilon 3] [--noise-multipliers 0.01,0.001]

Runs, one after another in this process, `pipelines.movielens.train_and_evaluate`
(no canaries) for: `none`; `dense`, `eana`, `lazy` at each fixed noise
multiplier (EANA's 0.01 and 0.001, §4.1.3); `dense` and `lazy` at the noise
multiplier calibrated for (--epsilon, delta = 1/N) and `eana` at that same
sigma (EANA has no epsilon: the sigma is DP-SGD's). Every run: precision@k /
recall@k for k in 1, 5, 10, 20 ranking all 1,682 items for every position of
the 189 test users, epsilon (DP mechanisms), EANA's data-dependent bound,
steps, median step time, wall time. Then it writes `--json` and `--png`
(precision@k vs k, one line per run; both default to new files of this run
under `benchmarks/results/`); `make results` regenerates
`benchmarks/RESULTS.md` from the JSON files (`--results-md` naming another
page appends a "movielens" section: command, date, machine, versions, table).

One seed per setting: the run-to-run spread is not measured, and the section says so.

References: Berlowitz et al., "EANA", RecSys 2022, §4.1.3, Fig. 4.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import resource
import shlex
import sys
import time

from benchmarks import outputs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KS = (1, 5, 10, 20)


def _settings(noise_multipliers, epsilon) -> list:
    runs = [("none", None, None)]
    for sigma in noise_multipliers:
        runs += [(m, sigma, None) for m in ("dense", "eana", "lazy")]
    if epsilon is not None:
        runs += [
            ("dense", None, epsilon),
            ("lazy", None, epsilon),
            ("eana", None, epsilon),
        ]
    return runs


def _row(report: dict, wall: float) -> dict:
    bound = report.get("eana_bound") or {}
    return {
        "mechanism": report["mechanism"],
        "noise_multiplier": report["noise_multiplier"],
        "noise_source": report["noise_source"],
        "epsilon": report["epsilon"],
        "nominal_epsilon_not_dp": report.get("nominal_epsilon_not_dp"),
        "delta": report["delta"],
        "accountant": report["accountant"],
        "steps": report["steps_run"],
        **{f"precision@{k}": report[f"precision@{k}"] for k in KS},
        **{f"recall@{k}": report[f"recall@{k}"] for k in KS},
        "final_train_loss": report["final_train_loss"],
        "median_step_ms": None if report["median_step_s"] is None else 1e3 * report["median_step_s"],
        "wall_s": wall,
        "eana_data_dependent_epsilon": bound.get("data_dependent_epsilon"),
        "eana_history_rows_never_touched": bound.get("history_rows_never_touched"),
        "warnings": report.get("warnings", []),
    }


def _number(value, fmt="{:.4f}") -> str:
    if value is None:
        return "—"
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return fmt.format(value)


def _markdown(command: str, info: dict, config: dict, rows: list, data: dict, peak_mb: float) -> str:
    v = info["versions"]
    lines = [
        f"## movielens — {info['date_utc']} — two-tower precision@k / recall@k on ml-100k (none, DP-SGD, EANA, LazyDP)",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {info['nproc']} cores ({info['cpu_model']}), {info['memory_total_gb']} GB; load average at start "
        f"{info['load_average_at_start']} (shared machine: step times are inflated by other jobs). Versions: "
        + ", ".join(f"{k} {val}" for k, val in v.items())
        + f". Git: {info['git'].get('commit', '?')}. Peak RSS of the process: {peak_mb:.0f} MB.",
        "",
        (
            f"Data: {data['train_users']} training users / {data['test_users']} test users (seeded split), "
            f"{data['train_examples']} training examples (every position of a training timeline: the privacy unit), "
            f"{data['test_examples']} test examples (every position of a test timeline), {data['num_items']} items, "
            f"context {data['context_length']}. Model: dim {config['embedding_dim']}, hidden {config['hidden_units']}, "
            f"full softmax over all items. Training: {config['epochs']} epochs of Poisson batches (expected "
            f"{config['batch_size']}), legacy SGD momentum {config['momentum']}, learning rate "
            f"{config['learning_rates']}, clip {config['l2_norm_clip']}, seed {config['seed']}."
        ),
        "",
        "| mechanism | sigma | epsilon (delta) | P@1 | P@5 | P@10 | P@20 | R@1 | R@5 | R@10 | R@20 | steps | median step | wall |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["mechanism"] == "eana":
            eps = "not DP"
        elif r["epsilon"] is None:
            eps = "—"
        else:
            eps = f"{r['epsilon']:.3g} ({r['delta']:.2g}, {r['accountant'].upper()})"
        lines.append(
            f"| {r['mechanism']} | {_number(r['noise_multiplier'], '{:.4g}')} ({r['noise_source']}) | {eps} | "
            + " | ".join(_number(r[f"precision@{k}"]) for k in KS)
            + " | "
            + " | ".join(_number(r[f"recall@{k}"]) for k in KS)
            + f" | {r['steps']} | {_number(r['median_step_ms'], '{:.1f} ms')} | {r['wall_s']:.0f} s |"
        )
    eana = [r for r in rows if r["mechanism"] == "eana"]
    lines += [
        "",
        (
            "With one relevant item per query, recall@k is the hit rate and precision@k = recall@k / k. A random "
            f"ranking has recall@k = k / {data['num_items']}."
        ),
        "EANA rows: no epsilon exists (not DP). Its data-dependent bound (Theorem 3.1, from the run's real "
        "per-row touch counts, passes composed) was: "
        + "; ".join(
            f"sigma {r['noise_multiplier']:.4g}: {_number(r['eana_data_dependent_epsilon'], '{:.4g}')} "
            f"({r['eana_history_rows_never_touched']} history rows never touched)"
            for r in eana
        )
        + " (inf when some row has no noise draw: its value reveals that no example used it).",
        (
            "Every item row has a non-zero full-softmax gradient in every step, so EANA and LazyDP noise the whole "
            "item table every step like DP-SGD; their sparsity is on the history table only."
        ),
        "Spread: one seed per setting; the run-to-run spread is not measured.",
    ]
    warn = [f"{r['mechanism']} sigma {r['noise_multiplier']}: {w}" for r in rows for w in r["warnings"]]
    if warn:
        lines += [""] + [f"WARNING: {w}" for w in warn]
    lines.append("")
    return "\n".join(lines)


def _plot(rows: list, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        label = f"{r['mechanism']} sigma={r['noise_multiplier']:.3g}" + (
            f" eps={r['epsilon']:.2g}" if r["epsilon"] is not None else ""
        )
        ax.plot(KS, [r[f"precision@{k}"] for k in KS], marker="o", label=label)
    ax.set_xlabel("k")
    ax.set_ylabel("precision@k (test users, all items ranked)")
    ax.set_title("MovieLens ml-100k two-tower: precision@k")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.movielens_utility",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--epsilon", type=float, default=3.0)
    p.add_argument("--noise-multipliers", default="0.01,0.001")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--accountant", choices=("pld", "rdp"), default="rdp")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--dp-learning-rate",
        type=float,
        default=None,
        help="SGD rate of the noised runs (default: pipeline's)",
    )
    p.add_argument("--data", default=None)
    p.add_argument("--json", default=outputs.AUTO, help="'auto': a new file under benchmarks/results/; '' skips")
    p.add_argument("--png", default=outputs.AUTO, help="'auto': a new file under benchmarks/results/; '' skips")
    p.add_argument("--results-md", default=outputs.RESULTS_MD, help="'' skips")
    args = p.parse_args(argv)
    outputs.resolve(
        p,
        args,
        benchmark="movielens_utility",
        tag=f"eps{args.epsilon:g}-ep{args.epochs}",
        files={"json": ".json", "png": ".png"},
    )
    from benchmarks.machine import machine_info
    from pipelines import movielens

    info = machine_info(ROOT)
    command = "python -m benchmarks.movielens_utility " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    sigmas = [float(s) for s in args.noise_multipliers.split(",") if s]
    base = movielens.MovieLensConfig(
        epochs=args.epochs,
        batch_size=args.batch_size,
        seed=args.seed,
        accountant=args.accountant,
        verbose=0,
        **({"data_path": args.data} if args.data else {}),
    )
    data = movielens.load_movielens(base)
    rows, rates_used = [], {}
    settings = _settings(sigmas, args.epsilon)
    for index, (mechanism, sigma, epsilon) in enumerate(settings, start=1):
        rate = args.dp_learning_rate if mechanism != "none" else None
        config = dataclasses.replace(
            base,
            mechanism=mechanism,
            noise_multiplier=sigma,
            epsilon=epsilon,
            learning_rate=rate,
        )
        rates_used.setdefault(mechanism, set()).add(config.resolved_learning_rate)
        started = time.perf_counter()
        report = movielens.train_and_evaluate(config, data=data).report
        rows.append(_row(report, time.perf_counter() - started))
        r = rows[-1]
        print(
            f"[{index}/{len(settings)}] {mechanism:5s} sigma={r['noise_multiplier']:.4g} eps={r['epsilon']} "
            f"P@1={r['precision@1']:.4f} R@10={r['recall@10']:.4f} R@20={r['recall@20']:.4f} "
            f"({r['wall_s']:.0f} s)",
            flush=True,
        )
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    config = {
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "embedding_dim": base.embedding_dim,
        "hidden_units": list(base.hidden_units),
        "momentum": base.momentum,
        "l2_norm_clip": base.l2_norm_clip,
        "learning_rates": {
            name: sorted(rates) if len(rates) > 1 else rates.pop() for name, rates in rates_used.items()
        },
        "seed": args.seed,
        "accountant": args.accountant,
        "epsilon": args.epsilon,
        "noise_multipliers": sigmas,
    }
    result = {
        "command": command,
        "machine": info,
        "config": config,
        "data": data.summary(),
        "runs": rows,
        "peak_rss_mb": peak_mb,
    }
    section = _markdown(command, info, config, rows, data.summary(), peak_mb)
    outputs.write_run(args, result, plot=lambda path: _plot(rows, path), section=lambda **_: section)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
