"""`nonfinite.check_weights`: its sums assert exactly when an elementwise check would."""

import numpy as np
import pytest
import tensorflow as tf

from tfdp_embed import nonfinite


def _run(pairs, *, traced: bool) -> None:
    def check():
        nonfinite.check_weights(pairs)

    (tf.function(check) if traced else check)()


@pytest.mark.parametrize("traced", [False, True])
def test_finite_weights_whose_sum_overflows_pass(traced):
    big = np.finfo(np.float32).max
    table = tf.Variable([[big, big], [1.0, 2.0], [big, big]])  # rows 0 and 2 sum to +Inf in float32
    dense = tf.Variable(tf.fill([3], big))
    grad = tf.IndexedSlices(tf.zeros([2, 2]), tf.constant([0, 2], tf.int64), tf.constant([3, 2], tf.int64))
    _run([(grad, table), (tf.zeros([3]), dense)], traced=traced)


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_written_nonfinite_row_or_weight_fails(traced, bad):
    table = tf.Variable([[1.0, 2.0], [bad, 0.0], [3.0, 4.0]])
    written = tf.IndexedSlices(tf.zeros([2, 2]), tf.constant([0, 1], tf.int64), tf.constant([3, 2], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="weights are NaN or Inf"):
        _run([(written, table)], traced=traced)
    dense = tf.Variable([0.0, bad], dtype=tf.float16)
    with pytest.raises(tf.errors.InvalidArgumentError, match="weights are NaN or Inf"):
        _run([(tf.zeros([2], tf.float16), dense)], traced=traced)
    dense = tf.Variable([0.0, bad])  # float32: its float32 sum is not finite, then the elementwise check fails
    with pytest.raises(tf.errors.InvalidArgumentError, match="weights are NaN or Inf"):
        _run([(tf.zeros([2]), dense)], traced=traced)


def test_an_unwritten_nonfinite_row_is_not_read():
    table = tf.Variable([[1.0, 2.0], [np.nan, 0.0]])  # row 1 is not written this step
    written = tf.IndexedSlices(tf.zeros([1, 2]), tf.constant([0], tf.int64), tf.constant([2, 2], tf.int64))
    _run([(written, table)], traced=True)


def test_float16_weights_whose_float16_sum_would_overflow_pass():
    dense = tf.Variable(tf.fill([4], tf.constant(60000.0, tf.float16)))  # 240,000 overflows float16, not float32
    _run([(tf.zeros([4], tf.float16), dense)], traced=True)


@pytest.mark.parametrize("bad", [None, np.nan, np.inf])
def test_float64_weights_are_checked_elementwise(bad):
    big = np.finfo(np.float64).max
    table = tf.Variable([[big, big], [1.0, 2.0]], dtype=tf.float64)  # their float64 sum overflows
    dense = tf.Variable([big, big if bad is None else bad], dtype=tf.float64)
    rows = tf.IndexedSlices(tf.zeros([1, 2], tf.float64), tf.constant([0], tf.int64), tf.constant([2, 2], tf.int64))
    pairs = [(rows, table), (tf.zeros([2], tf.float64), dense)]
    if bad is None:
        _run(pairs, traced=True)
        return
    with pytest.raises(tf.errors.InvalidArgumentError, match="weights are NaN or Inf"):
        _run(pairs, traced=True)


def test_a_float32_tables_written_rows_are_summed_in_place():
    from tfdp_embed.ops import sparse_rows

    if not sparse_rows.available():
        pytest.skip("the op library is not built: the reference gathers the rows")
    table = tf.Variable(tf.ones([5, 3]))
    rows = tf.IndexedSlices(tf.zeros([2, 3]), tf.constant([1, 4], tf.int64), tf.constant([5, 3], tf.int64))
    graph = tf.function(lambda: _run([(rows, table)], traced=False)).get_concrete_function().graph
    types = {op.type for op in graph.get_operations()}
    assert "TfdpEmbedRowsSum" in types and "ResourceGather" not in types
