"""`mechanism.update` on the TPU engine path: once per global batch, and its dry run before the lookup.

Why a dry run: the noise feature is enqueued with the batch, before any
gradient exists, but DP-AdaFEST draws its survivors inside `update`.
Every TPU-possible mechanism decides its rows from the ids and its
generator only, never from gradient values, so `update` is run once on
zero gradients with the batch's touched rows, its rows are kept, and all
mechanism state (generator included) is put back; the real `update` draws
the same numbers and must return the same rows (`TpuDPStep` checks). Cost: a
second `update` (O(rows x dim)) and a copy of the mechanism's variables per
step (DP-FEST: its [vocabulary] int32 position map).

References: DP-FEST / DP-AdaFEST (NeurIPS 2023) §3; docs/tpu_sparsecore.md ("Rows first").
"""

from __future__ import annotations

from tfdp_embed._sorted_sets import is_member
from tfdp_embed.absent_examples import present_occurrences, read_rows
from tfdp_embed.keras2._keras import tf
from tfdp_embed.keras2.distribute.collectives import _decode_grad, _encode_grad, _flatten, all_reduce_clipped
from tfdp_embed.mechanisms.base import ClippedGradients, NoiseMechanism, TableGradient


def planned_rows(
    mechanism: NoiseMechanism,
    tables: list,
    dense_variables: list,
    *,
    expected_batch_size: float,
    occurrences: dict,
    batch_size,
    ctx,
    present=None,
) -> list:
    """Sorted int64 rows per table that `mechanism.update` will change for this batch (a dry run).

    With `present`, absent examples' lookups are dropped as `without_absent_examples` drops them.
    """
    table_grads = []
    for t in tables:
        occ = occurrences[t.name]
        touched, _ = tf.unique(tf.concat([tf.cast(o.ids, tf.int64) for o in occ], 0))  # the registry's order
        if present is not None:  # the registry's rows, then those only absent examples read dropped
            occ = [present_occurrences(o, present) for o in occ]
            touched = tf.boolean_mask(touched, is_member(touched, read_rows(occ)))
        zeros = tf.zeros([tf.size(touched), t.output_dim], t.embeddings.dtype)
        table_grads.append(
            TableGradient(
                layer=t,
                variable=t.embeddings,
                gradient=tf.IndexedSlices(zeros, touched, t.dense_shape),
                occurrences=occ,
                clip_factors=tf.ones([batch_size], tf.float32),
            )
        )
    dense = [(v, tf.zeros_like(v)) for v in dense_variables]
    dry = ClippedGradients(
        tables=table_grads, dense=dense, expected_batch_size=expected_batch_size, batch_size=batch_size
    )
    pairs, _ = run_once(mechanism, dry, ctx, dry=True)
    by_variable = {id(v): g for g, v in pairs}
    return [tf.sort(tf.cast(by_variable[id(t.embeddings)].indices, tf.int64)) for t in tables]


def run_once(mechanism: NoiseMechanism, clipped: ClippedGradients, ctx, *, dry: bool):
    """`mechanism.update` once for the global batch; (pairs, global clipped sums).

    `dry`: the mechanism's state (generator included) is restored afterwards.
    """

    def update(sums):
        if not dry:
            return mechanism.update(sums)
        state = _mechanism_state(mechanism)
        saved = [tf.identity(v.read_value()) for v in state]
        with tf.control_dependencies(saved):
            pairs = mechanism.update(sums)
        done = [g.values if isinstance(g, tf.IndexedSlices) else g for g, _ in pairs]
        with tf.control_dependencies(done):
            for variable, value in zip(state, saved):
                variable.assign(value)
        return pairs

    if ctx is None or ctx.num_replicas_in_sync == 1:
        return update(clipped), clipped
    total = all_reduce_clipped(clipped, ctx, with_lookups=True)
    variables = [t.variable for t in total.tables] + [v for v, _ in total.dense]
    order = {id(v): i for i, v in enumerate(variables)}
    flat, rebuild = _flatten(total)

    def merged(strategy, *per_replica):
        local = [strategy.experimental_local_results(x)[0] for x in per_replica]
        grads = [None] * len(variables)
        for grad, var in update(rebuild(local)):
            grads[order[id(var)]] = grad
        return [_encode_grad(g) for g in grads]

    encoded = ctx.merge_call(merged, args=tuple(flat))
    pairs = [(_decode_grad(g), v) for g, v in zip(encoded, variables) if g is not None]
    return pairs, total


def _mechanism_state(mechanism: NoiseMechanism) -> list:
    """Every variable `update` may write: the mechanism's variables and its generator's state."""
    seen, out = set(), []
    for variable in [*mechanism.variables, mechanism.generator.state]:
        if id(variable) not in seen:
            seen.add(id(variable))
            out.append(variable)
    return out


__all__ = ["planned_rows", "run_once"]
