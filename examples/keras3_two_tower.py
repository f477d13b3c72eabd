"""A Keras 3 two-tower retrieval model on MovieLens 100k, trained with DP-SGD at epsilon = 3 and without DP.

    PYTHONPATH=. .venv/bin/python examples/keras3_two_tower.py            # the full run (a few minutes on 2 cores)
    PYTHONPATH=. .venv/bin/python examples/keras3_two_tower.py --quick    # a tiny run (tests)

Run it in a process whose `tf.keras` is Keras 3 (`TF_USE_LEGACY_KERAS` unset): it uses the Keras 3
front end, `tfdp_embed.keras3`, and keras-rs.

* Data: ml-100k `u.data` (the privacy unit is one rating: example-level DP, not user-level), a random
  80/20 split of the ratings with a fixed seed. The users (`u.user`) and movies (`u.item`) are the
  dataset's published lists, so the tables' sizes and the catalogue do not depend on who rated what.
* Model: user tower `DPEmbedding(user) -> Dense`, item tower `[DPEmbedding(movie), genres] -> Dense`, the dot
  product, and a full softmax over the whole catalogue: the item tower runs over every movie inside
  `tfdp_embed.clipping.shared_computation()` (data-independent inputs), so each example's loss depends
  on that example alone and its gradient norm through the shared candidate matrix is exact. In-batch
  negatives would mix examples and are not used.
* Privacy: N released with DP (`release_dataset_size`), q = B / N~, delta = 1 / N~, sigma calibrated by
  `plan_run("dense", target_epsilon=3, ...)` (PLD), Poisson batches (`tfdp_embed.data.poisson_batches`);
  epsilon is read back from the run's ledger (`tfdp_embed.keras3.PrivacyBudget`).
* Baseline: the same model, batches and optimizer under `mechanisms.NonPrivate` (`plan_run("none")`).
* Evaluation: recall@10 over the whole catalogue with `keras_rs.metrics.RecallAtK` (operator-only).
* Serving: a `tf.Module` with `keras_rs.layers.BruteForceRetrieval` (raw user ids in, top-10 movie ids
  out) saved after the DP flush, loaded and called from a fresh Python process.
* Result: `benchmarks/results/keras3_two_tower-<UTC>.json` (full runs), shown by `make results`.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from importlib import metadata

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DATA = os.path.join(ROOT, "..", "shared", "data", "movielens", "ml-100k")
K = 10


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=DEFAULT_DATA, help="folder with u.data, u.item and u.user")
    parser.add_argument("--epochs", type=int, default=None, help="passes of round(1/q) Poisson batches (default 20)")
    parser.add_argument("--batch-size", type=int, default=1024, help="expected Poisson batch size q N~")
    parser.add_argument("--epsilon", type=float, default=3.0)
    parser.add_argument("--l2-norm-clip", type=float, default=1.0)
    parser.add_argument("--learning-rate", type=float, default=0.3, help="SGD rate (momentum 0.9), both runs")
    parser.add_argument("--dim", type=int, default=32, help="embedding and tower output dimension")
    parser.add_argument("--seed", type=int, default=0, help="split, initialisation, batches and noise")
    parser.add_argument("--out", default=None, help="export folder (default: a new temporary folder)")
    parser.add_argument(
        "--json",
        default="auto",
        help="result file; 'auto': benchmarks/results/keras3_two_tower-<UTC>.json "
        "(full runs; --quick writes none unless given); '' writes none",
    )
    parser.add_argument("--quick", action="store_true", help="a tiny run for tests (< 60 s)")
    args = parser.parse_args(argv)
    if args.epochs is None:
        args.epochs = 1 if args.quick else 20
    if args.quick and args.json == "auto":
        args.json = ""
    return args


# -- data ------------------------------------------------------------------------------------------
def read_ids(path: str) -> np.ndarray:
    """The sorted distinct ids in the first '|'-separated field of `u.user` / `u.item`."""
    with open(path, encoding="latin-1") as handle:
        ids = [int(line.split("|", 1)[0]) for line in handle if line.strip()]
    return np.unique(np.asarray(ids, np.int64))


def read_genres(path: str) -> np.ndarray:
    """The genre flags of `u.item` (public catalogue data), `[movies, genres]` float32, in sorted-id order."""
    with open(path, encoding="latin-1") as handle:
        rows = sorted(
            (int(f[0]), [float(x) for x in f[5:]]) for f in (ln.rstrip("\n").split("|") for ln in handle) if f[0]
        )
    width = max(len(flags) for _, flags in rows)
    return np.asarray([flags + [0.0] * (width - len(flags)) for _, flags in rows], np.float32)


def load_data(data_dir: str, seed: int, quick: bool) -> dict:
    """Ratings as (user row, movie row) pairs, split 80/20 at random (seeded); the published id lists.

    User rows are 1..U (row 0: a user not in `u.user`); movie rows are 0..M-1 (the catalogue order).
    """
    from tfdp_embed.data.movielens_files import read_ratings

    ratings = read_ratings(os.path.join(data_dir, "u.data"))
    user_ids = read_ids(os.path.join(data_dir, "u.user"))
    item_ids = read_ids(os.path.join(data_dir, "u.item"))
    users = np.searchsorted(user_ids, ratings.users).astype(np.int32) + 1
    items = np.searchsorted(item_ids, ratings.items).astype(np.int32)
    if np.any(user_ids[users - 1] != ratings.users) or np.any(item_ids[items] != ratings.items):
        raise ValueError(f"{data_dir}: u.data names users or movies missing from u.user / u.item.")
    order = np.random.default_rng(seed).permutation(len(ratings))
    cut = int(0.8 * len(order))
    train, test = order[:cut], order[cut:]
    if quick:
        test = test[:2000]
    return {
        "user_ids": user_ids,
        "item_ids": item_ids,
        "item_genres": read_genres(os.path.join(data_dir, "u.item")),
        "train": (users[train], items[train]),
        "test": (users[test], items[test]),
    }


# -- model -----------------------------------------------------------------------------------------
def build_model(num_users: int, num_items: int, dim: int, genres: np.ndarray):
    """The two towers and the full-softmax logits over the catalogue, `[batch, num_items]`.

    The item tower reads each movie's id and its genres (an item feature from the public catalogue).
    """
    from tfdp_embed.clipping import shared_computation
    from tfdp_embed.keras3 import DPEmbedding, keras, tf

    class TwoTower(keras.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.user_embedding = DPEmbedding(num_users + 1, dim, name="user_embedding")
            self.user_dense = keras.layers.Dense(dim, name="user_dense")
            self.item_embedding = DPEmbedding(num_items, dim, name="item_embedding")
            self.item_dense = keras.layers.Dense(dim, name="item_dense")
            self.num_items = num_items

        def query(self, user_rows):
            return self.user_dense(self.user_embedding(user_rows))

        def candidates(self):
            """Every movie's vector, `[num_items, dim]`: the item tower over the whole catalogue (id and genres)."""
            ids = self.item_embedding(tf.range(self.num_items))
            return self.item_dense(keras.ops.concatenate([ids, tf.constant(genres)], axis=-1))

        def call(self, user_rows):
            queries = self.query(user_rows)
            # The catalogue does not depend on the batch: one shared computation, exact per-example norms.
            with shared_computation() as shared:
                candidates = shared.output(self.candidates())
            return shared.scored_by(queries, tf.matmul(queries, candidates, transpose_b=True))

    model = TwoTower(name="two_tower")
    model(tf.constant([1, 2], tf.int32))  # builds every layer
    return model


# -- privacy plan and training -----------------------------------------------------------------------
def plan_runs(num_examples: int, args) -> dict:
    """N~ (released with DP), q = B / N~, T = epochs x round(1/q), delta = 1 / N~; the DP and non-private plans."""
    from tfdp_embed import Release, plan_run, release_dataset_size

    released = release_dataset_size(num_examples, seed=args.seed)  # seeded for a reproducible example only
    q = released.sampling_probability(args.batch_size)
    steps = args.epochs * max(1, round(1 / q))
    delta = released.delta()
    common = dict(target_delta=delta, sampling_probability=q, steps=steps, seed=args.seed)
    dp = plan_run(
        "dense",
        target_epsilon=args.epsilon,
        l2_norm_clip=args.l2_norm_clip,
        releases=[Release.dataset_size(released)],  # N~'s share of epsilon
        **common,
    )
    return {"released": released, "q": q, "steps": steps, "delta": delta, "dp": dp, "none": plan_run("none", **common)}


def train(name: str, plan, planned: dict, data: dict, args) -> dict:
    """Trains the two-tower under `plan` on Poisson batches; returns the model, its DPModel, budget and time."""
    from tfdp_embed.data import poisson_batches
    from tfdp_embed.keras3 import DPModel, keras

    keras.utils.set_random_seed(args.seed)  # both runs start from the same weights and see the same batches
    model = build_model(len(data["user_ids"]), len(data["item_ids"]), args.dim, data["item_genres"])
    batches, _ = poisson_batches(data["train"], sampling_probability=planned["q"], seed=args.seed)
    expected = planned["q"] * planned["released"].value if plan.is_dp else None  # q N~: a scale
    dp = DPModel(model, plan=plan, expected_batch_size=expected)
    dp.compile(
        optimizer=keras.optimizers.SGD(args.learning_rate, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),  # `call`: one loss per example
    )
    budget = plan.budget() if plan.is_dp else None  # a Keras 3 callback: this process loaded tfdp_embed.keras3
    start = time.perf_counter()
    history = dp.fit(batches, epochs=args.epochs, callbacks=[budget] if budget else [], verbose=0, shuffle=False)
    wall = time.perf_counter() - start
    epsilon = budget.spent_epsilon() if budget else None
    losses = ", ".join(f"{v:.3f}" for v in history.history["loss"][-3:])
    print(f"{name}: {plan.steps} steps in {wall:.1f} s, last epochs' loss {losses}", flush=True)
    return {"model": model, "dp": dp, "epsilon": epsilon, "train_s": wall, "sigma": plan.noise_multiplier}


# -- evaluation and serving ------------------------------------------------------------------------
def seen_items(data: dict) -> np.ndarray:
    """bool `[users + 1, movies]`: the movies each user rated in training (left out of their test ranking)."""
    seen = np.zeros((len(data["user_ids"]) + 1, len(data["item_ids"])), bool)
    seen[data["train"]] = True
    return seen


def recall_at_k(model, data: dict, batch_size: int = 2048) -> float:
    """recall@K of each test rating's movie among the movies its user did not rate in training (not DP).

    `keras_rs.metrics.RecallAtK`, the training movies masked out (`y_true={"labels", "mask"}`).
    """
    import keras_rs

    from tfdp_embed.keras3 import tf

    metric = keras_rs.metrics.RecallAtK(k=K, shuffle_ties=False)
    candidates, seen = model.candidates(), seen_items(data)
    users, items = data["test"]
    for start in range(0, len(users), batch_size):
        rows = slice(start, start + batch_size)
        scores = tf.matmul(model.query(users[rows]), candidates, transpose_b=True)
        labels = tf.one_hot(items[rows], model.num_items)
        metric.update_state({"labels": labels, "mask": ~seen[users[rows]]}, scores)
    return float(metric.result())


def popularity_recall(data: dict) -> float:
    """recall@K of the K movies rated most often in training that the user did not rate (non-private)."""
    counts = np.bincount(data["train"][1], minlength=len(data["item_ids"])).astype(float)
    seen, (users, items) = seen_items(data), data["test"]
    hits = 0
    for start in range(0, len(users), 2048):
        rows = slice(start, start + 2048)
        scores = np.where(seen[users[rows]], -np.inf, counts)  # the user's unseen movies only
        top = np.argsort(-scores, axis=1, kind="stable")[:, :K]
        hits += int(np.sum(np.any(top == items[rows, None], axis=1)))
    return hits / len(users)


def serving_module(model, data: dict):
    """A `tf.Module`: raw MovieLens user ids (int64 `[n]`) in, the top-K movie ids out (BruteForceRetrieval)."""
    import keras_rs

    from tfdp_embed.keras3 import tf

    class TopK(tf.Module):
        def __init__(self):
            super().__init__()
            self.user_embedding, self.user_dense = model.user_embedding, model.user_dense
            self.retrieval = keras_rs.layers.BruteForceRetrieval(
                candidate_embeddings=model.candidates(),
                candidate_ids=tf.constant(data["item_ids"], tf.int32),
                k=K,
                return_scores=False,
            )
            rows = np.arange(1, len(data["user_ids"]) + 1, dtype=np.int64)
            initializer = tf.lookup.KeyValueTensorInitializer(tf.constant(data["user_ids"]), tf.constant(rows))
            self.users = tf.lookup.StaticHashTable(initializer, default_value=0)  # unknown user: row 0

        @tf.function(input_signature=[tf.TensorSpec([None], tf.int64, name="user_id")])
        def top_k(self, user_id):
            queries = self.user_dense(self.user_embedding(self.users.lookup(user_id)))
            return {"movie_ids": tf.cast(self.retrieval(queries), tf.int64)}

    return TopK()


SERVE = """
import json, sys
import tensorflow as tf
served = tf.saved_model.load(sys.argv[1])
ids = tf.constant(json.loads(sys.argv[2]), tf.int64)
print(json.dumps(served.signatures["serving_default"](user_id=ids)["movie_ids"].numpy().tolist()))
"""


def export_and_serve(trained: dict, data: dict, out: str, users: list) -> dict:
    """Exports the flushed DP model and its top-K module, then serves `users` from a fresh process."""
    from tfdp_embed.keras3 import tf

    model_path, serving_path = os.path.join(out, "dp_model"), os.path.join(out, "top_k")
    trained["dp"].export(model_path, verbose=False, input_signature=[tf.TensorSpec([None], tf.int32)])
    module = serving_module(trained["model"], data)
    tf.saved_model.save(module, serving_path, signatures={"serving_default": module.top_k})
    in_process = module.top_k(tf.constant(users, tf.int64))["movie_ids"].numpy().tolist()
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    done = subprocess.run(
        [sys.executable, "-c", SERVE, serving_path, json.dumps(users)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"serving from a fresh process failed:\n{done.stderr[-3000:]}")
    served = json.loads(done.stdout.strip().splitlines()[-1])
    return {"model_path": model_path, "serving_path": serving_path, "served": served, "matches": served == in_process}


# -- result file -----------------------------------------------------------------------------------
def write_result(path: str, payload: dict) -> str:
    """Writes the run's JSON (`auto`: a new `benchmarks/results/keras3_two_tower-<UTC>.json`); returns its path."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from benchmarks import machine, outputs

    if path == "auto":
        path = outputs.default_path("keras3_two_tower", "", ".json", stamp=outputs.utc_stamp())
    info = machine.machine_info(ROOT)
    doc = {
        "benchmark": "keras3_two_tower",
        "command": "PYTHONPATH=. python " + shlex.join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
        "commit": info.get("git", {}).get("commit"),
        "date": info.get("date_utc"),
        "machine": info,
        **payload,
    }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(doc, handle, indent=2)
        handle.write("\n")
    return path


def summary(args, planned: dict, runs: dict, popularity: float, serving: dict, wall: float) -> dict:
    """The JSON payload: settings, epsilon and delta, recall@K per run, times, what serving returned."""
    rows = []
    for name, mechanism in (("dp", "dense"), ("non-private", "none")):
        run = runs[name]
        rows.append(
            {
                "run": name,
                "mechanism": mechanism,
                "epsilon": run["epsilon"],
                "noise_multiplier": run["sigma"],
                f"recall@{K}": run["recall"],
                "train_s": round(run["train_s"], 2),
            }
        )
    return {
        "settings": {
            key: getattr(args, key)
            for key in ("epochs", "batch_size", "epsilon", "l2_norm_clip", "learning_rate", "dim", "seed", "quick")
        }
        | {
            "steps": planned["steps"],
            "sampling_probability": planned["q"],
            "dataset_size_released": planned["released"].value,
        },
        "epsilon": runs["dp"]["epsilon"],
        "delta": planned["delta"],
        f"recall@{K}_dp": runs["dp"]["recall"],
        f"recall@{K}_non_private": runs["non-private"]["recall"],
        f"recall@{K}_popularity": popularity,
        "runs": rows,
        "wall_s": round(wall, 1),
        "served": serving["served"],
        "served_matches_in_process": serving["matches"],
        "versions": {"keras": metadata.version("keras"), "keras-rs": metadata.version("keras-rs")},
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    data = load_data(args.data, args.seed, args.quick)
    num_train = len(data["train"][0])
    print(
        f"ratings: {num_train} training, {len(data['test'][0])} test ratings, "
        f"{len(data['user_ids'])} users, {len(data['item_ids'])} movies",
        flush=True,
    )
    planned = plan_runs(num_train, args)
    print(
        f"plan: sigma {planned['dp'].noise_multiplier:.4f} for epsilon {args.epsilon:g} at delta "
        f"{planned['delta']:.3g}, q {planned['q']:.4g}, {planned['steps']} steps",
        flush=True,
    )
    runs = {
        name: train(name, planned[key], planned, data, args) for name, key in (("dp", "dp"), ("non-private", "none"))
    }
    for run in runs.values():
        run["recall"] = recall_at_k(run["model"], data)
    popularity = popularity_recall(data)
    print(f"epsilon = {runs['dp']['epsilon']:.3f} (delta = {planned['delta']:.3g}; PLD accounting of the run's ledger)")
    print(
        f"recall@{K}: dp {runs['dp']['recall']:.4f}, non-private {runs['non-private']['recall']:.4f}, "
        f"most-popular {popularity:.4f}"
    )
    if runs["dp"]["recall"] <= popularity:
        print(
            f"WARNING: the DP model does not beat the most-popular list ({runs['dp']['recall']:.4f} <= "
            f"{popularity:.4f}): at this epsilon ml-100k's 80k ratings leave the noise larger than what the "
            "model learns; serve popularity, or train on more data or at a larger epsilon."
        )
    out = args.out or tempfile.mkdtemp(prefix="keras3_two_tower-")
    users = [int(u) for u in data["user_ids"][:3]] + [10**9]  # the last one is unknown
    serving = export_and_serve(runs["dp"], data, out, users)
    for user, ids in zip(users, serving["served"]):
        print(f"served (fresh process) user {user}: top-{K} movie ids {ids}")
    print(f"served ids match in-process: {serving['matches']}; exported to {out}")
    wall = time.perf_counter() - start
    print(f"wall time {wall:.1f} s")
    if args.json:
        payload = summary(args, planned, runs, popularity, serving, wall)
        print("wrote", write_result(args.json, payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())
