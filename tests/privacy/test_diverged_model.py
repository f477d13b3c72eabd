"""Attack (M6): a diverged (NaN) retrieval model scores perfectly and is exported.

NaN compares false with everything, so a query whose scores are all NaN
has no item "ahead" of its positive and (ties counted with `==`) rank -1:
before the fix every query was a hit, `evaluate` reported recall@10 = 1.0
for a model that recommends nothing, and `export_top_k` released it. The
attack: train the TFRS-style two-tower a little, let its query tower
diverge (its Dense kernel becomes NaN, as after an overflow), then read
the metrics and export it.

Now a query with a non-finite score makes recall and precision NaN (in
`evaluate` and in `metrics.precision_recall_at_k`), `metrics.target_ranks`
refuses NaN scores, and every export refuses a model with a non-finite
weight.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.retrieval.user_model import dp_two_tower, movielens_like
from tfdp_embed import mechanisms, tf
from tfdp_embed.keras2.retrieval import FullSoftmax, export_top_k
from tfdp_embed.metrics.ranking import target_ranks
from tfdp_embed.metrics.retrieval import precision_recall_at_k


@pytest.fixture(scope="module")
def diverged():
    model, dp = dp_two_tower(FullSoftmax(), mechanisms.DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=0.5, seed=0))
    dp.fit(tf.data.Dataset.from_tensor_slices(movielens_like(128)).batch(64), epochs=1, verbose=0)
    healthy = dp.evaluate(tf.data.Dataset.from_tensor_slices(movielens_like(128, seed=1)).batch(64), verbose=0)
    kernel = model.user_model.layers[-1].kernel
    kernel.assign(tf.fill(tf.shape(kernel), float("nan")))
    return model, dp, dict(zip(dp.metrics_names, np.atleast_1d(healthy)))


def test_a_diverged_model_reports_nan_recall_not_a_perfect_one(diverged):
    model, dp, healthy = diverged
    assert 0.0 <= healthy["recall_at_10"] < 1.0  # the control: a trained model's recall is a number
    logs = dp.evaluate(tf.data.Dataset.from_tensor_slices(movielens_like(128, seed=1)).batch(64), return_dict=True)
    # Before the fix: recall_at_1 = recall_at_10 = 1.0.
    for name in ("recall_at_1", "recall_at_10", "precision_at_10"):
        assert np.isnan(logs[name]), logs


def test_offline_metrics_of_nan_scores_are_nan_or_refused(diverged):
    model, _, _ = diverged
    users = movielens_like(16, seed=2)["user_id"]
    queries = model.user_model(users).numpy()
    candidates = model.task.candidate_embeddings().numpy()
    metrics = precision_recall_at_k(queries, candidates, np.zeros(16, np.int64), ks=(1, 10))
    assert np.isnan(metrics["recall@10"]) and np.isnan(metrics["precision@1"]), metrics
    scores = np.concatenate([np.zeros((16, 1), np.float32), queries @ candidates.T], axis=1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="NaN"):
        target_ranks(scores, np.ones(16, np.int64))


def test_a_diverged_model_is_not_exported(diverged, tmp_path):
    model, dp, _ = diverged
    with pytest.raises(ValueError, match="diverged"):
        export_top_k(
            dp,
            str(tmp_path / "top_k"),
            query_model=model.user_model,
            candidates=model.task,
            input_signature=tf.TensorSpec([None], tf.int32, name="user_id"),
            k=5,
        )
    assert not (tmp_path / "top_k").exists()
