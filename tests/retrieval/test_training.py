"""A TFRS user's two-tower with an item tower with features, trained with DPModel and the DP Retrieval task.

The user's code: `tfrs.Model`, a query tower, an item tower made of a
`DPEmbedding` subclass (item id), a genre table and Dense layers, and
`tfdp_embed.keras2.retrieval.Retrieval` where `tfrs.tasks.Retrieval` was. Before,
running that item tower over the catalogue inside the model died in the
clipping op (`TfdpEmbedPooledWeightSquares: row_index, examples and
weights must have the same length`).
"""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed import mechanisms, tf
from tfdp_embed.keras2.retrieval import FullSoftmax, SampledSoftmax

from .user_model import NUM_GENRES, NUM_ITEMS, NUM_USERS
from .user_model import dp_two_tower as _dp
from .user_model import movielens_like as _data


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
            l2_norm_clip=1.0,
            noise_multiplier=0.3,
            contribution_clip=1.0,
            contribution_noise_multiplier=0.5,
            threshold={"user_id": 1.0, "movie_id": 1.0, "genres": 3.0},
            seed=0,
        )
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
            l2_norm_clip=1.0,
            noise_multiplier=0.3,
            top_k=5,
            selection_epsilon=1.0,
            counts={"movie_id": np.ones(NUM_ITEMS), "genres": np.ones(NUM_GENRES), "user_id": np.ones(NUM_USERS)},
            seed=0,
        ),
    )
    with pytest.raises(ValueError, match=r"cannot train table 'movie_id'.*scored rows would stay at their initial"):
        dp.fit(tf.data.Dataset.from_tensor_slices(_data(128)).batch(64), epochs=1, verbose=0)
