"""DP normalization statistics and the lookup layers built from DP vocabularies."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tfdp_embed.data.vocabulary import public_vocabulary
from tfdp_embed.keras2.contract.preprocessing import check_preprocessing, state_source
from tfdp_embed.keras2.dp_preprocessing import dp_normalization_statistics, lookup_layer, normalization_layer

VALUES = np.linspace(10.0, 30.0, 1000)  # mean 20, variance (20^2 / 12) x 1001/999 ~ 33.4


def test_tiny_noise_gives_the_clipped_mean_and_variance():
    stats = dp_normalization_statistics(VALUES, clip_range=(0, 40), delta=1e-6, noise_multiplier=1e-6, seed=0)
    assert stats.mean[0] == pytest.approx(20.0, abs=1e-6)
    assert stats.variance[0] == pytest.approx(VALUES.var(), rel=1e-6)
    clipped = dp_normalization_statistics(VALUES, clip_range=(0, 20), delta=1e-6, noise_multiplier=1e-6, seed=0)
    assert clipped.mean[0] == pytest.approx(np.clip(VALUES, 0, 20).mean(), abs=1e-6)


def test_mean_noise_matches_the_formula():
    # mean = c + r (S1 + e1) / (n + e0): for small noise its std is about r z sqrt(1 + 2d) / n = 20 x 2 x sqrt(3) / 1000
    # = 0.0693. 400 seeds: the sample std is within 4 x 0.0693 / sqrt(2 x 400) ~ 0.0098 of it.
    means = [
        dp_normalization_statistics(VALUES, clip_range=(0, 40), delta=1e-6, noise_multiplier=2.0, seed=s).mean[0]
        for s in range(400)
    ]
    assert np.std(means) == pytest.approx(20 * 2.0 * math.sqrt(3) / 1000, abs=0.0098)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(clip_range=(1, 1), delta=1e-6, epsilon=1.0), "clip_range"),
        (dict(clip_range=(0, 1), delta=0.0, epsilon=1.0), "delta"),
        (dict(clip_range=(0, 1), delta=1e-6, epsilon=0.0), "epsilon"),
        (dict(clip_range=(0, 1), delta=1e-6), "exactly one"),
    ],
)
def test_bad_input_is_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        dp_normalization_statistics(VALUES, **kwargs)


def test_layers_are_marked_with_their_source():
    stats = dp_normalization_statistics(VALUES, clip_range=(0, 40), delta=1e-6, epsilon=1.0, seed=0)
    assert state_source(normalization_layer(stats)).startswith("dp: normalization")
    ints = lookup_layer(public_vocabulary([3, 1, 2]))
    assert ints.get_vocabulary()[1:] == [1, 2, 3] and state_source(ints) == "public"
    with pytest.raises(ValueError, match="empty"):
        lookup_layer(public_vocabulary(np.array([], np.int64)))
    check_preprocessing(ints)  # a marked layer (the check walks the layer itself too)
