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
the fused ops cannot update (`lazy_fused`). With momentum and aggregated
noise, the per-row factors (drift, Cholesky) and the normals are computed
here and one op writes the rows (`sparse_rows.lazy_momentum_add`: the
gather, products, sums and both scatters of its TensorFlow reference, with
the same float32 rounding).

References: LazyDP (Lim et al., ASPLOS 2024) §5.2, Alg. 1.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

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
        if self.beta == 0:
            sums = self._sums()
            s0, _, _ = lazy_math.range_sums(sums.at(noise_from), sums.at(now), now - noise_from, beta=0.0)
            z = self.normals(rows, -now, [dim])  # negative steps: a key space apart from per-step draws
            return None, tf.cast(tf.sqrt(s0), tf.float32)[:, None] * z
        return self._aggregated_with_momentum(rows, noise_from, now, dim)

    def _aggregated_with_momentum(self, rows, noise_from, now, dim: int) -> tuple:
        """One 2x2 Cholesky per row; a row owing one step draws `dim` normals, others `2 dim`."""
        (l11, l21, l22), x, y, y_rows = self.momentum_noise(rows, noise_from, now, dim)
        y = tf.scatter_nd(tf.reshape(y_rows, [-1, 1]), y, tf.shape(x, tf.int64))
        return l11[:, None] * x, l21[:, None] * x + l22[:, None] * y

    def momentum_noise(self, rows, noise_from, now, dim: int) -> tuple:
        """((l11, l21, l22) float32 `[n]`, x `[n, dim]`, y `[k, dim]`, y_rows int64 `[k]`): M = l11 x, Theta = l21 x + l22 y.

        y holds the normals of the rows at positions `y_rows`; the others' y is 0.
        """
        sums = self._sums()
        var_m, cov, var_theta = lazy_math.owed_noise_moments(
            sums.at(noise_from),
            sums.at(now),
            now - noise_from,
            sums.recent_weights(now, DIRECT_WINDOW),
            beta=self.beta,
            nesterov=self.nesterov,
        )
        factors = tuple(tf.cast(f, tf.float32) for f in lazy_math.cholesky_2x2(var_m, cov, var_theta))
        if self.row_noise == "stateless":
            z = self.normals(rows, -now, [2, dim])
            return factors, z[:, 0], z[:, 1], tf.range(tf.shape(rows, tf.int64)[0])
        # A row owing one step (touched last step, read again now: the hot rows) has a
        # rank-one covariance, M = Theta / (1 + nesterov beta): it needs dim draws, not 2 dim.
        x = self.normals(rows, -now, [dim])
        two = tf.where(now - noise_from > 1)
        return factors, x, self.normals(tf.gather_nd(rows, two), -now, [dim]), two[:, 0]

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
    var, history = target.table, target.history
    noise_from, state_from = lazy_history.owed_from(tf.gather(history, rows))
    if _fuses_momentum(target, owed):
        decay, gain = lazy_math.momentum_drift(now - state_from, beta=owed.beta, nesterov=owed.nesterov)
        factors, x, y, y_rows = owed.momentum_noise(rows, noise_from, now, target.dim)
        drift = (tf.cast(decay, tf.float32), tf.cast(gain, tf.float32))
        sparse_rows.lazy_momentum_add(var, target.momentum, rows, *drift, *factors, x, y, y_rows)
    else:
        _add_owed(target, rows, noise_from, state_from, now, owed)
    history.scatter_update(tf.IndexedSlices(tf.fill(tf.shape(rows), lazy_history.current(now)), rows))


def _fuses_momentum(target: TableState, owed: OwedNoise) -> bool:
    """Momentum, one aggregated draw with noise, float32 variables: one op (or its reference) does the rows."""
    return (
        target.momentum is not None
        and owed.step_sums is not None
        and owed.aggregate
        and owed.beta != 0
        and target.table.dtype.base_dtype == tf.float32
        and target.momentum.dtype.base_dtype == tf.float32
    )


def _add_owed(target: TableState, rows: tf.Tensor, noise_from, state_from, now, owed: OwedNoise) -> None:
    """The owed drift and noise of `rows` in TensorFlow ops (no momentum, per-step draws, no noise)."""
    var = target.table
    theta_delta, m_new = None, None
    if target.momentum is not None:
        m = tf.gather(target.momentum, rows)
        decay, gain = lazy_math.momentum_drift(now - state_from, beta=owed.beta, nesterov=owed.nesterov)
        m_new = tf.cast(decay, var.dtype)[:, None] * m
        theta_delta = tf.cast(gain, var.dtype)[:, None] * m
    if owed.step_sums is not None:
        noise_m, noise_theta = owed.sample(rows, noise_from, now, target.dim)
        noise_theta = tf.cast(noise_theta, var.dtype)
        theta_delta = noise_theta if theta_delta is None else theta_delta + noise_theta
        if m_new is not None:
            m_new = m_new + tf.cast(noise_m, var.dtype)
    if m_new is not None:
        assert target.momentum is not None, "m_new exists only with momentum"
        target.momentum.scatter_update(tf.IndexedSlices(m_new, rows))
    if theta_delta is not None:
        var.scatter_add(tf.IndexedSlices(theta_delta, rows))


__all__ = [
    "DIRECT_WINDOW",
    "OwedNoise",
    "TableState",
    "bring_current",
    "bring_current_function",
    "catch_up_rows",
    "table_width",
]
