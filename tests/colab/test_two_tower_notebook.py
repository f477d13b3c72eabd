"""colab/two_tower_eana.ipynb runs top to bottom at tiny settings on generated data."""

from __future__ import annotations

import os

import pytest

nbformat = pytest.importorskip(
    "nbformat", reason="nbformat is in the [test] extra: pip install -e '.[test]'"
)
nbclient = pytest.importorskip(
    "nbclient", reason="nbclient is in the [test] extra: pip install -e '.[test]'"
)
pytest.importorskip(
    "ipykernel", reason="ipykernel is in the [test] extra: pip install -e '.[test]'"
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOK = os.path.join(ROOT, "colab", "two_tower_eana.ipynb")

TINY = {
    "ML_NB_SYNTHETIC_USERS": "40",
    "ML_NB_EPOCHS": "1",
    "ML_NB_BATCH": "32",
    "ML_NB_DIM": "4",
    "ML_NB_CONTEXT_LENGTH": "5",
    "ML_NB_INSERTIONS": "1,3",
    "ML_NB_CANARIES_PER_COUNT": "2",
    "ML_NB_CANDIDATES": "50",
    "ML_NB_ACCOUNTANT": "rdp",
}


def _outputs(nb) -> str:
    text = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            text.append(output.get("text", ""))
            text.append(str(output.get("data", {}).get("text/plain", "")))
    return "\n".join(text)


def test_two_tower_notebook_runs_top_to_bottom(tmp_path, monkeypatch):
    out = tmp_path / "out"
    # A path that does not exist: the notebook generates its own tiny u.data under OUT.
    settings = {
        **TINY,
        "ML_NB_OUT": str(out),
        "ML_NB_DATA": str(tmp_path / "absent" / "u.data"),
    }
    for key, value in settings.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    monkeypatch.setenv(
        "PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    )
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": os.path.join(ROOT, "colab")}},
    )
    client.execute()  # raises CellExecutionError (with the cell and traceback) on any failure

    text = _outputs(nb)
    assert "HistoryEmbedding is a DPEmbedding: True" in text
    assert "none (NOT differentially private)" in text  # EANA has no epsilon
    assert "EANA data-dependent bound" in text
    assert "max rank exposure log2(n) = 5.64 bits" in text
    assert "InvalidArgumentError: " in text and "must be movie ids" in text
    for mechanism in ("eana", "dense"):
        assert os.path.exists(
            out / mechanism / "retrieval_saved_model" / "saved_model.pb"
        )
        assert os.path.exists(out / mechanism / "report.json")
