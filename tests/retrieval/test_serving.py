"""Serving any user's retrieval model: `export_top_k` / `TopKServing` with the user's query model and candidates.

Before, the only top-k export took the library's own `TwoTowerModel`. Here
a TFRS user's query tower and item tower (through the `Retrieval` task), or
any query model with a matrix of candidate embeddings, become a top-k
SavedModel; the served ids and scores must equal a numpy top-k over the
released (flushed) weights.
"""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed import DPEmbedding, keras, mechanisms, tf
from tfdp_embed.keras2.retrieval import SampledSoftmax, TopKServing, export_top_k

from .user_model import MOVIE_IDS, NUM_USERS
from .user_model import dp_two_tower as _dp
from .user_model import movielens_like as _data

USERS = np.array([0, 3, 7, 3, 29], np.int32)


def _numpy_top_k(queries, candidates, ids, k):
    scores = queries.astype(np.float64) @ candidates.astype(np.float64).T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return ids[order], np.take_along_axis(scores, order, axis=1)


def test_export_top_k_serves_a_tfrs_users_towers_after_the_flush(tmp_path):
    model, dp = _dp(SampledSoftmax(12, seed=5), mechanisms.LazyDP(l2_norm_clip=1.0, noise_multiplier=0.5, seed=0))
    dp.fit(tf.data.Dataset.from_tensor_slices(_data(256)).batch(64), epochs=1, verbose=0)

    path = export_top_k(
        dp,
        str(tmp_path / "top_k"),
        query_model=model.user_model,
        candidates=model.task,
        input_signature=tf.TensorSpec([None], tf.int32, name="user_id"),
        k=5,
        report={"epsilon": 1.0},
    )
    queries = model.user_model(USERS).numpy()
    candidates = model.task.candidate_embeddings().numpy()
    want_ids, want_scores = _numpy_top_k(queries, candidates, MOVIE_IDS, 5)

    served = tf.saved_model.load(path).signatures["serving_default"](user_id=tf.constant(USERS))
    np.testing.assert_array_equal(served["item_ids"].numpy(), want_ids)  # the catalogue's own ids
    np.testing.assert_allclose(served["scores"].numpy(), want_scores, rtol=1e-5, atol=1e-6)
    assert (tmp_path / "top_k" / "privacy_report.json").exists()


def test_top_k_serving_takes_any_query_model_and_an_embedding_matrix(tmp_path):
    keras.utils.set_random_seed(1)
    user_id = keras.Input(shape=(), dtype=tf.int32, name="user_id")
    query_model = keras.Model(user_id, keras.layers.Dense(4)(DPEmbedding(NUM_USERS, 6)(user_id)))  # functional
    candidates = np.random.default_rng(0).normal(size=(9, 4)).astype(np.float32)
    names = np.array([f"item-{i}" for i in range(9)])

    module = TopKServing(query_model, candidates, identifiers=names, k=3)  # input signature from the model
    tf.saved_model.save(module, str(tmp_path / "m"), signatures={"serving_default": module.serve})
    served = tf.saved_model.load(str(tmp_path / "m")).signatures["serving_default"](user_id=tf.constant(USERS))

    want_ids, want_scores = _numpy_top_k(query_model(USERS).numpy(), candidates, names, 3)
    np.testing.assert_array_equal(served["item_ids"].numpy().astype(str), want_ids)
    np.testing.assert_allclose(served["scores"].numpy(), want_scores, rtol=1e-5, atol=1e-6)


def test_dict_inputs_become_named_serving_inputs(tmp_path):
    class TwoInputs(keras.Model):  # subclassed: no declared inputs
        def __init__(self):
            super().__init__()
            self.users = DPEmbedding(NUM_USERS, 4)
            self.hours = DPEmbedding(24, 4)

        def call(self, features):
            return self.users(features["user_id"]) + self.hours(features["hour"])

    query_model = TwoInputs()
    candidates = np.eye(4, dtype=np.float32)
    spec = {"user_id": tf.TensorSpec([None], tf.int32), "hour": tf.TensorSpec([None], tf.int32)}
    module = TopKServing(query_model, candidates, k=2, input_signature=spec)
    tf.saved_model.save(module, str(tmp_path / "m"), signatures={"serving_default": module.serve})
    serve = tf.saved_model.load(str(tmp_path / "m")).signatures["serving_default"]
    features = {"user_id": tf.constant([1, 2]), "hour": tf.constant([5, 23])}
    want_ids, _ = _numpy_top_k(query_model(features).numpy(), candidates, np.arange(4), 2)
    np.testing.assert_array_equal(serve(**features)["item_ids"].numpy(), want_ids)


def test_wrong_arguments_are_refused_with_messages():
    model, _ = _dp(SampledSoftmax(12, seed=5), mechanisms.LazyDP(l2_norm_clip=1.0, noise_multiplier=0.5, seed=0))
    spec = tf.TensorSpec([None], tf.int32)
    with pytest.raises(ValueError, match=r"`k` must be an int in \[1, 40\]"):
        TopKServing(model.user_model, model.task, k=41, input_signature=spec)
    with pytest.raises(ValueError, match=r"`identifiers` come from the Retrieval task"):
        TopKServing(model.user_model, model.task, identifiers=MOVIE_IDS, input_signature=spec)
    with pytest.raises(ValueError, match=r"`input_signature` is needed"):
        TopKServing(model, model.task)
    with pytest.raises(ValueError, match=r"float \[num_items, dim\] matrix.*int32"):
        TopKServing(model.user_model, np.zeros((4, 2), np.int32), input_signature=spec)
    with pytest.raises(ValueError, match=r"one id per candidate, shape \(4,\)"):
        TopKServing(model.user_model, np.zeros((4, 2), np.float32), identifiers=[1, 2], input_signature=spec)
