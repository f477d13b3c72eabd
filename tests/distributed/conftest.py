"""Helpers for the distributed tests: each scenario runs in its own Python process.

Logical-device splits (MirroredStrategy on 2 CPUs), worker processes
(MultiWorkerMirroredStrategy) and in-process gRPC clusters
(ParameterServerStrategy) change process-wide TensorFlow state, so none of
it happens in the pytest process: scripts beside this file do it and print
one JSON object as their last line of output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def run_script(script: str, *args: str, timeout: float = 240.0, env: dict | None = None) -> dict:
    """Runs tests/distributed/<script> with `args`; returns the JSON printed on its last line.

    Fails the test with the script's output tail when it exits non-zero, times
    out (the process group is killed), or prints no JSON.
    """
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT), **(env or {})}
    process = subprocess.Popen(
        [sys.executable, str(HERE / script), *args],
        cwd=ROOT,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        output, _ = process.communicate()
        pytest.fail(f"{script} {' '.join(args)} did not finish in {timeout:.0f} s; output tail:\n{output[-3000:]}")
    lines = [line for line in output.strip().splitlines() if line.startswith("{")]
    if process.returncode != 0 or not lines:
        pytest.fail(f"{script} {' '.join(args)} exited {process.returncode}; output tail:\n{output[-4000:]}")
    result = json.loads(lines[-1])
    if "skip" in result:
        pytest.skip(result["skip"])
    return result


@pytest.fixture(scope="session")
def script_runner():
    return run_script
