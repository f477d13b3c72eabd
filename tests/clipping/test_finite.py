"""`per_example._finite`: one finiteness check, elementwise zeroing only when it fails, same values either way."""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed.clipping.per_example import _finite
from tfdp_embed.keras2._keras import tf


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf_function"])
def test_zeroes_only_non_finite_float_entries_and_keeps_other_leaves(traced):
    values = {
        "a": tf.constant([[1.0, np.nan], [np.inf, -2.0]]),
        "b": (tf.constant([3.0, -np.inf], tf.float16), tf.constant([1, 2])),
        "flag": True,
    }
    clean = tf.function(_finite)(values) if traced else _finite(values)
    np.testing.assert_array_equal(clean["a"].numpy(), [[1.0, 0.0], [0.0, -2.0]])
    np.testing.assert_array_equal(clean["b"][0].numpy(), np.array([3.0, 0.0], np.float16))
    np.testing.assert_array_equal(clean["b"][1].numpy(), [1, 2])
    assert bool(clean["flag"]) if traced else clean["flag"] is True  # tf.function returns tensors


def test_finite_values_pass_unchanged_even_when_their_sum_overflows():
    big = tf.constant([60000.0, 60000.0, -1.5], tf.float16)  # float16 sum overflows; float32 does not
    huge = tf.constant([3e38, 3e38], tf.float32)  # the float32 sum is Inf: the cleaning branch, same values
    clean = _finite([big, huge])
    np.testing.assert_array_equal(clean[0].numpy(), big.numpy())
    np.testing.assert_array_equal(clean[1].numpy(), huge.numpy())
