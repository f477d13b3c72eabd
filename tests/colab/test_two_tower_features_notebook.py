"""colab/two_tower_features.ipynb runs top to bottom at tiny settings on generated data.

The notebook is a TFRS user's two-tower with an item tower with features, trained with the
sampled-softmax `Retrieval` task under LazyDP and DP-AdaFEST, evaluated with recall@k, exported as a
top-k SavedModel and served from a fresh process.
"""

from __future__ import annotations

import os
import re

import pytest
from notebook_runner import run_notebook

TINY = {
    "TT_NB_SYNTHETIC_USERS": "40",
    "TT_NB_EPOCHS": "3",
    "TT_NB_BATCH": "64",
    "TT_NB_DIM": "8",
    "TT_NB_NEGATIVES": "16",
    "TT_NB_LR": "5.0",
    "TT_NB_NOISE": "0.3",
    "TT_NB_ACCOUNTANT": "rdp",
}


@pytest.mark.slow  # ~14 s; the feature two-tower's tests (tests/retrieval, tests/models) run by default
def test_two_tower_features_notebook_runs_top_to_bottom(tmp_path, monkeypatch):
    out = tmp_path / "out"
    settings = {**TINY, "TT_NB_OUT": str(out), "TT_NB_DATA": str(tmp_path / "absent")}
    text = run_notebook("two_tower_features.ipynb", settings, monkeypatch)
    assert "MovieIdEmbedding is a DPEmbedding: True" in text
    for mechanism in ("lazy", "adafest"):
        match = re.search(rf"{mechanism}\s+epsilon=(\S+) \(delta=1e-5\)\s+recall@10=(\S+)", text)
        assert match, text[-3000:]
        assert 0 < float(match.group(1)) < 100
        # 60 movies, each user likes 3 of them: chance recall@10 is 1/6; the towers learn the rule.
        assert float(match.group(2)) > 2 / 6, match.group(0)
    assert "served ids match in-process: True" in text
    assert os.path.exists(out / "lazy" / "top_k_saved_model" / "saved_model.pb")
    assert os.path.exists(out / "lazy" / "top_k_saved_model" / "privacy_report.json")
