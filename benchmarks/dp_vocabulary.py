"""What DP vocabularies cost: MovieLens recall@10 ratings-only vs with the catalogue; sequential NDCG@10.

    python -m benchmarks.dp_vocabulary [--movielens-epochs 2] [--shares 0.3,0.5] [--sequential-steps 120]

Runs, one after another in this process:

* MovieLens ml-100k, dense DP-SGD at --epsilon (example-level, as the pipeline): the movie ids from the
  catalogue `u.item` (public, nothing spent) and from the ratings alone (`--item-catalogue none`: the movie
  set released by `dp_vocabulary`, unit = user, per-unit weights, D0 = 100) for each share of epsilon in
  --shares. recall@10 over every test position (positions whose movie the map dropped are misses).
* Sequential (Amazon Games, DPFormer at --sequential-epsilon, --sequential-steps steps, --max-eval-users test
  users): the item ids of a stand-in public catalogue (every id 1..largest of the file: Amazon Games ships no
  catalogue, so this is the no-cost reference) and the default DP vocabulary (10% of epsilon, D0 = 5).

One seed per setting; the short settings are a smoke-sized measurement, not the pipelines' full runs.
Writes --json (default a new file under benchmarks/results/) through `benchmarks.outputs`.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time

from benchmarks import machine, outputs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ML_100K = os.path.join(ROOT, "..", "shared", "data", "movielens", "ml-100k", "u.data")
GAMES = os.path.join(ROOT, "..", "shared", "data", "sasrec", "amazon_games.txt")


def movielens_runs(args) -> list:
    from pipelines import movielens

    settings = [("catalogue u.item", "auto", None)] + [
        (f"ratings only, DP vocabulary ({share:g} of epsilon)", None, share) for share in args.shares
    ]
    rows = []
    for name, catalogue, share in settings:
        config = movielens.MovieLensConfig(
            data_path=args.movielens_data,
            item_catalogue=catalogue,
            vocabulary_epsilon_share=share,
            mechanism="dense",
            epsilon=args.epsilon,
            epochs=args.movielens_epochs,
            seed=args.seed,
            verbose=0,
        )
        started = time.perf_counter()
        try:
            report = movielens.train_and_evaluate(config).report
        except ValueError as error:  # e.g. the release kept fewer than 2 movies
            rows.append({"setting": name, "error": str(error)})
            continue
        rows.append(
            {
                "setting": name,
                "recall@10": report["recall@10"],
                "precision@10": report["precision@10"],
                "movies_in_map": report["model"]["num_items"],
                "epsilon": report["epsilon"],
                "noise_multiplier": report["noise_multiplier"],
                "unranked_test_positions": report.get("unranked_test_positions", 0),
                "vocabulary": report.get("extra", {}).get("movie_vocabulary"),
                "wall_seconds": time.perf_counter() - started,
            }
        )
    return rows


def sequential_runs(args) -> list:
    from pipelines import sequential
    from tfdp_embed.data.sequences import read_user_sequences

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        largest = max(max(items) for items in read_user_sequences(args.sequential_data).values())
        catalogue = os.path.join(tmp, "items.txt")
        with open(catalogue, "w") as f:
            f.write("".join(f"{i}\n" for i in range(1, largest + 1)))
        common = [
            "--data",
            args.sequential_data,
            "--model",
            "dpformer",
            "--epsilon",
            str(args.sequential_epsilon),
            "--epochs",
            "1",
            "--max-steps",
            str(args.sequential_steps),
            "--dim",
            "32",
            "--blocks",
            "1",
            "--max-eval-users",
            str(args.max_eval_users),
            "--verbose",
            "0",
            "--seed",
            str(args.seed),
        ]
        for name, flags in (
            ("catalogue (ids 1..largest, stand-in)", ["--item-catalogue", catalogue]),
            ("DP vocabulary (default: 0.1 of epsilon, D0 = 5)", []),
        ):
            started = time.perf_counter()
            out = os.path.join(tmp, f"run{len(rows)}")
            report = sequential.run(sequential.parse_args([*common, *flags, "--out", out])).report
            rows.append(
                {
                    "setting": name,
                    "ndcg@10": report["ndcg@10"],
                    "hit@10": report["hit@10"],
                    "items": report["extra"].get("item_vocabulary", {}).get("items"),
                    "unknown_test_targets": report["test"].get("unknown_targets"),
                    "epsilon": report["epsilon"],
                    "noise_multiplier": report["noise_multiplier"],
                    "vocabulary": report["extra"].get("item_vocabulary"),
                    "wall_seconds": time.perf_counter() - started,
                }
            )
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.dp_vocabulary", description=__doc__.splitlines()[0])
    p.add_argument("--epsilon", type=float, default=3.0, help="MovieLens target epsilon")
    p.add_argument("--shares", default="0.3,0.5", help="MovieLens: shares of epsilon for the movie-set release")
    p.add_argument("--movielens-epochs", type=int, default=2)
    p.add_argument("--movielens-data", default=ML_100K)
    p.add_argument("--sequential-data", default=GAMES)
    p.add_argument("--sequential-epsilon", type=float, default=8.0)
    p.add_argument("--sequential-steps", type=int, default=120)
    p.add_argument("--max-eval-users", type=int, default=3000)
    p.add_argument("--skip", choices=("movielens", "sequential"), action="append", default=[])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=outputs.AUTO, help="'auto': a new file under benchmarks/results/; '' skips")
    p.add_argument("--results-md", default="", help="a results page to append a section to ('' skips)")
    args = p.parse_args(argv)
    args.shares = [float(s) for s in args.shares.split(",") if s]
    args.png = ""
    outputs.resolve(p, args, benchmark="dp_vocabulary", tag=f"eps{args.epsilon:g}", files={"json": ".json"})
    started = time.perf_counter()
    payload = {
        "command": "python -m benchmarks.dp_vocabulary " + shlex.join(sys.argv[1:] if argv is None else argv),
        "date": outputs.utc_stamp(),
        "machine": machine.machine_info(ROOT),
        "seed": args.seed,
        "movielens": [] if "movielens" in args.skip else movielens_runs(args),
        "sequential": [] if "sequential" in args.skip else sequential_runs(args),
    }
    payload["wall_seconds"] = time.perf_counter() - started
    outputs.write_run(args, payload, plot=lambda path: None, section=lambda **files: _section(payload, **files))
    print(json.dumps(payload, indent=2, default=str))
    return 0


def _section(payload: dict, *, png: str, json_path: str) -> str:
    lines = [
        "## DP vocabularies: what the id maps cost",
        "",
        f"`{payload['command']}` ({payload['date']}); JSON: `{json_path}`.",
        "",
        "| pipeline | setting | metric | ids kept |",
        "|---|---|---|---|",
    ]
    for row in payload["movielens"]:
        metric = f"recall@10 {row['recall@10']:.4f}" if "recall@10" in row else row["error"]
        lines.append(f"| MovieLens | {row['setting']} | {metric} | {row.get('movies_in_map', '-')} |")
    for row in payload["sequential"]:
        lines.append(f"| sequential | {row['setting']} | NDCG@10 {row['ndcg@10']:.4f} | {row['items']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
