"""A TFRS user's MovieLens-like two-tower, shared by the retrieval tests: their code, with tfdp_embed's task.

A `tfrs.Model` with a query tower (user-id table + Dense) and an item
tower with features (a `DPEmbedding` subclass for the movie id, a
multi-valued genre table, Dense), trained with
`tfdp_embed.keras2.retrieval.Retrieval` where `tfrs.tasks.Retrieval` was.
"""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed import DPEmbedding, DPModel, keras, tf
from tfdp_embed.keras2.retrieval import Retrieval

tfrs = pytest.importorskip("tensorflow_recommenders")  # after tfdp_embed: it selects Keras 2

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


def movielens_like(n=1200, seed=0):
    """(user_id, movie_id) pairs following a learnable rule: 2 movies per user."""
    rng = np.random.default_rng(seed)
    users = rng.integers(0, NUM_USERS, n)
    movies = MOVIE_IDS[(users * 7 + rng.integers(0, 2, n)) % NUM_ITEMS]
    return {"user_id": users.astype("int32"), "movie_id": movies.astype("int32")}


def dp_two_tower(negatives, mechanism, lr=0.5, batch=64):
    """(the user's model, its DPModel compiled with legacy SGD)."""
    keras.utils.set_random_seed(0)
    model = MovielensModel(negatives)
    dp = DPModel(model, mechanism=mechanism, expected_batch_size=batch)
    dp.compile(optimizer=keras.optimizers.legacy.SGD(lr))
    return model, dp
