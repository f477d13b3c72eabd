"""Two-tower retrieval with item features: recall@10 and step time of the DP Retrieval task vs TFRS and popularity.

    python -m benchmarks.retrieval [--epsilon 3] [--epochs 12] [--batch-size 512]
        [--dp-runs none:full,lazy:full,none:sampled,lazy:sampled,adafest:sampled]
        [--tune-learning-rates 0.02,0.05,0.1,0.2] [--tune-max-epochs 8] [--interleaved-steps 40]

Part 1, ml-100k (one process, one run after another): a TFRS user's two-tower
(user-id table + Dense; item tower = movie-id `DPEmbedding` subclass +
multi-valued genre table + Dense over the catalogue), and

* the most popular movies of the training split (`retrieval_baselines.popularity_row`);
* the two-tower without privacy with `tfrs.tasks.Retrieval` (in-batch
  negatives, Adagrad), tuned on a validation split carved from the training
  ratings (`retrieval_baselines.tune_tfrs`: each `--tune-learning-rates`,
  with and without TFRS' log-Q correction, epochs 1..`--tune-max-epochs`;
  `--tune-learning-rates ''` runs the tutorial's setting instead);
* with DP (`DPModel`, Poisson batches, sigma calibrated per mechanism for
  `--epsilon`, RDP, delta 1/N) and `tfdp_embed.keras2.retrieval.Retrieval`:
  full softmax and sampled softmax (uniform data-independent negatives,
  log-Q), under LazyDP or DP-AdaFEST (`--dp-runs`), trained with the
  library's `RetrievalRecipe` (SGD, cosine decay, epochs, batch);
* the same model, task and recipe through `DPModel` with `NonPrivate`
  (`none:full`, `none:sampled`): the control each DP run's recall@10 (the
  DP gap, the cost of the noise) and step time are compared with.

Each run reports recall@10 / recall@50 on a random 20 % of the ratings
(the same ranking code for every run, `retrieval_baselines.ranked_recall`),
over all movies and over the movies the user did not rate in training,
the median step time after warm-up, the wall time and epsilon. Then the
LazyDP and the non-private step of the same sampled-softmax model run
alternately for `--interleaved-steps` steps (`benchmarks.retrieval_step`):
the DP ÷ non-private ratio with both under the same load.

Part 2, a synthetic catalogue of `--synthetic-items` (10^6) items: median
LazyDP step time of the sampled softmax and of the full softmax at
`--synthetic-batch`, the sampled softmax again at `--batch-size`. The item
tower (table + Dense without activation) gets factored per-example
gradients (`tfdp_embed.clipping.shared_factored`), O(batch x items);
a tower with non-linear layers would pay O(batch x items x dim) memory, which
is why the full softmax is measured at a small batch.

Writes `--json`, `--png` (both default to new files under
`benchmarks/results/`); `make results` regenerates `benchmarks/RESULTS.md`
from the JSON files (`--results-md` naming another page appends the
section). Run it
with `nice -n 10` on a shared machine. One seed: the spread is not measured.

References: TFRS retrieval tutorial (in-batch baseline); Yi et al., RecSys
2019 (sampled softmax with log-Q correction).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
import warnings

import numpy as np

from benchmarks import outputs
from benchmarks import retrieval_baselines as baselines

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DATA = os.path.join(ROOT, "..", "shared", "data", "movielens", "ml-100k")
WARMUP_STEPS = 5


# -- data ------------------------------------------------------------------------
def load_ml100k(path: str, seed: int) -> dict:
    """Train / test (user, movie) pairs (random 80/20 of the ratings) and the catalogue (ids, genres)."""
    from tfdp_embed.data.movielens import read_item_genres, read_ratings

    ratings = read_ratings(os.path.join(path, "u.data"))
    ids, genres = read_item_genres(os.path.join(path, "u.item"))
    order = np.random.default_rng(seed).permutation(len(ratings))
    cut = int(0.8 * len(order))

    def pairs(rows):
        return {"user_id": ratings.users[rows].astype("int32"), "movie_id": ratings.items[rows].astype("int32")}

    return {
        "train": pairs(order[:cut]),
        "test": pairs(order[cut:]),
        "num_users": int(ratings.users.max()) + 1,
        "movie_ids": ids,
        "genres": genres,
    }


# -- models ----------------------------------------------------------------------
def build_towers(num_users: int, num_items: int, num_genres: int, dim: int):
    """(user tower, item tower): what a TFRS user writes, with DPEmbedding tables."""
    from tfdp_embed import DPEmbedding, keras, tf

    class MovieIdEmbedding(DPEmbedding):
        def call(self, ids):
            return self.lookup(ids - 1)  # MovieLens ids 1..N

    class MovieModel(keras.Model):
        def __init__(self):
            super().__init__()
            self.movie = MovieIdEmbedding(num_items, dim, name="movie_id")
            self.genres = DPEmbedding(num_genres, dim, combiner="mean", name="genres") if num_genres else None
            self.dense = keras.layers.Dense(dim, name="movie_dense")

        def call(self, features):
            parts = [self.movie(features["movie_id"])]
            if self.genres is not None:
                parts.append(self.genres(features["genres"]))
            return self.dense(tf.concat(parts, axis=1))

    user = keras.Sequential([DPEmbedding(num_users, dim, name="user_id"), keras.layers.Dense(dim)])
    return user, MovieModel()


def dp_model(towers, catalogue: dict, negatives):
    import tensorflow_recommenders as tfrs

    from tfdp_embed.keras2.retrieval import Retrieval

    user_model, movie_model = towers

    class Model(tfrs.Model):
        def __init__(self):
            super().__init__()
            self.user_model, self.movie_model = user_model, movie_model
            self.task = Retrieval(
                movie_model, catalogue, identifiers=catalogue["movie_id"], negatives=negatives, ks=(10,)
            )

        def compute_loss(self, features, training=False):
            return self.task(
                self.user_model(features["user_id"]), candidate_ids=features["movie_id"], training=training
            )

    return Model()


# -- measuring -------------------------------------------------------------------
def step_timer():
    from tfdp_embed import keras

    class StepTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times = []

        def on_train_batch_begin(self, batch, logs=None):
            self._start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.times.append(time.perf_counter() - self._start)

    return StepTimer()


def median_ms(times) -> float | None:
    kept = times[WARMUP_STEPS:] if len(times) > WARMUP_STEPS else times
    return 1e3 * float(np.median(kept)) if kept else None


# -- ml-100k runs ----------------------------------------------------------------
def mechanism(name: str, sigma: float, seed: int, taus: dict):
    from tfdp_embed import mechanisms

    if name == "none":  # the same model and step without privacy: the control of the DP step
        return mechanisms.NonPrivate(seed=seed)
    if name == "lazy":
        return mechanisms.LazyDP(l2_norm_clip=1.0, noise_multiplier=sigma, seed=seed)
    if name == "adafest":
        return mechanisms.DPAdaFEST(
            l2_norm_clip=1.0,
            noise_multiplier=sigma,
            contribution_clip=1.0,
            contribution_noise_multiplier=1.0,
            threshold=taus,
            seed=seed,
        )
    raise ValueError(f"--dp-runs: unknown mechanism {name!r}; choose from none, lazy, adafest.")


def planned_mechanism(name: str, args, q: float, steps: int):
    """The mechanism at sigma calibrated for `--epsilon` (RDP, delta 1/N) over `steps` steps, or at `--noise-multiplier`."""
    from tfdp_embed import plan_run

    taus = {"user_id": args.tau_user, "movie_id": args.tau_movie, "genres": args.tau_genres}
    if name == "none" or not args.epsilon:
        return mechanism(name, args.noise_multiplier, args.seed, taus)
    options = {"contribution_clip": 1.0, "threshold": taus} if name == "adafest" else {}
    run = {"sampling_probability": q, "steps": steps, "target_delta": q / args.batch_size, "accountant": "rdp"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DP-AdaFEST's density warning is recorded by the run itself
        return plan_run(name, target_epsilon=args.epsilon, seed=args.seed, **run, **options).mechanism


def recipe(args):
    """The library's `RetrievalRecipe` at this run's flags (its defaults unless a flag says otherwise)."""
    from tfdp_embed.keras2.retrieval.recipe import RetrievalRecipe

    return RetrievalRecipe(
        num_negatives=args.negatives,
        learning_rate=args.dp_learning_rate,
        cosine_decay=args.cosine_decay,
        epochs=args.epochs,
        batch_size=args.batch_size,
    )


def run_dp(data, catalogue, args, seen, *, name: str, negatives) -> dict:
    from tfdp_embed import DPModel
    from tfdp_embed.data import poisson_batches
    from tfdp_embed.keras2.callbacks import PrivacyBudget

    towers = baselines.fresh_towers(data, args)
    model = dp_model(towers, catalogue, negatives)
    n = len(data["train"]["user_id"])
    q = args.batch_size / n
    batches, _ = poisson_batches(data["train"], sampling_probability=q, seed=args.seed)
    mech = planned_mechanism(name, args, q, args.epochs * round(1 / q))
    dp = DPModel(model, mechanism=mech, expected_batch_size=args.batch_size)
    dp.compile(optimizer=recipe(args).optimizer(steps=args.epochs * round(1 / q)))
    private = name != "none"
    budget = (
        PrivacyBudget(mech, sampling_probability=q, target_epsilon=1e6, target_delta=1.0 / n, accountant="rdp")
        if private
        else None
    )
    timer = step_timer()
    started = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = dp.fit(batches, epochs=args.epochs, callbacks=[budget, timer] if private else [timer], verbose=0)
    wall = time.perf_counter() - started
    softmax = "full softmax" if negatives.full else f"sampled softmax K={negatives.num_negatives}"
    return {
        "warnings": sorted({str(w.message)[:160] for w in caught if "DP-AdaFEST" in str(w.message)}),
        "run": f"{'DP ' + name if private else 'non-private (same model, SGD)'}, {softmax}",
        "mechanism": name,
        "negatives": "full" if negatives.full else "sampled",
        "epsilon": float(budget.epsilon) if private else None,
        "delta": 1.0 / n if private else None,
        "noise_multiplier": float(mech.noise_multiplier) if private else None,
        **baselines.model_recall(towers[0], towers[1], catalogue, data["test"], seen),
        "median_step_ms": median_ms(timer.times),
        "steps": len(timer.times),
        "wall_s": wall,
        "final_train_loss": float(history.history["loss"][-1]),
    }


def run_in_batch(data, catalogue, args, seen, setting: dict) -> dict:
    """The TFRS two-tower at `setting` (learning_rate, epochs, corrected) on the whole training split."""
    towers = baselines.fresh_towers(data, args)
    timer = step_timer()
    started = time.perf_counter()
    history = baselines.train_tfrs(data, catalogue, args, towers, **setting, callbacks=[timer])
    wall = time.perf_counter() - started
    correction = ", log-Q + accidental hits" if setting["corrected"] else ""
    return {
        "run": f"non-private TFRS in-batch (tfrs.tasks.Retrieval, Adagrad {setting['learning_rate']:g}{correction})",
        "mechanism": "none",
        "negatives": "in-batch",
        "epsilon": None,
        "delta": None,
        "noise_multiplier": None,
        **baselines.model_recall(towers[0], towers[1], catalogue, data["test"], seen),
        "median_step_ms": median_ms(timer.times),
        "steps": len(timer.times),
        "wall_s": wall,
        "final_train_loss": float(history.history["loss"][-1]),
        "setting": setting,
    }


# -- synthetic catalogue ---------------------------------------------------------
def synthetic_step_ms(num_items: int, batch: int, negatives, args) -> float:
    """Median LazyDP step time (ms) on a synthetic catalogue with an item-id tower (table + Dense)."""
    from tfdp_embed import DPModel, keras, mechanisms, tf

    keras.utils.set_random_seed(args.seed)
    towers = build_towers(10_000, num_items, 0, args.synthetic_dim)
    catalogue = {"movie_id": np.arange(1, num_items + 1, dtype=np.int64)}
    model = dp_model(towers, catalogue, negatives)
    mech = mechanisms.LazyDP(l2_norm_clip=1.0, noise_multiplier=1.0, seed=args.seed)
    dp = DPModel(model, mechanism=mech, expected_batch_size=batch)
    dp.compile(optimizer=keras.optimizers.legacy.SGD(0.1))
    rng = np.random.default_rng(args.seed)
    steps = WARMUP_STEPS + args.synthetic_steps
    data = {
        "user_id": rng.integers(0, 10_000, steps * batch).astype("int32"),
        "movie_id": rng.integers(1, num_items + 1, steps * batch).astype("int32"),
    }
    timer = step_timer()
    dp.fit(tf.data.Dataset.from_tensor_slices(data).batch(batch), epochs=1, callbacks=[timer], verbose=0)
    return median_ms(timer.times)


# -- report ----------------------------------------------------------------------
def _fmt(value, spec="{:.4f}") -> str:
    return "—" if value is None else spec.format(value)


def same_model_ratio(row: dict, rows: list) -> float | None:
    """A DP run's median step ÷ that of the non-private run of the same model and negatives (None if absent)."""
    if row["mechanism"] in ("none", "in-batch") or row["negatives"] == "in-batch":
        return None
    control = [r for r in rows if r["mechanism"] == "none" and r["negatives"] == row["negatives"]]
    if not control or not row["median_step_ms"] or not control[0]["median_step_ms"]:
        return None
    return row["median_step_ms"] / control[0]["median_step_ms"]


def interleaved_lines(found: dict) -> list:
    """Markdown lines for `retrieval_step.interleaved`'s result."""
    dp, none = found["dp"], found["none"]
    return [
        "",
        f"Side by side in one process ({found['steps']} alternating steps, mean batch {found['mean_batch']:.0f}, "
        f"{found['negatives']}, 1-min load {found['load_average'][0]:.1f} → {found['load_average'][1]:.1f}): "
        f"DP {found['mechanism']} {dp['wall_ms']:.1f} ms wall / {dp['cpu_ms']:.1f} ms CPU per step, non-private "
        f"same model {none['wall_ms']:.1f} / {none['cpu_ms']:.1f} ms: DP ÷ non-private {found['wall_ratio']:.2f}× "
        f"wall, {found['cpu_ratio']:.2f}× CPU.",
    ]


def dp_gaps(rows: list) -> list:
    """Each DP run's recall@10 against the non-private run of the same model and negatives (the noise's cost)."""
    gaps = []
    for row in rows:
        control = [r for r in rows if r["mechanism"] == "none" and r["negatives"] == row["negatives"]]
        if row["epsilon"] is None or not control:
            continue
        base = control[0]["recall@10"]
        gaps.append(
            {
                "run": row["run"],
                "epsilon": row["epsilon"],
                "recall@10": row["recall@10"],
                "control_recall@10": base,
                "gap": base - row["recall@10"],
                "relative_gap": (base - row["recall@10"]) / base if base else None,
            }
        )
    return gaps


def notes(rows: list, tuning: dict | None) -> list:
    """Sentences for RESULTS: the DP gap against the non-private control, and how the TFRS baseline was picked."""
    found = []
    for gap in dp_gaps(rows):
        found.append(
            f"{gap['run']} at ε {gap['epsilon']:.2f}: recall@10 {gap['recall@10']:.4f} vs {gap['control_recall@10']:.4f} "
            f"for the same model without DP, a gap of {gap['gap']:+.4f} ({100 * gap['relative_gap']:+.0f} %)."
        )
    if tuning:
        best, tried = tuning["best"], tuning["tried"]
        rates = sorted({t["learning_rate"] for t in tried})
        found.append(
            f"TFRS baseline tuned on a validation split ({int(100 * baselines.VALIDATION_FRACTION)} % of the training "
            f"ratings, never the test split): Adagrad rates {', '.join(f'{r:g}' for r in rates)}, with and without "
            f"TFRS' log-Q correction + accidental-hit removal, 1-{max(t['epochs'] for t in tried)} epochs "
            f"({len(tried)} settings); best: rate {best['learning_rate']:g}, "
            f"{'corrected' if best['corrected'] else 'uncorrected'}, epochs {best['epochs']} (validation recall@10 "
            f"{best['validation_recall@10']:.4f})."
        )
    return found


def markdown(command: str, info: dict, args, rows: list, extra: dict) -> str:
    data_summary, side, synthetic = extra["data"], extra["interleaved"], extra["synthetic"]
    lines = [
        f"## retrieval — {info['date_utc']} — two-tower with item features on ml-100k: DP Retrieval task "
        "(full / sampled softmax) vs TFRS in-batch and popularity",
        "",
        f"Command: `{command}`",
        "",
        f"Commit: {info['git'].get('commit', '?')}. Machine: {info['nproc']} cores, {info['cpu_model']}; load "
        f"average at start {info['load_average_at_start']}.",
        "",
        (
            f"Data: ml-100k, {data_summary['train']} training / {data_summary['test']} test ratings (random 80/20, "
            f"seed {args.seed}), {data_summary['items']} movies with their genres. DP runs and their non-private "
            f"controls: `RetrievalRecipe` {recipe(args).get_config()}, clip 1, ε {args.epsilon or '—'} "
            f"(sigma calibrated, RDP, delta 1/N). recall@k ranks every movie (ties against the positive); "
            f"'unrated' ranks the movies the user did not rate in training."
        ),
        "",
        "| run | epsilon | recall@10 | recall@50 | recall@10 unrated | median step | step ÷ same-model non-private "
        "| steps | wall |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['run']} | {_fmt(r['epsilon'], '{:.3g}')} | {r['recall@10']:.4f} | {r['recall@50']:.4f} | "
        f"{r['recall@10 unrated']:.4f} | {_fmt(r['median_step_ms'], '{:.1f} ms')} | "
        f"{_fmt(same_model_ratio(r, rows), '{:.2f}×')} | {r['steps']} | {r['wall_s']:.0f} s |"
        for r in rows
    ]
    lines += ["", *[f"- {n}" for n in extra["notes"]]]
    if side:
        lines += interleaved_lines(side)
    lines += _synthetic_lines(synthetic, args)
    warned = [f"{r['run']}: {w}" for r in rows for w in r.get("warnings", [])]
    if warned:
        lines += ["", "Warnings during the DP runs (first 160 characters):", ""] + [f"- {n}" for n in warned]
    lines += [
        "",
        "recall@k is operator-only (raw test ratings, no noise). One seed per run: the spread is not measured.",
        "",
    ]
    return "\n".join(lines)


def _synthetic_lines(synthetic: list, args) -> list:
    if not synthetic:
        return []
    return [
        "",
        f"Synthetic catalogue, LazyDP, item tower = id table + Dense (dim {args.synthetic_dim}), median step "
        f"after {WARMUP_STEPS} warm-up steps of {args.synthetic_steps}:",
        "",
        "| items | negatives | batch | median step |",
        "|---|---|---|---|",
        *[
            f"| {s['items']:,} | {s['negatives']} | {s['batch']} | {_fmt(s['median_step_ms'], '{:.1f} ms')} |"
            for s in synthetic
        ],
    ]


def plot(rows: list, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    names = [r["run"].replace(", ", "\n").replace(" (", "\n(") for r in rows]
    left.barh(names, [r["recall@10"] for r in rows])
    left.set_xlabel("recall@10 (all movies ranked)")
    right.barh(names, [r["median_step_ms"] or 0 for r in rows])
    right.set_xlabel("median step (ms)")
    right.set_yticklabels([])
    fig.suptitle("ml-100k two-tower with item features: DP Retrieval task vs TFRS in-batch")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _ml100k_runs(parser, data, catalogue, args) -> tuple[list, dict | None]:
    """Popularity, the TFRS baseline (tuned on a validation split unless `--tune-learning-rates ''`), then each of
    `--dp-runs` (mechanism:softmax), one after another; and the tuning record."""
    from tfdp_embed.keras2.retrieval import FullSoftmax, SampledSoftmax

    seen = baselines.seen_matrix(data)
    tuning = None
    setting = {"learning_rate": args.baseline_learning_rate, "epochs": args.epochs, "corrected": False}
    if args.tune_learning_rates:
        best, tried = baselines.tune_tfrs(data, catalogue, args)
        tuning = {"best": best, "tried": tried}
        setting = {key: best[key] for key in setting}
    rows = [baselines.popularity_row(data, seen), run_in_batch(data, catalogue, args, seen, setting)]
    for run in [r for r in args.dp_runs.split(",") if r]:
        name, _, softmax = run.partition(":")
        if softmax not in ("full", "sampled"):
            parser.error(f"--dp-runs: {run!r} must be mechanism:full or mechanism:sampled.")
        negatives = FullSoftmax() if softmax == "full" else SampledSoftmax(args.negatives, seed=args.seed)
        rows.append(run_dp(data, catalogue, args, seen, name=name, negatives=negatives))
        print(rows[-1], flush=True)
    return rows, tuning


def _synthetic_runs(args) -> list:
    from tfdp_embed.keras2.retrieval import FullSoftmax, SampledSoftmax

    synthetic = []
    settings = [
        ("full", args.synthetic_batch),
        (f"sampled K={args.negatives}", args.synthetic_batch),
        (f"sampled K={args.negatives}", args.batch_size),
    ]
    for label, batch in settings if args.synthetic_items else []:
        negatives = FullSoftmax() if label == "full" else SampledSoftmax(args.negatives, seed=args.seed)
        ms = synthetic_step_ms(args.synthetic_items, batch, negatives, args)
        synthetic.append({"items": args.synthetic_items, "negatives": label, "batch": batch, "median_step_ms": ms})
        print(synthetic[-1], flush=True)
    return synthetic


def _recipe_defaults():
    from tfdp_embed.keras2.retrieval.recipe import RetrievalRecipe

    return RetrievalRecipe()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.retrieval", description=__doc__.splitlines()[0])
    p.add_argument("--data", default=DEFAULT_DATA, help="directory with ml-100k's u.data and u.item")
    recipe_defaults = _recipe_defaults()
    p.add_argument("--epochs", type=int, default=recipe_defaults.epochs, help="RetrievalRecipe's by default")
    p.add_argument("--batch-size", type=int, default=recipe_defaults.batch_size)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--negatives", type=int, default=recipe_defaults.num_negatives, help="sampled softmax: K")
    p.add_argument(
        "--dp-runs",
        default="none:full,lazy:full,none:sampled,lazy:sampled,adafest:sampled",
        help="runs as mechanism:softmax (mechanism none (the same model without DP), lazy or adafest; softmax "
        "full or sampled), comma-separated",
    )
    p.add_argument("--epsilon", type=float, default=3.0, help="sigma calibrated per mechanism; 0: --noise-multiplier")
    p.add_argument("--noise-multiplier", type=float, default=1.0, help="with --epsilon 0")
    p.add_argument("--dp-learning-rate", type=float, default=recipe_defaults.learning_rate, help="SGD, DPModel runs")
    p.add_argument("--cosine-decay", action=argparse.BooleanOptionalAction, default=recipe_defaults.cosine_decay)
    p.add_argument("--baseline-learning-rate", type=float, default=0.1, help="TFRS Adagrad, when not tuned")
    p.add_argument(
        "--tune-learning-rates",
        default="0.02,0.05,0.1,0.2",
        help="TFRS Adagrad rates tried on a validation split (with and without log-Q); '' skips tuning",
    )
    p.add_argument("--tune-max-epochs", type=int, default=8, help="TFRS tuning: epochs 1..this are scored")
    p.add_argument("--tau-user", type=float, default=1.0)
    p.add_argument("--tau-movie", type=float, default=2.0)
    p.add_argument("--tau-genres", type=float, default=5.0)
    p.add_argument("--interleaved-steps", type=int, default=40, help="LazyDP vs non-private side by side; 0 skips")
    p.add_argument("--synthetic-items", type=int, default=1_000_000, help="0 skips part 2")
    p.add_argument("--synthetic-batch", type=int, default=8, help="batch of the full vs sampled comparison")
    p.add_argument("--synthetic-dim", type=int, default=16)
    p.add_argument("--synthetic-steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=outputs.AUTO, help="'auto': a new file under benchmarks/results/; '' skips")
    p.add_argument("--png", default=outputs.AUTO, help="'auto': a new file under benchmarks/results/; '' skips")
    p.add_argument("--results-md", default=outputs.RESULTS_MD, help="'' skips")
    return p


def main(argv=None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    tag = f"ml-100k-ep{args.epochs}-b{args.batch_size}" + (f"-eps{args.epsilon:g}" if args.epsilon else "")
    outputs.resolve(p, args, benchmark="retrieval", tag=tag, files={"json": ".json", "png": ".png"})
    if not os.path.exists(os.path.join(args.data, "u.data")):
        p.error(f"--data: no u.data in {args.data!r} (ml-100k is expected there).")
    from benchmarks import retrieval_step
    from benchmarks.machine import machine_info
    from tfdp_embed import tf

    info = machine_info(ROOT)
    command = "python -m benchmarks.retrieval " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    data = load_ml100k(args.data, args.seed)
    catalogue = {"movie_id": data["movie_ids"], "genres": tf.ragged.constant(data["genres"], dtype=tf.int64)}
    rows, tuning = _ml100k_runs(p, data, catalogue, args)
    side = (
        retrieval_step.interleaved(data, catalogue, args, steps=args.interleaved_steps)
        if args.interleaved_steps
        else None
    )
    print(side, flush=True)
    synthetic = _synthetic_runs(args)
    summary = {
        "train": len(data["train"]["user_id"]),
        "test": len(data["test"]["user_id"]),
        "items": len(data["movie_ids"]),
    }
    result = {
        "command": command,
        "machine": info,
        "args": vars(args),
        "recipe": recipe(args).get_config(),
        "data": summary,
        "runs": rows,
        "tuning": tuning,
        "dp_gap": dp_gaps(rows),
        "notes": notes(rows, tuning),
        "interleaved": side,
        "synthetic": synthetic,
    }
    section = markdown(command, info, args, rows, result)
    outputs.write_run(args, result, plot=lambda path: plot(rows, path), section=lambda **_: section)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
