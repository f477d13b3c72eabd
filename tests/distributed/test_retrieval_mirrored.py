"""The DP `Retrieval` task and `TwoTowerModel` under MirroredStrategy on 2 logical CPUs (issue 34).

Built and compiled in the strategy scope, as a TFRS user does, they train
with zero noise and a huge clip to the one-device weights, and the top-k
metrics (SyncOnRead variables there) evaluate to the one-device values.
Each scenario runs in a subprocess (tests/distributed/retrieval_mirrored_cases.py).
"""

import pytest

pytestmark = (
    pytest.mark.slow
)  # 2 replicas in a subprocess, ~25 s: `make test-slow` (MirroredStrategy's default cases: test_mirrored.py)

CASES = ["retrieval_full", "retrieval_sampled", "two_tower"]


@pytest.fixture(scope="module")
def results(script_runner):
    return script_runner("retrieval_mirrored_cases.py", *CASES)


@pytest.mark.parametrize("case", CASES)
def test_two_replicas_train_like_one_device(results, case):
    row = results[case]
    assert row["max_abs_diff"] < 1e-5, row
    assert row["replica_spread"] == 0.0, row


@pytest.mark.parametrize("case", ["retrieval_full", "retrieval_sampled"])
def test_top_k_metrics_evaluate_like_one_device(results, case):
    one, two = results[case]["metrics"]
    for name in ("recall_at_1", "recall_at_10", "precision_at_10"):
        assert two[name] == pytest.approx(one[name], abs=1e-6), (name, one, two)
