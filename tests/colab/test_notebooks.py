"""The notebooks in colab/ run top to bottom (tiny settings), so they never rot.

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
NOTEBOOK = os.path.join(ROOT, "colab", "criteo_dp_ctr.ipynb")

TINY_CRITEO = {
    "CRITEO_NB_ROWS": "400",
    "CRITEO_NB_HASH_SIZE": "20",
    "CRITEO_NB_EMBEDDING_DIM": "2",
    "CRITEO_NB_HIDDEN": "8",
    "CRITEO_NB_BATCH": "100",
    "CRITEO_NB_EPOCHS": "1",
    "CRITEO_NB_ACCOUNTANT": "rdp",
    "CRITEO_NB_MECHANISMS": "dense,adafest",
}


def _outputs(nb) -> str:
    text = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            text.append(output.get("text", ""))
            text.append(str(output.get("data", {}).get("text/plain", "")))
    return "\n".join(text)


def test_criteo_notebook_runs_top_to_bottom(tmp_path, monkeypatch):
    for key, value in {**TINY_CRITEO, "CRITEO_NB_OUT": str(tmp_path / "out")}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": os.path.join(ROOT, "colab")}}
    )
    client.execute()  # raises CellExecutionError (with the cell and traceback) on any failure

    text = _outputs(nb)
    assert "== privacy report ==" in text
    assert "P(click)=" in text
    assert "TypeError: Criteo serving request: field I3" in text
    for mechanism in ("dense", "adafest"):
        assert os.path.exists(tmp_path / "out" / mechanism / "saved_model" / "saved_model.pb")
        assert os.path.exists(tmp_path / "out" / mechanism / "report.json")
