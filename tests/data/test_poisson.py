"""Poisson-sampled batches (tfdp_embed/data/poisson.py).

Statistical checks use stated binomial tolerances (5 standard deviations, so
a correct sampler fails about once in 1.7 million runs; seeds are fixed, so
the tests are deterministic anyway).
"""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed.data import BatchingInfo, fixed_size_batches, poisson_batches, streaming_poisson_batches
from tfdp_embed.data.provenance import registered_info
from tfdp_embed.keras2._keras import tf

N = 200


def _ids(n=N):
    return tf.data.Dataset.range(n)  # example i is the int64 i


def _membership(batches, epochs, n=N):
    """[num_batches, n] 0/1 matrix; also checks there are no duplicates inside a batch."""
    rows = []
    for batch in batches.repeat(epochs):  # one iterator; the sampling RNG carries on
        ids = batch.numpy()
        assert len(np.unique(ids)) == len(ids)
        row = np.zeros(n, np.int64)
        row[ids] = 1
        rows.append(row)
    return np.array(rows)


@pytest.mark.parametrize("q", [0.1, 0.5])  # distinct-index path and Bernoulli-mask path
def test_in_memory_batches_are_poisson(q, check_poisson):
    batches, info = poisson_batches(_ids(), sampling_probability=q, seed=1)
    assert info.batching == "poisson" and info.batches_per_epoch == round(1 / q)
    assert info.expected_batch_size == pytest.approx(q * N)
    epochs = 20 if q == 0.1 else 100  # 200 batches either way
    m = _membership(batches, epochs)
    assert m.shape == (200, N)
    check_poisson(m, q)


def test_streaming_batches_are_poisson_and_read_the_source_once_per_pass(check_poisson):
    reads = tf.Variable(0, dtype=tf.int64)

    def count(x):
        reads.assign_add(1)
        return x

    source = _ids().map(count)
    q, g = 0.1, 4  # 10 batches per epoch: passes of 4, 4, 2
    batches, info = streaming_poisson_batches(
        source, sampling_probability=q, num_examples=N, batches_per_pass=g, seed=2, read_chunk_size=64
    )
    assert info.streaming and info.batches_per_pass == g
    m = _membership(batches, epochs=1)
    assert m.shape == (10, N)
    assert int(reads.numpy()) == 3 * N  # 3 passes per epoch, each reads N examples
    # Statistics with fewer, larger passes (each pass costs ~0.1 s of tf.data setup).
    batches, _ = streaming_poisson_batches(
        _ids(), sampling_probability=q, num_examples=N, batches_per_pass=10, seed=3, read_chunk_size=64
    )
    m = _membership(batches, epochs=15)
    assert m.shape == (150, N)
    check_poisson(m, q)


def test_in_memory_arrays_give_the_same_batches_as_a_dataset():
    x = np.arange(N, dtype=np.float32)[:, None] * [1.0, 2.0]
    arrays = ({"x": x}, np.arange(N, dtype=np.int64))
    from_arrays, info = poisson_batches(arrays, sampling_probability=0.1, seed=9)
    from_dataset, _ = poisson_batches(tf.data.Dataset.from_tensor_slices(arrays), sampling_probability=0.1, seed=9)
    assert info.num_examples == N
    for (fa, la), (fd, ld) in zip(from_arrays, from_dataset):
        np.testing.assert_array_equal(la, ld)
        np.testing.assert_array_equal(fa["x"], fd["x"])
    shuffled, info = fixed_size_batches(arrays, batch_size=50, seed=0)
    epoch = [labels.numpy() for _, labels in shuffled]
    assert info.batching == "fixed_shuffled" and [len(b) for b in epoch] == [50] * 4
    assert sorted(np.concatenate(epoch).tolist()) == list(range(N))
    with pytest.raises(ValueError, match="share one leading"):
        poisson_batches((np.zeros([3, 2]), np.zeros([4])), sampling_probability=0.5)


def test_streaming_reads_a_batched_source_of_uneven_chunks(check_poisson):
    # A source of consecutive batches of any sizes (e.g. the Criteo reader's chunks) is used as is.
    source = _ids().batch(37)
    q = 0.1
    batches, info = streaming_poisson_batches(
        source, sampling_probability=q, num_examples=N, batches_per_pass=10, seed=5, source_batched=True
    )
    assert info.streaming and info.batches_per_epoch == 10
    m = _membership(batches, epochs=15)
    assert m.shape == (150, N)
    check_poisson(m, q)
    short, _ = streaming_poisson_batches(
        source, sampling_probability=q, num_examples=N + 3, batches_per_pass=10, seed=5, source_batched=True
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match="exactly `num_examples`"):
        list(short)
    with pytest.raises(ValueError, match="first dimension may vary"):
        streaming_poisson_batches(
            tf.data.Dataset.from_tensor_slices(tf.ragged.constant([[[1]], [[2, 3]]])),
            sampling_probability=0.5,
            num_examples=2,
            batches_per_pass=1,
            source_batched=True,
        )


def test_seeds_are_reproducible_and_epochs_differ():
    def first_epoch(seed):
        return [b.numpy().tolist() for b in poisson_batches(_ids(), sampling_probability=0.1, seed=seed)[0]]

    assert first_epoch(7) == first_epoch(7)
    assert first_epoch(7) != first_epoch(8)
    assert first_epoch(None) != first_epoch(None)  # OS entropy
    batches, _ = poisson_batches(_ids(), sampling_probability=0.1, seed=7)
    epoch_1 = [b.numpy().tolist() for b in batches]
    epoch_2 = [b.numpy().tolist() for b in batches]
    assert epoch_1 == first_epoch(7) and epoch_2 != epoch_1  # fresh batches every epoch

    def stream():
        batches, _ = streaming_poisson_batches(
            _ids(), sampling_probability=0.1, num_examples=N, batches_per_pass=5, seed=7
        )
        return [b.numpy().tolist() for b in batches]

    assert stream() == stream()


@pytest.mark.parametrize("q, streaming", [(0.5, False), (0.1, False), (0.5, True)])
def test_oversized_batches_are_truncated_and_counted(q, streaming):
    cap = int(q * N)  # about half the batches overflow

    def make(max_batch_size):
        if streaming:
            return streaming_poisson_batches(
                _ids(),
                sampling_probability=q,
                num_examples=N,
                batches_per_pass=2,
                seed=3,
                max_batch_size=max_batch_size,
            )
        return poisson_batches(_ids(), sampling_probability=q, seed=3, max_batch_size=max_batch_size)

    epochs = 2 if q == 0.1 else 5 if streaming else 10  # 20, 10, 20 batches
    untruncated, _ = make(None)
    full = [set(b.numpy().tolist()) for b in untruncated.repeat(epochs)]
    batches, info = make(cap)
    cut = [set(b.numpy().tolist()) for b in batches.repeat(epochs)]
    # Same seed: the same Poisson samples, cut to a random subset of size `cap`.
    for before, after in zip(full, cut):
        assert after <= before and len(after) == min(len(before), cap)
    overflowing = [len(b) - cap for b in full if len(b) > cap]
    assert 0 < len(overflowing) < len(full)
    report = info.report()
    assert report["truncated_batches"] == len(overflowing)
    assert report["truncated_examples"] == sum(overflowing)
    assert report["max_batch_size"] == cap


def test_truncation_keeps_a_uniform_subset():
    # q = 0.5, cap = 10: nearly every batch (~100 ids) is cut to 10 uniform ids,
    # so every example appears with frequency ~ 10 / N = 0.05 per batch.
    batches, info = poisson_batches(_ids(), sampling_probability=0.5, seed=4, max_batch_size=10)
    m = _membership(batches, epochs=200)  # 400 batches, 4000 inclusions
    assert (m.sum(1) == 10).all()
    counts = m.sum(0)  # ~ Binomial(400, 0.05): mean 20, sd 4.36
    assert abs(counts.mean() - 20) < 1e-9 and counts.min() > 20 - 5 * 4.36 and counts.max() < 20 + 5 * 4.36
    assert info.report()["truncated_batches"] == 400


def test_features_and_labels_are_gathered_together_including_ragged():
    x = np.arange(N, dtype=np.float32)[:, None] * [1.0, 2.0]
    ragged = tf.ragged.constant([[i] * (i % 3) for i in range(N)], dtype=tf.int64)
    ds = tf.data.Dataset.from_tensor_slices(({"x": x, "ids": ragged}, np.arange(N, dtype=np.int64)))
    batches, _ = poisson_batches(ds, sampling_probability=0.2, seed=5)
    for features, labels in batches:
        labels = labels.numpy()
        np.testing.assert_array_equal(features["x"].numpy()[:, 0], labels)
        assert [len(r) for r in features["ids"].to_list()] == [i % 3 for i in labels]


def test_empty_dataset_and_bad_arguments():
    with pytest.raises(ValueError, match="`dataset` is empty"):
        poisson_batches(_ids(0), sampling_probability=0.1)
    with pytest.raises(ValueError, match="dataset is empty"):
        streaming_poisson_batches(_ids(0), sampling_probability=0.1, num_examples=0, batches_per_pass=1)
    with pytest.raises(ValueError, match="`sampling_probability` must be a number in \\(0, 1\\]; received 0"):
        poisson_batches(_ids(), sampling_probability=0)
    with pytest.raises(ValueError, match="`max_batch_size`"):
        poisson_batches(_ids(), sampling_probability=0.1, max_batch_size=0)
    with pytest.raises(ValueError, match="`num_examples`=5 but the dataset holds 200"):
        poisson_batches(_ids(), sampling_probability=0.1, num_examples=5)
    with pytest.raises(ValueError, match="`batches_per_pass`"):
        streaming_poisson_batches(_ids(), sampling_probability=0.1, num_examples=N, batches_per_pass=0)
    with pytest.raises(TypeError, match="`seed`"):
        poisson_batches(_ids(), sampling_probability=0.1, seed="0")
    with pytest.raises(ValueError, match="fully defined shapes"):
        streaming_poisson_batches(
            tf.data.Dataset.from_tensor_slices(tf.ragged.constant([[1], [2, 3]])),
            sampling_probability=0.5,
            num_examples=2,
            batches_per_pass=1,
        )
    # The stream must hold exactly `num_examples`: checked while reading.
    batches, _ = streaming_poisson_batches(
        _ids(), sampling_probability=0.5, num_examples=N + 1, batches_per_pass=1, seed=0
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match="exactly `num_examples`"):
        list(batches)


def test_fixed_size_batches_only_on_request_and_labelled():
    batches, info = fixed_size_batches(_ids(), batch_size=50, seed=0)
    assert isinstance(info, BatchingInfo)
    assert info.batching == "fixed_shuffled" and info.report()["batching"] == "fixed_shuffled"
    epoch = [b.numpy() for b in batches]
    assert [len(b) for b in epoch] == [50] * 4
    assert sorted(np.concatenate(epoch).tolist()) == list(range(N))  # each example once: not Poisson
    with pytest.raises(TypeError):
        fixed_size_batches(_ids(), batch_size=50)  # the seed choice must be explicit
    with pytest.raises(ValueError, match="empty"):
        fixed_size_batches(_ids(0), batch_size=5, seed=0)


def test_in_memory_batches_run_without_autotuning_and_stay_registered():
    """Autotuning's model thread made iterator deletion wait ~2 s at the end of half the pipeline's fits."""
    batches, info = poisson_batches(tf.data.Dataset.range(100), sampling_probability=0.1, seed=0)
    assert batches.options().autotune.enabled is False
    assert registered_info(batches) == info
    assert registered_info(batches.map(lambda x: x)) == info
