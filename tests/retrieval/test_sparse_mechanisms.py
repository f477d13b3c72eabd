"""Sparse mechanisms and the scoring table, as a TFRS user meets them: tau per table, scored rows, epoch warnings.

Before, DP-AdaFEST on a full-softmax item table dropped almost every row
(the batch's own lookups are a handful; the catalogue's scores touch every
row), silently, and one tau served every table. Here every table's rows
that the loss scores are always updated, tau is set per table, and a table
that drops more than half of its touched rows is named at each epoch end.
"""

from __future__ import annotations

import warnings

import dp_accounting
import numpy as np
import pytest

from tfdp_embed import mechanisms, tf
from tfdp_embed.keras2.retrieval import FullSoftmax, SampledSoftmax

from .user_model import NUM_GENRES, NUM_ITEMS, NUM_USERS
from .user_model import dp_two_tower as _dp
from .user_model import movielens_like as _data

BATCH = 32
HUGE = 1e9  # a tau no noisy count reaches


def _adafest(threshold):
    # sigma1 * C1 = 0.01: a row an example touches gets weight 1/sqrt(rows it touches) >= 0.5 > tau = 0.3;
    # an untouched row never passes tau.
    return mechanisms.DPAdaFEST(
        l2_norm_clip=1.0,
        noise_multiplier=0.5,
        contribution_clip=1.0,
        contribution_noise_multiplier=0.01,
        threshold=threshold,
        seed=0,
    )


def _one_step(negatives, threshold):
    """(model, weights before, the batch) after one DP-AdaFEST step on one batch."""
    batch = {k: v[:BATCH] for k, v in _data().items()}
    model, dp = _dp(negatives, _adafest(threshold), batch=BATCH)
    data = tf.data.Dataset.from_tensors(batch)
    dp.prepare(data)
    before = {v.name: v.numpy().copy() for v in model.trainable_variables}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the epoch warning has its own test
        dp.fit(data, epochs=1, verbose=0)
    return model, before, batch


def _changed_rows(layer, before) -> set:
    table = layer.embeddings
    return set(np.flatnonzero(np.any(table.numpy() != before[table.name], axis=1)).tolist())


def test_full_softmax_tables_are_updated_in_every_scored_row_whatever_tau():
    """The item tower's tables are scored (read for every example): all their rows update even at tau = 1e9."""
    model, before, batch = _one_step(FullSoftmax(), {"movie_id": HUGE, "genres": HUGE, "user_id": 0.3})
    assert _changed_rows(model.movie_model.movie, before) == set(range(NUM_ITEMS))
    assert _changed_rows(model.movie_model.genres, before) == set(range(NUM_GENRES))
    # tau per table: the user table keeps exactly the rows the batch touched (count 1 > tau = 0.3).
    assert _changed_rows(model.user_model.layers[0], before) == set(batch["user_id"].tolist())


def test_sampled_softmax_scores_exactly_the_sample_and_the_positives_are_counted():
    """Sampled softmax: the step's shared sample is scored (always updated); positives are the batch's lookups."""
    negatives = SampledSoftmax(12, seed=5)
    model, before, batch = _one_step(negatives, {"movie_id": HUGE, "genres": HUGE, "user_id": HUGE})
    sample = set(negatives.sample(tf.constant(0, tf.int64), NUM_ITEMS).numpy().tolist())
    assert _changed_rows(model.movie_model.movie, before) == sample  # the positives' rows fall below tau
    assert _changed_rows(model.user_model.layers[0], before) == set()
    model, before, batch = _one_step(negatives, {"movie_id": 0.3, "genres": HUGE, "user_id": HUGE})
    positives = set((batch["movie_id"] - 1000).tolist())
    assert _changed_rows(model.movie_model.movie, before) == sample | positives


def test_tau_mapping_must_name_exactly_the_tables():
    model, dp = _dp(FullSoftmax(), _adafest({"movie_id": 1.0, "user_id": 1.0, "genre": 1.0}), batch=BATCH)
    with pytest.raises(ValueError, match=r"exactly the model's tables.*missing \['genres'\], not tables \['genre'\]"):
        dp.fit(tf.data.Dataset.from_tensor_slices(_data(64)).batch(BATCH), epochs=1, verbose=0)


def test_adafest_plus_refuses_a_scored_table_with_the_reason():
    selected = {"movie_id": np.arange(5), "genres": np.arange(NUM_GENRES), "user_id": np.arange(NUM_USERS)}
    mechanism = mechanisms.DPAdaFESTPlus(
        selected_rows=selected,
        selection_event=dp_accounting.GaussianDpEvent(10.0),
        l2_norm_clip=1.0,
        noise_multiplier=0.5,
        contribution_clip=1.0,
        contribution_noise_multiplier=0.01,
        threshold=0.3,
        seed=0,
    )
    model, dp = _dp(FullSoftmax(), mechanism, batch=BATCH)
    with pytest.raises(ValueError, match=r"cannot train table 'movie_id'.*scored rows would stay at their initial"):
        dp.fit(tf.data.Dataset.from_tensor_slices(_data(64)).batch(BATCH), epochs=1, verbose=0)
