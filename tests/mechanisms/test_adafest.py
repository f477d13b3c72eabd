"""Tests of DP-AdaFEST (tfdp_embed/mechanisms/adafest.py).

Unit tests drive the mechanism with hand-built `ClippedGradients`; the
embedding layers are left unbuilt so that a 10^12-row "table" costs nothing
unless the mechanism itself does O(vocabulary) work.
"""

from __future__ import annotations

import math
import time

import dp_accounting
import numpy as np
import pytest
from scipy import stats

from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.layers.embedding import DPEmbedding
from tfdp_embed.mechanisms.adafest import (
    DPAdaFEST,
    contribution_map,
    effective_noise_multiplier,
    geometric_skip_positions,
    split_noise_multiplier,
)
from tfdp_embed.mechanisms.base import ClippedGradients, TableGradient


# -- helpers ---------------------------------------------------------------------
def make_table(vocab, dim, ids, grad_rows=None, grad_values=None, seed=0, name=None):
    """A TableGradient whose examples look up `ids` (list of lists) in an unbuilt layer."""
    layer = DPEmbedding(vocab, dim, combiner="sum", name=name)
    occ = layer.occurrences(tf.ragged.constant(ids, dtype=tf.int64))
    if grad_rows is None:
        grad_rows = sorted({r for row in ids for r in row})
    if grad_values is None:
        grad_values = np.random.default_rng(seed).normal(size=(len(grad_rows), dim))
    grad = tf.IndexedSlices(
        tf.constant(grad_values, tf.float32),
        tf.constant(grad_rows, tf.int64),
        tf.constant([vocab, dim], tf.int64),
    )
    return TableGradient(
        layer=layer,
        variable=layer.name,  # never read by the mechanism; stands in for the table
        gradient=grad,
        occurrences=[occ],
        clip_factors=tf.ones([len(ids)]),
    )


def make_step(tables, batch_size, expected_batch_size=1.0, dense=()):
    return ClippedGradients(
        tables=list(tables),
        dense=list(dense),
        expected_batch_size=expected_batch_size,
        batch_size=tf.constant(batch_size, tf.int32),
    )


def make_mechanism(tables, dense_variables=(), **kwargs):
    args = dict(
        l2_norm_clip=1.0,
        noise_multiplier=0.0,
        contribution_clip=1.0,
        contribution_noise_multiplier=1e-6,
        threshold=0.5,
        seed=1,
    )
    args.update(kwargs)
    mechanism = DPAdaFEST(**args)
    mechanism.init(tables=[t.layer for t in tables], dense_variables=list(dense_variables), optimizer=None)
    return mechanism


def threshold_for(probability, scale):
    """tau with P(N(0, scale^2) >= tau) = probability."""
    return float(stats.norm.isf(probability)) * scale


def as_dict(slices):
    rows = slices.indices.numpy()
    assert len(set(rows)) == len(rows), "survivor rows must be unique"
    return dict(zip(rows.tolist(), slices.values.numpy()))


# -- degenerate settings reproduce SGD -----------------------------------------------
def test_zero_noise_huge_clip_reproduces_sgd_sum():
    # sigma1 C1 = 1e-3, tau = 0.5: every touched row (count 1 or more) survives,
    # untouched rows survive with P(N(0,1e-6) >= 0.5) = 0; sigma2 = 0.
    table = make_table(100, 3, [[1, 5, 5], [5, 7], [99]])
    dense_var = tf.Variable(tf.zeros([2, 2]))
    dense_grad = tf.constant([[1.0, 2.0], [3.0, 4.0]])
    mechanism = make_mechanism([table], [dense_var], l2_norm_clip=1e6, contribution_clip=1e3, threshold=0.5)
    assert mechanism.noise_survival_probability == 0.0
    out = mechanism.update(make_step([table], 3, 4.0, dense=[(dense_var, dense_grad)]))
    (dense_out, var), (slices, _) = out
    assert var is dense_var
    np.testing.assert_allclose(dense_out.numpy(), dense_grad.numpy() / 4.0)
    got = as_dict(slices)
    want = dict(zip([1, 5, 7, 99], table.gradient.values.numpy() / 4.0))
    assert sorted(got) == sorted(want)
    for row in want:
        np.testing.assert_allclose(got[row], want[row], rtol=1e-6)


@pytest.mark.parametrize("run_eagerly", [True, False])
def test_end_to_end_dpmodel_zero_noise_matches_sgd(run_eagerly):
    from tfdp_embed.keras2.training import DPModel

    def build():
        keras.utils.set_random_seed(3)
        inputs = keras.Input((3,), dtype="int32")
        x = DPEmbedding(40, 4, combiner="sum", name="table")(inputs)
        return keras.Model(inputs, keras.layers.Dense(1)(x))

    rng = np.random.default_rng(0)
    ids = rng.integers(0, 40, size=(8, 3)).astype("int32")
    labels = rng.normal(size=(8, 1)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((ids, labels)).batch(8)

    reference = build()
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(reference(ids) - labels))
    grads = tape.gradient(loss, reference.trainable_variables)
    keras.optimizers.legacy.SGD(0.5).apply_gradients(zip(grads, reference.trainable_variables))

    model = build()
    mechanism = DPAdaFEST(
        l2_norm_clip=1e6,
        noise_multiplier=0.0,
        contribution_clip=1e3,
        contribution_noise_multiplier=1e-6,
        threshold=0.5,
        seed=0,
    )
    dp = DPModel(model, mechanism=mechanism, expected_batch_size=8)
    dp.compile(
        optimizer=keras.optimizers.legacy.SGD(0.5),
        loss=keras.losses.MeanSquaredError(),
        run_eagerly=run_eagerly,
    )
    dp.fit(data, epochs=1, verbose=0)
    for got, want in zip(model.trainable_variables, reference.trainable_variables):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    touched = len(np.unique(ids))
    assert mechanism.rows_noised.numpy().tolist() == [touched]
    assert mechanism.gradient_size_reduction() == pytest.approx(40 / touched)


def test_end_to_end_dpmodel_noisy_runs_in_graph():
    from tfdp_embed.keras2.training import DPModel

    inputs = keras.Input((2,), dtype="int32")
    x = DPEmbedding(5000, 4, combiner="mean", name="big")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(1)(x))
    ids = np.random.default_rng(1).integers(0, 5000, size=(64, 2)).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((ids, np.zeros((64, 1), "float32"))).batch(16)
    # p = P(N(0, 1) >= 2.5) ~ 0.0062: ~31 noise-only rows per step out of 5000.
    mechanism = DPAdaFEST(
        l2_norm_clip=1.0,
        noise_multiplier=1.0,
        contribution_clip=1.0,
        contribution_noise_multiplier=1.0,
        threshold=2.5,
        seed=0,
    )
    dp = DPModel(model, mechanism=mechanism, expected_batch_size=16)
    dp.compile(optimizer=keras.optimizers.legacy.SGD(0.1), loss="mse")
    before = model.layers[1].embeddings.numpy().copy()
    dp.fit(data, epochs=1, verbose=0)
    assert int(mechanism.steps.numpy()) == 4
    changed = np.any(model.layers[1].embeddings.numpy() != before, axis=1).sum()
    assert changed <= int(mechanism.rows_noised.numpy()[0])  # a row may survive twice
    assert 0 < changed < 5000 * 0.1
    report = mechanism.report()
    assert report["gradient_size_reduction"] > 10
    # The realised count of untouched survivors needs the un-noised touches: a diagnostic, not reported.
    assert "mean_noise_only_rows" not in report["tables"][0]
    assert mechanism.diagnostics()["tables"][0]["mean_noise_only_rows"] == pytest.approx(
        report["tables"][0]["expected_noise_only_rows"], rel=0.6
    )


@pytest.mark.parametrize("plus", [False, True], ids=["adafest", "adafest_plus"])
def test_one_trace_of_the_table_step_serves_tables_of_every_shape(plus):
    # Tables of different sizes and widths, one with an empty selection (AdaFEST+) and one with p = 0:
    # the table step is traced once (per kind of draw) and every table still trains.
    from tfdp_embed.keras2.training import DPModel
    from tfdp_embed.mechanisms.adafest_plus import DPAdaFESTPlus

    sizes, dims = (50, 300, 7), (3, 5, 2)
    inputs = [keras.Input((), dtype="int64", name=f"f{i}") for i in range(3)]
    parts = [DPEmbedding(v, d, name=f"t{i}")(x) for i, (v, d, x) in enumerate(zip(sizes, dims, inputs))]
    model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Concatenate()(parts)))
    rng = np.random.default_rng(0)
    x = {f"f{i}": rng.integers(0, v, 64) for i, v in enumerate(sizes)}
    data = tf.data.Dataset.from_tensor_slices((x, np.zeros(64, "float32"))).batch(16)
    kwargs = dict(
        l2_norm_clip=1.0,
        noise_multiplier=1.0,
        contribution_clip=1.0,
        contribution_noise_multiplier=1.0,
        threshold={"t0": 0.5, "t1": 2.0, "t2": 1e6},
        seed=0,
    )
    if plus:
        selected = {"t0": np.arange(0, 50, 2), "t1": np.arange(100, 300), "t2": np.zeros([0], np.int64)}
        mechanism = DPAdaFESTPlus(selected_rows=selected, selection_event=dp_accounting.NoOpDpEvent(), **kwargs)
    else:
        mechanism = DPAdaFEST(**kwargs)
    dp = DPModel(model, mechanism=mechanism, expected_batch_size=16)
    dp.compile(optimizer=keras.optimizers.legacy.SGD(0.1), loss="mse")
    dp.fit(data, epochs=2, verbose=0)
    # t2 draws nothing (p = 0, or an empty selection): a second concrete function, without the draw.
    assert mechanism._table_step_function().traced.experimental_get_tracing_count() == 2
    assert int(mechanism.steps.numpy()) == 8
    assert (mechanism.rows_noised.numpy()[:2] > 0).all()


def test_update_prefetches_its_survivors_rows():
    """Noise-only survivors are rows no lookup read: the update warms them for the optimizer's scatter."""
    import dataclasses

    from tfdp_embed.ops import sparse_rows

    if not sparse_rows.available():
        pytest.skip("fused ops not built: nothing to prefetch with")
    table = make_table(100, 3, [[1, 2], [2]])
    table = dataclasses.replace(table, variable=tf.Variable(tf.zeros([100, 3])))
    mechanism = make_mechanism([table], noise_multiplier=1.0, threshold=1.0)
    graph = tf.function(lambda: mechanism.update(make_step([table], 2))).get_concrete_function().graph
    assert [node.type for node in graph.get_operations()].count("TfdpEmbedPrefetchRows") == 1


# -- noise matches the formulas ------------------------------------------------------
def test_gradient_noise_std_on_touched_and_noise_only_survivors():
    vocab, dim = 100_000, 8
    ids = [[r] for r in range(0, 4000)]  # 4000 touched rows, one example each
    table = make_table(vocab, dim, ids)
    # sigma2 C2 = 2.0 * 0.5 = 1.0. Contribution: sigma1 C1 = 1, tau = 2.3:
    # touched rows (count 1) survive w.p. P(N(0,1) >= 1.3) ~ 0.097; untouched
    # rows w.p. P(N(0,1) >= 2.3) ~ 0.0107, i.e. ~1030 rows.
    mechanism = make_mechanism(
        [table],
        l2_norm_clip=0.5,
        noise_multiplier=2.0,
        contribution_noise_multiplier=1.0,
        threshold=2.3,
    )
    ((slices, _),) = mechanism.update(make_step([table], len(ids)))
    got = as_dict(slices)
    grads = dict(zip(range(4000), table.gradient.values.numpy()))
    touched_noise = np.array([got[r] - grads[r] for r in got if r < 4000]).ravel()
    pure_noise = np.array([got[r] for r in got if r >= 4000]).ravel()
    # ~390 touched survivors x 8 = ~3100 draws, ~1030 x 8 = ~8200 draws:
    # std of a sample std ~ 1/sqrt(2n), <= 1.3%; allow 5 of those.
    assert touched_noise.size > 2000 and pure_noise.size > 6000
    assert np.std(touched_noise) == pytest.approx(1.0, abs=0.065)
    assert np.std(pure_noise) == pytest.approx(1.0, abs=0.04)
    assert abs(np.mean(pure_noise)) < 0.05


def test_noise_only_survivor_count_is_binomial():
    vocab = 1_000_000
    touched = list(range(0, vocab, 400))  # 2500 rows
    table = make_table(vocab, 1, [[r] for r in touched])
    scale = 2.0  # sigma1 C1 = 1.0 * 2.0
    tau = 3.0 * scale  # p = P(Z >= 3) = 0.0013499
    mechanism = make_mechanism([table], contribution_clip=2.0, contribution_noise_multiplier=1.0, threshold=tau)
    p = mechanism.noise_survival_probability
    assert p == pytest.approx(stats.norm.sf(3.0), rel=1e-12)
    steps = 5
    touched_set = set(touched)
    total = 0
    for _ in range(steps):
        ((slices, _),) = mechanism.update(make_step([table], len(touched_set)))
        total += sum(1 for r in slices.indices.numpy() if r not in touched_set)
    n = steps * (vocab - len(touched_set))  # Bernoulli trials on untouched rows
    mean, sd = n * p, math.sqrt(n * p * (1 - p))  # ~6733 +- 82
    assert abs(total - mean) < 5 * sd
    assert int(mechanism.noise_only_rows.numpy()[0]) == total


def test_noise_only_positions_are_uniform_distinct_and_untouched():
    vocab = 50_000
    touched = set(range(0, vocab, 10))  # every tenth row touched
    table = make_table(vocab, 1, [[r] for r in sorted(touched)])
    mechanism = make_mechanism([table], contribution_noise_multiplier=1.0, threshold=threshold_for(0.02, 1.0))
    positions = []
    for _ in range(10):
        ((slices, _),) = mechanism.update(make_step([table], len(touched)))
        rows = slices.indices.numpy()
        assert len(np.unique(rows)) == len(rows)
        extra = rows[~np.isin(rows, sorted(touched))]
        positions.append(extra)
    positions = np.concatenate(positions)
    assert not np.isin(positions, sorted(touched)).any()
    assert positions.min() >= 0 and positions.max() < vocab
    # ~10 x 45,000 x 0.02 = 9000 positions over 40 equal bins (each holds the
    # same number of untouched rows): chi-square goodness of fit.
    counts, _ = np.histogram(positions, bins=40, range=(0, vocab))
    assert stats.chisquare(counts).pvalue > 1e-4


def test_geometric_skips_match_bernoulli_marginals():
    generator = tf.random.Generator.from_seed(7)
    size, p, reps = 200, 0.05, 400
    hits = np.zeros(size)
    lengths = []
    for _ in range(reps):
        pos = geometric_skip_positions(generator, size, p).numpy()
        assert np.all(np.diff(pos) > 0) and (len(pos) == 0 or pos[-1] < size)
        hits[pos] += 1
        lengths.append(len(pos))
    assert np.mean(lengths) == pytest.approx(size * p, abs=5 * math.sqrt(size * p * (1 - p) / reps))
    assert stats.chisquare(hits.reshape(10, 20).sum(1)).pvalue > 1e-4
    assert geometric_skip_positions(generator, 10, 0.0).shape == [0]
    # A chunk that falls short of `size` is extended in the while_loop.
    assert len(geometric_skip_positions(generator, 10**6, 1e-6).numpy()) < 30


@pytest.mark.parametrize("vocab", [10**7, 10**12])
def test_per_step_work_does_not_scale_with_vocabulary(vocab):
    # A 10^12-row contribution map would need 4 TB; we expect ~800 survivors.
    table = make_table(vocab, 16, [[3, 10**6], [5]])
    p = 800.0 / vocab
    mechanism = make_mechanism(
        [table],
        noise_multiplier=1.0,
        contribution_noise_multiplier=1.0,
        threshold=threshold_for(p, 1.0),
    )
    assert mechanism.noise_survival_probability == pytest.approx(p, rel=1e-6)
    mechanism.update(make_step([table], 2))  # warm up
    start = time.perf_counter()
    ((slices, _),) = mechanism.update(make_step([table], 2))
    elapsed = time.perf_counter() - start
    n = slices.indices.shape[0]
    assert abs(n - 800) < 6 * math.sqrt(800) + 3
    assert slices.values.shape == (n, 16)
    assert slices.dense_shape.numpy().tolist() == [vocab, 16]
    assert elapsed < 2.0
    assert mechanism.report()["gradient_size_reduction"] > vocab / 2000


# -- contribution clipping and thresholding -------------------------------------------
def test_contribution_clipping_is_joint_over_tables():
    # Example 0 touches rows 0..99 of A (each twice: duplicates count once) and
    # rows 0..43 of B: n_0 = 144 distinct rows, ||v_0|| = 12, C1 = 3, so each of
    # its rows counts 3/12 = 0.25. Example 1 touches row 0 of A only: ||v_1|| = 1
    # <= C1, counts 1. Row 0 of A: 0.25 + 1 = 1.25.
    a = make_table(1000, 2, [list(range(100)) * 2, [0]], name="a")
    b = make_table(1000, 2, [list(range(44)), []], name="b")
    (rows_a, counts_a), (rows_b, counts_b) = contribution_map([a, b], 2, 3.0)
    got_a = dict(zip(rows_a.numpy().tolist(), counts_a.numpy()))
    got_b = dict(zip(rows_b.numpy().tolist(), counts_b.numpy()))
    assert sorted(got_a) == list(range(100)) and sorted(got_b) == list(range(44))
    assert got_a[0] == pytest.approx(1.25)
    np.testing.assert_allclose([got_a[r] for r in range(1, 100)], 0.25, rtol=1e-6)
    np.testing.assert_allclose(list(got_b.values()), 0.25, rtol=1e-6)
    # Through the mechanism with (almost) no noise: tau = 1 keeps only row 0 of A.
    mechanism = make_mechanism([a, b], contribution_clip=3.0, threshold=1.0)
    (sa, _), (sb, _) = mechanism.update(make_step([a, b], 2))
    assert sa.indices.numpy().tolist() == [0] and sb.indices.numpy().tolist() == []
    assert mechanism.dropped_touched_rows.numpy().tolist() == [99, 44]
    # tau = 0.2 keeps all of them.
    mechanism = make_mechanism([a, b], contribution_clip=3.0, threshold=0.2)
    (sa, _), (sb, _) = mechanism.update(make_step([a, b], 2))
    assert sa.indices.shape[0] == 100 and sb.indices.shape[0] == 44


def test_threshold_drops_rows_with_few_contributors():
    # Row 4 is touched by one example (count 1), row 6 by two (count 2).
    table = make_table(10, 2, [[4, 6], [6]])
    mechanism = make_mechanism([table], contribution_clip=5.0, threshold=1.5)
    ((slices, _),) = mechanism.update(make_step([table], 2))
    assert slices.indices.numpy().tolist() == [6]
    np.testing.assert_allclose(slices.values.numpy()[0], table.gradient.values.numpy()[1])


# -- accounting ----------------------------------------------------------------------
@pytest.mark.parametrize("sigma,ratio", [(0.7, 0.1), (1.0, 1.0), (2.5, 10.0), (1.3, 3.0)])
def test_split_noise_multiplier_composes_back(sigma, ratio):
    s1, s2 = split_noise_multiplier(sigma, ratio=ratio)
    assert s1 / s2 == pytest.approx(ratio, rel=1e-12)
    assert (s1**-2 + s2**-2) ** -0.5 == pytest.approx(sigma, rel=1e-12)
    assert effective_noise_multiplier(s1, s2) == pytest.approx(sigma, rel=1e-12)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(sigma=0.0, ratio=1.0), "`sigma`"),
        (dict(sigma=-1.0, ratio=1.0), "`sigma`"),
        (dict(sigma=1.0, ratio=0.0), "`ratio`"),
        (dict(sigma=1.0, ratio=float("inf")), "`ratio`"),
    ],
)
def test_split_noise_multiplier_rejects_bad_values(kwargs, match):
    sigma = kwargs.pop("sigma")
    with pytest.raises(ValueError, match=match):
        split_noise_multiplier(sigma, **kwargs)
    with pytest.raises(TypeError):
        split_noise_multiplier(1.0, 2.0)  # ratio is keyword-only


def test_step_event_is_one_poisson_gaussian_with_composed_sigma():
    s1, s2 = split_noise_multiplier(1.1, ratio=2.0)
    mechanism = DPAdaFEST(
        l2_norm_clip=1.0,
        noise_multiplier=s2,
        contribution_clip=1.0,
        contribution_noise_multiplier=s1,
        threshold=5.0,
        seed=0,
    )
    event = mechanism.step_event(0.01)
    assert isinstance(event, dp_accounting.PoissonSampledDpEvent)
    assert event.event.noise_multiplier == pytest.approx(1.1)

    def epsilon(e):
        accountant = dp_accounting.pld.PLDAccountant()
        accountant.compose(e, 100)
        return accountant.get_epsilon(1e-5)

    dpsgd = dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.1))
    assert epsilon(event) == pytest.approx(epsilon(dpsgd), rel=1e-9)
    assert mechanism.setup_event() is None
    # sigma2 = 0 is allowed (a test setting) but reports no privacy.
    free = make_mechanism([], noise_multiplier=0.0)
    assert free.effective_noise_multiplier == 0.0


@pytest.mark.parametrize(
    "override,match",
    [
        (dict(threshold=-0.1), "`threshold`"),
        (dict(contribution_noise_multiplier=0.0), "`contribution_noise_multiplier`"),
        (dict(contribution_noise_multiplier=-1.0), "`contribution_noise_multiplier`"),
        (dict(noise_multiplier=-0.5), "`noise_multiplier`"),
        (dict(contribution_clip=0.0), "`contribution_clip`"),
        (dict(contribution_clip=-2.0), "`contribution_clip`"),
        (dict(l2_norm_clip=0.0), "`l2_norm_clip`"),
        (dict(threshold=float("nan")), "`threshold`"),
    ],
)
def test_bad_hyperparameters_raise_clear_errors(override, match):
    args = dict(
        l2_norm_clip=1.0,
        noise_multiplier=1.0,
        contribution_clip=1.0,
        contribution_noise_multiplier=1.0,
        threshold=3.0,
    )
    args.update(override)
    with pytest.raises(ValueError, match=match) as info:
        DPAdaFEST(**args)
    assert "received" in str(info.value)


def test_privacy_arguments_are_keyword_only_and_required():
    with pytest.raises(TypeError):
        DPAdaFEST(1.0, 1.0, 1.0, 1.0, 3.0)
    with pytest.raises(TypeError):
        DPAdaFEST(l2_norm_clip=1.0, noise_multiplier=1.0)  # missing C1, sigma1, tau


def test_low_threshold_warns_that_gradient_is_dense():
    with pytest.warns(UserWarning, match="threshold"):
        DPAdaFEST(
            l2_norm_clip=1.0,
            noise_multiplier=1.0,
            contribution_clip=1.0,
            contribution_noise_multiplier=1.0,
            threshold=0.0,
        )


def test_update_before_init_raises():
    mechanism = DPAdaFEST(
        l2_norm_clip=1.0,
        noise_multiplier=1.0,
        contribution_clip=1.0,
        contribution_noise_multiplier=1.0,
        threshold=3.0,
        seed=0,
    )
    with pytest.raises(RuntimeError, match="init"):
        mechanism.update(make_step([], 1))
