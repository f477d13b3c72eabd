"""step_time's two LazyDP rows: `lazy` (catch-up on read) and `lazy_lookahead` (next batch caught up after each step)."""

from __future__ import annotations

import numpy as np

from benchmarks import step_time_worker as worker
from tfdp_embed.keras2._keras import tf

SPEC = dict(vocab=3000, dim=8, batch=16, l2_norm_clip=1.0, noise_multiplier=1.0, seed=0)


def _history_after_one_step(name: str):
    batches = worker.make_batches(vocab=SPEC["vocab"], batch=SPEC["batch"], count=4, zipf=None, seed=0)
    batches = [(tf.constant(ids), tf.constant(labels)) for ids, labels in batches]
    setup = worker.Setup(name, SPEC, batches)
    setup.step(0)
    mechanism = setup.mechanism
    history = [v for v in mechanism.variables if "history" in v.name][0].numpy()
    now = 2 * int(mechanism.steps.numpy())  # the history stores 2 * (step a row is current at)
    next_rows = np.unique(np.asarray(batches[1][0]))  # step 1's batch (first half of the batches)
    return setup, history, now, next_rows


def test_lazy_lookahead_catches_up_the_next_batch_after_the_step():
    setup, history, now, next_rows = _history_after_one_step(worker.LAZY_LOOKAHEAD)
    assert worker.registry_name(worker.LAZY_LOOKAHEAD) == "lazy"
    assert (history[next_rows] == now).all()
    assert "history int32, 4 B/row" in "; ".join(setup.notes)


def test_lazy_catches_up_on_read_only():
    setup, history, now, next_rows = _history_after_one_step("lazy")
    # Nothing is caught up ahead of its read: rows only step 1 reads are still behind.
    assert (history[next_rows] < now).any()
    assert "history int32, 4 B/row" in "; ".join(setup.notes)
