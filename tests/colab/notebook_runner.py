"""Runs a notebook of colab/ top to bottom in a fresh kernel; shared by the notebook tests.

Each notebook reads its parameters from environment variables in its first
code cell; the kernel inherits the environment set here.
"""

from __future__ import annotations

import os

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat is in the [test] extra: pip install -e '.[test]'")
nbclient = pytest.importorskip("nbclient", reason="nbclient is in the [test] extra: pip install -e '.[test]'")
pytest.importorskip("ipykernel", reason="ipykernel is in the [test] extra: pip install -e '.[test]'")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_notebook(name: str, settings: dict, monkeypatch) -> str:
    """Executes colab/`name` with `settings` in the environment; returns its text outputs.

    Raises `CellExecutionError` (with the failing cell and traceback) on any failure.
    """
    env = {
        **settings,
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    nb = nbformat.read(os.path.join(ROOT, "colab", name), as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": os.path.join(ROOT, "colab")}}
    )
    client.execute()
    text = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            text.append(output.get("text", ""))
            text.append(str(output.get("data", {}).get("text/plain", "")))
    return "\n".join(text)
