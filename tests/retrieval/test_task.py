"""`tfdp_embed.keras2.retrieval.Retrieval`: losses against numpy oracles, the negative sample, metrics, errors."""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed import DPEmbedding, keras, tf
from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.keras2.retrieval import FullSoftmax, Retrieval, SampledSoftmax

N, D = 9, 4
IDS = np.array([f"item{i}" for i in range(N)])  # identifiers as the data names items


def _task(negatives=None, **kwargs):
    keras.utils.set_random_seed(0)
    tower = DPEmbedding(N, D, embeddings_initializer=keras.initializers.RandomNormal(stddev=1.0))
    return Retrieval(tower, np.arange(N), identifiers=IDS, negatives=negatives, **kwargs)


def _table(task):
    return task.candidate_tower.embeddings.numpy().astype(np.float64)


def _log_softmax(x):
    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


QUERIES = np.random.default_rng(0).normal(size=(5, D)).astype(np.float32)
POSITIVES = np.array([2, 2, 0, 8, 5])  # a repeated positive


def test_full_softmax_is_the_softmax_over_the_whole_catalogue():
    task = _task(temperature=0.5)
    loss = task(QUERIES, candidate_ids=IDS[POSITIVES]).numpy()
    logits = QUERIES.astype(np.float64) @ _table(task).T / 0.5
    expected = -_log_softmax(logits)[np.arange(5), POSITIVES]
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    # With the positives' embeddings given (TFRS style), the same softmax: [positive, every other item].
    given = task(QUERIES, _table(task)[POSITIVES].astype(np.float32), candidate_ids=IDS[POSITIVES]).numpy()
    np.testing.assert_allclose(given, expected, rtol=1e-5)


def test_sampled_softmax_matches_the_oracle_with_log_q_and_accidental_hits():
    proposal = np.arange(1, N + 1, dtype=np.float64)
    proposal /= proposal.sum()
    negatives = SampledSoftmax(6, proposal=proposal, proposal_provenance="public", seed=7)
    task = _task(negatives)
    loss = task(QUERIES, candidate_ids=IDS[POSITIVES], training=False).numpy()
    sample = negatives.sample(tf.constant(0, tf.int64), N).numpy()  # step 0: no training step yet
    table, q = _table(task), QUERIES.astype(np.float64)
    positive = np.sum(q * table[POSITIVES], axis=1) - np.log(6 * proposal[POSITIVES])
    sampled = q @ table[sample].T - np.log(6 * proposal[sample])[None, :]
    sampled[sample[None, :] == POSITIVES[:, None]] = -np.inf  # an item equal to the positive is no negative
    logits = np.concatenate([positive[:, None], sampled], axis=1)
    np.testing.assert_allclose(loss, -_log_softmax(logits)[:, 0], rtol=1e-5)


def test_the_sample_is_one_per_training_step_and_does_not_depend_on_the_batch():
    task = _task(SampledSoftmax(4, seed=1))
    other = np.random.default_rng(3).normal(size=(5, D)).astype(np.float32)
    first = task(QUERIES[:2], candidate_ids=IDS[POSITIVES[:2]], training=False).numpy()
    # Same step, another batch around example 0: example 0's loss is unchanged.
    mixed = task(np.concatenate([QUERIES[:1], other]), candidate_ids=IDS[[2, 1, 1, 3, 4, 0]], training=False)
    np.testing.assert_allclose(mixed.numpy()[0], first[0], rtol=1e-6)
    with task.frozen_randomness():  # the contract checks re-run a training step: the same sample
        again = task(QUERIES[:2], candidate_ids=IDS[POSITIVES[:2]], training=True).numpy()
    np.testing.assert_allclose(again, first, rtol=1e-6)
    task(QUERIES[:2], candidate_ids=IDS[POSITIVES[:2]], training=True)  # a training step uses step 0's sample...
    after = task(QUERIES[:2], candidate_ids=IDS[POSITIVES[:2]], training=False).numpy()  # ...then step 1's
    assert not np.array_equal(_negatives_at(task, 0), _negatives_at(task, 1))
    assert abs(after[0] - first[0]) > 1e-3


def _negatives_at(task, step):
    return task.negatives.sample(tf.constant(step, tf.int64), N).numpy()


def test_samples_follow_the_proposal():
    proposal = np.array([0.4, 0.3, 0.1, 0.1, 0.05, 0.02, 0.01, 0.01, 0.01])
    negatives = SampledSoftmax(1000, proposal=proposal, proposal_provenance="public", seed=0)
    draws = np.concatenate([negatives.sample(tf.constant(t, tf.int64), N).numpy() for t in range(20)])
    frequencies = np.bincount(draws, minlength=N) / draws.size
    # 20,000 draws: the standard error of a frequency p is sqrt(p (1 - p) / 20000) <= 0.0035.
    np.testing.assert_allclose(frequencies, proposal, atol=0.015)
    uniform = SampledSoftmax(1000, seed=0).sample(tf.constant(0, tf.int64), N).numpy()
    assert uniform.min() == 0 and uniform.max() == N - 1


def test_top_k_metrics_rank_the_positive_among_all_items():
    task = _task(ks=(1, 3))
    assert np.isnan(task.metrics[0].result().numpy())  # nothing seen yet: NaN, not 0
    task(QUERIES, candidate_ids=IDS[POSITIVES], compute_metrics=True)
    scores = QUERIES.astype(np.float64) @ _table(task).T
    positive = scores[np.arange(5), POSITIVES][:, None]
    ranks = (scores > positive).sum(1) + (scores == positive).sum(1) - 1
    results = {m.name: float(m.result().numpy()) for m in task.metrics}
    for k in (1, 3):
        assert results[f"recall_at_{k}"] == pytest.approx(np.mean(ranks < k))
        assert results[f"precision_at_{k}"] == pytest.approx(np.mean(ranks < k) / k)
    # Training calls skip them by default (they cost a pass over the catalogue).
    for m in task.metrics:
        m.reset_state()
    task(QUERIES, candidate_ids=IDS[POSITIVES], training=True)
    assert all(np.isnan(m.result().numpy()) for m in task.metrics)


def test_metrics_are_never_saved_with_the_model():
    task = _task()
    task(QUERIES, candidate_ids=IDS[POSITIVES], compute_metrics=True)
    path = tf.train.Checkpoint(task=task).write("/tmp/tfdp_retrieval_metrics_ckpt")
    names = [name for name, _ in tf.train.list_variables(path)]
    assert any("embeddings" in n for n in names)
    assert not any("recall" in n or "precision" in n or "total" in n or "count" in n for n in names), names
    assert not any("step" in n for n in names), names  # the negative sample counter is training state


def test_wrong_inputs_are_refused_with_messages():
    task = _task()
    with pytest.raises(ValueError, match="needs `candidate_ids`"):
        task(QUERIES)
    with pytest.raises(tf.errors.InvalidArgumentError, match="not in the catalogue"):
        task(QUERIES, candidate_ids=np.array(["item1", "nope", "item2", "item3", "item4"]))
    with pytest.raises(ValueError, match=r"`ks` must be .* in \[1, 9\]"):
        _task(ks=(10,))
    with pytest.raises(PrivacyContractError, match="proposal_provenance"):
        SampledSoftmax(3, proposal=np.full(N, 1 / N))
    with pytest.raises(ValueError, match="sum to 1"):
        SampledSoftmax(3, proposal=np.full(N, 0.5), proposal_provenance="public")
    with pytest.raises(ValueError, match="probabilities > 0"):
        SampledSoftmax(3, proposal=np.eye(N)[0], proposal_provenance="public")
    with pytest.raises(ValueError, match="4 probabilities for a catalogue of 9"):
        _task(SampledSoftmax(3, proposal=np.full(4, 0.25), proposal_provenance="public"))
    with pytest.raises(ValueError, match="same leading size"):
        Retrieval(DPEmbedding(N, D), {"a": np.arange(3), "b": np.arange(4)})
    rows_task = Retrieval(DPEmbedding(N, D), np.arange(N))  # no identifiers: positives are rows
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"rows in \[0, 9\)"):
        rows_task(QUERIES, candidate_ids=np.array([0, 1, 2, 3, 9]))


def test_tfrs_retrieval_is_refused_naming_this_task():
    tfrs = pytest.importorskip("tensorflow_recommenders")
    from tfdp_embed import DPModel, mechanisms

    class InBatch(tfrs.Model):
        def __init__(self):
            super().__init__()
            self.query = DPEmbedding(N, D)
            self.task = tfrs.tasks.Retrieval()

        def compute_loss(self, features, training=False):
            return self.task(self.query(features), self.query(features))

    with pytest.raises(
        PrivacyContractError, match=r"tfdp_embed\.keras2\.retrieval\.Retrieval.*drawn independently of the data"
    ):
        DPModel(
            InBatch(), mechanism=mechanisms.DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0), expected_batch_size=4
        )


def test_full_softmax_default_and_repr():
    assert _task().negatives.full and repr(FullSoftmax()) == "FullSoftmax()"
    assert "num_negatives=3" in repr(SampledSoftmax(3, seed=0))
