"""Attack: restore one checkpoint twice and subtract the two continuations (issue 16, leak 4).

A checkpoint holds the mechanism's noise generator (and LazyDP's catch-up
stream). Restored twice with `seed=None` and trained one step on two
different batches, the two runs drew the same noise, so their difference
is the exact, noise-free difference of the two batches' gradients: on the
rows neither batch touched it is exactly 0. After the fix every restore
re-keys from OS entropy, and the difference on those rows is the
difference of two independent noise draws:

    dense DP-SGD, DP-FEST (selected rows): std sqrt(2) * lr * sigma * C / B
    LazyDP, flushed after the step: a row untouched since step 0 owes all
      T + 1 steps: std sqrt(2 (T + 1)) * lr * sigma * C / B

An explicit seed keeps the saved stream (tests/test_checkpoint.py: a
resumed run reproduces the uninterrupted one); the last test checks it.

Both front ends (the `fe` fixture of tests/conftest.py): `TrainingCheckpoint`
is the core's (`tfdp_embed.checkpointing`).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tfdp_embed.checkpointing import DataPosition, TrainingCheckpoint
from tfdp_embed.mechanisms import DPFEST, DenseDPSGD, LazyDP

VOCAB, DIM, IDS = 256, 4, 2
TOUCHED = 8  # every batch reads rows < TOUCHED only
BATCH, LR, SIGMA, CLIP = 4, 0.5, 1.0, 1.0
STEPS_BEFORE = 3  # steps trained before the checkpoint
TOP_K = 128  # DP-FEST: rows trained (selected)


def _dense(seed):
    return DenseDPSGD(l2_norm_clip=CLIP, noise_multiplier=SIGMA, seed=seed)


def _lazy(seed):
    return LazyDP(l2_norm_clip=CLIP, noise_multiplier=SIGMA, seed=seed)


def _fest(seed):
    counts = {"table": np.arange(VOCAB, 0, -1).astype(np.float64) * 100}  # rows 0..127 win by far
    return DPFEST(
        l2_norm_clip=CLIP, noise_multiplier=SIGMA, selection_epsilon=50.0, top_k=TOP_K, counts=counts, seed=seed
    )


def _dp_model(fe, mechanism):
    keras = fe.keras
    keras.utils.set_random_seed(0)
    inputs = keras.Input((IDS,), dtype="int32")
    table = fe.DPEmbedding(VOCAB, DIM, combiner="sum", name="table")
    model = keras.Model(inputs, table(inputs))
    # loss_i = sum of example i's output: its gradient is known, whatever the weights.
    dp = fe.dp_model(model, mechanism, batch=BATCH, lr=LR, loss=lambda y, p: tf.reduce_sum(p, axis=-1))
    return dp, table


def _batches(ids):
    ids = np.asarray(ids, np.int32)
    return tf.data.Dataset.from_tensor_slices((ids, np.zeros([len(ids), 1], np.float32))).batch(BATCH)


def _table_after_one_step(fe, directory, make_mechanism, batch_ids, *, seed):
    """A fresh model restored from `directory`, trained on one batch (then flushed); its table."""
    dp, table = _dp_model(fe, make_mechanism(seed))
    TrainingCheckpoint(directory, dp_model=dp).restore()
    dp.fit(_batches(batch_ids), epochs=1, verbose=0)
    dp.flush()  # LazyDP: every owed noise term now (a no-op for the others)
    return table.embeddings.numpy(), dp.mechanism


def _checkpoint(fe, directory, make_mechanism, *, seed):
    rng = np.random.default_rng(0)
    dp, _ = _dp_model(fe, make_mechanism(seed))
    dp.fit(_batches(rng.integers(0, TOUCHED, (STEPS_BEFORE * BATCH, IDS))), epochs=1, verbose=0)
    assert int(dp.mechanism.steps.numpy()) == STEPS_BEFORE
    TrainingCheckpoint(directory, dp_model=dp).save(position=DataPosition(STEPS_BEFORE, 1, 0, STEPS_BEFORE))


def _two_restores(fe, tmp_path, make_mechanism, *, seed=None):
    """Tables of two restores of one checkpoint, each trained on a different batch."""
    _checkpoint(fe, str(tmp_path), make_mechanism, seed=seed)
    batch_a = [[0, 1]] * BATCH  # the attacker's two neighbouring batches
    batch_b = [[2, 3]] * BATCH
    table_a, mechanism = _table_after_one_step(fe, str(tmp_path), make_mechanism, batch_a, seed=seed)
    table_b, _ = _table_after_one_step(fe, str(tmp_path), make_mechanism, batch_b, seed=seed)
    return table_a, table_b, mechanism


@pytest.mark.parametrize(
    "make_mechanism, owed_steps",
    [(_dense, 1), (_lazy, STEPS_BEFORE + 1), (_fest, 1)],
    ids=["dense", "lazy", "fest"],
)
def test_two_restores_do_not_share_noise(fe, tmp_path, make_mechanism, owed_steps):
    table_a, table_b, mechanism = _two_restores(fe, tmp_path, make_mechanism)
    rows = np.arange(TOUCHED, VOCAB)  # never read by any batch: their change is noise only
    if isinstance(mechanism, DPFEST):
        rows = np.intersect1d(rows, mechanism.selected_rows("table"))  # unselected rows never move
        assert rows.size > 100
    difference = (table_a - table_b)[rows]
    # Old code: the same noise in both runs, so the difference is the exact gradient
    # difference (0 on these rows) and the noise is known to whoever holds both models.
    assert np.abs(difference).max() > 0, "the two restored runs drew bit-identical noise"
    expected = np.sqrt(2 * owed_steps) * LR * SIGMA * CLIP / BATCH
    # >= 480 values: the sample std is within 20% of the truth with overwhelming probability.
    assert difference.std() == pytest.approx(expected, rel=0.2)
    assert abs(difference.mean()) < 5 * expected / np.sqrt(difference.size)


def test_explicit_seed_keeps_the_saved_stream(fe, tmp_path):
    # With a seed (tests), a restore continues the saved stream: the same batch gives the same table.
    _checkpoint(fe, str(tmp_path), _dense, seed=3)
    same = [[0, 1]] * BATCH
    first, _ = _table_after_one_step(fe, str(tmp_path), _dense, same, seed=3)
    second, _ = _table_after_one_step(fe, str(tmp_path), _dense, same, seed=3)
    np.testing.assert_array_equal(first, second)
