"""LazyDP's catch-up in TensorFlow ops: what a row owes, in every mode.

A row whose history says it is behind step t gets, in one catch-up, the
momentum drift it missed and the noise it owes (closed forms in
`tfdp_embed.mechanisms.lazy.closed_form`), and is marked current:

    plain SGD:  theta += N(0, sum_{r in (h, t]} (eta_r sigma C / B)^2)
    momentum:   (m, theta) <- (beta^k m, theta + gain_k m) + (M, Theta),
                (M, Theta) ~ N(0, Sigma_2x2(h, t)) per coordinate

The noise is drawn per mode: aggregated (one draw per row, or two with
momentum unless the row owes a single step, whose covariance is rank one)
or per step (each missed step's own draw, LazyDP Alg. 1 with aggregated
noise sampling disabled); from the mechanism's generator or stateless,
keyed by (seed, step, row) (`tfdp_embed.mechanisms.row_noise`). LazyDP
uses this path for momentum, per-step draws, stateless noise and tables
the fused ops cannot update (`lazy_fused`).

References: LazyDP (Lim et al., ASPLOS 2024) §5.2, Alg. 1.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

import tensorflow as tf

from tfdp_embed.mechanisms.any_shape import AnyShapeFunction
from tfdp_embed.mechanisms.lazy import closed_form as lazy_math
from tfdp_embed.mechanisms.lazy import history as lazy_history
from tfdp_embed.mechanisms.row_noise import stateless_row_normals
from tfdp_embed.ops import sparse_rows

# Rows owing at most this many steps get their momentum moments summed directly.
DIRECT_WINDOW = 32


@dataclasses.dataclass(frozen=True)
class TableState:
    """The variables a catch-up of one table writes.

    Attributes:
      table: the embedding table.
      history: its history (`lazy_history`).
      momentum: its momentum slot, None for plain SGD.
      dim: the table's row width.
    """

    table: tf.Variable
    history: tf.Variable
    momentum: tf.Variable | None
    dim: int


@dataclasses.dataclass(frozen=True)
class OwedNoise:
    """What a row owes and how its noise is drawn.

    Attributes:
      step_sums: the per-step noise weights; None when sigma = 0 (drift only).
      beta, nesterov: the optimizer's momentum (`lazy_sgd.SgdSettings`).
      aggregate: one draw for all owed steps, else one per step.
      row_noise: "generator" (draws from `noise_like`) or "stateless"
        (keyed by `seed`, step and row).
      seed: the mechanism's seed.
      noise_like: `(shape, stddev) -> float32` normals from the mechanism's
        generator (`NoiseMechanism._noise_like`).
    """

    step_sums: lazy_history.StepSums | None
    beta: float
    nesterov: bool
    aggregate: bool
    row_noise: str
    seed: int | None
    noise_like: Callable

    def _sums(self) -> lazy_history.StepSums:
        assert self.step_sums is not None, "owed noise is sampled only when sigma > 0"
        return self.step_sums

    def normals(self, rows, steps, shape) -> tf.Tensor:
        """float32 `[n, *shape]` standard normals for `rows` at `steps`."""
        if self.row_noise == "stateless":
            assert self.seed is not None, "stateless row noise needs a seed"
            return stateless_row_normals(seed=self.seed, steps=steps, rows=rows, shape=shape)
        return self.noise_like(tf.concat([tf.shape(rows), shape], 0), 1.0)

    def sample(self, rows, noise_from, now, dim: int) -> tuple:
        """(M, Theta) `[n, dim]` float32 owed by `rows` for steps (noise_from, now]; M None without momentum."""
        if not self.aggregate:
            return self._per_step(rows, noise_from, now, dim)
        return self.draw(rows, self.scales(noise_from, now), noise_from, now, dim)

    def scales(self, noise_from, now) -> tuple:
        """The float64 per-row factors of an aggregated draw for steps (noise_from, now].

        `(sqrt S0,)` for plain SGD; `(L11, L21, L22)`, the Cholesky factor of
        the row's 2x2 covariance, with momentum. They depend on `noise_from`
        only: one computation serves the rows of every table.
        """
        sums = self._sums()
        if self.beta == 0:
            s0, _, _ = lazy_math.range_sums(sums.at(noise_from), sums.at(now), now - noise_from, beta=0.0)
            return (tf.sqrt(s0),)
        var_m, cov, var_theta = lazy_math.owed_noise_moments(
            sums.at(noise_from),
            sums.at(now),
            now - noise_from,
            sums.recent_weights(now, DIRECT_WINDOW),
            beta=self.beta,
            nesterov=self.nesterov,
        )
        return lazy_math.cholesky_2x2(var_m, cov, var_theta)

    def draw(self, rows, scales: tuple, noise_from, now, dim: int) -> tuple:
        """(M, Theta) `[n, dim]` float32 for `rows` from their `scales` (`scales(noise_from, now)`).

        M is None without momentum. With momentum a row owing one step draws
        `dim` normals, others `2 dim`.
        """
        if self.beta == 0:
            z = self.normals(rows, -now, [dim])  # negative steps: a key space apart from per-step draws
            return None, tf.cast(scales[0], tf.float32)[:, None] * z
        l11, l21, l22 = (tf.cast(x, tf.float32)[:, None] for x in scales)
        if self.row_noise == "stateless":
            z = self.normals(rows, -now, [2, dim])
            x, y = z[:, 0], z[:, 1]
        else:
            # A row owing one step (touched last step, read again now: the hot rows) has a
            # rank-one covariance, M = Theta / (1 + nesterov beta): it needs dim draws, not 2 dim.
            x = self.normals(rows, -now, [dim])
            two = tf.where(now - noise_from > 1)
            y = tf.scatter_nd(two, self.normals(tf.gather_nd(rows, two), -now, [dim]), tf.shape(x, tf.int64))
        return l11 * x, l21 * x + l22 * y

    def _per_step(self, rows, noise_from, now, dim: int) -> tuple:
        """Alg. 1 with ANS disabled: each missed step r draws its own u_r = -eta_r z_r / B."""
        n = tf.shape(rows)[0]
        steps = tf.ragged.range(noise_from + 1, now + 1)
        pair_steps = steps.flat_values
        owner = tf.cast(steps.value_rowids(), tf.int32)
        scale = -tf.sqrt(tf.maximum(self._sums().weights(pair_steps), 0.0))
        z = self.normals(tf.gather(rows, owner), pair_steps, [dim])
        u = tf.cast(scale, tf.float32)[:, None] * z
        coef_m, coef_theta = lazy_math.propagation_coefficients(
            now - pair_steps, beta=self.beta, nesterov=self.nesterov
        )
        theta = tf.math.unsorted_segment_sum(tf.cast(coef_theta, tf.float32)[:, None] * u, owner, n)
        if self.beta == 0:
            return None, theta
        return tf.math.unsorted_segment_sum(tf.cast(coef_m, tf.float32)[:, None] * u, owner, n), theta


def bring_current(target: TableState, ids, now, owed: OwedNoise, *, unique: bool, stamp=None) -> tf.Tensor:
    """Catches up the rows among `ids` behind step `now`; returns whether any were.

    Args:
      target: the table's variables.
      ids: int row ids, any shape.
      now: int32 scalar, the current step.
      owed: what the rows owe and how it is drawn.
      unique: `ids` hold no repeats (skips the deduplication, `sparse_rows.unique`).
      stamp: optional history entry then written for every row of `ids`
        (`lazy_history.state_ahead` for the rows the optimizer steps).
    """
    rows = tf.reshape(tf.cast(ids, tf.int64), [-1])
    behind = tf.not_equal(tf.gather(target.history, rows), lazy_history.current(now))

    def catch_up():
        stale = tf.boolean_mask(rows, behind)
        catch_up_rows(target, stale if unique else sparse_rows.unique(stale)[0], now, owed)
        return tf.constant(True)

    result = tf.cond(tf.reduce_any(behind), catch_up, lambda: tf.constant(False))
    if stamp is not None:
        with tf.control_dependencies([result]):
            target.history.scatter_update(tf.IndexedSlices(tf.fill(tf.shape(rows), stamp), rows))
    return result


def bring_current_function(owed: Callable[[], OwedNoise]) -> Callable:
    """`bring_current` as one traced function for every table and call site: `(target, ids, now, *, unique, stamp)`.

    A step reads, steps and looks ahead on every table (3 x 26 call sites
    for the Criteo model), and a flush or an evaluation reads them again:
    each call would otherwise hold its own `tf.cond` and copy of the
    catch-up's ops (the momentum moments, the Cholesky, the draws), traced
    and optimised again. Here the variables are arguments, traced for any
    shape (`AnyShapeFunction`: once per `unique` and stamp/no stamp; LazyDP
    calls it one way, so once), and each call site is one function call. `owed` is called at trace time
    (the function must not keep the mechanism alive). Kept out of line:
    inlined, every call site would be a copy again for the graph optimiser
    and the runtime to prepare; a call runs the same ops. Stateless row
    noise needs the row width when tracing: one trace per width then.
    The catch-up's ops are inline in it.
    """
    traced = AnyShapeFunction(functools.partial(_bring_current_traced, owed), noinline=True)

    def call(target: TableState, ids, now, *, unique: bool, stamp=None) -> tf.Tensor:
        width = target.dim if owed().row_noise == "stateless" else None
        rows = tf.reshape(tf.cast(ids, tf.int64), [-1])
        return traced(target.table, target.history, target.momentum, rows, now, unique, stamp, width)

    call.traced = traced.traced  # type: ignore[attr-defined]  # tests count its traces
    return call


def _bring_current_traced(owed, table, history, momentum, rows, now, unique, stamp, width) -> tf.Tensor:
    target = TableState(table, history, momentum, table_width(table, width))
    return bring_current(target, rows, now, owed(), unique=unique, stamp=stamp)


def table_width(table: tf.Variable, width: int | None):
    """The row width: `width` when given (a Python int), else the table's static width, else its shape op.

    Never `tf.shape(table)`: that reads the whole table, and after a sparse
    update a read copies it (TensorFlow's copy-on-read mode), every call.
    """
    if width is not None:
        return width
    if table.shape.rank == 2 and table.shape[1] is not None:
        return int(table.shape[1])
    return tf.raw_ops.VariableShape(input=table.handle)[1]


def catch_up_rows(target: TableState, rows: tf.Tensor, now, owed: OwedNoise) -> None:
    """Adds owed drift and noise to unique `rows` and marks them current at `now`."""
    noise_from, state_from = lazy_history.owed_from(tf.gather(target.history, rows))
    drift = None
    if target.momentum is not None:
        drift = lazy_math.momentum_drift(now - state_from, beta=owed.beta, nesterov=owed.nesterov)
    noise = None if owed.step_sums is None else owed.sample(rows, noise_from, now, target.dim)
    _write_caught_up(target, rows, now, drift, noise)


def bring_current_many(targets: Sequence[TableState], ids: Sequence, now, owed: OwedNoise, *, stamp=None) -> tf.Tensor:
    """`bring_current` on several tables at once; `ids[i]`: unique rows of `targets[i]`. Whether any were behind.

    One check and one `tf.cond` for all the tables, and the closed forms of
    every table's stale rows (drift, variances: float64 per row) computed
    together (`catch_up_rows_many`); per table there remain the gathers, the
    draws and the scatters. `stamp` (optional) is then written to the
    history of every row of `ids`, as `bring_current` writes it.
    """
    rows = [tf.reshape(tf.cast(i, tf.int64), [-1]) for i in ids]
    entries = [tf.gather(target.history, r) for target, r in zip(targets, rows)]
    behind = [tf.not_equal(e, lazy_history.current(now)) for e in entries]

    def catch_up():
        stale = [tf.boolean_mask(r, b) for r, b in zip(rows, behind)]
        catch_up_rows_many(targets, stale, [tf.boolean_mask(e, b) for e, b in zip(entries, behind)], now, owed)
        return tf.constant(True)

    result = tf.cond(tf.reduce_any(tf.concat(behind, 0)), catch_up, lambda: tf.constant(False))
    if stamp is not None:
        with tf.control_dependencies([result]):
            for target, r in zip(targets, rows):
                target.history.scatter_update(tf.IndexedSlices(tf.fill(tf.shape(r), stamp), r))
    return result


def catch_up_rows_many(targets: Sequence[TableState], rows: Sequence, entries: Sequence, now, owed: OwedNoise) -> None:
    """`catch_up_rows` on several tables: unique `rows[i]` of `targets[i]`, whose history entries are `entries[i]`.

    The per-row closed forms depend on the history entry only: computed
    once on all tables' rows, split per table. Each table then draws its
    noise (table after table, in the order of `targets`, as a loop of
    `catch_up_rows` draws it) and writes its rows. Per-step draws
    (`aggregate=False`) run `catch_up_rows` per table.
    """
    if not owed.aggregate:
        for target, r in zip(targets, rows):
            catch_up_rows(target, r, now, owed)
        return
    sizes = tf.stack([tf.shape(r)[0] for r in rows])
    noise_from, state_from = lazy_history.owed_from(tf.concat(list(entries), 0))
    columns = [noise_from]
    momentum = any(target.momentum is not None for target in targets)
    if momentum:
        columns += lazy_math.momentum_drift(now - state_from, beta=owed.beta, nesterov=owed.nesterov)
    if owed.step_sums is not None:
        columns += owed.scales(noise_from, now)
    per_table = zip(*(tf.split(column, sizes) for column in columns))
    for target, r, (table_from, *rest) in zip(targets, rows, per_table):
        drift, scales = (tuple(rest[:2]), rest[2:]) if momentum else (None, rest)
        noise = None if owed.step_sums is None else owed.draw(r, tuple(scales), table_from, now, target.dim)
        _write_caught_up(target, r, now, drift if target.momentum is not None else None, noise)


def _write_caught_up(target: TableState, rows: tf.Tensor, now, drift: tuple | None, noise: tuple | None) -> None:
    """Writes a catch-up of unique `rows`: `drift` = (decay, gain) per row, `noise` = (M, Theta); marks them current."""
    var = target.table
    theta_delta, m_new = None, None
    if drift is not None:
        assert target.momentum is not None, "drift exists only with momentum"
        m = tf.gather(target.momentum, rows)
        decay, gain = drift
        m_new = tf.cast(decay, var.dtype)[:, None] * m
        theta_delta = tf.cast(gain, var.dtype)[:, None] * m
    if noise is not None:
        noise_m, noise_theta = noise
        noise_theta = tf.cast(noise_theta, var.dtype)
        theta_delta = noise_theta if theta_delta is None else theta_delta + noise_theta
        if m_new is not None:
            m_new = m_new + tf.cast(noise_m, var.dtype)
    if m_new is not None:
        assert target.momentum is not None, "m_new exists only with momentum"
        target.momentum.scatter_update(tf.IndexedSlices(m_new, rows))
    if theta_delta is not None:
        var.scatter_add(tf.IndexedSlices(theta_delta, rows))
    target.history.scatter_update(tf.IndexedSlices(tf.fill(tf.shape(rows), lazy_history.current(now)), rows))


__all__ = [
    "DIRECT_WINDOW",
    "OwedNoise",
    "TableState",
    "bring_current",
    "bring_current_function",
    "bring_current_many",
    "catch_up_rows",
    "catch_up_rows_many",
    "table_width",
]
