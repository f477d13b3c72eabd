"""Tests of DP-AdaFEST+ (tfdp_embed/mechanisms/adafest_plus.py).

Driven with hand-built `ClippedGradients` over unbuilt `DPEmbedding` layers,
so a 10^12-row table costs nothing unless the mechanism does O(vocab) work.
"""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from scipy import stats

from tfdp_embed.keras2._keras import tf
from tfdp_embed.keras2.layers.embedding import DPEmbedding
from tfdp_embed.mechanisms.adafest_plus import DPAdaFESTPlus
from tfdp_embed.mechanisms.base import ClippedGradients, TableGradient

SELECTION_EVENT = dp_accounting.LaplaceDpEvent(100.0)  # stands in for a top-k event


def make_table(vocab, dim, ids, name, seed=0):
    layer = DPEmbedding(vocab, dim, combiner="sum", name=name)
    occ = layer.occurrences(tf.ragged.constant(ids, dtype=tf.int64))
    rows = sorted({r for row in ids for r in row})
    values = np.random.default_rng(seed).normal(size=(len(rows), dim))
    grad = tf.IndexedSlices(
        tf.constant(values, tf.float32),
        tf.constant(rows, tf.int64),
        tf.constant([vocab, dim], tf.int64),
    )
    return TableGradient(layer, name, grad, [occ], tf.ones([len(ids)]))


def make_step(tables, batch_size, expected_batch_size=1.0):
    return ClippedGradients(list(tables), [], expected_batch_size, tf.constant(batch_size))


def make_mechanism(tables, selected, **kwargs):
    args = dict(
        selected_rows=selected,
        selection_event=SELECTION_EVENT,
        l2_norm_clip=1.0,
        noise_multiplier=0.0,
        contribution_clip=1.0,
        contribution_noise_multiplier=1e-6,
        threshold=0.5,
        seed=2,
    )
    args.update(kwargs)
    mechanism = DPAdaFESTPlus(**args)
    mechanism.init(tables=[t.layer for t in tables], dense_variables=[], optimizer=None)
    return mechanism


def test_zero_noise_updates_exactly_the_selected_touched_rows():
    table = make_table(100, 3, [[1, 5, 5], [5, 7], [99]], "t")
    mechanism = make_mechanism([table], {"t": [5, 7, 50]}, l2_norm_clip=1e6)
    ((slices, _),) = mechanism.update(make_step([table], 3, 2.0))
    got = dict(zip(slices.indices.numpy().tolist(), slices.values.numpy()))
    assert sorted(got) == [5, 7]  # 1 and 99 are touched but not selected; 50 untouched
    grads = dict(zip([1, 5, 7, 99], table.gradient.values.numpy()))
    for row in (5, 7):
        np.testing.assert_allclose(got[row], grads[row] / 2.0, rtol=1e-6)
    assert mechanism.dropped_touched_rows.numpy().tolist() == [2]


def test_selecting_everything_equals_adafest():
    from tfdp_embed.mechanisms.adafest import DPAdaFEST

    table = make_table(1000, 4, [[r, r + 1] for r in range(0, 600, 3)], "t")
    kwargs = dict(
        l2_norm_clip=1.0,
        noise_multiplier=1.0,
        contribution_clip=1.0,
        contribution_noise_multiplier=1.0,
        threshold=2.0,
        seed=5,
    )
    plus = DPAdaFESTPlus(selected_rows={"t": range(1000)}, selection_event=SELECTION_EVENT, **kwargs)
    plain = DPAdaFEST(**kwargs)
    for m in (plus, plain):
        m.init(tables=[table.layer], dense_variables=[], optimizer=None)
    ((a, _),) = plus.update(make_step([table], 200))
    ((b, _),) = plain.update(make_step([table], 200))
    # Same seed and same draws in the same order: identical outputs.
    np.testing.assert_array_equal(a.indices.numpy(), b.indices.numpy())
    np.testing.assert_allclose(a.values.numpy(), b.values.numpy())


def test_contribution_clipping_counts_only_selected_rows():
    # Example 0 touches 100 rows of which 4 are selected: n_0 = 4, so with
    # C1 = 1 each of its selected rows counts 1/sqrt(4) = 0.5 (not 1/10).
    # Example 1 touches selected row 0 alone: counts 1. Row 0: 1.5.
    table = make_table(1000, 2, [list(range(100)), [0]], "t")
    selected = {"t": [0, 10, 20, 30]}
    mechanism = make_mechanism([table], selected, threshold=0.45)
    ((slices, _),) = mechanism.update(make_step([table], 2))
    assert sorted(slices.indices.numpy().tolist()) == [0, 10, 20, 30]
    mechanism = make_mechanism([table], selected, threshold=0.55)
    ((slices, _),) = mechanism.update(make_step([table], 2))
    assert slices.indices.numpy().tolist() == [0]
    mechanism = make_mechanism([table], selected, threshold=1.45)
    ((slices, _),) = mechanism.update(make_step([table], 2))
    assert slices.indices.numpy().tolist() == [0]


def test_noise_survivors_only_among_selected_rows_binomial_and_uniform():
    vocab = 10**6
    rng = np.random.default_rng(0)
    selected = np.sort(rng.choice(vocab, size=40_000, replace=False))
    touched = selected[::20][:500].tolist() + [int(r) for r in range(7, vocab, 5003)]
    table = make_table(vocab, 2, [[r] for r in touched], "t")
    p = 0.01
    mechanism = make_mechanism(
        [table],
        {"t": selected},
        noise_multiplier=1.0,
        contribution_noise_multiplier=1.0,
        threshold=float(stats.norm.isf(p)),
    )
    touched_set = set(touched)
    untouched_selected = np.setdiff1d(selected, touched)
    extras = []
    for _ in range(5):
        ((slices, _),) = mechanism.update(make_step([table], len(touched)))
        rows = slices.indices.numpy()
        assert np.isin(rows, selected).all()  # nothing outside the selection
        extras.append([r for r in rows if r not in touched_set])
    n = 5 * untouched_selected.size  # ~197,500 Bernoulli(p) trials, mean 1975 +- 44
    total = sum(len(e) for e in extras)
    assert abs(total - n * p) < 5 * math.sqrt(n * p * (1 - p))
    # Uniform over the untouched selected rows: chi-square on their ranks.
    ranks = np.searchsorted(untouched_selected, np.concatenate(extras))
    counts, _ = np.histogram(ranks, bins=25, range=(0, untouched_selected.size))
    assert stats.chisquare(counts).pvalue > 1e-4
    report = mechanism.report()
    assert report["tables"][0]["expected_noise_only_rows"] == pytest.approx(40_000 * p)
    assert report["selected_rows"] == {"t": 40_000}


def test_huge_vocabulary_costs_only_the_selection():
    vocab = 10**12
    selected = np.arange(0, 10**12, 10**7)  # 100,000 selected rows
    table = make_table(vocab, 8, [[0, 10**7], [123]], "t")
    mechanism = make_mechanism(
        [table],
        {"t": selected},
        contribution_noise_multiplier=1.0,
        threshold=float(stats.norm.isf(0.005)),
    )
    ((slices, _),) = mechanism.update(make_step([table], 2))
    n = slices.indices.shape[0]
    assert abs(n - 500) < 6 * math.sqrt(500) + 3
    assert np.all(slices.indices.numpy() % 10**7 == 0)


def test_accounting_events():
    s1, s2 = 2.0, 1.5
    table = make_table(10, 2, [[1]], "t")
    mechanism = make_mechanism(
        [table], {"t": [1]}, noise_multiplier=s2, contribution_noise_multiplier=s1, threshold=6.0
    )
    assert mechanism.setup_event() is SELECTION_EVENT
    step = mechanism.step_event(0.01)
    assert step.event.noise_multiplier == pytest.approx((s1**-2 + s2**-2) ** -0.5)
    assert mechanism.name == "adafest+"


def test_bad_selection_arguments_raise():
    table = make_table(10, 2, [[1]], "t")
    with pytest.raises(ValueError, match="no selection for table"):
        make_mechanism([table], {"other": [1]})
    other = make_table(10, 2, [[1]], "u")
    with pytest.raises(ValueError, match="not tables of this model"):
        make_mechanism([table], {"t": [1], "x": [2]})
    with pytest.raises(ValueError, match=r"outside \[0, 10\)"):
        make_mechanism([table, other], {"t": [1], "u": [10]})
    with pytest.raises(ValueError, match="integer row ids"):
        make_mechanism([table], {"t": [0.5]})
    with pytest.raises(TypeError, match="selection_event"):
        make_mechanism([table], {"t": [1]}, selection_event=0.01)
    with pytest.raises(ValueError, match="`threshold`"):
        make_mechanism([table], {"t": [1]}, threshold=-1.0)
    with pytest.raises(TypeError):
        DPAdaFESTPlus(  # selection_event is required: no silent "free" selection
            selected_rows={"t": [1]},
            l2_norm_clip=1.0,
            noise_multiplier=1.0,
            contribution_clip=1.0,
            contribution_noise_multiplier=1.0,
            threshold=3.0,
        )


def test_end_to_end_fest_selection_then_adafest_in_dpmodel():
    from tfdp_embed.keras2._keras import keras
    from tfdp_embed.keras2.training import DPModel
    from tfdp_embed.mechanisms.topk_selection import bucket_counts

    vocab = 300
    rng = np.random.default_rng(0)
    ids = np.minimum(rng.zipf(1.5, size=(256, 3)) - 1, vocab - 1).astype("int32")
    labels = rng.normal(size=(256, 1)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((ids, labels)).batch(64)
    counts = bucket_counts(data, vocabulary_sizes={"table": vocab}, ids_fn=lambda element: {"table": element[0]})
    mechanism = DPAdaFESTPlus.from_counts(
        counts,
        top_k={"table": 10},
        selection_epsilon=1.0,
        l2_norm_clip=1.0,
        noise_multiplier=0.8,
        contribution_clip=1.0,
        contribution_noise_multiplier=2.0,
        threshold=8.0,
        seed=0,
    )
    selected = mechanism._selected_rows["table"]
    assert selected.size == 10 and mechanism.selection_epsilon == pytest.approx(1.0)
    # Buckets 0 and 1 hold ~1/3 and ~1/8 of a Zipf(1.5) sample (~200 and ~90 of
    # 256 examples): far above Gumbel(k / eps1 = 10) noise, so they are selected.
    assert {0, 1} <= set(selected.tolist())
    assert isinstance(mechanism.setup_event(), dp_accounting.GaussianDpEvent)

    inputs = keras.Input((3,), dtype="int32")
    x = DPEmbedding(vocab, 4, combiner="sum", name="table")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(1)(x))
    dp = DPModel(model, mechanism=mechanism, expected_batch_size=64)
    dp.compile(optimizer=keras.optimizers.legacy.SGD(0.1), loss="mse")
    table = model.layers[1].embeddings
    before = table.numpy().copy()
    dp.fit(data, epochs=1, verbose=0)
    changed = np.flatnonzero(np.any(table.numpy() != before, axis=1))
    assert set(changed.tolist()) <= set(selected.tolist())  # nothing outside the selection
    assert len(changed) > 0
    assert int(mechanism.steps.numpy()) == 4
    assert mechanism.report()["gradient_size_reduction"] >= vocab / 10
