"""Attack (low finding): read how many touched rows DP-AdaFEST dropped out of its end-of-epoch warning.

The warning was computed from the un-noised row touches ("dropped 100.0% of
the rows of table 'items' ... Lower tau for this table"): whether it appears,
and its percentage, are statistics of the private data, and the advice was
to retune tau from them, a hyperparameter fitted outside the guarantee.
The attacker compares the console of two runs that differ only in how
their data meets tau. On 6fce81d: one run printed 2 warnings ("dropped
100.0%"), the other none. Now both print the same fixed note, once,
naming no table and no count, and it points to tuning on public or
held-out data or with `select_privately`.

Both front ends (the `fe` fixture of tests/conftest.py).
"""

from __future__ import annotations

import warnings

import numpy as np
import tensorflow as tf
from tiny_model import embedding_dense_model

from tfdp_embed import mechanisms


def _epoch_messages(fe, threshold: float) -> list:
    model = embedding_dense_model(16, 3, table_seed=1, dense_seed=2, fe=fe)
    mechanism = mechanisms.DPAdaFEST(
        l2_norm_clip=1.0,
        noise_multiplier=0.5,
        contribution_clip=1.0,
        contribution_noise_multiplier=0.01,
        threshold=threshold,
    )
    loss = fe.keras.losses.MeanSquaredError(reduction="none")
    dp = fe.dp_model(model, mechanism, batch=8, lr=0.1, loss=loss)
    ids = np.random.default_rng(0).integers(0, 16, (32, 2)).astype(np.int32)
    data = tf.data.Dataset.from_tensor_slices((ids, np.ones([32, 1], np.float32))).batch(8)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        dp.fit(data, epochs=2, verbose=0)
    return [str(w.message) for w in record if "AdaFEST" in str(w.message)]


def test_the_epoch_warning_reads_nothing_from_the_data(fe):
    drops_everything = _epoch_messages(fe, 1e9)  # no noisy count reaches tau: every touched row is dropped
    keeps_everything = _epoch_messages(fe, 0.3)  # every touched row passes
    assert drops_everything == keeps_everything, (drops_everything, keeps_everything)
    assert all("%" not in m and "'items'" not in m for m in drops_everything)


def test_the_fixed_note_points_to_tuning_outside_the_run(fe):
    drops_everything = _epoch_messages(fe, 1e9)
    assert len(drops_everything) == 1  # once, not per epoch
    note = drops_everything[0]
    assert "%" not in note and "'items'" not in note
    assert "select_privately" in note and "public or held-out data" in note
