"""SGD's table steps applied by the library: one fused op per table, the check's sum with it.

A DP step hands the optimizer each table's noised gradient as
`tf.IndexedSlices`. Under SGD the optimizer's whole work on a table is a
scatter (`table[rows] -= lr * values`) or, with tf-keras' legacy momentum,
Keras' sparse momentum op on the deduplicated rows; both wait for memory row
after row, and the diverged-model check then reads the same rows again
(`nonfinite.check_weights`). Here one op does the step and the check's sum
(`sparse_rows.scatter_add_sum`, `sparse_rows.momentum_sum`): the same
float32 arithmetic as the optimizer's op, so the weights are bit-identical,
with the rows split between the CPU workers and prefetched, and the float64
sum of the written values taken while they are in cache. The optimizer still
applies every other variable and counts the step (with no other variable the
step is counted here), so schedules, `iterations`, slots and checkpoints are
unchanged.

Only an optimizer that is exactly a front end's SGD class (a subclass may
apply otherwise), with none of the settings its adapter refuses (clipping,
weight decay, EMA, accumulation, loss scaling), on one
device, is applied here (Keras 3's SGD without momentum only: its momentum
step is dense); any other optimizer applies its own gradients as before.
Tables with a constraint, other dtypes than float32 and accelerator tables
(see `sparse_rows.takes_table`, `placement`) stay with the optimizer.
"""

from __future__ import annotations

import tensorflow as tf

from tfdp_embed.mechanisms.lazy import sgd as lazy_sgd
from tfdp_embed.ops import sparse_rows


def fused_sgd(optimizer) -> lazy_sgd.SgdOptimizer | None:
    """`optimizer` seen through its front end's SGD adapter when its table steps may be applied here, else None."""
    if tf.distribute.has_strategy() or not sparse_rows.available():
        return None
    try:
        with tf.init_scope():  # the settings are read eagerly, also while a step is traced
            sgd = lazy_sgd.adapt(optimizer)
            sgd.settings()  # refuses clipping, weight decay, EMA, accumulation, loss scaling
    except ValueError:  # not an SGD, or settings without a sparse form: the optimizer applies everything
        return None
    return sgd if getattr(sgd, "sparse_step", None) else None


def _applies(gradient, variable) -> bool:
    return (
        isinstance(gradient, tf.IndexedSlices)
        and gradient.values.dtype == tf.float32
        and getattr(variable, "constraint", None) is None
        and sparse_rows.takes_table(variable)
    )


@tf.autograph.experimental.do_not_convert
def apply_tables(sgd: lazy_sgd.SgdOptimizer | None, pairs, *, constrained=()) -> tuple[list, list]:
    """Applies the sparse table pairs of `pairs` under `sgd` (a `fused_sgd`); returns (the other pairs, sums).

    Call it before the optimizer applies the other pairs: the learning rate is
    the coming step's. `sums` are the float64 sums of the written values, one
    per table applied, for `nonfinite.check_weights(..., row_sums=sums)`.
    With `sgd` None nothing is applied: `(pairs, [])`. `constrained` holds the
    refs of variables whose constraint the optimizer applies (Keras 3 keeps it
    on its own variable, not on the `tf.Variable` of `pairs`): left to it.
    """
    if sgd is None:
        return list(pairs), []
    mine = [(g, v) for g, v in pairs if _applies(g, v) and v.ref() not in constrained]
    if not mine:
        return list(pairs), []
    lr = sgd.learning_rate()
    sums = [_step(sgd, g, v, lr) for g, v in mine]
    applied = {v.ref() for _, v in mine}
    return [(g, v) for g, v in pairs if v.ref() not in applied], sums


def _step(sgd, gradient: tf.IndexedSlices, variable, lr) -> tf.Tensor:
    """One table's step as the optimizer takes it; the float64 sum of the written rows."""
    if sgd.sparse_step == "sgd":  # ResourceScatterAdd(-values * lr)
        return sparse_rows.scatter_add_sum(variable, gradient.indices, gradient.values, -lr)
    # Legacy momentum: duplicates summed as `_deduplicate_indexed_slices` does, then the momentum op.
    # The clipping's rows (`sparse_rows.is_distinct`) have none: summing would only copy the values
    # (and turn a -0.0 into +0.0).
    rows, values = gradient.indices, gradient.values
    if not sparse_rows.is_distinct(rows):
        rows, positions = sparse_rows.unique(gradient.indices)
        values = tf.math.unsorted_segment_sum(gradient.values, positions, tf.shape(rows)[0])
    slot = sgd.momentum_slot(variable)
    return sparse_rows.momentum_sum(variable, slot, rows, values, lr, sgd.momentum(), nesterov=sgd.nesterov)


def count_step(sgd: lazy_sgd.SgdOptimizer) -> None:
    """Counts the step on the optimizer when `apply_tables` left it nothing to apply."""
    sgd.iterations.assign_add(1)


__all__ = ["apply_tables", "count_step", "fused_sgd"]
