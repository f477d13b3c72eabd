"""colab/two_tower_eana.ipynb runs top to bottom at tiny settings on generated data."""

from __future__ import annotations

import os

import pytest
from notebook_runner import run_notebook

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


@pytest.mark.slow  # ~11 s; the MovieLens pipeline and its canary audit run by default
def test_two_tower_notebook_runs_top_to_bottom(tmp_path, monkeypatch):
    out = tmp_path / "out"
    # A path that does not exist: the notebook generates its own tiny u.data under OUT.
    settings = {**TINY, "ML_NB_OUT": str(out), "ML_NB_DATA": str(tmp_path / "absent" / "u.data")}
    text = run_notebook("two_tower_eana.ipynb", settings, monkeypatch)
    assert "HistoryEmbedding is a DPEmbedding: True" in text
    assert "none (NOT differentially private)" in text  # EANA has no epsilon
    assert "EANA data-dependent bound" in text
    assert "max rank exposure log2(n) = 5.64 bits" in text
    assert "an unknown id is dropped: known_ids [1]" in text
    for mechanism in ("eana", "dense"):
        assert os.path.exists(out / mechanism / "retrieval_saved_model" / "saved_model.pb")
        assert os.path.exists(out / mechanism / "report.json")
