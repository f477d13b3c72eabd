"""DP-AdaFEST under MirroredStrategy on 2 logical CPUs (issue 34, bug B), as a user runs it with `fit`.

The cases run in a subprocess (tests/distributed/adafest_mirrored_cases.py)
so the 2-device split does not reach other tests.

* `selection`: the replicas touch different numbers of rows (4 and 12 per
  step) and ~45 untouched rows survive the noisy threshold every step. The
  survivors are chosen once, from the contribution map of the global batch:
  the 2-replica run equals the one-device run bit for bit, the replicas'
  copies agree, the noise on survivors has std sigma2 C2 and untouched rows
  survive with probability P(N(0, sigma1^2 C1^2) >= tau).
* `scored`: a full-softmax item table. Its scored rows (`shared_rows`)
  always survive DP-AdaFEST and DP-FEST refuses the table, as on one
  device (before the fix the replicated step dropped `shared_rows`:
  DP-AdaFEST froze every scored row, DP-FEST trained silently).
"""

from __future__ import annotations

import math

import pytest


@pytest.fixture(scope="module")
def results(script_runner):
    return script_runner("adafest_mirrored_cases.py", "selection", "scored", timeout=400.0)


def test_replicas_touching_different_row_counts_select_the_global_batch_survivors(results):
    row = results["selection"]
    assert row["replicas"] == 2 and row["replica_spread"] == 0.0
    assert row["max_abs_diff_one_vs_two"] == 0.0  # same map noise on the same global map: same rows, same noise
    assert row["two"] == row["one"]
    two = row["two"]
    assert two["steps"] == 12 and two["updated_rows"] == two["rows_noised"] > 0


def test_the_dp_guarantee_is_unchanged_noise_on_survivors_and_the_threshold(results):
    row, p = results["selection"]["two"], 0.5 * math.erfc(2.0 / math.sqrt(2.0))  # P(N(0, 1) >= tau = 2)
    # Survivors move by exactly the noise (gradients ~1e-20): std sigma2 C2 within 4 standard errors.
    n, expected = row["noise_samples"], results["selection"]["expected_std"]
    assert n > 5000
    assert abs(row["noise_std_on_survivors"] - expected) < 4 * expected / math.sqrt(2 * n), row
    assert abs(row["noise_mean_on_survivors"]) < 4 * expected / math.sqrt(n), row
    # Untouched rows survive by noise alone, each with probability p, within 4 binomial sds.
    trials, hits = row["untouched_trials"], row["untouched_survivors"]
    assert abs(hits - p * trials) < 4 * math.sqrt(trials * p * (1 - p)), (hits, p * trials)


def test_scored_rows_keep_their_one_device_treatment_on_two_replicas(results):
    row = results["scored"]
    assert row["adafest_one"] == row["adafest_two"] == list(range(1, 51))  # tau = 1e9: only scored rows
    for name in ("fest_one", "fest_two"):
        assert row[name].startswith("ValueError"), (name, row[name][:300])
        assert "Mechanism 'fest' cannot train table 'items': every example is scored" in row[name], name
