"""Tests of the end-to-end audit (tfdp_embed/audit/secret_sharer.py) with stand-in scoring functions."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tfdp_embed.audit import (
    CHANCE_EXPOSURE_BITS,
    generate_canaries,
    sample_candidates,
    secret_sharer_audit,
    summarize_exposure,
)

ITEMS = np.arange(1, 501)


def setup(per_count=10, counts=(1, 10, 100), n=2048):
    canaries = generate_canaries(
        item_ids=ITEMS,
        context_length=6,
        seed=0,
        insertion_counts=counts,
        canaries_per_count=per_count,
    )
    candidates = sample_candidates(item_ids=ITEMS, context_length=6, num_candidates=n, seed=1, exclude=canaries)
    return canaries, candidates


def hashed_noise(contexts, labels):
    """A model that memorised nothing: a deterministic N(0, 1) score per sequence, blind to insertion."""
    keys = [hash((tuple(sorted(c.tolist())), int(lab))) % (2**32) for c, lab in zip(contexts, labels)]
    return np.array([np.random.default_rng(k).normal() for k in keys])


def test_a_model_that_memorised_nothing_sits_at_chance_exposure():
    # m is uniform on 1..n+1, so exposure = -log2 U, mean 1/ln 2 = 1.4427 bits and std 1.4427 bits.
    # 300 canaries: std of the mean 1.4427 / sqrt(300) = 0.083; tolerance 0.3 (3.6 std).
    canaries, candidates = setup(per_count=100)
    audit = secret_sharer_audit(hashed_noise, canaries=canaries, candidates=candidates, batch_size=500)
    assert audit.exposure.mean() == pytest.approx(CHANCE_EXPOSURE_BITS, abs=0.3)
    assert CHANCE_EXPOSURE_BITS == pytest.approx(1.4426950409)


def test_memorised_canaries_get_exposure_growing_with_insertions():
    canaries, candidates = setup()
    bonus = {
        (tuple(sorted(c.tolist())), int(lab)): math.log(k)
        for c, lab, k in zip(canaries.contexts, canaries.labels, canaries.insertion_counts)
    }

    def memoriser(contexts, labels):
        base = hashed_noise(contexts, labels)
        return base + np.array(
            [bonus.get((tuple(sorted(c.tolist())), int(lab)), 0.0) for c, lab in zip(contexts, labels)]
        )

    audit = secret_sharer_audit(memoriser, canaries=canaries, candidates=candidates)
    summary = audit.summary()
    rows = summary["by_insertion_count"]
    assert list(rows) == ["1", "10", "100"] and all(r["num_canaries"] == 10 for r in rows.values())
    assert rows["1"]["mean_exposure"] < rows["10"]["mean_exposure"] < rows["100"]["mean_exposure"]
    assert rows["100"]["max_exposure"] <= summary["max_rank_exposure"] == 11.0  # log2 2048
    # a +ln(100) = 4.6 sigma shift: beyond the rank ceiling only the fitted tail can tell how far
    assert rows["100"]["mean_extrapolated_exposure"] > rows["10"]["mean_extrapolated_exposure"]
    assert summary["fit"]["distribution"] == "skewnorm" and summary["num_candidates"] == 2048
    json.dumps(audit.as_dict(), allow_nan=False)  # JSON-able, no NaN / inf


def test_summarize_exposure_hand_computed():
    summary = summarize_exposure([2, 1, 2, 1], [1.0, 0.5, 3.0, 1.5], [1.0, 0.5, 5.0, 1.5])
    assert summary == {
        "1": {
            "num_canaries": 2,
            "mean_exposure": 1.0,
            "median_exposure": 1.0,
            "min_exposure": 0.5,
            "max_exposure": 1.5,
            "mean_extrapolated_exposure": 1.0,
            "median_extrapolated_exposure": 1.0,
            "max_extrapolated_exposure": 1.5,
        },
        "2": {
            "num_canaries": 2,
            "mean_exposure": 2.0,
            "median_exposure": 2.0,
            "min_exposure": 1.0,
            "max_exposure": 3.0,
            "mean_extrapolated_exposure": 3.0,
            "median_extrapolated_exposure": 3.0,
            "max_extrapolated_exposure": 5.0,
        },
    }
    with pytest.raises(ValueError, match="one value per canary"):
        summarize_exposure([1, 2], [1.0])


def test_bad_scoring_function_and_inputs_are_rejected():
    canaries, candidates = setup(per_count=2, n=64)
    with pytest.raises(ValueError, match="one log-probability per sequence"):
        secret_sharer_audit(
            lambda c, lab: np.zeros((len(lab), 2)),
            canaries=canaries,
            candidates=candidates,
        )
    with pytest.raises(ValueError, match="finite"):
        secret_sharer_audit(
            lambda c, lab: np.full(len(lab), np.nan),
            canaries=canaries,
            candidates=candidates,
        )
    with pytest.raises(ValueError, match="batch_size"):
        secret_sharer_audit(hashed_noise, canaries=canaries, candidates=candidates, batch_size=0)
    with pytest.raises(ValueError, match="non-inserted"):
        secret_sharer_audit(hashed_noise, canaries=canaries, candidates=canaries)
    other = sample_candidates(item_ids=ITEMS, context_length=4, num_candidates=8, seed=0)
    with pytest.raises(ValueError, match="same context length"):
        secret_sharer_audit(hashed_noise, canaries=canaries, candidates=other)
