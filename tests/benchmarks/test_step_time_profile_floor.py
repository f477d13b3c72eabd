"""Smoke test of step_time_profile's untouched-row floor at a tiny size (in process, a few seconds)."""

from __future__ import annotations

import numpy as np

from benchmarks import step_time_profile, step_time_worker
from tfdp_embed.keras2._keras import tf


def test_floor_times_plain_write_and_mechanism_and_writes_the_rows():
    spec = dict(
        vocab=2000,
        dim=8,
        batch=16,
        l2_norm_clip=1.0,
        noise_multiplier=1.0,
        seed=0,
        fest_top_k=16,
        fest_selection_epsilon=0.1,
        adafest_ratio=5.0,
        adafest_contribution_clip=1.0,
        adafest_threshold=19.0,
    )
    batches = step_time_worker.make_batches(vocab=2000, batch=16, count=4, zipf=None, seed=0)
    batches = [(tf.constant(ids), tf.constant(labels)) for ids, labels in batches]
    medians = step_time_profile.untouched_rows_floor(spec, batches, rows=50, steps=3, mechanism="adafest")
    assert set(medians) == {"plain", "plain+write", "adafest"}
    for m in medians.values():
        assert m["wall_s"] > 0 and m["cpu_s"] >= 0


def test_step_functions_share_one_table():
    # tau = 10 with sigma1 C1 = 5.1: ~2.5% of the 500 rows survive by noise each step.
    spec = dict(
        vocab=500,
        dim=4,
        batch=8,
        l2_norm_clip=1.0,
        noise_multiplier=1.0,
        seed=0,
        fest_top_k=16,
        fest_selection_epsilon=0.1,
        adafest_ratio=5.0,
        adafest_contribution_clip=1.0,
        adafest_threshold=10.0,
    )
    batches = step_time_worker.make_batches(vocab=500, batch=8, count=2, zipf=None, seed=0)
    batches = [(tf.constant(ids), tf.constant(labels)) for ids, labels in batches]
    steps = step_time_profile._step_functions("adafest", spec, batches)
    before = steps.table.numpy().copy()
    steps.plain(0)
    after_plain = steps.table.numpy().copy()
    steps.step(1)
    # The plain step and the mechanism step both train the one table the namespace names.
    assert not np.array_equal(before, after_plain)
    assert not np.array_equal(after_plain, steps.table.numpy())
