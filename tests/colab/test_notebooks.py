"""colab/criteo_dp_ctr.ipynb runs top to bottom at tiny settings, so it never rots."""

from __future__ import annotations

import os

from notebook_runner import run_notebook

TINY_CRITEO = {
    "CRITEO_NB_ROWS": "400",
    "CRITEO_NB_HASH_SIZE": "20",
    "CRITEO_NB_EMBEDDING_DIM": "2",
    "CRITEO_NB_HIDDEN": "8",
    "CRITEO_NB_BATCH": "100",
    "CRITEO_NB_EPOCHS": "1",
    "CRITEO_NB_ACCOUNTANT": "rdp",
    # One mechanism: the notebook's cells are the same for each (the pipeline's mechanisms have their own
    # end-to-end runs in tests/pipelines/test_criteo_pipeline.py); a second costs a whole pipeline run.
    "CRITEO_NB_MECHANISMS": "adafest",
}


def test_criteo_notebook_runs_top_to_bottom(tmp_path, monkeypatch):
    text = run_notebook("criteo_dp_ctr.ipynb", {**TINY_CRITEO, "CRITEO_NB_OUT": str(tmp_path / "out")}, monkeypatch)
    assert "== privacy report ==" in text
    assert "P(click)=" in text
    assert "TypeError: Criteo serving request: field I3" in text
    assert os.path.exists(tmp_path / "out" / "adafest" / "saved_model" / "saved_model.pb")
    assert os.path.exists(tmp_path / "out" / "adafest" / "report.json")
