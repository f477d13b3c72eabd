"""DP vocabularies (Gaussian thresholding): degenerate settings, the threshold's delta, the noise, bad input."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from scipy import stats

from tfdp_embed.accounting.one_off_releases import release_epsilon
from tfdp_embed.data.vocabulary import (
    add_threshold_delta,
    bounded_key_counts,
    dp_vocabulary,
    public_vocabulary,
    vocabulary_threshold,
)


def test_bounded_key_counts_keeps_each_units_first_distinct_keys():
    # unit 1 keeps 3, 5 (7 dropped: D0 = 2); unit 2 keeps 5, 9; unit 3 keeps 5 (repeat counted once)
    keys, counts = bounded_key_counts([[3, 3, 5, 7], [5, 9], [5, 5]], max_keys_per_unit=2)
    assert dict(zip(keys.tolist(), counts.tolist())) == {3: 1.0, 5: 3.0, 9: 1.0}


def test_tiny_noise_releases_keys_of_many_units_and_never_keys_of_one():
    # sigma 1e-3: tau = 1/sqrt(D0) + 1e-3 x ~4.6, so any key of >= 2 units (count >= 2/sqrt(D0)) passes,
    # a key of one unit (count exactly 1/sqrt(D0)) never does: the degenerate setting is "count >= 2".
    units = [[1, 2], [1, 3], [1, 2], [4]]
    vocab = dp_vocabulary(units, max_keys_per_unit=2, delta=1e-6, noise_multiplier=1e-3, seed=0)
    assert vocab.keys.tolist() == [1, 2]
    assert vocab.release.event == dp_accounting.GaussianDpEvent(1e-3)
    assert vocab.summary()["keys"] == 2 and "candidate_keys" not in vocab.summary()


def test_one_unit_keys_are_released_with_probability_at_most_threshold_delta():
    # 20,000 units, each holding D0 = 4 keys nobody else holds. The claim: P[some of a unit's keys passes]
    # <= delta_thr = 0.2 (large on purpose, so that it is measurable). Per unit the rate is a mean of 20,000
    # Bernoulli(<= 0.2): 4 standard errors are 4 x sqrt(0.16 / 20000) = 0.011.
    d0, units = 4, 20_000
    keys = np.arange(units * d0).reshape(units, d0)
    vocab = dp_vocabulary(
        keys.tolist(), max_keys_per_unit=d0, delta=0.4, threshold_delta=0.2, noise_multiplier=0.5, seed=1
    )
    released_units = np.isin(keys, vocab.keys).any(axis=1).mean()
    assert released_units <= 0.2 + 0.011, released_units
    assert released_units >= 0.2 - 0.011, released_units  # the bound is tight (independent keys)


def test_release_rate_follows_the_noise_formula():
    # Keys held by c units have count c/sqrt(D0); P[released] = 1 - Phi((tau - c/sqrt(D0)) / sigma).
    # Two values of c pin both the mean and sigma; 10,000 keys each: 4 standard errors <= 0.02.
    d0, sigma, per_c = 9, 0.8, 10_000
    units = []
    for c, offset in ((2, 0), (6, per_c)):
        units += [[offset + k] for k in range(per_c) for _ in range(c)]
    vocab = dp_vocabulary(units, max_keys_per_unit=d0, delta=1e-3, noise_multiplier=sigma, seed=2)
    tau = vocabulary_threshold(noise_multiplier=sigma, max_keys_per_unit=d0, threshold_delta=5e-4)
    assert vocab.threshold == pytest.approx(tau)
    for c, offset in ((2, 0), (6, per_c)):
        measured = np.isin(np.arange(offset, offset + per_c), vocab.keys).mean()
        expected = stats.norm.sf((tau - c / math.sqrt(d0)) / sigma)
        assert measured == pytest.approx(expected, abs=0.02), (c, measured, expected)


def test_epsilon_given_calibrates_sigma_for_the_gaussian_part():
    vocab = dp_vocabulary([[1]], max_keys_per_unit=1, epsilon=0.5, delta=1e-5, seed=0)
    assert vocab.gaussian_delta == pytest.approx(5e-6) and vocab.threshold_delta == pytest.approx(5e-6)
    assert release_epsilon(vocab.event, delta=vocab.gaussian_delta) <= 0.5 + 1e-9
    assert vocab.epsilon == pytest.approx(0.5, rel=1e-3)


def test_public_vocabulary_spends_nothing():
    vocab = public_vocabulary([5, 3, 5])
    assert vocab.keys.tolist() == [3, 5] and vocab.is_public
    assert vocab.release is None and vocab.event is None


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(max_keys_per_unit=0, delta=1e-5, epsilon=1.0), "max_keys_per_unit"),
        (dict(max_keys_per_unit=True, delta=1e-5, epsilon=1.0), "max_keys_per_unit"),
        (dict(max_keys_per_unit=2, delta=0.0, epsilon=1.0), "`delta`"),
        (dict(max_keys_per_unit=2, delta=1e-5, epsilon=-1.0), "`epsilon`"),
        (dict(max_keys_per_unit=2, delta=1e-5, epsilon=math.inf), "`epsilon`"),
        (dict(max_keys_per_unit=2, delta=1e-5, noise_multiplier=0.0), "`noise_multiplier`"),
        (dict(max_keys_per_unit=2, delta=1e-5), "exactly one"),
        (dict(max_keys_per_unit=2, delta=1e-5, epsilon=1.0, noise_multiplier=1.0), "exactly one"),
        (dict(max_keys_per_unit=2, delta=1e-5, epsilon=1.0, threshold_delta=1e-5), "`threshold_delta`"),
    ],
)
def test_bad_input_is_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        dp_vocabulary([[1, 2]], **kwargs)


def test_per_unit_weighting_bounds_the_threshold_delta_for_every_unit_size():
    # 10,000 units of each size k = 1 and k = 3 (D0 = 3), keys nobody else holds, weights 1/sqrt(k).
    # P[some key of a unit passes] <= delta_thr = 0.2 for every k; 4 standard errors: 4 x sqrt(0.16 / 1e4) = 0.016.
    d0, units = 3, 10_000
    singles = [[f"a{i}"] for i in range(units)]
    triples = [[f"b{i}_{j}" for j in range(3)] for i in range(units)]
    vocab = dp_vocabulary(
        singles + triples,
        max_keys_per_unit=d0,
        delta=0.4,
        threshold_delta=0.2,
        noise_multiplier=0.5,
        seed=3,
        weighting="per_unit",
    )
    released = set(vocab.keys.tolist())
    for group in (singles, triples):
        rate = np.mean([any(k in released for k in unit) for unit in group])
        assert rate <= 0.2 + 0.016, rate
    # and the threshold is the worst case over the sizes: keys of one unit with one key are the hardest
    tau = vocabulary_threshold(noise_multiplier=0.5, max_keys_per_unit=d0, threshold_delta=0.2, weighting="per_unit")
    assert tau == pytest.approx(vocab.threshold) and tau > vocabulary_threshold(
        noise_multiplier=0.5, max_keys_per_unit=d0, threshold_delta=0.2
    )


def test_threshold_delta_is_added_to_a_dp_release_report_only():
    # sigma given, not calibrated: calibrating for epsilon 50 (sigma ~0.13) takes ~10 s of PLD and is not what is checked.
    dp = dp_vocabulary(
        [[1], [1], [2]], max_keys_per_unit=1, noise_multiplier=1.0, delta=1e-3, threshold_delta=1e-4, seed=1
    )
    report = add_threshold_delta({"delta": 1e-5, "caveats": []}, dp, what="item vocabulary")
    # 1e-5 + 1e-4 = 1.1e-4: the run's delta plus the threshold's.
    assert report["delta_with_vocabulary"] == pytest.approx(1.1e-4)
    assert "item vocabulary" in report["caveats"][0] and "(epsilon, 0.00011)" in report["caveats"][0]
    public = add_threshold_delta({"delta": 1e-5}, public_vocabulary([1, 2]), what="item vocabulary")
    assert public == {"delta": 1e-5}
