"""colab/keras3_two_tower.ipynb runs top to bottom at quick settings, with tf.keras left as Keras 3.

ml-100k from ../shared when there (one epoch, 2,000 test ratings), else the notebook's generated data.
The kernel inherits this process's environment: TF_USE_LEGACY_KERAS (set by the tf-keras front end that
other tests load) is removed, as a Keras 3 user's environment has it.
"""

from __future__ import annotations

import os
import re

from notebook_runner import run_notebook

QUICK = {"K3_NB_EPOCHS": "1", "K3_NB_QUICK": "1", "K3_NB_DIM": "16"}


def test_keras3_two_tower_notebook_runs_top_to_bottom(tmp_path, monkeypatch):
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    data = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "movielens", "ml-100k")
    real = os.path.isfile(os.path.join(data, "u.data"))
    settings = {**QUICK, "K3_NB_OUT": str(tmp_path / "out"), "K3_NB_DATA": data if real else str(tmp_path / "absent")}
    if not real:
        settings["K3_NB_BATCH"] = "64"
    text = run_notebook("keras3_two_tower.ipynb", settings, monkeypatch)
    assert "tf.keras is Keras 3: True" in text
    epsilon = re.search(r"epsilon = (\S+) \(delta = ", text)
    assert epsilon and 0 < float(epsilon.group(1)) <= 3.0 + 1e-6, text[-3000:]
    recall = re.search(r"recall@10: dp (\S+), non-private (\S+), most-popular (\S+)", text)
    assert recall and all(0 <= float(v) <= 1 for v in recall.groups()), text[-3000:]
    assert len(re.findall(r"served \(fresh process\) user \d+: top-10 movie ids \[", text)) == 4
    assert "served ids match in-process: True" in text
    assert os.path.isfile(tmp_path / "out" / "top_k" / "saved_model.pb")
