"""Fused sparse-row ops: bit-identical to their TensorFlow references; errors; fallback.

Each op must return exactly (assert_array_equal, not allclose) what the
chain of stock TensorFlow ops it replaces returns, given the same inputs and
the same Philox key; the fallback (no op) must run the reference.
"""

from __future__ import annotations

import ast
import os
import platform
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tfdp_embed.keras2._keras import tf
from tfdp_embed.ops import fast_normal, sparse_rows

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def op():
    if fast_normal.compiler() is None:
        pytest.skip("no C++ compiler: the op cannot be built")
    assert sparse_rows.available(), fast_normal.unavailable_reason()
    return fast_normal._load()


def _occurrences(rng, n, batch, vocab, contiguous=True):
    examples = np.sort(rng.integers(0, batch, n)) if contiguous else rng.integers(0, batch, n)
    ids = rng.integers(0, vocab, n)  # small vocab: many repeats, also inside one example
    _, row_index = np.unique(ids, return_inverse=True)
    weights = rng.uniform(0.1, 1.0, n).astype(np.float32)
    return examples.astype(np.int32), row_index.astype(np.int32), weights


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("n, vocab", [(0, 5), (1, 5), (700, 40), (4096, 2**40)])
def test_unique_equals_tf_unique(op, dtype, n, vocab):
    rng = np.random.default_rng(n)
    high = min(vocab, np.iinfo(dtype).max)
    x = rng.integers(-high, high, n).astype(dtype)  # negative ids too: the op must not assume ids >= 0
    y, idx = op.tfdp_embed_unique(x)
    want = tf.unique(x, out_idx=tf.int32)
    assert y.dtype == want.y.dtype and idx.dtype == tf.int32
    np.testing.assert_array_equal(y.numpy(), want.y.numpy())
    np.testing.assert_array_equal(idx.numpy(), want.idx.numpy())
    wrapped = sparse_rows.unique(tf.constant(x))
    np.testing.assert_array_equal(wrapped[1].numpy(), want.idx.numpy())


def test_unique_hand_values_and_bad_input(op):
    y, idx = sparse_rows.unique(tf.constant([7, 3, 7, 7, -1, 3], tf.int64))
    assert y.numpy().tolist() == [7, 3, -1] and idx.numpy().tolist() == [0, 1, 0, 0, 2, 1]
    with pytest.raises(TypeError, match="int32 or int64"):
        sparse_rows.unique(tf.constant([1.0, 2.0]))
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="rank|vector"):
        op.tfdp_embed_unique(tf.constant([[1, 2]], tf.int64))


@pytest.mark.parametrize("use_bias", [True, False])
@pytest.mark.parametrize("batch, d, p", [(0, 4, 2), (1, 1, 1), (37, 13, 3), (1024, 64, 64), (5, 200, 9)])
def test_dense_ghost_norms_match_the_reference(op, use_bias, batch, d, p):
    """Not bit-identical (summation order), so checked against float64 sums: within
    a few float32 ulp, as close as reduce_sum's own result."""
    rng = np.random.default_rng(batch + d)
    x = rng.normal(size=(batch, d)).astype(np.float32)
    g = (rng.normal(size=(batch, p)) * 1e-3).astype(np.float32)
    got = op.tfdp_embed_dense_ghost_norms(x, g, use_bias=use_bias).numpy()
    x64, g64 = x.astype(np.float64), g.astype(np.float64)
    want = ((x64**2).sum(1) + float(use_bias)) * (g64**2).sum(1)
    assert got.shape == (batch,) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=4e-7 * max(d, p) ** 0.5 + 1e-7, atol=0)
    reference = sparse_rows.dense_ghost_norms_reference(x, g, use_bias=use_bias).numpy()
    np.testing.assert_allclose(got, reference, rtol=1e-5, atol=0)
    wrapped = sparse_rows.dense_ghost_norms(tf.constant(x), tf.constant(g), use_bias=use_bias)
    np.testing.assert_array_equal(wrapped.numpy(), got)


def test_dense_ghost_norms_hand_values_fallback_dtypes_and_bad_input(op):
    x = tf.constant([[3.0, 4.0], [0.0, 0.0]])
    g = tf.constant([[1.0, 2.0, 2.0], [2.0, 0.0, 0.0]])
    assert sparse_rows.dense_ghost_norms(x, g, use_bias=False).numpy().tolist() == [225.0, 0.0]
    assert sparse_rows.dense_ghost_norms(x, g, use_bias=True).numpy().tolist() == [234.0, 4.0]
    as64 = sparse_rows.dense_ghost_norms(tf.cast(x, tf.float64), tf.cast(g, tf.float64), use_bias=True)
    assert as64.dtype == tf.float64 and as64.numpy().tolist() == [234.0, 4.0]  # the reference, in float64
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="Dimensions must be equal|same batch"):
        op.tfdp_embed_dense_ghost_norms(tf.ones([3, 2]), tf.ones([4, 2]), use_bias=True)
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="rank|must be matrices"):
        op.tfdp_embed_dense_ghost_norms(tf.ones([3]), tf.ones([3, 2]), use_bias=True)


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


def _lazy_state(rng, vocab=50, dim=9, now=6, capacity=None):
    """A LazyDP state at step `now`: step sums, histories from 0..now (some flagged), stream."""
    weights = rng.uniform(0.01, 0.1, now + 1)
    weights[0] = 0.0
    capacity = capacity or now + 1
    p_hi = np.zeros(capacity)
    p_lo = np.zeros(capacity)
    p_hi[: now + 1] = np.cumsum(weights)
    p_lo[: now + 1] = rng.normal(scale=1e-18, size=now + 1)
    history = (2 * rng.integers(0, now + 1, vocab) + rng.integers(0, 2, vocab)).astype(np.int32)
    history[history > 2 * now] = 2 * now
    return dict(
        table=rng.normal(size=(vocab, dim)).astype(np.float32),
        history=history,
        p_hi=p_hi,
        p_lo=p_lo,
        steps=np.int64(now),
        stream=np.array([21, 4, 3], np.int64),
    )


def _variables(state):
    return {name: tf.Variable(value, shape=[None] if name.startswith("p_") else None) for name, value in state.items()}


def _catch_up_args(v, rows):
    return (v["table"], v["history"], rows, v["p_hi"], v["p_lo"], v["steps"], v["stream"])


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("repeats", [False, True])
def test_lazy_catch_up_is_bit_identical_to_the_tf_ops(op, dtype, repeats):
    rng = np.random.default_rng(3)
    state = _lazy_state(rng)
    rows = (rng.integers(0, 50, 60) if repeats else rng.choice(50, 30, replace=False)).astype(dtype)
    fused, reference = _variables(state), _variables(state)
    count = sparse_rows.lazy_catch_up(*_catch_up_args(fused, rows))
    want = sparse_rows.lazy_catch_up_reference(*_catch_up_args(reference, rows))
    assert int(count) == int(want) > 0
    for name in state:
        np.testing.assert_array_equal(fused[name].numpy(), reference[name].numpy(), err_msg=name)
    # Semantics, from numpy: behind rows caught up once, in first-appearance order, with the
    # stream (21, 4 + 3); every row current; one call counted.
    behind = [r for r in dict.fromkeys(rows.tolist()) if state["history"][r] != 12]
    assert int(count) == len(behind)
    np.testing.assert_array_equal(fused["history"].numpy()[rows], 12)
    np.testing.assert_array_equal(fused["stream"].numpy(), [21, 4, 4])
    start = state["history"][behind] >> 1
    s0 = np.maximum((state["p_hi"][6] - state["p_hi"][start]) + (state["p_lo"][6] - state["p_lo"][start]), 0.0)
    z = fast_normal.fast_normal([len(behind), 9], tf.constant([21, 7], tf.int64), 1.0).numpy()
    expected = state["table"].copy()
    expected[behind] += np.sqrt(s0).astype(np.float32)[:, None] * z
    np.testing.assert_array_equal(fused["table"].numpy(), expected)
    untouched = np.setdiff1d(np.arange(50), behind)
    np.testing.assert_array_equal(fused["table"].numpy()[untouched], state["table"][untouched])
    # A second call finds every row current: no draw, nothing moves, the stream is not used.
    again = sparse_rows.lazy_catch_up(*_catch_up_args(fused, rows))
    assert int(again) == 0
    np.testing.assert_array_equal(fused["table"].numpy(), expected)
    np.testing.assert_array_equal(fused["stream"].numpy(), [21, 4, 4])


@pytest.mark.parametrize("dim", [9, 64, 0])
def test_lazy_catch_up_split_equals_the_single_op(op, dim):
    """Noise op (no table access) + add op: the same table, history and stream as one catch-up."""
    rng = np.random.default_rng(8)
    state = _lazy_state(rng, vocab=300, dim=dim)
    rows = rng.integers(0, 300, 500).astype(np.int32)  # repeats, more than one 4096-float block
    single, split = _variables(state), _variables(state)
    count = sparse_rows.lazy_catch_up(*_catch_up_args(single, rows))
    split_count = sparse_rows.lazy_catch_up_split(*_catch_up_args(split, rows))
    assert int(count) == int(split_count) > 0
    for name in state:
        np.testing.assert_array_equal(split[name].numpy(), single[name].numpy(), err_msg=name)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("dim", [9, 64])
def test_lazy_catch_up_gather_is_the_catch_up_then_tf_gather(op, dtype, dim):
    """Same table, history and stream as `lazy_catch_up`; values = tf.gather of the caught-up table."""
    rng = np.random.default_rng(11)
    state = _lazy_state(rng, vocab=300, dim=dim)
    rows = rng.integers(0, 300, (100, 5)).astype(dtype)  # repeats, rank 2: flattened like the lookup
    single, fused = _variables(state), _variables(state)
    sparse_rows.lazy_catch_up(*_catch_up_args(single, rows))
    values = sparse_rows.lazy_catch_up_gather(*_catch_up_args(fused, rows))
    for name in state:
        np.testing.assert_array_equal(fused[name].numpy(), single[name].numpy(), err_msg=name)
    assert values.shape == (500, dim)
    np.testing.assert_array_equal(values.numpy(), single["table"].numpy()[rows.reshape(-1)])
    empty = sparse_rows.lazy_catch_up_gather(*_catch_up_args(fused, np.zeros([0], dtype)))
    assert empty.shape == (0, dim)
    with pytest.raises(tf.errors.InvalidArgumentError, match="row 300 outside \\[0, 300\\)"):
        sparse_rows.lazy_catch_up_gather(*_catch_up_args(fused, np.array([1, 300], dtype)))


def test_lazy_catch_up_gather_has_the_gather_gradient(op):
    rng = np.random.default_rng(12)
    v = _variables(_lazy_state(rng, vocab=40, dim=3))
    rows = np.array([3, 7, 3, 39], np.int64)
    upstream = tf.constant(rng.normal(size=(4, 3)).astype(np.float32))
    with tf.GradientTape() as tape:
        values = sparse_rows.lazy_catch_up_gather(*_catch_up_args(v, rows))
        loss = tf.reduce_sum(values * upstream)
    grad = tape.gradient(loss, v["table"])
    assert isinstance(grad, tf.IndexedSlices)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(v["table"], rows) * upstream)
    want = tape.gradient(loss, v["table"])
    np.testing.assert_array_equal(tf.convert_to_tensor(grad).numpy(), tf.convert_to_tensor(want).numpy())
    assert grad.dense_shape.numpy().tolist() == [40, 3]


def test_lazy_add_rows_adds_in_place_and_refuses_bad_rows(op):
    table = tf.Variable(np.arange(12, dtype=np.float32).reshape(4, 3))
    op.tfdp_embed_lazy_add_rows(table.handle, tf.constant([2, 0, 2], tf.int64), tf.ones([3, 3]))
    np.testing.assert_array_equal(table.numpy()[:, 0], [1, 3, 8, 9])
    with pytest.raises(tf.errors.InvalidArgumentError, match="row 4 outside \\[0, 4\\)"):
        op.tfdp_embed_lazy_add_rows(table.handle, tf.constant([4], tf.int64), tf.ones([1, 3]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="`values` must be \\[1, 3\\]"):
        op.tfdp_embed_lazy_add_rows(table.handle, tf.constant([1], tf.int64), tf.ones([1, 2]))


@pytest.mark.parametrize("dim", [1, 7, 64])
def test_rows_sum_matches_the_reference_and_is_finite_exactly_when_the_rows_are(op, dim):
    rng = np.random.default_rng(dim)
    values = rng.normal(size=(50, dim)).astype(np.float32)
    values[3, 0] = values[9, -1] = np.finfo(np.float32).max  # a float32 sum of these two rows overflows
    table = tf.Variable(values)
    rows = tf.constant(rng.integers(0, 50, 300).tolist() + [3, 9], tf.int64)
    total = sparse_rows.rows_sum(table, rows)
    assert total.dtype == tf.float64 and np.isfinite(total.numpy())
    np.testing.assert_allclose(total.numpy(), sparse_rows.rows_sum_reference(table, rows).numpy(), rtol=1e-12)
    np.testing.assert_allclose(total.numpy(), values[rows.numpy()].astype(np.float64).sum(), rtol=1e-12)
    for bad in (np.nan, np.inf, -np.inf):
        table[9, 0].assign(bad)
        assert not np.isfinite(sparse_rows.rows_sum(table, rows).numpy())
        assert np.isfinite(sparse_rows.rows_sum(table, tf.constant([0, 1], tf.int64)).numpy())  # row 9 unread
    assert sparse_rows.rows_sum(table, tf.zeros([0], tf.int64)).numpy() == 0.0
    with pytest.raises(tf.errors.InvalidArgumentError, match="row 50 is outside \\[0, 50\\)"):
        op.tfdp_embed_rows_sum(table.handle, tf.constant([50], tf.int64))


def test_lazy_catch_up_calls_draw_independent_streams(op):
    """Two catch-ups of one step use streams (k0, k1 + c), c = 0, 1: different noise."""
    state = _lazy_state(np.random.default_rng(4), vocab=400, dim=8)
    state["history"][:] = 0
    state["stream"][2] = 0
    v = _variables(state)
    sparse_rows.lazy_catch_up(*_catch_up_args(v, np.arange(200)))
    sparse_rows.lazy_catch_up(*_catch_up_args(v, np.arange(200, 400)))
    delta = v["table"].numpy() - state["table"]
    assert abs(np.corrcoef(delta[:200].ravel(), delta[200:].ravel())[0, 1]) < 5 / np.sqrt(1600)
    np.testing.assert_array_equal(v["stream"].numpy(), [21, 4, 2])


@pytest.mark.parametrize("now,capacity", [(6, 16), (6, 7), (15, 16)])
def test_lazy_record_step_is_bit_identical_to_the_tf_ops(op, now, capacity):
    """Records p[now + 1], sets the stream, advances the step; grows the sums when full."""
    state = _lazy_state(np.random.default_rng(5), now=now, capacity=capacity)
    fused, reference = _variables(state), _variables(state)
    lr, scale, key = np.float32(0.3), 1.3 * 2.0 / 7.0, tf.constant([99, -5], tf.int64)
    for v, fn in ((fused, sparse_rows.lazy_record_step), (reference, sparse_rows.lazy_record_step_reference)):
        fn(v["p_hi"], v["p_lo"], v["steps"], v["stream"], lr, scale, key, first_stream=3)
    for name in state:
        np.testing.assert_array_equal(fused[name].numpy(), reference[name].numpy(), err_msg=name)
    assert int(fused["steps"].numpy()) == now + 1
    np.testing.assert_array_equal(fused["stream"].numpy(), [99, -2, 0])
    grown = capacity + max(capacity, now + 2 - capacity) if now + 1 >= capacity else capacity
    assert fused["p_hi"].numpy().size == grown
    w = (float(lr) * scale) ** 2
    total = fused["p_hi"].numpy()[now + 1] + fused["p_lo"].numpy()[now + 1]
    assert total == pytest.approx(state["p_hi"][now] + state["p_lo"][now] + w, rel=1e-15)


def test_lazy_ops_inside_tf_function_are_not_pruned(op):
    v = _variables(_lazy_state(np.random.default_rng(6), vocab=4, dim=2, now=2, capacity=8))
    v["history"].assign([0, 0, 0, 0])

    @tf.function
    def step():
        sparse_rows.lazy_catch_up(*_catch_up_args(v, tf.constant([1, 3], tf.int64)))  # result unused
        sparse_rows.lazy_record_step(v["p_hi"], v["p_lo"], v["steps"], v["stream"], 0.1, 1.0, [1, 2])
        return tf.constant(0)

    before = v["table"].numpy()
    step()
    np.testing.assert_array_equal(v["history"].numpy(), [0, 4, 0, 4])
    after = v["table"].numpy()
    assert np.all(after[[0, 2]] == before[[0, 2]]) and np.all(after[[1, 3]] != before[[1, 3]])
    assert int(v["steps"].numpy()) == 3


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
    v = _variables(_lazy_state(np.random.default_rng(7), vocab=4, dim=2, now=2))
    with pytest.raises(tf.errors.InvalidArgumentError, match="row 9 outside \\[0, 4\\)"):
        sparse_rows.lazy_catch_up(*_catch_up_args(v, [9]))
    v["history"].assign([0, 0, 40, 0])  # step 20 > now
    with pytest.raises(tf.errors.InvalidArgumentError, match="history of row 2 is 20, outside"):
        sparse_rows.lazy_catch_up(*_catch_up_args(v, [1, 2]))
    assert v["history"].numpy().tolist() == [0, 0, 40, 0]  # the failed call changed nothing
    v["steps"].assign(5)
    with pytest.raises(tf.errors.InvalidArgumentError, match="step sums .* must cover step 5"):
        sparse_rows.lazy_catch_up(*_catch_up_args(v, [1]))
    v["steps"].assign(1 << 30)
    with pytest.raises(tf.errors.InvalidArgumentError, match="step counter is 1073741824; allowed"):
        sparse_rows.lazy_catch_up(*_catch_up_args(v, [1]))
    v["steps"].assign((1 << 30) - 1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="holds 2\\^30 - 1 steps"):
        sparse_rows.lazy_record_step(v["p_hi"], v["p_lo"], v["steps"], v["stream"], 0.1, 1.0, [1, 2])
    v["steps"].assign(2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="must be finite"):
        sparse_rows.lazy_record_step(v["p_hi"], v["p_lo"], v["steps"], v["stream"], float("nan"), 1.0, [1, 2])
    with pytest.raises(tf.errors.InvalidArgumentError, match="`key` must have shape \\[2\\]"):
        sparse_rows.lazy_record_step(v["p_hi"], v["p_lo"], v["steps"], v["stream"], 0.1, 1.0, [1, 2, 3])
    with pytest.raises(ValueError, match="first_stream"):
        sparse_rows.lazy_record_step(v["p_hi"], v["p_lo"], v["steps"], v["stream"], 0.1, 1.0, [1, 2], first_stream=-1)
    wrong = tf.Variable(tf.zeros([4, 2], tf.float64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="`table` must be an initialized float variable of rank 2"):
        op.tfdp_embed_lazy_catch_up(
            wrong.handle,
            v["history"].handle,
            [1],
            v["p_hi"].handle,
            v["p_lo"].handle,
            v["steps"].handle,
            v["stream"].handle,
        )


def test_fallback_runs_the_references_and_training_still_works(tmp_path):
    """Without the library (TFDP_EMBED_FAST_NORMAL=0) every wrapper runs its reference,
    clipping gives the same bits (the Dense ghost norms: the same to float rounding),
    and EANA and LazyDP train (LazyDP on its TF path)."""
    script = """
        import numpy as np
        from tfdp_embed.keras2._keras import keras, tf
        from tfdp_embed.ops import sparse_rows
        from tfdp_embed import DPEmbedding, DPModel
        from tfdp_embed.mechanisms import EANA, LazyDP
        rng = np.random.default_rng(0)
        g = rng.normal(size=(5, 3)).astype(np.float32)
        out = sparse_rows.scaled_segment_sum(g, [0, 1, 1, 4], [0, 1, 0, 2], [1.0, 0.5, 0.5, 1.0], [1.0, 0.5, 1.0, 1.0, 0.2], 3)
        print("segsum", repr(out.numpy().round(6).tolist()))
        print("wsq", sparse_rows.pooled_weight_squares([3, 4, 3], [0, 0, 0], [0.5, 1.0, 0.25], 2).numpy().tolist())
        print("unique", [t.numpy().tolist() for t in sparse_rows.unique(tf.constant([5, 2, 5, 9], tf.int64))])
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
        proc = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(script)],
            capture_output=True,
            text=True,
            env=dict(env, **extra),
            timeout=300,
            cwd=REPO,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[mode] = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    assert runs["fallback"]["available"] == "False"
    assert runs["op"]["available"] == ("True" if fast_normal.compiler() else "False")
    for field in ("segsum", "wsq", "unique"):  # identical bits either way
        assert runs["op"][field] == runs["fallback"][field], field
    # No noise: the same training; the Dense ghost norms sum in another order (ulp-level).
    np.testing.assert_allclose(
        np.array(ast.literal_eval(runs["op"]["eana_weights"])),
        np.array(ast.literal_eval(runs["fallback"]["eana_weights"])),
        rtol=1e-5,
        atol=1e-7,
    )
    assert runs["op"]["wsq"] == "[1.5625, 0.0]"
    assert runs["fallback"]["lazy_finite"] == "True" and runs["op"]["lazy_finite"] == "True"


def test_noised_values_streams_are_the_offset_keys(op):
    values = [tf.constant(np.arange(10, dtype=np.float32)), tf.ones([3, 70])]
    gen = tf.random.Generator.from_key_counter(key=5, counter=[0, 0], alg="philox")
    many = sparse_rows.noised_values_many(gen, values, stddev=2.0, divisor=4.0)
    gen.reset_from_key_counter(key=5, counter=[0, 0])
    key = gen.uniform_full_int([2], dtype=tf.int64)
    for stream, (got, v) in enumerate(zip(many, values)):
        np.testing.assert_array_equal(
            got.numpy(), sparse_rows.noised_values_reference(v, key, 2.0, 4.0, stream).numpy()
        )
    # Different streams of one key are different noise.
    a, b = sparse_rows.noised_values_many(gen, [tf.zeros([256]), tf.zeros([256])], stddev=1.0, divisor=1.0)
    assert abs(np.corrcoef(a.numpy(), b.numpy())[0, 1]) < 5 / np.sqrt(256)


def test_lazy_lookahead_with_out_of_range_ids_is_refused(op):
    from tfdp_embed.keras2._keras import keras
    from tfdp_embed.keras2.layers.embedding import DPEmbedding
    from tfdp_embed.mechanisms import LazyDP

    layer = DPEmbedding(10, 2, combiner="mean", name="t")
    layer.build(None)
    mech = LazyDP(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0)
    mech.init(tables=[layer], dense_variables=[], optimizer=keras.optimizers.legacy.SGD(0.1))
    assert mech._fused(0)  # this test is about the fused path
    with pytest.raises(tf.errors.InvalidArgumentError, match="row 12 outside \\[0, 10\\).*lookahead"):
        mech.after_apply({"t": tf.constant([[1, 12]], tf.int64)})


@pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or shutil.which("objdump") is None,
    reason="checks x86 machine code with objdump",
)
def test_catch_up_row_prefetches_survive_compilation(op):
    """The catch-up prefetches the table rows it will add noise to. GCC 12 silently deleted
    those prefetches when they were `__builtin_prefetch` loops inlined into the shard
    lambda (the catch-up then stalled on every row); the inline-asm prefetch must be
    in the compiled catch-up."""
    library = fast_normal.build()
    listing = subprocess.run(
        ["objdump", "-d", "-C", "--no-show-raw-insn", str(library)], capture_output=True, text=True, timeout=120
    ).stdout
    functions = listing.split("\n\n")
    catch_up = [
        f
        for f in functions
        if re.search(r"LazyCatchUpOp(<\w+>)?::AddNoise", f.split("\n", 1)[0]) and "_M_invoke" in f.split("\n", 1)[0]
    ]
    assert catch_up, "the catch-up's shard function was not found in the library"
    assert all("prefetcht0" in f for f in catch_up), "the catch-up's row prefetches were compiled away"


def _op_types(fn, *args) -> set:
    return {node.type for node in tf.function(fn).get_concrete_function(*args).graph.get_operations()}


def test_prefetch_rows_changes_nothing_and_skips_rows_out_of_range(op):
    values = np.arange(40, dtype=np.float32).reshape(10, 4)
    table = tf.Variable(values)
    for rows in ([3, 3, 9, 0], [-1, 10, 2**40, 5], [], [[1, 2], [3, 4]]):
        sparse_rows.prefetch_rows(table, tf.constant(rows, tf.int64))
    sparse_rows.prefetch_rows(table, tf.constant([1, 7], tf.int32))
    np.testing.assert_array_equal(table.numpy(), values)
    assert "TfdpEmbedPrefetchRows" in _op_types(lambda: sparse_rows.prefetch_rows(table, tf.constant([1], tf.int64)))


def test_prefetch_rows_is_skipped_where_it_cannot_run(op):
    """Tables without one float32 resource handle get no op (and no error)."""
    rows = tf.constant([0, 1], tf.int64)
    ints = tf.Variable(tf.zeros([4, 2], tf.int32))
    assert "TfdpEmbedPrefetchRows" not in _op_types(lambda: sparse_rows.prefetch_rows(ints, rows))
    sparse_rows.prefetch_rows("not a variable", rows)
    from tensorflow.python.distribute.sharded_variable import ShardedVariable

    sharded = ShardedVariable([tf.Variable(tf.zeros([2, 2])), tf.Variable(tf.zeros([2, 2]))])
    assert "TfdpEmbedPrefetchRows" not in _op_types(lambda: sparse_rows.prefetch_rows(sharded, rows))
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():  # its handle raises outside a replica
        mirrored = tf.Variable(tf.zeros([4, 2]))
    assert "TfdpEmbedPrefetchRows" not in _op_types(lambda: sparse_rows.prefetch_rows(mirrored, rows))


@pytest.mark.parametrize("dim", [1, 7, 64])
def test_scatter_add_sum_writes_as_resource_scatter_add_and_sums_what_it_wrote(op, dim):
    """Distinct rows (as the mechanisms hand them): bit-identical to ResourceScatterAdd of updates * scale.

    Repeated rows add in the order of `rows` (np.add.at's order). TensorFlow's own scatter may add
    them in another order on several threads: it is compared on distinct rows only.
    """
    rng = np.random.default_rng(dim)
    start = rng.normal(size=(20_000, dim)).astype(np.float32)
    rows = tf.constant(rng.permutation(20_000)[:5000], tf.int64)
    updates = rng.normal(size=(5000, dim)).astype(np.float32)
    scale = np.float32(-0.37)
    fused, reference = tf.Variable(start), tf.Variable(start)
    total = sparse_rows.scatter_add_sum(fused, rows, updates, scale)
    tf.raw_ops.ResourceScatterAdd(resource=reference.handle, indices=rows, updates=updates * scale)
    np.testing.assert_array_equal(fused.numpy(), reference.numpy())
    want = sparse_rows.scatter_add_sum_reference(tf.Variable(start), rows, updates, scale)
    np.testing.assert_allclose(total.numpy(), want.numpy(), rtol=1e-9)
    repeated = rng.integers(0, 300, 5000)  # many repeats: each row's writes stay in order
    table = tf.Variable(start[:300])
    sparse_rows.scatter_add_sum(table, tf.constant(repeated, tf.int64), updates, scale)
    expected = start[:300].copy()
    np.add.at(expected, repeated, updates * scale)
    np.testing.assert_array_equal(table.numpy(), expected)
    empty = sparse_rows.scatter_add_sum(fused, tf.zeros([0], tf.int64), tf.zeros([0, dim]), scale)
    assert empty.numpy() == 0.0


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_scatter_add_sum_is_not_finite_exactly_when_a_written_value_is_not(op, bad):
    big = np.finfo(np.float32).max
    table = tf.Variable([[big, 1.0], [2.0, 3.0], [bad, 0.0]])  # row 2 is not written below
    rows, updates = tf.constant([0, 1, 0], tf.int64), tf.zeros([3, 2])
    assert np.isfinite(sparse_rows.scatter_add_sum(table, rows, updates, 1.0).numpy())  # big + big: float64
    assert not np.isfinite(sparse_rows.scatter_add_sum(table, tf.constant([2], tf.int64), tf.zeros([1, 2]), 1.0))
    overflow = tf.constant([[big, 0.0]])
    assert not np.isfinite(sparse_rows.scatter_add_sum(table, tf.constant([0], tf.int64), overflow, 1.0).numpy())
    assert np.isinf(table.numpy()[0, 0])


def test_scatter_add_sum_refuses_bad_rows_and_shapes_before_writing(op):
    table = tf.Variable(tf.ones([4, 3]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="row 4 is outside \\[0, 4\\)"):
        op.tfdp_embed_scatter_add_sum(table.handle, tf.constant([0, 4], tf.int64), tf.ones([2, 3]), 1.0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="`updates` must have shape \\[2, 3\\]"):
        op.tfdp_embed_scatter_add_sum(table.handle, tf.constant([0, 1], tf.int64), tf.ones([2, 2]), 1.0)
    np.testing.assert_array_equal(table.numpy(), np.ones([4, 3]))  # nothing written


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("dim", [1, 16, 64])
def test_momentum_sum_steps_as_keras_sparse_momentum(op, dim, nesterov):
    """Bit-identical to ResourceSparseApplyKerasMomentum (table and slot) on distinct rows."""
    rng = np.random.default_rng(dim)
    start = rng.normal(size=(20_000, dim)).astype(np.float32)
    slot = rng.normal(size=(20_000, dim)).astype(np.float32)
    rows = tf.constant(rng.permutation(20_000)[:5000], tf.int64)  # distinct: Keras dedups before this op
    grad = tf.constant(rng.normal(size=(5000, dim)).astype(np.float32))
    lr, momentum = tf.constant(0.37), tf.constant(0.9)
    fused = (tf.Variable(start), tf.Variable(slot))
    reference = (tf.Variable(start), tf.Variable(slot))
    total = sparse_rows.momentum_sum(*fused, rows, grad, lr, momentum, nesterov=nesterov)
    want = sparse_rows.momentum_sum_reference(*reference, rows, grad, lr, momentum, nesterov=nesterov)
    for got, expected in zip(fused, reference):
        np.testing.assert_array_equal(got.numpy(), expected.numpy())
    assert total.dtype == tf.float64 and np.isfinite(total.numpy()) and np.isfinite(want.numpy())
    table = fused[0]
    table[int(rows[0]), 0].assign(np.nan)
    assert not np.isfinite(sparse_rows.momentum_sum(*fused, rows[:1], grad[:1], lr, momentum, nesterov=nesterov))


def test_momentum_sum_refuses_bad_rows_shapes_and_slots_before_writing(op):
    table, slot = tf.Variable(tf.ones([4, 3])), tf.Variable(tf.ones([4, 3]))
    rows, grad = tf.constant([0, 4], tf.int64), tf.ones([2, 3])
    with pytest.raises(tf.errors.InvalidArgumentError, match="row 4 is outside \\[0, 4\\)"):
        op.tfdp_embed_momentum_sum(table.handle, slot.handle, rows, grad, 0.1, 0.9)
    with pytest.raises(tf.errors.InvalidArgumentError, match="`grad` must have shape \\[2, 3\\]"):
        op.tfdp_embed_momentum_sum(table.handle, slot.handle, rows, tf.ones([2, 2]), 0.1, 0.9)
    with pytest.raises(tf.errors.InvalidArgumentError, match="another variable of the table's shape"):
        op.tfdp_embed_momentum_sum(table.handle, tf.Variable(tf.ones([5, 3])).handle, rows[:1], grad[:1], 0.1, 0.9)
    for variable in (table, slot):
        np.testing.assert_array_equal(variable.numpy(), np.ones([4, 3]))  # nothing written


@pytest.mark.parametrize("dim", [1, 16, 64])
def test_lazy_momentum_add_is_bit_identical_to_its_tf_ops(op, dim):
    """Drift and owed noise of distinct rows, some with a y row, some without: as the reference's float32 ops."""
    rng = np.random.default_rng(dim)
    start, slot = (rng.normal(size=(20_000, dim)).astype(np.float32) for _ in range(2))
    n = 5000
    rows = tf.constant(rng.permutation(20_000)[:n], tf.int64)
    factors = [tf.constant(rng.uniform(0, 1, n).astype(np.float32)) for _ in range(5)]
    x = tf.constant(rng.normal(size=(n, dim)).astype(np.float32))
    y_rows = tf.constant(np.sort(rng.permutation(n)[: n // 3]), tf.int64)
    y = tf.constant(rng.normal(size=(n // 3, dim)).astype(np.float32))
    fused, reference = (tf.Variable(start), tf.Variable(slot)), (tf.Variable(start), tf.Variable(slot))
    sparse_rows.lazy_momentum_add(*fused, rows, *factors, x, y, y_rows)
    sparse_rows.lazy_momentum_add_reference(*reference, rows, *factors, x, y, y_rows)
    for got, want in zip(fused, reference):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert not np.array_equal(fused[0].numpy(), start) and not np.array_equal(fused[1].numpy(), slot)


def test_lazy_momentum_add_refuses_bad_input_before_writing(op):
    table, slot = tf.Variable(tf.ones([4, 3])), tf.Variable(tf.ones([4, 3]))
    ones = [tf.ones([2])] * 5
    x, y = tf.ones([2, 3]), tf.ones([1, 3])
    rows, y_rows = tf.constant([0, 1], tf.int64), tf.constant([1], tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match="row 4 is outside \\[0, 4\\)"):
        op.tfdp_embed_lazy_momentum_add(table.handle, slot.handle, tf.constant([0, 4], tf.int64), *ones, x, y, y_rows)
    with pytest.raises(tf.errors.InvalidArgumentError, match="`y_rows` must name distinct positions"):
        op.tfdp_embed_lazy_momentum_add(
            table.handle, slot.handle, rows, *ones, x, tf.ones([2, 3]), tf.constant([1, 1], tf.int64)
        )
    with pytest.raises(tf.errors.InvalidArgumentError, match="`x` must have shape \\[2, 3\\]"):
        op.tfdp_embed_lazy_momentum_add(table.handle, slot.handle, rows, *ones, tf.ones([2, 2]), y, y_rows)
    with pytest.raises(tf.errors.InvalidArgumentError, match="per-row factor must have 2 entries"):
        op.tfdp_embed_lazy_momentum_add(table.handle, slot.handle, rows, tf.ones([3]), *ones[1:], x, y, y_rows)
    with pytest.raises(tf.errors.InvalidArgumentError, match="another variable of the table's shape"):
        op.tfdp_embed_lazy_momentum_add(table.handle, tf.Variable(tf.ones([5, 3])).handle, rows, *ones, x, y, y_rows)
    for variable in (table, slot):
        np.testing.assert_array_equal(variable.numpy(), np.ones([4, 3]))  # nothing written


def test_is_distinct_vouches_only_for_the_values_unique_returned():
    ids = tf.constant([3, 1, 3, 7], tf.int64)
    rows, positions = sparse_rows.unique(ids)
    assert sparse_rows.is_distinct(rows)
    for other in (ids, positions, rows + 0, tf.constant([3, 1, 7], tf.int64), tf.identity(rows)):
        assert not sparse_rows.is_distinct(other)  # even with distinct values: only `unique`'s output is vouched for

    @tf.function
    def traced(x):
        y, _ = sparse_rows.unique(x)
        assert sparse_rows.is_distinct(y) and not sparse_rows.is_distinct(x)
        return y

    np.testing.assert_array_equal(traced(ids), [3, 1, 7])
