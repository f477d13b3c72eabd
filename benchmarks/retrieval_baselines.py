"""The non-private baselines of `benchmarks.retrieval` and the one ranking code every row is scored with.

* `ranked_recall`: recall@k of each test rating among every movie, ties
  counted against the positive, a row with a NaN score counted as a miss;
  twice: over all movies (TFRS' factorized top-k protocol) and over the
  movies the user did not rate in training (the usual MovieLens protocol,
  "unrated").
* `popularity_row`: every user gets the movies most rated in training.
* `tune_tfrs`: the plain TFRS two-tower (`tfrs.tasks.Retrieval`, in-batch
  negatives, Adagrad), tuned on a validation split carved from the training
  ratings (never the test split): each learning rate, with and without
  TFRS' own sampling-bias correction (`candidate_sampling_probability` =
  the movie's share of the training ratings, and `remove_accidental_hits`),
  trained for up to `max_epochs` epochs and scored after each; the best
  validation recall@10 picks the setting the test run uses.

References: TFRS `tasks/retrieval.py` (in-batch softmax, sampling-probability
correction); Yi et al., RecSys 2019 (log-Q correction of in-batch negatives).
"""

from __future__ import annotations

import numpy as np

KS = (10, 50)
CHUNK = 4096
VALIDATION_FRACTION = 0.1


def seen_matrix(data: dict) -> np.ndarray:
    """bool `[users, movies]`: True where the user rated the movie in training."""
    seen = np.zeros((data["num_users"], len(data["movie_ids"])), bool)
    seen[data["train"]["user_id"], data["train"]["movie_id"] - 1] = True
    return seen


def _ranks(scores: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """0-based rank of each row's positive (ties against it); a row with NaN or a non-finite positive: a miss."""
    positive = scores[np.arange(scores.shape[0]), rows][:, None]
    ranks = np.sum(scores > positive, axis=1) + np.sum(scores == positive, axis=1) - 1
    broken = np.isnan(scores).any(axis=1) | ~np.isfinite(positive[:, 0])
    return np.where(broken, scores.shape[1], ranks)


def ranked_recall(scores_of, test: dict, seen: np.ndarray, ks: tuple = KS) -> dict:
    """recall@k over all movies and over the user's unrated ones; `scores_of(start, stop)` -> `[stop - start, N]`."""
    rows = test["movie_id"] - 1
    hits = {f"recall@{k}{kind}": 0 for k in ks for kind in ("", " unrated")}
    for start in range(0, len(rows), CHUNK):
        stop = min(start + CHUNK, len(rows))
        scores = np.array(scores_of(start, stop), np.float64)
        unrated = np.where(seen[test["user_id"][start:stop]], -np.inf, scores)
        for kind, ranked in (("", scores), (" unrated", unrated)):
            ranks = _ranks(ranked, rows[start:stop])
            for k in ks:
                hits[f"recall@{k}{kind}"] += int(np.sum(ranks < k))
    return {key: value / len(rows) for key, value in hits.items()}


def model_recall(user_model, movie_model, catalogue: dict, test: dict, seen: np.ndarray) -> dict:
    """`ranked_recall` of a two-tower: query . candidate over the whole catalogue."""
    from tfdp_embed import tf

    candidates = tf.convert_to_tensor(movie_model(catalogue)).numpy()
    queries = tf.convert_to_tensor(user_model(test["user_id"])).numpy()
    return ranked_recall(lambda start, stop: queries[start:stop] @ candidates.T, test, seen)


def popularity_row(data: dict, seen: np.ndarray) -> dict:
    """The most-rated movies of the training split, the same for every user."""
    counts = np.bincount(data["train"]["movie_id"] - 1, minlength=len(data["movie_ids"])).astype(np.float64)
    recalls = ranked_recall(
        lambda start, stop: np.broadcast_to(counts, (stop - start, counts.size)), data["test"], seen
    )
    return {
        "run": "most popular movies (training counts)",
        "mechanism": "popularity",
        "negatives": "none",
        "epsilon": None,
        "delta": None,
        "noise_multiplier": None,
        **recalls,
        "median_step_ms": None,
        "steps": 0,
        "wall_s": 0.0,
        "final_train_loss": None,
    }


def validation_split(data: dict, seed: int, fraction: float = VALIDATION_FRACTION) -> dict:
    """`data` with its training ratings split again: `train` (1 - fraction) and `test` (fraction, the validation)."""
    train = data["train"]
    order = np.random.default_rng([seed, 1]).permutation(len(train["user_id"]))
    cut = int((1 - fraction) * len(order))
    return {
        **data,
        "train": {key: value[order[:cut]] for key, value in train.items()},
        "test": {key: value[order[cut:]] for key, value in train.items()},
    }


def sampling_probabilities(data: dict) -> np.ndarray:
    """float32 `[N]`: each movie's share of the training ratings (+1 smoothing): its chance to be an in-batch negative."""
    counts = np.bincount(data["train"]["movie_id"] - 1, minlength=len(data["movie_ids"])) + 1.0
    return (counts / counts.sum()).astype(np.float32)


def tfrs_model(towers, catalogue: dict, probabilities: np.ndarray | None):
    """`tfrs.tasks.Retrieval` on in-batch negatives; with `probabilities`, TFRS' sampling-bias correction."""
    import tensorflow_recommenders as tfrs

    from tfdp_embed import tf

    user_model, movie_model = towers
    correct = probabilities is not None
    log_q = tf.constant(probabilities) if correct else None

    class Model(tfrs.Model):
        def __init__(self):
            super().__init__()
            self.user_model, self.movie_model = user_model, movie_model
            self.task = tfrs.tasks.Retrieval(remove_accidental_hits=correct)

        def compute_loss(self, features, training=False):
            positives = tf.nest.map_structure(lambda t: tf.gather(t, features["row"]), catalogue)
            extra = {"candidate_sampling_probability": tf.gather(log_q, features["row"])} if correct else {}
            if correct:
                extra["candidate_ids"] = features["row"]
            return self.task(self.user_model(features["user_id"]), self.movie_model(positives), **extra)

    return Model()


def fresh_towers(data, args):
    """The benchmark's two towers (`benchmarks.retrieval.build_towers`), built after seeding Keras with `args.seed`."""
    from benchmarks.retrieval import build_towers
    from tfdp_embed import keras

    keras.utils.set_random_seed(args.seed)
    return build_towers(data["num_users"], len(data["movie_ids"]), 19, args.dim)


def train_tfrs(data, catalogue, args, towers, *, learning_rate: float, epochs: int, corrected: bool, callbacks=()):
    """Trains `towers` as a TFRS two-tower (Adagrad) on `data["train"]`; returns Keras' history."""
    from tfdp_embed import keras, tf

    model = tfrs_model(towers, catalogue, sampling_probabilities(data) if corrected else None)
    model.compile(optimizer=keras.optimizers.Adagrad(learning_rate))
    index = {int(m): i for i, m in enumerate(catalogue["movie_id"])}
    train = dict(data["train"])
    train["row"] = np.array([index[int(m)] for m in train["movie_id"]], np.int32)
    dataset = tf.data.Dataset.from_tensor_slices(train).shuffle(len(train["row"]), seed=args.seed)
    return model.fit(dataset.batch(args.batch_size), epochs=epochs, callbacks=list(callbacks), verbose=0)


def _epoch_scorer(towers, catalogue, validation: dict, seen: np.ndarray, found: list, setting: dict):
    """A callback appending `setting` with the epoch and its validation recall@10 to `found` after each epoch."""
    from tfdp_embed import keras

    class Score(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            scores = model_recall(towers[0], towers[1], catalogue, validation["test"], seen)
            found.append({**setting, "epochs": epoch + 1, "validation_recall@10": scores["recall@10"]})

    return Score()


def tune_tfrs(data, catalogue, args) -> tuple[dict, list]:
    """(the best setting on the validation split, every (setting, epochs) tried with its validation recall@10)."""
    validation = validation_split(data, args.seed)
    seen = seen_matrix(validation)
    tried: list = []
    for corrected in (False, True):
        for rate in [float(r) for r in args.tune_learning_rates.split(",") if r]:
            setting = {"learning_rate": rate, "corrected": corrected}
            towers = fresh_towers(validation, args)
            found: list = []
            score = _epoch_scorer(towers, catalogue, validation, seen, found, setting)
            train_tfrs(validation, catalogue, args, towers, **setting, epochs=args.tune_max_epochs, callbacks=[score])
            tried += found
            print(max(found, key=lambda t: t["validation_recall@10"]), flush=True)
    best = max(tried, key=lambda t: t["validation_recall@10"])
    return best, tried
