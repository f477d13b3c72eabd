"""Checkpoint / resume of DP training under MirroredStrategy (2 logical CPUs).

tests/distributed/checkpoint_cases.py trains, in its own process (the
2-device split must not reach other tests): an uninterrupted run of 16
steps; a run checkpointed every 5 steps by DPCheckpoint and stopped after
step 13 without a final save (steps 11-13 are lost, as in a kill); and a
fresh model, mechanism, optimizer and budget under the same strategy that
restore step 10 and finish. EANA (not DP: the ledger counts steps, no
epsilon) and dense DP-SGD (epsilon compared; DP-FEST too, marked slow). Same tolerance as the
single-device resume test (tests/test_checkpoint.py): atol 1e-6.
"""

import json

import numpy as np
import pytest

FAST = ("eana", "dense")
SLOW = ("fest",)  # DP-FEST: its selection state restored under the strategy
MECHANISMS = [*FAST, *(pytest.param(name, marks=pytest.mark.slow) for name in SLOW)]


@pytest.fixture(scope="module")
def run_group(script_runner):
    """One subprocess per group (fast, slow), started when a test of the group first asks."""
    groups = {}

    def run(group):
        if group not in groups:
            groups[group] = script_runner("checkpoint_cases.py", *group)
        return groups[group]

    return run


@pytest.fixture
def case(run_group, name):
    return run_group(SLOW if name in SLOW else FAST)[name]


@pytest.mark.parametrize("name", MECHANISMS)
def test_resume_under_mirrored_strategy_equals_the_uninterrupted_run(case, name):
    full, resumed, restored = case["full"], case["resumed"], case["restored"]
    # The newest complete checkpoint is step 10 (epoch 1, batch 2); the stopped run got to 13.
    assert case["stopped_steps"] == 13
    assert (restored["step"], restored["epoch"], restored["batch_in_epoch"]) == (10, 1, 2)
    assert restored["mechanism_steps"] == restored["iterations"] == 10
    assert restored["moved_from_initial"] > 0.01  # the fresh model really took the checkpoint's values
    assert restored["replica_spread"] == 0.0  # both replicas' copies restored
    for key in ("weights",):
        for i, (a, b) in enumerate(zip(full[key], resumed[key])):
            np.testing.assert_allclose(np.array(b), np.array(a), rtol=0, atol=1e-6, err_msg=f"{name} weight {i}")
    assert resumed["replica_spread"] == 0.0
    # Noise is not replayed: the generator continues where the uninterrupted run's is.
    assert resumed["generator_state"] == full["generator_state"]
    assert resumed["steps"] == full["steps"] == resumed["iterations"] == 16


@pytest.mark.parametrize("name", MECHANISMS)
def test_resumed_ledger_counts_every_step_once(case, name):
    full, resumed, restored = case["full"], case["resumed"], case["restored"]
    # Restored with 10 steps (not the 13 the stopped run trained, not 0); 16 at the end.
    assert restored["ledger_steps"] == restored["budget_ledger_steps"] == 10
    assert resumed["ledger_steps"] == full["ledger_steps"] == 16
    assert json.loads(resumed["ledger"]) == json.loads(full["ledger"])
    if name != "eana":
        assert resumed["epsilon"] == full["epsilon"] and full["epsilon"] > 0
    else:
        assert resumed["epsilon"] is None  # EANA is not DP: no epsilon is reported
