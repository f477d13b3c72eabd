"""Two-tower retrieval with item features: recall@10 and step time of the DP Retrieval task vs TFRS in-batch.

    python -m benchmarks.retrieval [--epochs 2] [--batch-size 512]
        [--dp-runs none:full,lazy:full,none:sampled,lazy:sampled,adafest:sampled] [--interleaved-steps 40]

Part 1, ml-100k (one process, one run after another): a TFRS user's two-tower
(user-id table + Dense; item tower = movie-id `DPEmbedding` subclass +
multi-valued genre table + Dense over the catalogue) trained

* without privacy with `tfrs.tasks.Retrieval` (in-batch negatives, Adagrad,
  as in the TFRS tutorial): the baseline;
* with DP (`DPModel`, Poisson batches, legacy SGD, fixed sigma) and
  `tfdp_embed.keras2.retrieval.Retrieval`: full softmax and sampled softmax
  (uniform data-independent negatives, log-Q), under LazyDP or DP-AdaFEST
  (`--dp-runs`);
* the same model, task and SGD through `DPModel` with `NonPrivate`
  (`none:full`, `none:sampled`): the control each DP step is divided by.

Each run reports recall@10 / recall@50 over all movies on a random 20 % of
the ratings (the same ranking code for every run), the median step time
after warm-up, the wall time and epsilon. Then the LazyDP and the
non-private step of the same sampled-softmax model run alternately for
`--interleaved-steps` steps (`benchmarks.retrieval_step`): the DP ÷
non-private ratio with both under the same load.

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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DATA = os.path.join(ROOT, "..", "shared", "data", "movielens", "ml-100k")
KS = (10, 50)
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


def in_batch_model(towers, catalogue: dict):
    """The non-private TFRS baseline: `tfrs.tasks.Retrieval` (in-batch negatives)."""
    import tensorflow_recommenders as tfrs

    from tfdp_embed import tf

    user_model, movie_model = towers
    rows = {key: value for key, value in catalogue.items()}
    index = {int(m): i for i, m in enumerate(catalogue["movie_id"])}

    class Model(tfrs.Model):
        def __init__(self):
            super().__init__()
            self.user_model, self.movie_model = user_model, movie_model
            self.task = tfrs.tasks.Retrieval()

        def compute_loss(self, features, training=False):
            positives = tf.nest.map_structure(lambda t: tf.gather(t, features["row"]), rows)
            return self.task(self.user_model(features["user_id"]), self.movie_model(positives))

    return Model(), index


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


def recall(user_model, movie_model, catalogue: dict, test: dict) -> dict:
    """recall@k over every movie, ties counted against the positive (as `tfdp_embed.keras2.retrieval.top_k`)."""
    from tfdp_embed import tf

    candidates = tf.convert_to_tensor(movie_model(catalogue)).numpy()
    queries = tf.convert_to_tensor(user_model(test["user_id"])).numpy()
    rows = test["movie_id"] - 1
    hits = {k: 0 for k in KS}
    for start in range(0, len(rows), 4096):
        scores = queries[start : start + 4096] @ candidates.T
        positive = scores[np.arange(scores.shape[0]), rows[start : start + 4096]][:, None]
        ranks = np.sum(scores > positive, axis=1) + np.sum(scores == positive, axis=1) - 1
        for k in KS:
            hits[k] += int(np.sum(ranks < k))
    return {f"recall@{k}": hits[k] / len(rows) for k in KS}


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


def run_dp(data, catalogue, args, *, name: str, negatives) -> dict:
    from tfdp_embed import DPModel, keras
    from tfdp_embed.data import poisson_batches
    from tfdp_embed.keras2.callbacks import PrivacyBudget

    keras.utils.set_random_seed(args.seed)
    towers = build_towers(data["num_users"], len(data["movie_ids"]), 19, args.dim)
    model = dp_model(towers, catalogue, negatives)
    taus = {"user_id": args.tau_user, "movie_id": args.tau_movie, "genres": args.tau_genres}
    mech = mechanism(name, args.noise_multiplier, args.seed, taus)
    dp = DPModel(model, mechanism=mech, expected_batch_size=args.batch_size)
    dp.compile(optimizer=keras.optimizers.legacy.SGD(args.dp_learning_rate))
    n = len(data["train"]["user_id"])
    q = args.batch_size / n
    batches, _ = poisson_batches(data["train"], sampling_probability=q, seed=args.seed)
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
        "noise_multiplier": args.noise_multiplier if private else None,
        **recall(towers[0], towers[1], catalogue, data["test"]),
        "median_step_ms": median_ms(timer.times),
        "steps": len(timer.times),
        "wall_s": wall,
        "final_train_loss": float(history.history["loss"][-1]),
    }


def run_in_batch(data, catalogue, args) -> dict:
    from tfdp_embed import keras, tf

    keras.utils.set_random_seed(args.seed)
    towers = build_towers(data["num_users"], len(data["movie_ids"]), 19, args.dim)
    model, index = in_batch_model(towers, catalogue)
    model.compile(optimizer=keras.optimizers.Adagrad(args.baseline_learning_rate))
    train = dict(data["train"])
    train["row"] = np.array([index[int(m)] for m in train["movie_id"]], np.int32)
    dataset = tf.data.Dataset.from_tensor_slices(train).shuffle(len(train["row"]), seed=args.seed)
    timer = step_timer()
    started = time.perf_counter()
    history = model.fit(dataset.batch(args.batch_size), epochs=args.epochs, callbacks=[timer], verbose=0)
    wall = time.perf_counter() - started
    return {
        "run": "non-private TFRS in-batch (tfrs.tasks.Retrieval, Adagrad)",
        "mechanism": "none",
        "negatives": "in-batch",
        "epsilon": None,
        "delta": None,
        "noise_multiplier": None,
        **recall(towers[0], towers[1], catalogue, data["test"]),
        "median_step_ms": median_ms(timer.times),
        "steps": len(timer.times),
        "wall_s": wall,
        "final_train_loss": float(history.history["loss"][-1]),
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


def markdown(command: str, info: dict, args, rows: list, synthetic: list, data_summary: dict, side=None) -> str:
    base = rows[0]
    lines = [
        f"## retrieval — {info['date_utc']} — two-tower with item features on ml-100k: DP Retrieval task "
        "(full / sampled softmax) vs TFRS in-batch",
        "",
        f"Command: `{command}`",
        "",
        f"Commit: {info['git'].get('commit', '?')}. Machine: 2-core shared CPU, under load from other jobs "
        f"({info['nproc']} cores, {info['cpu_model']}; load average at start {info['load_average_at_start']}).",
        "",
        (
            f"Data: ml-100k, {data_summary['train']} training / {data_summary['test']} test ratings (random 80/20, "
            f"seed {args.seed}), {data_summary['items']} movies with their genres. Model: user-id table + Dense; item "
            f"tower = movie-id table + genre table (mean) + Dense, dim {args.dim}. DP runs: Poisson batches "
            f"(expected {args.batch_size}), legacy SGD lr {args.dp_learning_rate}, clip 1, sigma "
            f"{args.noise_multiplier}, {args.epochs} epochs, delta = 1/N (RDP); DP-AdaFEST C1 = 1, sigma1 = 1, "
            f"tau user/movie/genres = {args.tau_user}/{args.tau_movie}/{args.tau_genres}. Baseline: "
            f"`tfrs.tasks.Retrieval`, Adagrad lr {args.baseline_learning_rate}, batch {args.batch_size}, "
            f"{args.epochs} epochs. recall@k ranks every movie (ties against the positive); chance recall@10 = "
            f"{10 / data_summary['items']:.4f}."
        ),
        "",
        "| run | epsilon | recall@10 | recall@50 | median step | step ÷ TFRS in-batch | step ÷ same-model non-private "
        "| steps | wall |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = r["median_step_ms"] / base["median_step_ms"] if r["median_step_ms"] and base["median_step_ms"] else None
        lines.append(
            f"| {r['run']} | {_fmt(r['epsilon'], '{:.3g}')} | {r['recall@10']:.4f} | {r['recall@50']:.4f} | "
            f"{_fmt(r['median_step_ms'], '{:.1f} ms')} | {_fmt(ratio, '{:.2f}×')} | "
            f"{_fmt(same_model_ratio(r, rows), '{:.2f}×')} | {r['steps']} | {r['wall_s']:.0f} s |"
        )
    if side:
        lines += interleaved_lines(side)
    if synthetic:
        lines += [
            "",
            f"Synthetic catalogue, LazyDP, item tower = id table + Dense (dim {args.synthetic_dim}), median step "
            f"after {WARMUP_STEPS} warm-up steps of {args.synthetic_steps}:",
            "",
            "| items | negatives | batch | median step |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {s['items']:,} | {s['negatives']} | {s['batch']} | {_fmt(s['median_step_ms'], '{:.1f} ms')} |"
            for s in synthetic
        ]
    notes = [f"{r['run']}: {w}" for r in rows for w in r.get("warnings", [])]
    if notes:
        lines += ["", "Warnings during the DP runs (first 160 characters):", ""] + [f"- {n}" for n in notes]
    lines += [
        "",
        "recall@k is operator-only (raw test ratings, no noise). One seed per run: the spread is not measured. "
        "The step-time ratios come from runs one after another in one process on a shared machine.",
        "",
    ]
    return "\n".join(lines)


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


def _ml100k_runs(parser, data, catalogue, args) -> list:
    """The TFRS in-batch baseline, then each of `--dp-runs` (mechanism:softmax), one after another."""
    from tfdp_embed.keras2.retrieval import FullSoftmax, SampledSoftmax

    rows = [run_in_batch(data, catalogue, args)]
    print(rows[-1], flush=True)
    for run in [r for r in args.dp_runs.split(",") if r]:
        name, _, softmax = run.partition(":")
        if softmax not in ("full", "sampled"):
            parser.error(f"--dp-runs: {run!r} must be mechanism:full or mechanism:sampled.")
        negatives = FullSoftmax() if softmax == "full" else SampledSoftmax(args.negatives, seed=args.seed)
        rows.append(run_dp(data, catalogue, args, name=name, negatives=negatives))
        print(rows[-1], flush=True)
    return rows


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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.retrieval", description=__doc__.splitlines()[0])
    p.add_argument("--data", default=DEFAULT_DATA, help="directory with ml-100k's u.data and u.item")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--negatives", type=int, default=256, help="sampled softmax: shared negatives per step")
    p.add_argument(
        "--dp-runs",
        default="none:full,lazy:full,none:sampled,lazy:sampled,adafest:sampled",
        help="runs as mechanism:softmax (mechanism none (the same model without DP), lazy or adafest; softmax "
        "full or sampled), comma-separated",
    )
    p.add_argument("--noise-multiplier", type=float, default=1.0)
    p.add_argument("--dp-learning-rate", type=float, default=2.0, help="SGD learning rate of the DPModel runs")
    p.add_argument("--baseline-learning-rate", type=float, default=0.1)
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
    args = p.parse_args(argv)
    tag = f"ml-100k-ep{args.epochs}-b{args.batch_size}"
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
    rows = _ml100k_runs(p, data, catalogue, args)
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
        "data": summary,
        "runs": rows,
        "interleaved": side,
        "synthetic": synthetic,
    }
    section = markdown(command, info, args, rows, synthetic, summary, side)
    outputs.write_run(args, result, plot=lambda path: plot(rows, path), section=lambda **_: section)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
