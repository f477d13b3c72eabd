"""LazyDP's fused path: plain SGD with aggregated generator noise, in custom ops.

This is LazyDP's common case, and its bookkeeping runs in the ops of
`tfdp_embed.ops.sparse_rows`: a catch-up is one `lazy_catch_up` (a read
hook, a flush), `lazy_catch_up_gather` (a lookup: the caught-up rows are
returned, saving the lookup's own gather) or `lazy_catch_up_split` (the
lookahead: the draws run while the optimizer writes the table, then the
rows are added); a step's bookkeeping is one `lazy_record_step`. Without
the op library, or where `placement` keeps its CPU kernels off the
variables, the same functions run as TensorFlow ops, bit-identical given
the op's normals (`sparse_rows.*_reference`). Which of the two runs, and
whether a table takes this path at all, is chosen once, at `init`
(`choose`); the functions here run what was chosen.

Keys: each step draws one generator key. The dense variables' noise uses
its streams 0..n-1; the catch-ups that follow (this step's lookahead, the
next step's read hooks, a flush) use streams n, n+1, ..., counted in the
catch-up stream `(k0, k1, calls)` (variable `catch_up_stream`).

Touched rows need no history write: without momentum a row's
deterministic state never drifts, so the one-step-ahead flag changes
nothing (its owed noise starts after step `now` either way), and the read
hook made every row the forward pass read current. A row the optimizer
steps without reading it is not a read: its noise, owed from its history
on, is added before its next read, as usual.

References: LazyDP (Lim et al., ASPLOS 2024) §5.2, Alg. 1 (aggregated
noise sampling).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tfdp_embed.ops import sparse_rows


class OpState(NamedTuple):
    """The variables every fused op reads and writes besides a table and its history.

    Attributes:
      p_hi, p_lo: the step sums of P (`lazy_history.StepSums`).
      steps: the mechanism's step counter.
      stream: the catch-up stream `(k0, k1, calls)`.
    """

    p_hi: tf.Variable
    p_lo: tf.Variable
    steps: tf.Variable
    stream: tf.Variable


class Paths(NamedTuple):
    """What runs LazyDP's step and each table's catch-ups, chosen once (`choose`).

    Attributes:
      step: the ops of a fused step (`record_step`); None: the TensorFlow path's step.
      tables: per table, the ops that catch it up; None: the TensorFlow path (`lazy_catch_up`).
    """

    step: sparse_rows.LazyOps | None
    tables: tuple[sparse_rows.LazyOps | None, ...]


def applies(*, beta: float, aggregate: bool, row_noise: str, noise_multiplier: float) -> bool:
    """True for the settings this path implements: plain SGD, aggregated generator noise, sigma > 0."""
    return noise_multiplier > 0 and beta == 0 and aggregate and row_noise == "generator"


def choose(tables: Sequence[tf.Variable], histories: Sequence[tf.Variable], state: OpState | None) -> Paths:
    """The paths, from the settings, the tables and the variables' placement.

    Args:
      tables, histories: each table's variable and history.
      state: the op state for the settings this path implements
        (`applies`), None otherwise: every table takes the TensorFlow path.

    A table takes this path when the in-place ops can update it (a float32
    variable with one resource handle, `sparse_rows.takes_table`); then
    `sparse_rows.lazy_ops` picks the custom ops or their references. Chosen
    under a distribution strategy (`init` under ParameterServerStrategy,
    whose servers hold the state: one op would take variables of several
    servers), every table takes the TensorFlow path, eager flushes included.
    """
    if state is None or tf.distribute.has_strategy():
        return Paths(None, (None,) * len(tables))
    ops = [
        sparse_rows.lazy_ops(t, h, *state) if sparse_rows.takes_table(t) else None for t, h in zip(tables, histories)
    ]
    return Paths(sparse_rows.lazy_ops(*state), tuple(ops))


def new_catch_up_stream(seed: int | None) -> tf.Variable:
    """The catch-up stream, keyed from `seed` (else OS entropy) until the first step.

    Every step resets it from the step's key; the initial key is used only
    if a restored history owes noise before the first step. It does not
    come from the generator, whose sequence feeds the dense noise.
    """
    initial = np.random.SeedSequence(seed).generate_state(2, np.uint64).view(np.int64)
    return tf.Variable(np.concatenate([initial, np.zeros([1], np.int64)]), trainable=False, name="catch_up_stream")


def rekey(stream: tf.Variable) -> None:
    """A fresh key from OS entropy, call count 0."""
    key = tf.raw_ops.NonDeterministicInts(shape=[2], dtype=tf.int64)
    stream.assign(tf.concat([key, tf.zeros([1], tf.int64)], 0))


def catch_up(ops: sparse_rows.LazyOps, table: tf.Variable, history: tf.Variable, ids, state: OpState) -> tf.Tensor:
    """Catches up the rows among `ids` behind the current step with `ops`; returns whether any were."""
    return ops.catch_up(table, history, ids, *state) > 0


def catch_up_and_gather(ops: sparse_rows.LazyOps, table: tf.Variable, history: tf.Variable, ids, state: OpState):
    """`catch_up`, then the rows of `ids` (`[n, dim]`, with `tf.gather`'s gradient)."""
    return ops.catch_up_gather(table, history, ids, *state)


def catch_up_next_batch(ops: sparse_rows.LazyOps, table: tf.Variable, history: tf.Variable, rows, state) -> None:
    """`catch_up` as two ops: the draws need not wait for the optimizer's table write."""
    ops.catch_up_split(table, history, rows, *state)


def noised_dense(generator: tf.random.Generator, clipped, *, stddev: float) -> tuple:
    """Draws the step's key and noises the dense variables from its first streams.

    Returns:
      `(key, pairs)`: int64 `[2]` key and `(noised gradient / B, variable)`
      for each of `clipped.dense`, whose noise used streams 0..n-1.
    """
    key = generator.uniform_full_int([2], dtype=tf.int64)
    dense = [grad for _, grad in clipped.dense]
    noised = sparse_rows.noised_values_many(
        generator,
        dense,
        stddev=stddev,
        divisor=clipped.expected_batch_size,
        key=key,
    )
    return key, [(grad, variable) for grad, (variable, _) in zip(noised, clipped.dense)]


def record_step(ops: sparse_rows.LazyOps, state: OpState, learning_rate, noise_scale, key, *, first_stream: int):
    """Ends the step with `ops`: its noise weight in the step sums, the catch-up stream from `key`, steps + 1."""
    ops.record_step(*state, learning_rate, noise_scale, key, first_stream=first_stream)


__all__ = [
    "OpState",
    "Paths",
    "applies",
    "catch_up",
    "catch_up_and_gather",
    "catch_up_next_batch",
    "choose",
    "new_catch_up_stream",
    "noised_dense",
    "record_step",
    "rekey",
]
