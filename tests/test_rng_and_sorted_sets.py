"""The shared RNG factory (tfdp_embed/_rng.py) and sorted-set membership (tfdp_embed/_sorted_sets.py)."""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed._rng import make_generator
from tfdp_embed._sorted_sets import is_member
from tfdp_embed.keras2._keras import tf


def _draws(generator, n=8):
    return generator.uniform_full_int([n], dtype=tf.int64).numpy()


def test_key_layout_is_the_philox_key():
    # Philox state [counter_lo, counter_hi, key]: the seed is the key, counter 0.
    assert make_generator(7, seed_as="key").state.numpy().tolist() == [0, 0, 7]
    assert np.array_equal(
        _draws(make_generator(7, seed_as="key")),
        _draws(tf.random.Generator.from_key_counter(key=7, counter=[0, 0], alg="philox")),
    )


def test_counter_layout_is_from_seed():
    assert make_generator(7, seed_as="counter").state.numpy().tolist() == [7, 0, 0]
    assert np.array_equal(_draws(make_generator(7, seed_as="counter")), _draws(tf.random.Generator.from_seed(7)))


def test_neighbouring_seeds_overlap_only_in_the_counter_layout():
    # Counter layout: seed s + 1 starts one Philox block (two int64 draws) into seed s's stream.
    a, b = _draws(make_generator(3, seed_as="counter")), _draws(make_generator(4, seed_as="counter"))
    assert np.array_equal(a[2:], b[:-2])
    a, b = _draws(make_generator(3, seed_as="key")), _draws(make_generator(4, seed_as="key"))
    assert not set(a.tolist()) & set(b.tolist())


def test_unseeded_generators_differ_and_bad_arguments_raise():
    assert not np.array_equal(_draws(make_generator(None, seed_as="key")), _draws(make_generator(None, seed_as="key")))
    with pytest.raises(TypeError, match="`seed`"):
        make_generator(True, seed_as="key")
    with pytest.raises(TypeError, match="`seed`"):
        make_generator("0", seed_as="counter")
    with pytest.raises(ValueError, match="`seed_as`"):
        make_generator(0, seed_as="philox")


@pytest.mark.parametrize("set_size", [0, 1, 5, 300])
def test_is_member_matches_numpy(set_size):
    rng = np.random.default_rng(set_size)
    sorted_set = np.unique(rng.integers(0, 500, size=set_size)).astype(np.int64)
    values = rng.integers(-2, 502, size=[7, 11]).astype(np.int64)
    got = is_member(tf.constant(values), tf.constant(sorted_set, tf.int64)).numpy()
    np.testing.assert_array_equal(got, np.isin(values, sorted_set))


def test_is_member_ignores_a_trailing_sentinel():
    # DP-AdaFEST+ stores its selection with the vocabulary size appended.
    values = tf.constant([0, 2, 3, 9], tf.int64)
    got = is_member(values, tf.constant([2, 3, 10], tf.int64)).numpy()
    assert got.tolist() == [False, True, True, False]
