"""A TFRS user's two-tower with an item tower with features, trained with DPModel and the DP Retrieval task.

The user's code: `tfrs.Model`, a query tower, an item tower made of a
`DPEmbedding` subclass (item id), a genre table and Dense layers, and
`tfdp_embed.retrieval.Retrieval` where `tfrs.tasks.Retrieval` was. Before,
running that item tower over the catalogue inside the model died in the
clipping op (`TfdpEmbedPooledWeightSquares: row_index, examples and
weights must have the same length`).
"""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed import DPEmbedding, DPModel, keras, mechanisms, tf
from tfdp_embed.retrieval import FullSoftmax, Retrieval, SampledSoftmax

tfrs = pytest.importorskip("tensorflow_recommenders")

NUM_ITEMS, NUM_GENRES, NUM_USERS, DIM = 40, 6, 30, 8
MOVIE_IDS = np.arange(1000, 1000 + NUM_ITEMS)  # the data's own item ids
GENRES = tf.ragged.constant([[i % NUM_GENRES] + ([(i // 2) % NUM_GENRES] if i % 4 else []) for i in range(NUM_ITEMS)])


class MovieIdEmbedding(DPEmbedding):
    def call(self, ids):
        return self.lookup(ids - 1000)  # the user's own id mapping, around `lookup`


class MovieModel(keras.Model):
    def __init__(self):
        super().__init__()
        self.movie = MovieIdEmbedding(NUM_ITEMS, DIM, name="movie_id")
        self.genres = DPEmbedding(NUM_GENRES, DIM, combiner="mean", name="genres")
        self.dense = keras.layers.Dense(DIM, name="movie_dense")

    def call(self, features):
        return self.dense(tf.concat([self.movie(features["movie_id"]), self.genres(features["genres"])], axis=1))


class MovielensModel(tfrs.Model):
    def __init__(self, negatives):
        super().__init__()
        self.user_model = keras.Sequential([DPEmbedding(NUM_USERS, DIM, name="user_id"), keras.layers.Dense(DIM)])
        self.movie_model = MovieModel()
        self.task = Retrieval(
            self.movie_model,
            {"movie_id": MOVIE_IDS, "genres": GENRES},
            identifiers=MOVIE_IDS,
            negatives=negatives,
            ks=(1, 10),
        )

    def compute_loss(self, features, training=False):
        return self.task(self.user_model(features["user_id"]), candidate_ids=features["movie_id"], training=training)


def _data(n=1200, seed=0):
    rng = np.random.default_rng(seed)
    users = rng.integers(0, NUM_USERS, n)
    movies = MOVIE_IDS[(users * 7 + rng.integers(0, 2, n)) % NUM_ITEMS]  # a learnable rule: 2 movies per user
    return {"user_id": users.astype("int32"), "movie_id": movies.astype("int32")}


def _dp(negatives, mechanism, lr=0.5, batch=64):
    keras.utils.set_random_seed(0)
    model = MovielensModel(negatives)
    dp = DPModel(model, mechanism=mechanism, expected_batch_size=batch)
    dp.compile(optimizer=keras.optimizers.legacy.SGD(lr))
    return model, dp


@pytest.mark.parametrize("negatives", [FullSoftmax(), SampledSoftmax(12, seed=5)], ids=["full", "sampled"])
def test_zero_noise_huge_clip_step_is_sgd_on_the_mean_loss(negatives):
    """Degenerate DP (sigma 0, C huge) reproduces the non-private step exactly, item tower included."""
    batch = {k: v[:16] for k, v in _data().items()}
    model, dp = _dp(negatives, mechanisms.DenseDPSGD(l2_norm_clip=1e6, noise_multiplier=0.0, seed=0), batch=16)
    dp.prepare(tf.data.Dataset.from_tensors(batch))
    before = [v.numpy().copy() for v in model.trainable_variables]
    with model.task.frozen_randomness(), tf.GradientTape() as tape:  # step 0's sample, as the DP step uses
        mean = tf.reduce_mean(model.compute_loss(batch, training=True))
    grads = [tf.convert_to_tensor(g).numpy() for g in tape.gradient(mean, model.trainable_variables)]
    dp.fit(tf.data.Dataset.from_tensors(batch), epochs=1, verbose=0)
    for v, w, g in zip(model.trainable_variables, before, grads):
        np.testing.assert_allclose(v.numpy(), w - 0.5 * g, rtol=1e-5, atol=1e-7, err_msg=v.name)


@pytest.mark.parametrize("negatives", [FullSoftmax(), SampledSoftmax(12, seed=5)], ids=["full", "sampled"])
@pytest.mark.parametrize("mechanism_name", ["lazy", "adafest"])
def test_trains_privately_and_reports_top_k_recall(negatives, mechanism_name):
    if mechanism_name == "lazy":
        mechanism = mechanisms.LazyDP(l2_norm_clip=1.0, noise_multiplier=0.3, seed=0)
    else:
        # tau per table: the user-id rows are touched by ~2 examples per batch, the genres by many.
        mechanism = mechanisms.DPAdaFEST(
            l2_norm_clip=1.0, noise_multiplier=0.3, contribution_clip=1.0, contribution_noise_multiplier=0.5,
            threshold={"user_id": 1.0, "movie_id": 1.0, "genres": 3.0}, seed=0,
        )  # fmt: skip
    model, dp = _dp(negatives, mechanism, lr=5.0)
    train = tf.data.Dataset.from_tensor_slices(_data()).batch(64)
    history = dp.fit(train, epochs=4, verbose=0)
    assert np.isnan(history.history["recall_at_10"][-1])  # not computed in training steps
    assert history.history["loss"][-1] < history.history["loss"][0]
    result = dp.evaluate(tf.data.Dataset.from_tensor_slices(_data(400, seed=1)).batch(100), verbose=0, return_dict=True)
    # Each user has 2 movies among 40: chance recall@10 is 0.25; the towers learn the rule.
    assert result["recall_at_10"] > 0.8, result
    assert result["precision_at_10"] == pytest.approx(result["recall_at_10"] / 10, rel=1e-5)


def test_fest_refuses_a_table_of_the_candidate_tower():
    model, dp = _dp(
        FullSoftmax(),
        mechanisms.DPFEST(
            l2_norm_clip=1.0, noise_multiplier=0.3, top_k=5, selection_epsilon=1.0,
            counts={"movie_id": np.ones(NUM_ITEMS), "genres": np.ones(NUM_GENRES), "user_id": np.ones(NUM_USERS)},
            seed=0,
        ),
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"cannot train table 'movie_id'.*scored rows would stay at their initial"):
        dp.fit(tf.data.Dataset.from_tensor_slices(_data(128)).batch(64), epochs=1, verbose=0)
