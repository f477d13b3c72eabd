"""LazyDP's catch-up of several tables at once (`lazy_catch_up.bring_current_many`) against one table at a time.

The many-table form computes the per-row closed forms (drift, Cholesky
factors) on all tables' stale rows together and then draws table after
table: with the same generator it draws the same normals for the same rows
as a loop of `bring_current`, so the tables, momenta and histories agree.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfdp_embed.mechanisms.lazy import catch_up as lazy_catch_up
from tfdp_embed.mechanisms.lazy import history as lazy_history

BETA, NOW = 0.9, 40
WIDTHS, ROWS = (3, 5, 2), (30, 50, 20)


def _tables(*, momentum: bool):
    """Three tables of different widths; each row's history owes 0..39 steps (some state one step ahead)."""
    rng = np.random.default_rng(4)
    targets = []
    for width, rows in zip(WIDTHS, ROWS):
        noise_from = rng.integers(0, NOW + 1, size=rows)
        ahead = (rng.random(rows) < 0.3) & (noise_from < NOW)
        targets.append(
            lazy_catch_up.TableState(
                tf.Variable(rng.normal(size=(rows, width)).astype(np.float32)),
                tf.Variable((2 * noise_from + ahead).astype(np.int32)),
                tf.Variable(rng.normal(size=(rows, width)).astype(np.float32)) if momentum else None,
                width,
            )
        )
    return targets


def _owed(generator: tf.random.Generator, *, momentum: bool) -> lazy_catch_up.OwedNoise:
    sums = lazy_history.StepSums(capacity=64)
    for step in range(1, NOW + 1):
        sums.record(tf.constant(step), tf.constant(1e-3 * (1 + step % 3), tf.float64), beta=BETA if momentum else 0.0)
    return lazy_catch_up.OwedNoise(
        sums,
        BETA if momentum else 0.0,
        False,
        True,
        "generator",
        None,
        lambda shape, stddev: generator.normal(shape, stddev=stddev),
    )


def _state(targets) -> list:
    return [v.numpy() for t in targets for v in (t.table, t.history, t.momentum) if v is not None]


def _ids():
    rng = np.random.default_rng(5)
    return [tf.constant(rng.permutation(rows)[: rows // 2 + 3], tf.int64) for rows in ROWS]


def test_many_tables_at_once_equal_one_table_at_a_time():
    """Momentum (2x2 Cholesky, one or two draws per row) and plain SGD; every table has stale rows."""
    now = tf.constant(NOW, tf.int32)
    for momentum in (True, False):
        one, many = _tables(momentum=momentum), _tables(momentum=momentum)
        owed_one = _owed(tf.random.Generator.from_seed(9), momentum=momentum)
        owed_many = _owed(tf.random.Generator.from_seed(9), momentum=momentum)
        for target, ids in zip(one, _ids()):
            lazy_catch_up.bring_current(target, ids, now, owed_one, unique=True)
        assert bool(lazy_catch_up.bring_current_many(many, _ids(), now, owed_many))
        for got, want in zip(_state(many), _state(one)):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)  # bit-identical here (eager, AVX-512)
        # The rows read are current, the others untouched.
        for target, ids, before in zip(many, _ids(), _tables(momentum=momentum)):
            history, read = target.history.numpy(), np.isin(np.arange(len(target.history.numpy())), ids.numpy())
            assert np.all(history[read] == 2 * NOW)
            np.testing.assert_array_equal(history[~read], before.history.numpy()[~read])
            np.testing.assert_array_equal(target.table.numpy()[~read], before.table.numpy()[~read])


def test_nothing_behind_draws_nothing_and_a_stamp_is_written():
    """All rows current: no draw (the generator does not move); the stamp marks the rows one step ahead."""
    now = tf.constant(NOW, tf.int32)
    targets = _tables(momentum=True)
    for target in targets:
        target.history.assign(tf.fill(tf.shape(target.history), 2 * NOW))
    generator = tf.random.Generator.from_seed(3)
    before, key = _state(targets), generator.state.numpy().copy()
    stamp = lazy_history.state_ahead(now)
    assert not bool(
        lazy_catch_up.bring_current_many(targets, _ids(), now, _owed(generator, momentum=True), stamp=stamp)
    )
    np.testing.assert_array_equal(generator.state.numpy(), key)
    for target, ids, (table, history, momentum) in zip(targets, _ids(), zip(*[iter(before)] * 3)):
        np.testing.assert_array_equal(target.table.numpy(), table)
        np.testing.assert_array_equal(target.momentum.numpy(), momentum)
        expected = history.copy()
        expected[ids.numpy()] = 2 * NOW + 1
        np.testing.assert_array_equal(target.history.numpy(), expected)
