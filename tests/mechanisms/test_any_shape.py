"""`AnyShapeFunction` (tfdp_embed/mechanisms/any_shape.py): one trace for variables of every shape."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from tfdp_embed.keras2._keras import tf
from tfdp_embed.mechanisms.any_shape import AnyShapeFunction


def _scale_rows(table, rows, factor):
    table.scatter_mul(tf.IndexedSlices(tf.fill([tf.size(rows), tf.shape(table)[1]], factor), rows))
    return tf.shape(table)[0]


def _tables():
    return [tf.Variable(tf.ones([n, d])) for n, d in [(5, 3), (9, 2), (4, 7)]]


def test_one_trace_for_tables_of_every_shape_eagerly_and_inside_a_trace():
    scale = AnyShapeFunction(_scale_rows, noinline=True)
    tables = _tables()
    for table in tables:
        scale(table, tf.constant([0, 2], tf.int64), 2.0)

    @tf.function(autograph=False)
    def step():
        return [scale(table, tf.constant([1], tf.int64), 3.0) for table in tables]

    sizes = step()
    gc.collect()  # the trace's variable arguments must outlive it
    step()
    assert [int(s) for s in sizes] == [5, 9, 4]
    # Python arguments are part of the key: factor 2.0 eagerly, 3.0 in the step.
    assert scale.traced.experimental_get_tracing_count() == 2
    for table in tables:
        got = table.numpy()
        assert np.all(got[0] == 2.0) and np.all(got[2] == 2.0) and np.all(got[1] == 9.0)


def test_under_a_distribution_strategy_the_call_runs_inline():
    calls = []

    def record(table, rows):
        calls.append(tf.executing_eagerly())
        return _scale_rows(table, rows, 2.0)

    scale = AnyShapeFunction(record)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        table = tf.Variable(tf.ones([3, 2]))
    strategy.run(lambda: scale(table, tf.constant([1], tf.int64)))
    assert scale.traced.experimental_get_tracing_count() == 0 and calls
    assert table.numpy()[1].tolist() == [2.0, 2.0]


@pytest.mark.parametrize("argument", [np.ones(2), object()])
def test_other_arguments_run_inline(argument):
    seen = []
    function = AnyShapeFunction(lambda x: seen.append(x))
    function(argument)
    assert seen == [argument] and function.traced.experimental_get_tracing_count() == 0
