"""MirroredStrategy on 2 logical CPUs: exact sums, noise once per step, replicas in sync.

Each scenario runs in a subprocess (tests/distributed/mirrored_cases.py) so
the 2-device split does not reach other tests.
"""

import pytest


@pytest.fixture(scope="module")
def results(script_runner):
    return script_runner(
        "mirrored_cases.py", "exact", "uneven", "noise_eana", "unsupported", "tpu_noise_feature", "tpu_step", "padding"
    )


@pytest.fixture(scope="module")
def slow_results(script_runner):
    """Dense DP-SGD's noise and dense / DP-FEST / DP-AdaFEST+ exactness (`make test-slow`)."""
    return script_runner("mirrored_cases.py", "noise_dense", "exact_more")


def test_zero_noise_huge_clip_equals_one_device_non_private_sgd(results):
    # 4 global batches of 8, split 4 + 4 over the replicas; float32 sums in another order.
    for name, row in results["exact"].items():
        assert row["max_abs_diff"] < 1e-5, (name, row)
        assert row["replica_spread"] == 0.0, (name, row)
        if row["steps"] is not None:
            assert row["steps"] == 4, (name, row)  # one mechanism update per global step, not per replica


def test_noise_is_added_once_with_the_single_device_variance(results):
    # Every clipped gradient is 0 (sample weights 0), so each step's update is -lr * noise / B.
    # Per coordinate std must be sigma * C = 1.0: noise drawn per replica and summed would give
    # sqrt(2); independent shares of variance 1/2 would give 0.71 on rows touched by one replica.
    # Samples are 39 consecutive steps (fresh draws each step, as over seeds) x 4 rows x 16 dims:
    # 2,496 per half; the sample std has relative sd 1/sqrt(2n) = 1.4%; allow 6%.
    row = results["noise_eana"]
    expected = row["expected_std"]
    assert row["samples_per_half"] > 2000
    for key in ("std_rows_replica0", "std_rows_replica1", "std_dense_variables"):
        assert abs(row[key] / expected - 1) < 0.06, (key, row)
    assert row["std_untouched_rows"] == 0.0  # EANA: rows outside the union never move
    assert row["replica_spread"] == 0.0
    assert row["steps"] == 40


@pytest.mark.slow
def test_dense_noise_covers_every_row_once(slow_results):
    row = slow_results["noise_dense"]
    for key in ("std_rows_replica0", "std_rows_replica1", "std_untouched_rows", "std_dense_variables"):
        assert abs(row[key] / row["expected_std"] - 1) < 0.06, (key, row)
    assert row["replica_spread"] == 0.0


def test_uneven_replica_batches_match_one_device(results):
    # Contribution counts use every example's distinct rows across replicas (offsets), the
    # threshold drops some touched rows and keeps others: same survivors, same update.
    row = results["uneven"]
    two, one = row["rows_noised"]
    assert two == one and two[0] > 0, row  # survivors (rows noised), 2 replicas vs one device
    two, one = row["dropped_touched_rows"]
    assert two == one and two[0] > 0, row  # touched rows below the threshold
    assert row["max_abs_diff"] < 1e-5, row
    assert row["table_moved"] > 1e-2, row  # training changed the table
    assert row["replica_spread"] == 0.0
    assert row["steps"] == 5


def test_weight_0_padding_is_absent_on_every_replica(results):
    # 4 real + 4 padding examples (one replica gets only padding), then a batch of padding alone
    # (no replica has a lookup): the same weights as the 4 examples unpadded on one device, and
    # row 0, which only the padding reads, never moves (issue 33, N1).
    for name, row in results["padding"].items():
        assert row["max_abs_diff"] < 1e-6, (name, row)
        assert row["row0_moved"] == 0.0 and row["table_moved"] > 1e-3, (name, row)


@pytest.mark.slow
def test_zero_noise_huge_clip_dense_fest_and_adafest_plus(slow_results):
    for name, row in slow_results["exact_more"].items():
        assert row["max_abs_diff"] < 1e-5 and row["replica_spread"] == 0.0, (name, row)
        assert row["steps"] == 4, (name, row)


def test_lazy_is_refused_under_mirrored_strategy_and_fest_is_accepted(results):
    row = results["unsupported"]
    assert row["kind"] == "mirrored"
    assert row["lazy"].startswith("DistributionNotSupportedError: Mechanism 'lazy' does not support MirroredStrategy")
    assert "read hook" in row["lazy"]
    assert row["fest"] == "accepted"


def test_tpu_noise_feature_noises_each_row_of_the_union_once_across_replicas(results):
    # Rows 3 and 5 are touched on both replicas: one owner each, so std sigma, not sigma * sqrt(2).
    row = results["tpu_noise_feature"]
    owned = row["owned_first_step"]
    assert sorted(owned[0] + owned[1]) == [0, 1, 2, 3, 5, 10, 11]
    assert not set(owned[0]) & set(owned[1])
    assert row["owned_always_same"]
    # 2,400 samples per row: relative sd of the sample std 1.4%; allow 6% (sqrt(2) would be +41%).
    for std in row["std_per_union_row"]:
        assert abs(std / row["expected_std"] - 1) < 0.06, row
    assert row["max_abs_other_rows"] == 0.0


def test_tpu_dp_step_on_two_replicas_equals_one_device(results):
    # distribute.TpuDPStep (EANA, sigma 1, clipping active) with a CPU engine shared by 2 replicas:
    # the mechanism runs once in merge_call, each row of the union is noised by one replica.
    row = results["tpu_step"]
    assert row["max_abs_diff"] < 1e-6 and row["table_moved"] > 1e-3, row
    first, second = row["owned_per_replica"]
    assert sorted(first + second) == row["union"] and not set(first) & set(second), row
    assert row["mechanism_steps"] == 1  # the dry run's state was put back
    assert row["replica_spread"] == 0.0
