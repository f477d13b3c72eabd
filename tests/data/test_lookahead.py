"""One-batch lookahead (tfdp_embed/data/lookahead.py)."""

from __future__ import annotations

import pytest

from tfdp_embed.data import poisson_batches, with_lookahead
from tfdp_embed.keras2._keras import tf


def _batches():
    ids = tf.constant([[1, 2], [2, 3], [5, 5], [7, 1], [9, 9]], tf.int32)
    ragged = tf.ragged.constant([[1], [2, 3], [], [4], [5]], dtype=tf.int64)
    labels = tf.range(5, dtype=tf.float32)
    return tf.data.Dataset.from_tensor_slices(({"a": ids, "r": ragged}, labels)).batch(2)


def _ids_fn(features):
    return {"table_a": features["a"], "table_r": features["r"]}


def test_each_batch_gets_the_next_batches_unique_ids_and_the_last_gets_none():
    out = list(with_lookahead(_batches(), _ids_fn))
    assert len(out) == 3
    # Batch 1 is [[1, 2], [2, 3]] and sees batch 2's ids [[5, 5], [7, 1]] -> unique {5, 7, 1}.
    features, labels, lookahead = out[0]
    assert features["a"].numpy().tolist() == [[1, 2], [2, 3]] and labels.numpy().tolist() == [0, 1]
    assert sorted(lookahead["table_a"].numpy().tolist()) == [1, 5, 7]
    assert lookahead["table_r"].numpy().tolist() == [4]  # ragged [[], [4]]
    assert lookahead["table_a"].dtype == tf.int64
    # Batch 2 sees batch 3 ([[9, 9]], ragged [[5]]).
    assert out[1][2]["table_a"].numpy().tolist() == [9] and out[1][2]["table_r"].numpy().tolist() == [5]
    # The last batch: empty id vectors, its own data intact.
    features, labels, lookahead = out[2]
    assert features["a"].numpy().tolist() == [[9, 9]] and features["r"].to_list() == [[5]]
    assert {k: v.shape.as_list() for k, v in lookahead.items()} == {"table_a": [0], "table_r": [0]}


def test_reads_the_source_once():
    reads = tf.Variable(0, dtype=tf.int64)

    def count(features, labels):
        reads.assign_add(1)
        return features, labels

    out = list(with_lookahead(_batches().map(count), _ids_fn))
    assert len(out) == 3 and int(reads.numpy()) == 3  # zip(ds, ds.skip(1)) would read 5


def test_lookahead_matches_the_batches_of_a_random_pipeline():
    # With Poisson batches the next batch is random: the lookahead must be the
    # ids of the batch that actually comes next (one stream, not two).
    ds = tf.data.Dataset.from_tensor_slices(({"item": tf.range(100, dtype=tf.int64) % 37}, tf.zeros([100])))
    batches, _ = poisson_batches(ds, sampling_probability=0.1, seed=0)
    out = list(with_lookahead(batches, lambda f: {"item": f["item"]}))
    assert len(out) == 10
    for (_, _, lookahead), (next_features, _, _) in zip(out, out[1:]):
        assert sorted(lookahead["item"].numpy().tolist()) == sorted(set(next_features["item"].numpy().tolist()))
    assert out[-1][2]["item"].shape == [0]


def test_single_batch_and_sample_weights():
    ds = tf.data.Dataset.from_tensors((tf.constant([[3, 3]]), tf.constant([1.0]), tf.constant([0.5])))
    ((features, labels, weights, lookahead),) = list(with_lookahead(ds, lambda f: {"t": f}))
    assert features.numpy().tolist() == [[3, 3]] and weights.numpy().tolist() == [0.5]
    assert lookahead["t"].shape == [0]
    assert list(with_lookahead(ds.take(0), lambda f: {"t": f})) == []


def test_bad_input():
    with pytest.raises(ValueError, match="tuples `\\(features, labels"):
        with_lookahead(tf.data.Dataset.range(3).batch(2), lambda f: {"t": f})
    with pytest.raises(ValueError, match="non-empty dict"):
        with_lookahead(_batches(), lambda f: f["a"])
    with pytest.raises(ValueError, match="integer ids"):
        with_lookahead(_batches(), lambda f: {"t": tf.cast(f["a"], tf.float32)})
    with pytest.raises(TypeError, match="`ids_fn`"):
        with_lookahead(_batches(), None)
