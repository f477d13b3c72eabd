"""Fused sparse-row ops: bit-identical to their TensorFlow references; errors; fallback.

Each op must return exactly (assert_array_equal, not allclose) what the
chain of stock TensorFlow ops it replaces returns, given the same inputs and
the same Philox key; the fallback (no op) must run the reference.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tfdp_embed._keras import tf
from tfdp_embed.ops import fast_normal, sparse_rows

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def op():
    if fast_normal.compiler() is None:
        pytest.skip("no C++ compiler: the op cannot be built")
    assert sparse_rows.available(), fast_normal.unavailable_reason()
    return fast_normal._load()  # noqa: SLF001


def _occurrences(rng, n, batch, vocab, contiguous=True):
    examples = np.sort(rng.integers(0, batch, n)) if contiguous else rng.integers(0, batch, n)
    ids = rng.integers(0, vocab, n)  # small vocab: many repeats, also inside one example
    _, row_index = np.unique(ids, return_inverse=True)
    weights = rng.uniform(0.1, 1.0, n).astype(np.float32)
    return examples.astype(np.int32), row_index.astype(np.int32), weights


@pytest.mark.parametrize("contiguous", [True, False])
def test_scaled_segment_sum_is_bit_identical(op, contiguous):
    rng = np.random.default_rng(0)
    batch, dim, n, vocab = 97, 13, 700, 40
    examples, row_index, weights = _occurrences(rng, n, batch, vocab, contiguous)
    grad = rng.normal(size=(batch, dim)).astype(np.float32)
    clip = rng.uniform(0.0, 1.0, batch).astype(np.float32)
    num_rows = int(row_index.max()) + 1
    got = op.tfdp_embed_scaled_segment_sum(grad, examples, row_index, weights, clip, num_rows).numpy()
    want = sparse_rows.scaled_segment_sum_reference(grad, examples, row_index, weights, clip, num_rows).numpy()
    np.testing.assert_array_equal(got, want)
    # float64 sanity check of the formula itself
    ref = np.zeros((num_rows, dim))
    np.add.at(ref, row_index, (clip[examples] * weights)[:, None].astype(np.float64) * grad[examples])
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("contiguous", [True, False])
def test_pooled_weight_squares_is_bit_identical(op, contiguous):
    rng = np.random.default_rng(1)
    batch, n, vocab = 64, 500, 30
    examples, row_index, weights = _occurrences(rng, n, batch, vocab, contiguous)
    got = op.tfdp_embed_pooled_weight_squares(row_index, examples, weights, batch).numpy()
    want = sparse_rows.pooled_weight_squares_reference(row_index, examples, weights, batch).numpy()
    np.testing.assert_array_equal(got, want)
    # hand check: example 0 reads row 3 twice (w 0.5 + 0.25) and row 4 once (w 1):
    # (0.75)^2 + 1^2 = 1.5625; example 1 reads nothing.
    tiny = op.tfdp_embed_pooled_weight_squares([3, 4, 3], [0, 0, 0], [0.5, 1.0, 0.25], 2).numpy()
    np.testing.assert_array_equal(tiny, [1.5625, 0.0])


def test_noised_values_is_bit_identical_to_noise_then_divide(op):
    values = tf.constant(np.random.default_rng(2).normal(size=(123, 7)).astype(np.float32))
    key = tf.constant([11, 5], tf.int64)
    got = op.tfdp_embed_noised_values(values, key, 1.7, 1024.0).numpy()
    want = sparse_rows.noised_values_reference(values, key, 1.7, 1024.0).numpy()
    np.testing.assert_array_equal(got, want)
    # Through the generator: the same key draw as fast_normal.normal.
    gen = tf.random.Generator.from_key_counter(key=3, counter=[0, 0], alg="philox")
    fused = sparse_rows.noised_values(gen, values, stddev=0.5, divisor=8.0).numpy()
    gen.reset_from_key_counter(key=3, counter=[0, 0])
    two_ops = ((values + fast_normal.normal(gen, tf.shape(values), 0.5)) / 8.0).numpy()
    np.testing.assert_array_equal(fused, two_ops)


def test_noised_values_noise_has_the_formula_std(op):
    # (0 + N(0, s^2)) / B has std s / B: 2^16 draws, tolerance 5 standard errors of the std.
    n = 1 << 16
    z = op.tfdp_embed_noised_values(tf.zeros([n]), tf.constant([1, 9], tf.int64), 3.0, 2.0).numpy()
    assert abs(z.std() - 1.5) < 5 * 1.5 / np.sqrt(2 * n)
    assert abs(z.mean()) < 5 * 1.5 / np.sqrt(n)


def _lazy_reference(table, history, rows, p_hi, p_lo, now, stamp, key, unique):
    """LazyDP._catch_up's TensorFlow ops for plain SGD, on numpy copies."""
    table, history = table.copy(), history.copy()
    behind = history[rows] != 2 * now
    stale = rows[behind]
    if not unique:
        stale = tf.unique(tf.constant(stale)).y.numpy()
    if stale.size:
        start = history[stale] >> 1
        s0 = np.maximum((p_hi[now] - p_hi[start]) + (p_lo[now] - p_lo[start]), 0.0)
        std = tf.cast(tf.sqrt(tf.constant(s0, tf.float64)), tf.float32)
        z = fast_normal.fast_normal([stale.size, table.shape[1]], tf.constant(key, tf.int64), 1.0)
        delta = (std[:, None] * z).numpy()
        updated = tf.Variable(table)
        updated.scatter_add(tf.IndexedSlices(delta, stale))
        table = updated.numpy()
    history[rows] = stamp
    return table, history, stale.size


@pytest.mark.parametrize("unique", [True, False])
def test_lazy_catch_up_is_bit_identical_to_the_tf_path(op, unique):
    rng = np.random.default_rng(3)
    vocab, dim, now = 50, 9, 6
    weights = rng.uniform(0.01, 0.1, now + 1)
    weights[0] = 0.0
    p_hi = np.cumsum(weights)
    p_lo = rng.normal(scale=1e-18, size=now + 1)
    table = rng.normal(size=(vocab, dim)).astype(np.float32)
    history = (2 * rng.integers(0, now + 1, vocab) + rng.integers(0, 2, vocab)).astype(np.int32)
    history[history > 2 * now] = 2 * now
    rows = rng.choice(vocab, 30, replace=False) if unique else rng.integers(0, vocab, 60)
    rows = rows.astype(np.int64)
    key = [21, 4]
    want_table, want_history, want_count = _lazy_reference(table, history, rows, p_hi, p_lo, now, 2 * now + 1, key, unique)
    assert want_count > 0
    t, h = tf.Variable(table), tf.Variable(history)
    count = sparse_rows.lazy_catch_up(t, h, rows, p_hi, p_lo, now, 2 * now + 1, tf.constant(key, tf.int64), unique=unique)
    assert int(count) == want_count
    np.testing.assert_array_equal(t.numpy(), want_table)
    np.testing.assert_array_equal(h.numpy(), want_history)
    # Rows already current are left alone (no draw, no change) apart from the stamp.
    again = sparse_rows.lazy_catch_up(t, h, rows, p_hi, p_lo, now + 0, 2 * now, tf.constant(key, tf.int64), unique=unique)
    assert int(again) == int(np.unique(rows).size)  # stamped 2 now + 1: all behind 2 now
    current = sparse_rows.lazy_catch_up(t, h, rows, p_hi, p_lo, now, 2 * now, tf.constant(key, tf.int64), unique=unique)
    assert int(current) == 0


def test_lazy_catch_up_inside_tf_function_is_not_pruned(op):
    t = tf.Variable(tf.zeros([4, 2]))
    h = tf.Variable(tf.zeros([4], tf.int32))
    p = tf.constant([0.0, 4.0, 8.0], tf.float64)

    @tf.function
    def step():
        sparse_rows.lazy_catch_up(t, h, tf.constant([1, 3], tf.int64), p, tf.zeros([3], tf.float64), 2, 4,
                                  tf.constant([1, 2], tf.int64), unique=True)  # result unused
        return tf.constant(0)

    step()
    np.testing.assert_array_equal(h.numpy(), [0, 4, 0, 4])
    assert np.all(t.numpy()[[0, 2]] == 0) and np.all(t.numpy()[[1, 3]] != 0)


def test_bad_inputs_raise_clear_errors(op):
    with pytest.raises(tf.errors.InvalidArgumentError, match="row index 5 .allowed \\[0, 2\\)"):
        op.tfdp_embed_scaled_segment_sum(tf.ones([2, 3]), [0, 1], [0, 5], [1.0, 1.0], [1.0, 1.0], 2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="`clip_factors` must have 2 entries"):
        op.tfdp_embed_scaled_segment_sum(tf.ones([2, 3]), [0, 1], [0, 1], [1.0, 1.0], [1.0], 2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="example 7"):
        op.tfdp_embed_pooled_weight_squares([0], [7], [1.0], 2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="`divisor` must be finite and > 0"):
        op.tfdp_embed_noised_values(tf.ones([3]), tf.constant([1, 2], tf.int64), 1.0, 0.0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="`stddev` must be finite and >= 0"):
        op.tfdp_embed_noised_values(tf.ones([3]), tf.constant([1, 2], tf.int64), -1.0, 1.0)
    t, h = tf.Variable(tf.zeros([4, 2])), tf.Variable(tf.zeros([4], tf.int32))
    p = tf.zeros([3], tf.float64)
    with pytest.raises(tf.errors.InvalidArgumentError, match="row 9 outside \\[0, 4\\)"):
        sparse_rows.lazy_catch_up(t, h, [9], p, p, 1, 2, tf.constant([1, 2], tf.int64), unique=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match="must index the step sums"):
        sparse_rows.lazy_catch_up(t, h, [1], p, p, 5, 2, tf.constant([1, 2], tf.int64), unique=True)


def test_fallback_runs_the_references_and_training_still_works(tmp_path):
    """Without the library (TFDP_EMBED_FAST_NORMAL=0) every wrapper runs its reference,
    clipping gives the same bits, and EANA and LazyDP train (LazyDP on its TF path)."""
    script = """
        import numpy as np
        from tfdp_embed._keras import keras, tf
        from tfdp_embed.ops import sparse_rows
        from tfdp_embed import DPEmbedding, DPModel
        from tfdp_embed.mechanisms import EANA, LazyDP
        rng = np.random.default_rng(0)
        g = rng.normal(size=(5, 3)).astype(np.float32)
        out = sparse_rows.scaled_segment_sum(g, [0, 1, 1, 4], [0, 1, 0, 2], [1.0, 0.5, 0.5, 1.0], [1.0, 0.5, 1.0, 1.0, 0.2], 3)
        print("segsum", repr(out.numpy().round(6).tolist()))
        print("wsq", sparse_rows.pooled_weight_squares([3, 4, 3], [0, 0, 0], [0.5, 1.0, 0.25], 2).numpy().tolist())
        results = {}
        for name, mech in [("eana", EANA(l2_norm_clip=1.0, noise_multiplier=0.0, seed=0)),
                           ("lazy", LazyDP(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0))]:
            keras.utils.set_random_seed(0)
            ids = keras.Input((3,), dtype="int64")
            x = DPEmbedding(50, 4, combiner="mean", name="t")(ids)
            model = keras.Model(ids, keras.layers.Dense(1)(x))
            dp = DPModel(model, mechanism=mech, expected_batch_size=8)
            dp.compile(optimizer=keras.optimizers.legacy.SGD(0.1), loss=keras.losses.BinaryCrossentropy(from_logits=True))
            data = tf.data.Dataset.from_tensor_slices((rng.integers(0, 50, (32, 3)), rng.integers(0, 2, (32, 1)).astype("float32"))).batch(8)
            dp.fit(data, epochs=1, verbose=0)
            dp.flush()
            results[name] = model.get_weights()[0]
        print("eana_weights", repr(results["eana"].round(7).tolist()))
        print("lazy_finite", bool(np.isfinite(results["lazy"]).all()))
        print("available", sparse_rows.available())
    """
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO))
    runs = {}
    for mode, extra in [("op", {}), ("fallback", {"TFDP_EMBED_FAST_NORMAL": "0"})]:
        proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                              env=dict(env, **extra), timeout=300, cwd=REPO)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[mode] = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    assert runs["fallback"]["available"] == "False"
    assert runs["op"]["available"] == ("True" if fast_normal.compiler() else "False")
    for field in ("segsum", "wsq", "eana_weights"):  # no noise: identical bits either way
        assert runs["op"][field] == runs["fallback"][field], field
    assert runs["op"]["wsq"] == "[1.5625, 0.0]"
    assert runs["fallback"]["lazy_finite"] == "True" and runs["op"]["lazy_finite"] == "True"


def test_noised_values_streams_are_the_offset_keys(op):
    values = [tf.constant(np.arange(10, dtype=np.float32)), tf.ones([3, 70])]
    gen = tf.random.Generator.from_key_counter(key=5, counter=[0, 0], alg="philox")
    many = sparse_rows.noised_values_many(gen, values, stddev=2.0, divisor=4.0)
    gen.reset_from_key_counter(key=5, counter=[0, 0])
    key = gen.uniform_full_int([2], dtype=tf.int64)
    for stream, (got, v) in enumerate(zip(many, values)):
        np.testing.assert_array_equal(got.numpy(), sparse_rows.noised_values_reference(v, key, 2.0, 4.0, stream).numpy())
    # Different streams of one key are different noise.
    a, b = sparse_rows.noised_values_many(gen, [tf.zeros([256]), tf.zeros([256])], stddev=1.0, divisor=1.0)
    assert abs(np.corrcoef(a.numpy(), b.numpy())[0, 1]) < 5 / np.sqrt(256)


def test_lazy_lookahead_with_out_of_range_ids_is_refused(op):
    from tfdp_embed._keras import keras
    from tfdp_embed.layers.embedding import DPEmbedding
    from tfdp_embed.mechanisms import LazyDP

    layer = DPEmbedding(10, 2, combiner="mean", name="t")
    layer.build(None)
    mech = LazyDP(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0)
    mech.init(tables=[layer], dense_variables=[], optimizer=keras.optimizers.legacy.SGD(0.1))
    assert mech._fused(0)  # noqa: SLF001 - this test is about the fused path
    with pytest.raises(tf.errors.InvalidArgumentError, match="row 12 outside \\[0, 10\\).*lookahead"):
        mech.after_apply({"t": tf.constant([[1, 12]], tf.int64)})
