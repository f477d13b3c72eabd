"""LazyDP's bookkeeping state: one history per table and the per-step noise sums.

A table's history (the paper's HistoryTable) holds one int32 per row,
`(step << 1) | flag`: the last step through which the row's noise was
applied, and a flag set when its deterministic state (gradient, momentum)
is one step further on (a row the optimizer stepped while its own noise of
that step is deferred; `lazy_math`, "state one step ahead"). The step sums
are the running sums of every step's noise weight, from which the noise a
row owes over any range of steps follows in O(1).

Checkpoints restore these variables by name, so their names and the
attributes holding them (`LazyDP._histories`, `LazyDP._step_sums`) are
fixed: `history_<table>`, a `lazy_step_sums` module holding `sums`.

References: LazyDP (Lim et al., ASPLOS 2024) §5.2, Alg. 1 (HistoryTable).
"""

from __future__ import annotations

import tensorflow as tf

from tfdp_embed.mechanisms.lazy import closed_form as lazy_math
from tfdp_embed.ops import sparse_rows

# Steps an int32 history can count (entries are (step << 1) | flag); the fused ops check the same.
MAX_STEPS = sparse_rows.LAZY_MAX_STEPS


def new_history(layer, now: tf.Tensor) -> tf.Variable:
    """A history for `layer`'s table with every row current at step `now`."""
    return tf.Variable(
        tf.fill([layer.vocabulary_size], current(now)),
        trainable=False,
        name=f"history_{layer.name}",
    )


def current(now) -> tf.Tensor:
    """The entry of a row whose noise and state are applied through step `now`."""
    return 2 * now


def state_ahead(now) -> tf.Tensor:
    """The entry of a row with noise through step `now` and state through `now + 1` (stepped, noise owed)."""
    return 2 * now + 1


def owed_from(entries) -> tuple:
    """(noise_from, state_from): the steps through which noise and deterministic state were applied."""
    noise_from = tf.bitwise.right_shift(entries, 1)
    return noise_from, noise_from + tf.bitwise.bitwise_and(entries, 1)


class StepSums(tf.Module):
    """Per-step running sums of the noise weights (float64, grows by doubling)."""

    def __init__(self, capacity: int = 1024):
        super().__init__(name="lazy_step_sums")
        self.sums = lazy_math.RunningSums(
            *[
                tf.Variable(
                    tf.zeros([capacity], tf.float64),
                    shape=tf.TensorShape([None]),
                    trainable=False,
                    name=name,
                )
                for name in lazy_math.RunningSums._fields
            ]
        )

    def record(self, step, weight, *, beta: float) -> None:
        """Writes the sums through `step` (>= 1) from those through `step - 1`."""
        capacity = tf.shape(self.sums.p_hi)[0]

        def grow():
            extra = tf.maximum(capacity, step + 1 - capacity)
            for var in self.sums:
                var.assign(tf.concat([var, tf.zeros([extra], tf.float64)], 0))
            return tf.constant(0)

        tf.cond(step >= capacity, grow, lambda: tf.constant(0))
        if beta == 0:
            # Plain SGD reads only P (S1, S2 feed the momentum moments): A and Q stay 0.
            zero = tf.zeros([], tf.float64)
            previous = lazy_math.RunningSums(
                tf.gather(self.sums.p_hi, step - 1), tf.gather(self.sums.p_lo, step - 1), zero, zero
            )
            new = lazy_math.advance_running_sums(previous, weight, beta=0.0)
            updated = zip(self.sums[:2], new[:2])
        else:
            updated = zip(self.sums, lazy_math.advance_running_sums(self.at(step - 1), weight, beta=beta))
        for var, value in updated:
            var.scatter_update(tf.IndexedSlices(value[None], step[None]))

    def at(self, steps) -> lazy_math.RunningSums:
        """The sums through each step in `steps`."""
        return lazy_math.RunningSums(*[tf.gather(var, steps) for var in self.sums])

    def weights(self, steps) -> tf.Tensor:
        """w_r for each step r >= 1 in `steps`."""
        now, before = self.at(steps), self.at(steps - 1)
        return (now.p_hi - before.p_hi) + (now.p_lo - before.p_lo)

    def recent_weights(self, now, size: int) -> tf.Tensor:
        """w at lags 0..size-1 from step `now` (0 before step 1)."""
        steps = now - tf.range(size)
        return tf.where(steps >= 1, self.weights(tf.maximum(steps, 1)), tf.zeros([], tf.float64))


__all__ = ["MAX_STEPS", "StepSums", "current", "new_history", "owed_from", "state_ahead"]
