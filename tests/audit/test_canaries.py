"""Tests of canary and candidate generation (tfdp_embed/audit/canaries.py)."""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed.audit import (
    DEFAULT_INSERTION_COUNTS,
    generate_canaries,
    sample_candidates,
)

ITEMS = np.arange(1, 201)  # ids 1..200, 0 is padding


def canaries(**kwargs):
    args = {"item_ids": ITEMS, "context_length": 5, "seed": 3, "canaries_per_count": 4}
    args.update(kwargs)
    return generate_canaries(**args)


def test_shapes_counts_and_eana_defaults():
    c = canaries()
    # 9 counts (EANA §4.1.3) x 4 canaries, grouped by count in the order given.
    assert DEFAULT_INSERTION_COUNTS == (1, 2, 3, 4, 5, 10, 20, 50, 100)
    assert len(c) == 36 and c.contexts.shape == (36, 5) and c.labels.shape == (36,)
    assert c.contexts.dtype == np.int32 and c.labels.dtype == np.int32
    assert c.insertion_counts.tolist() == [n for n in DEFAULT_INSERTION_COUNTS for _ in range(4)]
    # 4 * (1 + 2 + 3 + 4 + 5 + 10 + 20 + 50 + 100) = 4 * 195 = 780 inserted rows
    assert c.num_inserted_examples == 780


def test_each_sequence_is_distinct_items_from_the_vocabulary():
    c = canaries()
    rows = np.concatenate([c.contexts, c.labels[:, None]], axis=1)
    assert np.isin(rows, ITEMS).all()
    for row in rows:  # context without repeats, label not in the context
        assert len(set(row.tolist())) == row.size
    assert len(c.keys()) == len(c)  # pairwise distinct


def test_training_examples_repeat_each_canary_its_count():
    c = canaries()
    contexts, labels = c.training_examples()
    assert contexts.shape == (780, 5) and labels.shape == (780,)
    assert contexts.dtype == np.int32 and labels.dtype == np.int32
    for i in range(len(c)):
        hits = np.all(contexts == c.contexts[i], axis=1) & (labels == c.labels[i])
        assert hits.sum() == c.insertion_counts[i]
    shuffled_contexts, shuffled_labels = c.training_examples(shuffle_seed=0)
    assert not np.array_equal(shuffled_labels, labels)
    assert sorted(map(tuple, np.c_[shuffled_contexts, shuffled_labels].tolist())) == sorted(
        map(tuple, np.c_[contexts, labels].tolist())
    )


def test_seeds_are_reproducible_and_matter():
    a, b, other = canaries(seed=11), canaries(seed=11), canaries(seed=12)
    np.testing.assert_array_equal(a.contexts, b.contexts)
    np.testing.assert_array_equal(a.labels, b.labels)
    assert not np.array_equal(a.contexts, other.contexts)
    x = sample_candidates(item_ids=ITEMS, context_length=5, num_candidates=50, seed=1)
    y = sample_candidates(item_ids=ITEMS, context_length=5, num_candidates=50, seed=1)
    np.testing.assert_array_equal(x.contexts, y.contexts)
    # canaries and candidates use separate streams: the same seed does not give the same sequences
    z = sample_candidates(item_ids=ITEMS, context_length=5, num_candidates=36, seed=3)
    assert not np.array_equal(z.contexts, a.contexts)


def test_candidates_never_equal_a_canary_even_in_a_tiny_space():
    # 4 items, context 2, label the third: C(4, 2) * 2 = 12 distinct (set, label) sequences.
    items = np.arange(4)
    c = generate_canaries(
        item_ids=items,
        context_length=2,
        seed=0,
        insertion_counts=(1, 2),
        canaries_per_count=2,
    )
    cand = sample_candidates(item_ids=items, context_length=2, num_candidates=8, seed=0, exclude=c)
    assert len(c.keys()) == 4 and len(cand.keys()) == 8
    assert not (c.keys() & cand.keys())
    with pytest.raises(ValueError, match="too small"):  # only 12 - 4 = 8 are left
        sample_candidates(item_ids=items, context_length=2, num_candidates=9, seed=0, exclude=c)


def test_items_are_drawn_uniformly():
    # 30 items, context 3: each item is in a context with probability 3/30 and is the label with
    # probability 1/30. 20,000 draws (of 30 * C(29, 3) = 109,620 possible sequences; the distinctness
    # re-draws are symmetric in the items): std of a label frequency sqrt(1/30 * 29/30 / 2e4) = 0.0013,
    # of a context frequency sqrt(0.1 * 0.9 / 2e4) = 0.0021; tolerance ~4.5 std.
    items = np.arange(10, 40)
    cand = sample_candidates(item_ids=items, context_length=3, num_candidates=20000, seed=5)
    label_freq = np.bincount(cand.labels - 10, minlength=30) / 20000
    context_freq = np.bincount((cand.contexts - 10).ravel(), minlength=30) / 20000
    np.testing.assert_allclose(label_freq, 1 / 30, atol=0.006)
    np.testing.assert_allclose(context_freq, 0.1, atol=0.0095)


def test_large_vocabulary_path_is_uniform_without_repeats():
    # 100,000 ids takes the rejection path (width^2 <= |ids|); every row still has distinct items.
    items = np.arange(100_000)
    cand = sample_candidates(item_ids=items, context_length=20, num_candidates=2000, seed=2)
    rows = np.c_[cand.contexts, cand.labels]
    assert all(len(set(r)) == 21 for r in rows.tolist())
    assert abs(rows.mean() - 49_999.5) < 3 * 28_867 / np.sqrt(rows.size) * 1.5


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"insertion_counts": (1, 0)}, "insertion_counts"),
        ({"insertion_counts": (2, -1)}, "insertion_counts"),
        ({"insertion_counts": (1, 1)}, "distinct"),
        ({"insertion_counts": ()}, "at least one"),
        ({"insertion_counts": (1.5,)}, "insertion_counts"),
        ({"canaries_per_count": 0}, "canaries_per_count"),
        ({"context_length": 0}, "context_length"),
        ({"item_ids": np.array([1.0, 2.0, 3.0])}, "integer item ids"),
        ({"item_ids": np.arange(5)}, "distinct ids"),
        ({"item_ids": np.arange(6).reshape(2, 3)}, "1-D"),
    ],
)
def test_bad_canary_arguments_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        canaries(**kwargs)


def test_seed_must_be_an_int():
    with pytest.raises(TypeError, match="seed"):
        canaries(seed=None)
    with pytest.raises(TypeError, match="seed"):
        sample_candidates(item_ids=ITEMS, context_length=5, num_candidates=4, seed=1.5)


def test_bad_candidate_arguments_are_rejected():
    with pytest.raises(ValueError, match="num_candidates"):
        sample_candidates(item_ids=ITEMS, context_length=5, num_candidates=0, seed=0)
    with pytest.raises(ValueError, match="context_length"):
        sample_candidates(item_ids=ITEMS, context_length=-1, num_candidates=4, seed=0)
    with pytest.raises(ValueError, match=r"expected \[k, 4\]"):
        sample_candidates(
            item_ids=ITEMS,
            context_length=4,
            num_candidates=4,
            seed=0,
            exclude=canaries(),
        )
