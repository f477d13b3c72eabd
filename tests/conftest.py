"""Marks the slow tier (`slow_tier.py`); skips the tests marked `gpu` where TensorFlow sees no GPU; runs the Beam job.

The `fe` fixture runs a test once per front end (tf-keras, Keras 3): tests/front_ends/ and tests/privacy/ use it.
"""

from __future__ import annotations

import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.hookimpl(tryfirst=True)  # before `-m "not slow"` deselects
def pytest_collection_modifyitems(config, items):
    from slow_tier import is_slow  # tests/ is on sys.path (this conftest's directory)

    for item in items:
        if is_slow(item.nodeid):
            item.add_marker(pytest.mark.slow)
    gpu_tests = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_tests:
        return
    from tfdp_embed.keras2._keras import tf

    if tf.config.list_physical_devices("GPU"):
        return
    skip = pytest.mark.skip(reason="needs a GPU; TensorFlow sees none (the gpu tests run where one is visible)")
    for item in gpu_tests:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def beam_job():
    """`run(args)`: `python -m tfdp_embed_beam *args` (this tree's job) in the Beam environment, as a CompletedProcess.

    The environment is .venv-beam, or $TFDP_BEAM_PYTHON (`make test-beam`); the test skips without it.
    """
    python = os.environ.get("TFDP_BEAM_PYTHON", os.path.join(ROOT, ".venv-beam", "bin", "python"))
    python = python if os.path.isabs(python) else os.path.join(ROOT, python)
    if not os.access(python, os.X_OK):
        pytest.skip(f"no Beam environment at {python} (`make test-beam` creates .venv-beam; or set TFDP_BEAM_PYTHON)")

    def run(args):
        command = [python, "-m", "tfdp_embed_beam", *map(str, args)]
        env = {**os.environ, "PYTHONPATH": ROOT}
        return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)

    return run


@pytest.fixture(params=["keras2", "keras3"])
def fe(request):
    """Each test taking `fe` runs once per front end (tf-keras, Keras 3): a `front_ends.front_ends.FrontEnd`.

    Parametrize it indirectly to pick one (`@pytest.mark.parametrize("fe", ["keras3"], indirect=True)`).
    """
    from front_ends.front_ends import front_end  # tests/ is on sys.path (this conftest's directory)

    return front_end(request.param)
