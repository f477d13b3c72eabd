"""examples/keras3_two_tower.py --quick runs in a process whose tf.keras is Keras 3, trains, reports and serves.

The test process runs tf-keras (`tfdp_embed.keras2` sets TF_USE_LEGACY_KERAS=1), so the example runs in
a subprocess with that variable removed. It reads ml-100k from ../shared when there, else a tiny generated
copy (u.data, u.item, u.user).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ML_100K = os.path.join(ROOT, "..", "shared", "data", "movielens", "ml-100k")


def _generated(folder) -> str:
    """50 users x 20 ratings of 60 movies, each user rating movies near 3 x user (mod 60)."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    with open(os.path.join(folder, "u.item"), "w") as handle:
        handle.writelines(f"{m}|Movie {m}|01-Jan-1995||http://example|0\n" for m in range(1, 61))
    with open(os.path.join(folder, "u.user"), "w") as handle:
        handle.writelines(f"{u}|30|F|other|00000\n" for u in range(1, 51))
    with open(os.path.join(folder, "u.data"), "w") as handle:
        for user in range(1, 51):
            movies = rng.choice(np.arange(3 * user, 3 * user + 25) % 60 + 1, size=20, replace=False)
            handle.writelines(f"{user}\t{m}\t5\t{1000 + t}\n" for t, m in enumerate(movies))
    return str(folder)


def test_the_keras3_two_tower_example_trains_reports_and_serves_from_a_fresh_process(tmp_path):
    real = os.path.isfile(os.path.join(ML_100K, "u.data"))
    data = ML_100K if real else _generated(tmp_path / "ml")
    result = tmp_path / "result.json"
    command = [sys.executable, os.path.join(ROOT, "examples", "keras3_two_tower.py"), "--quick", "--data", data]
    command += ["--out", str(tmp_path / "out"), "--json", str(result)] + ([] if real else ["--batch-size", "64"])
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}  # tf.keras is Keras 3 there
    env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=85)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    out = done.stdout
    epsilon = re.search(r"^epsilon = (\S+) \(delta = (\S+);", out, re.M)
    assert epsilon, out
    assert 0 < float(epsilon.group(1)) <= 3.0 + 1e-6 and 0 < float(epsilon.group(2)) < 1e-2
    recall = re.search(r"^recall@10: dp (\S+), non-private (\S+), most-popular (\S+)$", out, re.M)
    assert recall, out
    assert all(0.0 <= float(value) <= 1.0 for value in recall.groups())
    served = re.findall(r"^served \(fresh process\) user (\d+): top-10 movie ids \[([\d, ]+)\]$", out, re.M)
    assert len(served) == 4, out
    assert all(len(ids.split(",")) == 10 for _, ids in served)
    assert "served ids match in-process: True" in out
    assert os.path.isfile(tmp_path / "out" / "top_k" / "saved_model.pb")
    assert os.path.isfile(tmp_path / "out" / "dp_model" / "saved_model.pb")
    doc = json.loads(result.read_text())
    assert doc["benchmark"] == "keras3_two_tower" and abs(doc["epsilon"] - float(epsilon.group(1))) < 1e-3
    assert {"epsilon", "delta", "recall@10_dp", "recall@10_non_private", "wall_s", "command", "commit", "date"} <= set(
        doc
    )
