"""ParameterServerStrategy, in-process loopback cluster: tables on the servers, sparse updates.

Keras `fit` with a `DatasetCreator` drives the steps (ClusterCoordinator
underneath). Scenarios run in subprocesses (tests/distributed/ps_cases.py).
"""

import pytest

PS = "/job:ps/"


@pytest.fixture(scope="module")
def one_worker(script_runner):
    return script_runner("ps_cases.py", "--workers", "1", "--ps", "2", "exact", "lazy")


def test_zero_noise_huge_clip_equals_local_non_private_sgd(one_worker):
    row = one_worker["exact"]
    assert one_worker["kind"] == "parameter_server"
    # One worker steps sequentially: same batches, same order as the local run.
    assert row["max_abs_diff"] < 1e-6, row
    assert row["steps"] == 4
    # Both tables live on parameter servers (round robin over the two).
    assert all(d.startswith(PS) for d in row["table_devices"]), row
    assert len(set(row["table_devices"])) == 2


def test_sparse_mechanisms_send_indexed_slices_for_tables(one_worker):
    for case in ("exact", "lazy"):  # EANA and LazyDP
        applied = one_worker[case]["applied"]
        tables = {k: v for k, v in applied.items() if k.startswith("table_")}
        assert tables and set(tables.values()) == {"IndexedSlices"}, applied


def test_lazy_history_lives_next_to_its_table_and_flush_clears_the_debt(one_worker):
    row = one_worker["lazy"]
    for table_device, history_device in row["pairs"]:
        assert table_device.startswith(PS) and history_device == table_device, row
    assert row["owed_before_flush"] is True
    assert row["owed_after_flush"] is False
    assert row["steps"] == 4


def test_lazy_under_ps_equals_dense_dp_sgd_after_flush(one_worker):
    # Same per-(step, row) stateless noise, momentum 0.9, lookahead through DatasetCreator.
    assert one_worker["lazy"]["max_abs_diff_vs_dense"] < 1e-5, one_worker["lazy"]


def test_lazy_with_two_workers_and_sharded_tables_are_refused(script_runner):
    rows = script_runner("ps_cases.py", "--workers", "2", "--ps", "2", "lazy_refused", "sharded_refused")
    lazy = rows["lazy_refused"]["error"]
    assert lazy.startswith(
        "DistributionNotSupportedError: Mechanism 'lazy' supports ParameterServerStrategy with exactly one worker"
    )
    sharded = rows["sharded_refused"]["error"]
    assert sharded.startswith("DistributionNotSupportedError: DPEmbedding 'table_a' is split into 2 shards")


@pytest.mark.slow  # dense, fest, adafest, adafest+ under ParameterServerStrategy
def test_other_mechanisms_train_under_parameter_server_strategy(script_runner):
    rows = script_runner("ps_cases.py", "--workers", "1", "--ps", "2", "mechanisms")["mechanisms"]
    for name, row in rows.items():
        assert row["steps"] == 4 and row["finite"], (name, row)
        expected = "SymbolicTensor" if name == "dense" else "IndexedSlices"  # dense ships the whole table
        assert set(row["applied"].values()) == {expected}, (name, row)
