"""Attack (N2, selection and output calibration): one non-finite value decides whether anything is released.

On 6fce81d `select_privately` raised when one run's score was not finite,
and the Criteo output calibration raised on one non-finite logit: whether
the tuned model, or the calibrated one, is released at all then depends on
one example (a row whose feature overflows the logit, a run whose
validation metric a single example turns into NaN). An (eps, delta) claim
cannot cover an outcome ("halted") that one example switches on and off.

New code: a non-finite score ranks below every finite one, deterministically
(the earliest run wins ties), and the calibration clips a non-finite logit
into the histogram's range (NaN to the middle bin) and a label into [0, 1],
so each row still moves one bin by 1 and the clicks by at most 1 (L1
sensitivity 2, the Laplace scale's assumption).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipelines.criteo import calibration as criteo_calibration
from tfdp_embed import keras, select_privately
from tfdp_embed.accounting import dpsgd_event

DELTA = 1e-5
RUN = dpsgd_event(sampling_probability=0.01, noise_multiplier=1.1, steps=100)
BAD_SCORES = [math.nan, math.inf, -math.inf, np.float32("nan")]


def _search(scores: dict, seed: int, **kwargs):
    calls = []

    def train(candidate):
        calls.append(candidate)
        return f"model-{candidate}", scores[candidate]

    result = select_privately(list(scores), train, run_event=RUN, mean_runs=6.0, target_delta=DELTA, rng=seed, **kwargs)
    return result, calls


@pytest.mark.parametrize(
    ("bad", "higher_is_better"), [*((bad, True) for bad in BAD_SCORES), (math.nan, False), (math.inf, False)]
)
def test_a_non_finite_score_never_halts_the_search_and_never_wins(bad, higher_is_better):
    scores = {"a": 0.3, "b": bad, "c": 0.1}
    drawn = set()
    for seed in range(8):
        result, calls = _search(scores, seed, higher_is_better=higher_is_better)  # 6fce81d: ValueError
        drawn.update(calls)
        finite = [c for c in calls if c != "b"]
        if finite:
            best = (max if higher_is_better else min)(finite, key=scores.__getitem__)
            assert result.candidate == best and result.model == f"model-{best}"
        else:  # every run diverged: the first one, deterministically
            assert result.candidate == "b" and math.isnan(result.score) == math.isnan(float(bad))
        again, _ = _search(scores, seed, higher_is_better=higher_is_better)
        assert (again.candidate, again.runs) == (result.candidate, result.runs)
    assert "b" in drawn  # the diverged run was drawn


def _identity_logit_model():
    """One input `x` [B, 1]; click_logit = x: the logits are the inputs."""
    x = keras.Input((1,), name="x", dtype="float32")
    dense = keras.layers.Dense(1, name="click_logit", kernel_initializer="ones", bias_initializer="zeros")
    return keras.Model({"x": x}, dense(x))


def _batches(logits, labels):
    logits, labels = np.asarray(logits, np.float32), np.asarray(labels, np.float32)
    return [({"x": logits[a : a + 64, None]}, labels[a : a + 64]) for a in range(0, logits.size, 64)]


@pytest.mark.parametrize(
    ("logit", "label"),
    [(math.inf, 1.0), (-math.inf, 0.0), (math.nan, 1.0), (0.4, math.nan), (1e30, 7.0), (math.nan, -3.0)],
)
def test_one_non_finite_row_neither_halts_the_calibration_nor_exceeds_its_sensitivity(logit, label):
    rng = np.random.default_rng(0)
    logits = rng.normal(-1.0, 2.0, size=300)
    labels = (rng.random(300) < 0.3).astype(np.float64)
    model = _identity_logit_model()
    without = criteo_calibration.logit_histogram(model, _batches(logits, labels))
    with_row = criteo_calibration.logit_histogram(model, _batches(np.append(logits, logit), np.append(labels, label)))
    assert with_row[2] == without[2] + 1
    assert np.all(np.isfinite(with_row[0])) and math.isfinite(with_row[1])
    l1 = np.abs(with_row[0] - without[0]).sum() + abs(with_row[1] - without[1])
    assert np.abs(with_row[0] - without[0]).sum() == 1 and l1 <= criteo_calibration.L1_SENSITIVITY
    # The release itself runs (6fce81d: ValueError on the non-finite logit) and shifts the bias by a finite amount.
    result = criteo_calibration.calibrate_output(
        model, [_batches(np.append(logits, logit), np.append(labels, label))], epsilon=1.0, seed=1
    )
    assert math.isfinite(result.shift)
