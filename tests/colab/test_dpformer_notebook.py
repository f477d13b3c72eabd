"""colab/dpformer_sequential.ipynb runs top to bottom at tiny settings (synthetic data)."""

from __future__ import annotations

import os

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat is in the [test] extra: pip install -e '.[test]'")
nbclient = pytest.importorskip("nbclient", reason="nbclient is in the [test] extra: pip install -e '.[test]'")
pytest.importorskip("ipykernel", reason="ipykernel is in the [test] extra: pip install -e '.[test]'")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOK = os.path.join(ROOT, "colab", "dpformer_sequential.ipynb")


def _outputs(nb) -> str:
    text = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            text.append(output.get("text", ""))
            text.append(str(output.get("data", {}).get("text/plain", "")))
    return "\n".join(text)


def test_dpformer_notebook_runs_top_to_bottom(tmp_path, monkeypatch):
    tiny = {
        "DPF_NB_DATA": str(tmp_path / "absent.txt"),  # -> synthetic data
        "DPF_NB_SYNTHETIC_USERS": "150",
        "DPF_NB_EPOCHS": "1",
        "DPF_NB_BATCH": "50",
        "DPF_NB_MAX_LEN": "6",
        "DPF_NB_DIM": "8",
        "DPF_NB_BLOCKS": "1",
        "DPF_NB_ACCOUNTANT": "rdp",
        "DPF_NB_OUT": str(tmp_path / "out"),
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    for key, value in tiny.items():
        monkeypatch.setenv(key, value)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": os.path.join(ROOT, "colab")}}
    )
    client.execute()  # raises CellExecutionError (with the cell and traceback) on any failure
    text = _outputs(nb)
    assert "using synthetic data" in text
    assert "analytic 0.3408" in text  # Table 3's N(0, 1) row
    assert "== sequential report ==" in text and "-> top-10" in text
    for model in ("transformer", "dpformer"):
        assert os.path.exists(tmp_path / "out" / model / "saved_model" / "saved_model.pb")
        assert os.path.exists(tmp_path / "out" / model / "report.json")
