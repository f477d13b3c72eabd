"""colab/dpformer_sequential.ipynb runs top to bottom at tiny settings (synthetic data)."""

from __future__ import annotations

import os

import pytest
from notebook_runner import run_notebook


@pytest.mark.slow  # ~15 s; the sequential pipeline's DPFormer tests run by default
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
    }
    text = run_notebook("dpformer_sequential.ipynb", tiny, monkeypatch)
    assert "using synthetic data" in text
    assert "analytic 0.3408" in text  # Table 3's N(0, 1) row
    assert "== sequential report ==" in text and "-> top-10" in text
    for model in ("transformer", "dpformer"):
        assert os.path.exists(tmp_path / "out" / model / "saved_model" / "saved_model.pb")
        assert os.path.exists(tmp_path / "out" / model / "report.json")
