"""The rule-coverage check in float32 at a realistic size: a full softmax over a catalogue, batch 512.

Under a full softmax the candidate tower's output bias b shifts every
score of a query by q . b, so every example's gradient of b is exactly 0
up to float32 round-off of its own terms. The coverage check compared the
rules' sum with the true gradient against scales that are themselves ~0,
and refused a correct model (`movie_dense/bias` "missed") at ml-100k
sizes; it must accept it, and still refuse a table read outside `lookup`.
"""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed import DPEmbedding, DPModel, keras, mechanisms, tf
from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.keras2.retrieval import FullSoftmax, Retrieval

tfrs = pytest.importorskip("tensorflow_recommenders")  # after tfdp_embed: it selects Keras 2

NUM_USERS, NUM_ITEMS, DIM, BATCH = 900, 1700, 32, 512


class ReadsTableItself(DPEmbedding):
    def call(self, ids):
        return self.lookup(ids) + 0.1 * tf.gather(self.embeddings, ids)  # a use the rule does not record


def _model(item_table):
    class TwoTower(tfrs.Model):
        def __init__(self):
            super().__init__()
            self.user_model = keras.Sequential([DPEmbedding(NUM_USERS, DIM), keras.layers.Dense(DIM)])
            self.item_model = keras.Sequential([item_table(NUM_ITEMS, DIM), keras.layers.Dense(DIM)])
            self.task = Retrieval(self.item_model, np.arange(NUM_ITEMS), negatives=FullSoftmax())

        def compute_loss(self, features, training=False):
            return self.task(self.user_model(features["user"]), candidate_ids=features["item"], training=training)

    keras.utils.set_random_seed(0)
    return TwoTower()


def _data():
    rng = np.random.default_rng(0)
    return tf.data.Dataset.from_tensors(
        {
            "user": rng.integers(0, NUM_USERS, BATCH).astype("int32"),
            "item": rng.integers(0, NUM_ITEMS, BATCH).astype("int32"),
        }
    )


def _dp(model):
    mechanism = mechanisms.LazyDP(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0)
    dp = DPModel(model, mechanism=mechanism, expected_batch_size=BATCH)
    dp.compile(optimizer=keras.optimizers.legacy.SGD(0.1))
    return dp


def test_full_softmax_output_bias_passes_the_coverage_check_in_float32():
    _dp(_model(DPEmbedding)).prepare(_data())


def test_a_table_read_outside_lookup_is_still_refused_at_this_size():
    with pytest.raises(PrivacyContractError, match=r"rules miss part of the gradient of .*embeddings"):
        _dp(_model(ReadsTableItself)).prepare(_data())
