"""`poisson_user_batches`: Poisson over users, at most k rows per sampled user (uniform), packed [users, k, ...].

Attack (e) lives here too: bad user ids, a unit with zero examples and k < 1 get a one-line error.
"""

from __future__ import annotations

import collections
import itertools

import numpy as np
import pytest
import tensorflow as tf

from tfdp_embed.data import fed_batching, poisson_user_batches
from tfdp_embed.data.user_batches import unit_rows

from .units import K, skewed_rows


def _batches(examples, user_ids, **kwargs):
    kwargs = {"max_examples_per_user": K, "sampling_probability": 1.0, "seed": 5, **kwargs}
    return poisson_user_batches(examples, user_ids=user_ids, **kwargs)


def test_every_user_once_with_all_rows_up_to_k_and_zero_padding():
    examples, users = skewed_rows()
    batches, info = _batches(examples, users, max_examples_per_user=40)
    ids, labels, weight = (t.numpy() for t in next(iter(batches)))
    assert ids.shape == (5, 40, 3) and labels.shape == (5, 40, 1) and weight.shape == (5, 40)
    # Users in id order (q = 1: all of them); rows 1, 2, 3, 5, 40; weight k on rows, 0 on padding.
    assert (weight > 0).sum(1).tolist() == [1, 2, 3, 5, 40]
    assert set(np.unique(weight)) == {0.0, 40.0}
    assert not ids[weight == 0].any() and not labels[weight == 0].any()
    # Each user's packed rows are exactly that user's rows (as a multiset of (ids, label) rows).
    for slot, user in enumerate(np.unique(users)):
        mine = np.concatenate([examples[0][users == user], examples[1][users == user]], 1)
        packed = np.concatenate([ids[slot], labels[slot]], 1)[weight[slot] > 0]
        assert sorted(map(tuple, packed)) == sorted(map(tuple, mine))
    assert (info.privacy_unit, info.num_examples, info.num_rows, info.max_examples_per_unit) == ("user", 5, 51, 40)


def test_a_heavy_user_brings_k_rows_drawn_uniformly_without_replacement():
    # 2000 users with 5 rows each, k = 2: each user's pair is one of C(5, 2) = 10, each with probability 1/10.
    users = 2000
    starts = tf.range(users, dtype=tf.int64) * 5
    rows = unit_rows(
        tf.constant([4, 2], tf.int64),
        starts,
        tf.fill([users], tf.constant(5, tf.int64)),
        tf.range(users, dtype=tf.int64),
        2,
    )
    assert rows.row_lengths().numpy().tolist() == [2] * users
    local = rows.to_tensor().numpy() - starts.numpy()[:, None]
    assert (local[:, 0] != local[:, 1]).all()  # without replacement
    pairs = collections.Counter(tuple(sorted(pair)) for pair in local.tolist())
    assert set(pairs) == set(itertools.combinations(range(5), 2))
    # 200 expected per pair, binomial sd ~13.4: 5 sd either way.
    assert all(133 <= count <= 267 for count in pairs.values()), pairs
    # Through the sampler: a fresh draw per batch (the RNG advances), 2 rows of the user each time.
    examples = (np.arange(5, dtype=np.int32)[:, None], np.zeros((5, 1), np.float32))
    batches, _ = _batches(examples, np.full(5, 7), max_examples_per_user=2)
    drawn = {tuple(sorted(ids[0, :, 0].numpy())) for ids, _, _ in batches.repeat(30)}
    assert len(drawn) > 3


def test_users_are_poisson_sampled_with_q():
    examples, users = skewed_rows(counts=(3,) * 60)
    batches, info = _batches(examples, users, sampling_probability=0.2)
    sizes = [int(weight.shape[0]) for _, _, weight in batches.repeat(40)]
    assert info.batches_per_epoch == 5 and info.expected_batch_size == pytest.approx(12.0)
    # 200 batches of Binomial(60, 0.2): mean 12, sd of the mean ~0.22.
    assert abs(np.mean(sizes) - 12.0) < 1.2
    assert np.var(sizes) == pytest.approx(60 * 0.2 * 0.8, rel=0.35)


def test_the_batches_carry_their_user_level_batching():
    examples, users = skewed_rows()
    batches, info = _batches(examples, users)
    fed = fed_batching(batches.prefetch(1))
    assert fed.verified_poisson and fed.info is info
    details = fed.report()
    assert details["privacy_unit"] == "user" and details["max_examples_per_unit"] == K
    assert details["num_examples"] == 5 and details["num_rows"] == 51 and details["sampler"] == "in_memory_users"


def test_users_per_batch_cap_is_counted():
    examples, users = skewed_rows(counts=(2,) * 30)
    batches, info = poisson_user_batches(
        examples, user_ids=users, max_examples_per_user=2, sampling_probability=0.5, max_batch_size=10, seed=4
    )
    sizes = [int(weight.shape[0]) for _, _, weight in batches.repeat(20)]
    assert max(sizes) == 10 and info.report()["truncated_batches"] > 0  # Binomial(30, 0.5) > 10 almost always


def _one_line(error) -> str:
    text = str(error.value)
    assert "\n" not in text, text
    return text


@pytest.mark.parametrize(
    ("user_ids", "needle"),
    [
        (None, "`user_ids` is required"),
        (np.array([1.0, np.nan] * 25 + [1.0]), "integers"),  # a missing id as NaN
        (np.array([1, None] * 25 + [1], dtype=object), "integers"),  # a missing id as None
        (np.array(["a"] * 51), "integers"),
        (np.arange(50), "has 50 entries but the examples have 51 rows"),
        (np.arange(51).reshape(51, 1), "1-D"),
    ],
)
def test_bad_user_ids_get_one_line(user_ids, needle):
    examples, _ = skewed_rows()
    with pytest.raises(ValueError) as error:
        _batches(examples, user_ids)
    assert needle in _one_line(error)


def test_a_unit_with_zero_examples_gets_one_line():
    examples, users = skewed_rows()
    with pytest.raises(ValueError) as error:
        _batches(examples, users, num_users=6)  # 6 users declared, 5 have rows
    assert "a unit with zero examples" in _one_line(error)


@pytest.mark.parametrize("k", [0, -1, 1.5, True, None])
def test_k_below_one_gets_one_line(k):
    examples, users = skewed_rows()
    with pytest.raises(ValueError) as error:
        _batches(examples, users, max_examples_per_user=k)
    assert "`max_examples_per_user` must be an int >= 1" in _one_line(error)


def test_examples_must_be_features_and_labels():
    examples, users = skewed_rows()
    with pytest.raises(ValueError) as error:
        _batches(examples[0], users)
    assert "(features, labels)" in _one_line(error)
