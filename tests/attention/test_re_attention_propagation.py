"""DPFormer's tracked activation variances against Monte Carlo on a tiny model (benchmarks.reattention_check).

Each parameter is drawn around its value with its effective error as std
(the model Re-Attention assumes, DPFormer §4.2, Alg. 1), the vanilla forward
pass is run per draw, and the measured per-stage variances are compared with
what `SASRec.trace_errors` tracks. The rules that are exact to first order
(embedding sum, layer norm, dense layers, ReLU by Lemma A.4) must agree
within the Monte-Carlo and linearisation error; the attention output's rule
(weights held fixed, values independent) is a known under-estimate and is
only bounded.
"""

from __future__ import annotations

import pytest

from benchmarks import reattention_check

SAMPLES = 150
FIRST_ORDER = (
    "input",
    "block0.attn_norm",
    "block0.key",
    "block0.value",
    "block0.ffn_norm",
    "block0.ffn_pre",
    "block0.ffn_relu",
    "block0.ffn_residual",
)


@pytest.fixture(scope="module")
def rows():
    model, ids = reattention_check.tiny_model(0, error_scale=0.01)
    measured = reattention_check.monte_carlo(model, ids, samples=SAMPLES, seed=1)
    return {r["stage"]: r for r in reattention_check.compare(model, ids, measured)}


@pytest.mark.parametrize("stage", FIRST_ORDER)
def test_first_order_rules_match_monte_carlo(rows, stage):
    # 150 draws: the variance of one coordinate has relative SE sqrt(2/150) = 12 %; the stage mean averages
    # over 16 coordinates and ~40 tokens. The FFN's layer norm took its scale from the block OUTPUT before
    # (ratio 0.65 here): it must be the residual stream that enters it.
    assert 0.85 < rows[stage]["ratio"] < 1.2, rows[stage]


def test_key_noise_is_part_of_the_measured_score_variance(rows):
    for block in ("block0", "block1"):
        row = rows[f"{block}.scores (key noise)"]
        assert 0.3 < row["ratio"] < 1.5, row  # the query's noise adds to the keys' (not tracked by eq. 4)


def test_attention_output_is_not_over_estimated(rows):
    for block in ("block0", "block1"):
        assert 0.5 < rows[f"{block}.attention"]["ratio"] < 1.1, rows[f"{block}.attention"]
