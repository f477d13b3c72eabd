"""`release_contribution_bound`: k released with DP from a noisy power-of-two histogram of examples per unit.

Degenerate noise gives the exact quantile's bucket edge; the bucket counts' noise std is z; one unit moves
one bucket by one (sensitivity 1); bad input is refused naming the argument; the plan charges the event.
"""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest

import tfdp_embed
from tfdp_embed import Release, accounting
from tfdp_embed.accounting.contribution_bound import (
    DEFAULT_MAX_BOUND,
    ReleasedContributionBound,
    bucket_counts,
    bucket_edges,
    release_contribution_bound,
)
from tfdp_embed.accounting.dataset_size import release_dataset_size
from tfdp_embed.planning import plan_run

# buckets j: [1,2) [2,4) [4,8) [8,16) [16,32) [32,64) [64,128) ...
# counts:      1    3,3    5     9     20     40     100      -> histogram 1, 2, 1, 1, 1, 1, 1 (8 units)
COUNTS = [1, 3, 3, 5, 9, 20, 40, 100]
TINY = 1e-9


@pytest.mark.parametrize(
    "quantile, k",
    [
        (0.7, 16),  # cumulative shares 1/8, 3/8, 4/8, 5/8, 6/8: 6/8 = 0.75 >= 0.7 first in [16, 32)
        (0.45, 4),  # 4/8 in [4, 8)
        (0.1, 1),  # 1/8 > 0.1 in [1, 2)
        (0.9, 64),  # only the last unit's bucket [64, 128) reaches 8/8
        # (a quantile equal to a share is a tie the noise breaks either way: none is tested)
    ],
)
def test_without_noise_k_is_the_exact_quantiles_bucket_edge(quantile, k):
    bound = release_contribution_bound(COUNTS, quantile=quantile, noise_multiplier=TINY, seed=0)
    assert bound.value == k and not bound.fallback
    assert bound.edges == (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def test_without_noise_counts_above_max_bound_share_the_last_bucket():
    # the default quantile 0.75 over 9 units: shares ..., 6/9 = 0.67 in [16, 32), 7/9 = 0.78 in [32, 64)
    assert release_contribution_bound([*COUNTS, 200], noise_multiplier=TINY, seed=0).value == 32
    assert release_contribution_bound([5000] * 4, noise_multiplier=TINY, seed=0).value == DEFAULT_MAX_BOUND
    # max_bound 8: buckets [1,2) [2,4) [4,8) [8, inf); 20 and 40 both fall in [8, inf)
    assert release_contribution_bound([20, 40, 3], noise_multiplier=TINY, max_bound=8, seed=0).value == 8
    # an array works too: 4/5 = 0.8 in [2, 4)
    assert release_contribution_bound(np.array([3, 3, 3, 3, 40]), noise_multiplier=TINY, seed=0).value == 2


def test_the_bucket_counts_noise_std_is_z():
    z, draws = 3.0, 4000
    exact = bucket_counts(COUNTS)
    released = [release_contribution_bound(COUNTS, noise_multiplier=z, seed=s).noisy_counts for s in range(draws)]
    noise = np.array(released) - exact
    # std of a sample std ~ z / sqrt(2 n) = 3 / 89 = 0.034 (1.1%): 5% is more than 4 standard errors
    np.testing.assert_allclose(noise.std(axis=0), z, rtol=0.05)
    np.testing.assert_allclose(noise.mean(axis=0), 0.0, atol=4 * z / np.sqrt(draws))
    # buckets are independent: |correlation| ~ 1 / sqrt(n) = 0.016
    assert np.abs(np.corrcoef(noise.T)[np.triu_indices(len(exact), 1)]).max() < 0.08


def test_a_seed_shared_with_the_dataset_size_release_draws_other_noise():
    size_noise = release_dataset_size(10**6, noise_multiplier=1e3, seed=7).value - 10**6
    bound_noise = release_contribution_bound([1], noise_multiplier=1e3, seed=7).noisy_counts[0] - 1
    assert abs(size_noise - bound_noise) > 1.0  # the first draws of one stream would agree to rounding


def test_all_noisy_counts_at_most_zero_fall_back_to_max_bound():
    # z huge, two buckets: both noisy counts <= 0 about one draw in four
    bounds = [release_contribution_bound([1], noise_multiplier=1e6, max_bound=2, seed=s) for s in range(40)]
    fallen = [b for b in bounds if b.fallback]
    assert fallen and all(max(b.noisy_counts) <= 0 and b.value == 2 for b in fallen)
    assert "fallback" in fallen[0].describe()
    assert all(max(b.noisy_counts) > 0 for b in bounds if not b.fallback)


@pytest.mark.parametrize("n", [1, 2, 3, 1023, 1024, 5000])
def test_adding_or_removing_one_unit_moves_exactly_one_bucket_by_one(n):
    rng = np.random.default_rng(0)
    counts = rng.integers(1, 3000, size=200)
    difference = bucket_counts(np.r_[counts, n]) - bucket_counts(counts)  # add one unit with n examples
    assert np.abs(difference).sum() == 1 and difference.max() == 1
    assert np.linalg.norm(difference) == 1.0  # the L2 sensitivity the Gaussian event assumes
    removed = bucket_counts(counts[1:]) - bucket_counts(counts)  # remove one unit
    assert np.abs(removed).sum() == 1 and removed.min() == -1


@pytest.mark.parametrize(
    "arguments, needle",
    [
        (dict(examples_per_unit=[]), "`examples_per_unit` must be a non-empty"),
        (dict(examples_per_unit=[[1, 2]]), "`examples_per_unit` must be a non-empty 1-D"),
        (dict(examples_per_unit=[1.0, 2.0]), "`examples_per_unit` must hold ints"),
        (dict(examples_per_unit=["3"]), "`examples_per_unit` must hold ints"),
        (dict(examples_per_unit=[True, False]), "`examples_per_unit` must hold ints"),
        (dict(examples_per_unit=[3, 0]), "`examples_per_unit` must be >= 1"),
        (dict(examples_per_unit=[3, -2]), "`examples_per_unit` must be >= 1"),
        (dict(quantile=0.0), "`quantile` must be a number in \\(0, 1\\)"),
        (dict(quantile=1.0), "`quantile` must be a number in \\(0, 1\\)"),
        (dict(quantile=float("nan")), "`quantile`"),
        (dict(quantile="0.5"), "`quantile`"),
        (dict(noise_multiplier=0.0), "`noise_multiplier` must be a finite number > 0"),
        (dict(noise_multiplier=-1.0), "`noise_multiplier`"),
        (dict(noise_multiplier=float("inf")), "`noise_multiplier`"),
        (dict(noise_multiplier=None), "`noise_multiplier`"),
        (dict(max_bound=0), "`max_bound` must be a power of two >= 1"),
        (dict(max_bound=1000), "`max_bound` must be a power of two"),
        (dict(max_bound=64.0), "`max_bound` must be a power of two >= 1"),
    ],
)
def test_bad_input_is_refused_naming_the_argument(arguments, needle):
    arguments = {"examples_per_unit": COUNTS, **arguments}
    with pytest.raises(ValueError, match=needle):
        release_contribution_bound(arguments.pop("examples_per_unit"), seed=0, **arguments)


def test_bucket_edges_are_the_powers_of_two_up_to_max_bound():
    assert bucket_edges(1) == (1,) and bucket_edges(16) == (1, 2, 4, 8, 16)


def test_exported_where_the_dataset_size_release_is():
    assert tfdp_embed.release_contribution_bound is accounting.release_contribution_bound is release_contribution_bound
    assert tfdp_embed.ReleasedContributionBound is ReleasedContributionBound


def test_the_plan_charges_the_release_and_keeps_the_target_epsilon():
    bound = release_contribution_bound(COUNTS, seed=0)
    size = release_dataset_size(1000, seed=0)
    assert isinstance(bound.event, dp_accounting.GaussianDpEvent) and bound.event.noise_multiplier == 10.0
    common = dict(target_epsilon=2.0, target_delta=1e-5, sampling_probability=0.05, steps=50, accountant="rdp")
    without = plan_run("dense", l2_norm_clip=1.0, releases=[Release.dataset_size(size)], **common)
    plan = plan_run(
        "dense", l2_norm_clip=1.0, releases=[Release.dataset_size(size), Release.contribution_bound(bound)], **common
    )
    names = [r["name"] for r in plan.summary()["releases"]]
    assert names == ["dataset_size", "contribution_bound"]
    assert plan.noise_multiplier > without.noise_multiplier  # the release's cost is paid by the steps' sigma
    assert plan.ledger().has_setup(bound.event)
    with pytest.raises(TypeError, match="ReleasedContributionBound"):
        Release.contribution_bound(size)
