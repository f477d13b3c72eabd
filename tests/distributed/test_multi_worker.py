"""MultiWorkerMirroredStrategy: two worker processes on loopback, started and stopped here.

Each worker runs tests/distributed/mwms_worker.py with its own TF_CONFIG.
Checks: zero noise + huge clip equals one-device SGD on the global batch;
with noise and a DP-FEST selection from OS entropy (`seed=None`) both
workers end with identical weights (the noise generator was synchronised
before the selection, noise drawn once per step, the same on every worker);
mechanism state that differs between workers is refused.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TIMEOUT_S = 150


def _free_ports(n):
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("localhost", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@pytest.fixture(scope="module")
def workers():
    try:
        ports = _free_ports(2)
    except OSError as error:
        pytest.skip(f"loopback sockets are not allowed in this sandbox: {error}")
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    processes = []
    for index in range(2):
        env = {
            **os.environ,
            "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}),
            "TF_CPP_MIN_LOG_LEVEL": "3",
            "PYTHONPATH": str(ROOT),
        }
        processes.append(
            subprocess.Popen(
                [sys.executable, str(HERE / "mwms_worker.py")],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        )
    outputs = []
    deadline = time.monotonic() + TIMEOUT_S
    try:
        for process in processes:
            remaining = max(1.0, deadline - time.monotonic())
            try:
                outputs.append(process.communicate(timeout=remaining)[0])
            except subprocess.TimeoutExpired:
                pytest.fail(f"a worker did not finish within {TIMEOUT_S} s (killed)")
    finally:
        for process in processes:  # never leave a worker behind
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    results = []
    for index, (process, output) in enumerate(zip(processes, outputs)):
        lines = [line for line in output.splitlines() if line.startswith("{")]
        if process.returncode != 0 or not lines:
            pytest.fail(f"worker {index} exited {process.returncode}; output tail:\n{output[-4000:]}")
        results.append(json.loads(lines[-1]))
    return results


def _max_diff(a, b):
    return max(float(np.abs(np.asarray(x) - np.asarray(y)).max()) for x, y in zip(a, b))


def test_two_workers_form_one_two_replica_strategy(workers):
    assert [w["replicas"] for w in workers] == [2, 2]
    # One mechanism update per global step on each worker (3 global batches).
    assert [w["exact_steps"] for w in workers] == [3, 3]
    assert [w["noisy_steps"] for w in workers] == [3, 3]


def test_zero_noise_huge_clip_equals_one_device_sgd_on_the_global_batch(workers):
    for worker in workers:
        assert _max_diff(worker["exact"], worker["reference"]) < 1e-5


def test_noisy_weights_and_selection_are_identical_on_both_workers(workers):
    # DP-FEST, seed=None: worker 0's OS-entropy generator state is copied to worker 1 before
    # init, so both select the same rows and draw the same noise.
    first, second = workers
    assert _max_diff(first["noisy"], second["noisy"]) == 0.0
    # ... and noise was added (sigma C / B = 1/8 per coordinate and step).
    assert _max_diff(first["noisy"], first["exact"]) > 0.05


def test_per_worker_selections_are_refused(workers):
    # DP-AdaFEST+ rows selected per worker with OS entropy (from_counts, seed=None): refused.
    # (Both workers drawing the same 8 of 30 rows under Gumbel noise of scale 16 would make this
    # "accepted"; that chance is tiny but not zero.)
    for worker in workers:
        message = worker["adafest_plus_os_entropy_selection"]
        assert message.startswith("DistributionNotSupportedError: Mechanism 'adafest+' holds different state"), message
