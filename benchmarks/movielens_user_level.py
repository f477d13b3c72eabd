"""MovieLens user-level vs example-level DP: two-tower recall@10 on ml-100k at epsilon 1, 3, 8 (issue 30).

    python -m benchmarks.movielens_user_level [--epochs 5] [--epsilons 1,3,8] [--ks 8,32,128] [--delta 1e-5]

Runs `pipelines.movielens.train_and_evaluate` (DP-SGD, `dense`) one after another in this
process, on the same data and seeded split:

* user level (`privacy_unit="user"`): Poisson over users (expected `--users-per-batch`
  per step), each sampled user bringing at most k of their examples, one clipped gradient
  per user, for every k in `--ks` and epsilon in `--epsilons`;
* example level (`privacy_unit="example"`): today's run over (context, label) examples
  (expected `--batch-size` per step) at each epsilon, with the group-privacy epsilon the
  pipeline reports for a user with the median and with the most examples;
* the non-private model (`none`, example level) and the popularity ranking of the training
  split (not private, from the pipeline's report).

Every DP run uses the same delta (`--delta`, default 1e-5, below 1 / users and 1 / examples)
so that the two units are compared at the same (epsilon, delta); the same number of
epochs (passes over the units), the pipeline's learning rate for calibrated runs and
every other default. Then it writes `--json` and `--png` (recall@10 vs epsilon, one line
per unit and k); `make results` regenerates `benchmarks/RESULTS.md` from the JSON.

The k with the best test recall is reported as such: choosing k by test recall is
not private and not accounted (and is optimistic); the table shows every k.
One seed per setting: the run-to-run spread is not measured.

References: Chua et al., "Mind the Privacy Unit!", COLM 2024; Dwork & Roth 2014, Thm 2.2.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import shlex
import sys
import time

from benchmarks import outputs
from pipelines.movielens import units as movielens_units

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _settings(epsilons, ks, users_per_batch) -> list:
    """(label, unit, epsilon, k, batch) of every run: non-private, then per epsilon example level and each (B, k)."""
    runs = [("none", "example", None, None, None)]
    for eps in epsilons:
        runs.append(("example", "example", eps, None, None))
        runs += [(f"user k={k} B={b}", "user", eps, k, b) for b in users_per_batch for k in ks]
    return runs


def _config(base, unit: str, epsilon, k, users, args):
    if epsilon is None:
        return dataclasses.replace(base, mechanism="none", privacy_unit="example", batch_size=args.batch_size)
    common = dict(mechanism="dense", epsilon=epsilon, delta=args.delta, privacy_unit=unit)
    if unit == "user":
        return dataclasses.replace(base, **common, max_examples_per_user=k, batch_size=users)
    return dataclasses.replace(base, **common, batch_size=args.batch_size)


def _row(label: str, report: dict, wall: float) -> dict:
    group = report.get("group_privacy") or {}
    return {
        "run": label,
        "privacy_unit": "user" if report.get("max_examples_per_unit") else ("none" if label == "none" else "example"),
        "k": report.get("max_examples_per_unit"),
        "epsilon": report["epsilon"],
        "delta": report["delta"],
        "noise_multiplier": report["noise_multiplier"],
        "num_units": report.get("num_units"),
        "steps": report["steps_run"],
        "learning_rate": report["training"]["learning_rate"],
        "batch_size": report["training"]["batch_size"],
        **{f"recall@{k}": report[f"recall@{k}"] for k in (5, 10, 20)},
        "precision@10": report["precision@10"],
        "popularity_recall@10": report["baselines"]["popularity"]["recall@10"],
        "group_epsilon_median_user": (group.get("median_user") or {}).get("epsilon"),
        "group_epsilon_largest_user": (group.get("largest_user") or {}).get("epsilon"),
        "median_user_examples": (group.get("median_user") or {}).get("examples"),
        "largest_user_examples": (group.get("largest_user") or {}).get("examples"),
        "users_above_k": report.get("users_with_more_examples_than_k"),
        "examples_dropped_share": report.get("examples_dropped_per_epoch_share"),
        "final_train_loss": report["final_train_loss"],
        "wall_s": wall,
        "warnings": report.get("warnings", []),
    }


def _markdown(command: str, info: dict, config: dict, rows: list, data: dict) -> str:
    from benchmarks.results_questions import user_level_text

    return "\n".join(
        [
            f"## movielens_user_level — {info['date_utc']} — recall@10, user vs example level, ml-100k",
            "",
            f"Command: `{command}`",
            "",
            f"Machine: {info['nproc']} cores ({info['cpu_model']}); git {info['git'].get('commit', '?')}.",
            "",
            user_level_text({"config": config, "runs": rows, "data": data}),
            "",
        ]
    )


def _plot(rows: list, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for label in dict.fromkeys(r["run"] for r in rows if r["epsilon"] is not None):
        points = sorted((r["epsilon"], r["recall@10"]) for r in rows if r["run"] == label)
        ax.plot(*zip(*points), marker="o", label=label if label != "example" else "example level")
    none = next(r for r in rows if r["run"] == "none")
    ax.axhline(none["recall@10"], color="k", linestyle="--", label="non-private")
    ax.axhline(none["popularity_recall@10"], color="gray", linestyle=":", label="popularity (not private)")
    ax.set_xscale("log")
    targets = sorted(round(r["epsilon"]) for r in rows if r["run"] == "example")
    ax.set_xticks(targets, [f"{t:g}" for t in targets])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("epsilon (delta 1e-5; users for user level, examples for example level)")
    ax.set_ylabel("recall@10 (test users, all movies ranked)")
    ax.set_title("MovieLens ml-100k two-tower: user-level vs example-level DP-SGD")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m benchmarks.movielens_user_level", description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=5, help="passes over the units (the MovieLensConfig default)")
    p.add_argument("--epsilons", default="1,3,8")
    p.add_argument("--ks", default="8,32,128", help="user level: max examples per user")
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--batch-size", type=int, default=256, help="example level: expected examples per batch")
    p.add_argument("--users-per-batch", default="64,128", help="user level: expected users per batch (a list)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default=None)
    p.add_argument("--json", default=outputs.AUTO, help="'auto': a new file under benchmarks/results/; '' skips")
    p.add_argument("--png", default=outputs.AUTO, help="'auto': a new file under benchmarks/results/; '' skips")
    p.add_argument("--results-md", default=outputs.RESULTS_MD, help="'' skips")
    args = p.parse_args(argv)
    tag = f"ep{args.epochs}-eps{args.epsilons.replace(',', '-')}"
    outputs.resolve(p, args, benchmark="movielens_user_level", tag=tag, files={"json": ".json", "png": ".png"})
    return args


def main(argv=None) -> int:
    args = _parse(argv)
    from benchmarks.machine import machine_info
    from pipelines import movielens

    info = machine_info(ROOT)
    command = "python -m benchmarks.movielens_user_level " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    base = movielens.MovieLensConfig(
        epochs=args.epochs, seed=args.seed, verbose=0, **({"data_path": args.data} if args.data else {})
    )
    data = movielens.load_movielens(base)
    settings = _settings(*(_numbers(text, kind) for text, kind in ((args.epsilons, float), (args.ks, int))),
                         _numbers(args.users_per_batch, int))  # fmt: skip
    rows = []
    for index, (label, unit, epsilon, k, users) in enumerate(settings, start=1):
        started = time.perf_counter()
        report = movielens.train_and_evaluate(_config(base, unit, epsilon, k, users, args), data=data).report
        rows.append(_row(label, report, time.perf_counter() - started))
        r = rows[-1]
        print(f"[{index}/{len(settings)}] {label:11s} eps={epsilon} sigma={r['noise_multiplier']:.4g} "
              f"steps={r['steps']} R@10={r['recall@10']:.4f} ({r['wall_s']:.0f} s)", flush=True)  # fmt: skip
    config = {
        "epochs": args.epochs, "epsilons": args.epsilons, "ks": args.ks, "delta": args.delta,
        "batch_size": args.batch_size, "users_per_batch": args.users_per_batch, "seed": args.seed,
        "embedding_dim": base.embedding_dim, "l2_norm_clip": base.l2_norm_clip, "momentum": base.momentum,
        **_default_k(data, args.seed),
    }  # fmt: skip
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result: dict = {"command": command, "machine": info, "config": config, "data": data.summary(), "runs": rows}
    result["peak_rss_mb"] = peak_mb
    section = _markdown(command, info, config, rows, data.summary())
    outputs.write_run(args, result, plot=lambda path: _plot(rows, path), section=lambda **_: section)
    print(section)
    return 0


def _default_k(data, seed) -> dict:
    """The k a run without `--max-examples-per-user` releases with DP on this data (at this seed), and how."""
    user_ids = movielens_units.example_users(data.train_timelines)
    k, how, _ = movielens_units.choose_k(None, user_ids, seed=seed)
    return {"default_k": k, "default_k_choice": how}


def _numbers(text: str, kind) -> list:
    return [kind(value) for value in str(text).split(",") if value]


if __name__ == "__main__":
    sys.exit(main())
