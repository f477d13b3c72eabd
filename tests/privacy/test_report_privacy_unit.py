"""Low finding: the MovieLens `privacy_report.json` (the one shipped beside the model) did not say what it protects.

A guarantee without its privacy unit reads as user-level to most readers;
the MovieLens pipeline protects one (context, label) example, so a user's
whole history is covered only by group privacy. On 6fce81d the shipped
report had no `privacy_unit` (only the operator's report.json did) and no
contribution bound or attacker bound. Now every privacy report carries the
unit, the contribution bound and the membership-test bound (TPR at FPR).
"""

from __future__ import annotations

import json
import math
import os

import numpy as np

from pipelines import movielens


def _ratings(path, *, users=30, length=10, items=20) -> str:
    rng = np.random.default_rng(0)
    lines = []
    for user in range(1, users + 1):
        start = int(rng.integers(0, items))
        lines += [
            f"{user}\t{(start + t) % items + 1}\t{int(rng.integers(1, 6))}\t{1000 + 10 * t}" for t in range(length)
        ]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(os.path.dirname(str(path)), "u.item"), "w") as f:  # a public catalogue beside them
        f.write("".join(f"{i}|Movie {i} (1995)|01-Jan-1995||\n" for i in range(1, items + 1)))
    return str(path)


def test_the_shipped_movielens_report_states_unit_bound_and_attacker_bound(tmp_path):
    config = movielens.MovieLensConfig(
        data_path=_ratings(tmp_path / "u.data"),
        mechanism="dense",
        noise_multiplier=1.0,
        epochs=1,
        batch_size=32,
        embedding_dim=4,
        hidden_units=(8,),
        context_length=3,
        verbose=0,
        k=5,
        accountant="rdp",
    )
    out = tmp_path / "run"
    movielens.train_and_evaluate(config, out_dir=str(out))
    shipped = [
        os.path.join(root, "privacy_report.json") for root, _, files in os.walk(out) if "privacy_report.json" in files
    ]
    assert shipped, "no privacy_report.json beside the model"
    report = json.loads(open(shipped[0]).read())
    assert report.get("privacy_unit", "").startswith("one (context, label) example"), report.get("privacy_unit")
    assert "clipped to L2 norm 1" in report["contribution_bound"]
    bounds = report["attacker_bound"]["bounds"]
    epsilon, delta = report["epsilon"], report["delta"]
    for row in bounds:  # TPR <= e^eps FPR + delta, hand-checked from the report's own epsilon
        assert row["max_tpr"] <= min(1.0, math.exp(epsilon) * row["fpr"] + delta) + 1e-12
