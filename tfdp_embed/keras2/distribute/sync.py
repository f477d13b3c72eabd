"""The synchronous step (MirroredStrategy, MultiWorkerMirroredStrategy): the one-device DP step on the global batch.

    per replica r: clipped sums S_r;  S = sum_r S_r (all-reduce);  g = mechanism.update(S) once;
    every replica applies the same g

`noised_gradients` all-reduces the clipped sums (`all_reduce_clipped`) and
runs the mechanism once inside `ReplicaContext.merge_call`. Under
MultiWorkerMirroredStrategy every worker runs that merge on the same sums
with the generator state copied from worker 0 (`synchronize_generator`);
`check_identical_state` refuses mechanism state that differs between
workers. `DPModel`'s train step calls `mean_loss`, `noised_gradients` and
`apply_gradients`; on one device they reduce to the plain calls.

References: TensorFlow `tf.distribute` guide (merge_call, all_reduce).
"""

from __future__ import annotations

from tfdp_embed.keras2._keras import tf
from tfdp_embed.keras2.distribute.collectives import (
    _decode_grad,
    _encode_grad,
    _flatten,
    all_reduce_clipped,
)
from tfdp_embed.keras2.distribute.support import (
    MULTI_WORKER_MIRRORED,
    DistributionNotSupportedError,
    is_synchronous_replicated,
    strategy_kind,
)
from tfdp_embed.mechanisms.base import ClippedGradients, NoiseMechanism
from tfdp_embed.mechanisms.capabilities import capabilities_of
from tfdp_embed.traced_as_written import user_code


def synchronize_generator(mechanism: NoiseMechanism, strategy: tf.distribute.Strategy) -> None:
    """Copies worker 0's noise-generator state to every worker (MultiWorkerMirrored only).

    Each worker then draws the same noise in its merge step, so the mirrored
    variables stay identical. A no-op under every other strategy. (Worker 0's
    state is still OS entropy when `seed=None`; the noise stays secret.)
    """
    if strategy_kind(strategy) != MULTI_WORKER_MIRRORED:
        return
    state = mechanism.generator.state

    def broadcast():
        ctx = tf.distribute.get_replica_context()
        # Collectives sum floats: send the state as 32-bit halves (exact in float64).
        halves = tf.cast(tf.bitcast(tf.convert_to_tensor(state), tf.uint32), tf.float64)
        first = tf.cast(tf.equal(ctx.replica_id_in_sync_group, 0), tf.float64)
        summed = ctx.all_reduce("sum", halves * first)
        return tf.bitcast(tf.cast(tf.round(summed), tf.uint32), tf.int64)

    synced = strategy.run(tf.function(broadcast, autograph=False))
    value = strategy.experimental_local_results(synced)[0]
    state.assign(value)


def check_identical_state(mechanism: NoiseMechanism, strategy: tf.distribute.Strategy) -> None:
    """Refuses to train when the mechanism's state differs between workers (MultiWorkerMirrored only).

    Every worker runs the mechanism on the same inputs and must hold the same
    state (step counter, RNG state, DP-FEST / DP-AdaFEST+ selections, ...):
    a selection drawn with OS entropy on each worker would make the workers'
    models diverge silently. Compares, across workers, a fingerprint of every
    mechanism variable (count, sum and position-weighted sum of its bytes;
    exact in float64 up to ~10^8 bytes per variable).

    Raises:
      DistributionNotSupportedError: naming the differing variables.
    """
    if strategy_kind(strategy) != MULTI_WORKER_MIRRORED:
        return
    variables = sorted(mechanism.variables, key=lambda v: v.name)
    if not variables:
        return

    def fingerprint(var):
        raw = tf.convert_to_tensor(var)
        raw = tf.cast(raw, tf.uint8) if raw.dtype == tf.bool else tf.bitcast(raw, tf.uint8)
        words = tf.cast(tf.reshape(raw, [-1]), tf.float64)
        position = tf.cast(tf.range(tf.size(words)) % 65521 + 1, tf.float64)
        return tf.stack([tf.cast(tf.size(words), tf.float64), tf.reduce_sum(words), tf.reduce_sum(words * position)])

    def compare():
        ctx = tf.distribute.get_replica_context()
        mine = tf.stack([fingerprint(v) for v in variables])
        total = ctx.all_reduce("sum", mine)
        return tf.reduce_any(tf.not_equal(total, mine * ctx.num_replicas_in_sync), axis=1)

    differs = strategy.experimental_local_results(strategy.run(tf.function(compare, autograph=False)))[0]
    names = [v.name for v, d in zip(variables, differs.numpy()) if d]
    if names:
        raise DistributionNotSupportedError(
            f"Mechanism {mechanism.name!r} holds different state on different workers ({', '.join(names)}); "
            "under MultiWorkerMirroredStrategy every worker must hold the same state or the mirrored "
            "models diverge. A DP selection (DP-FEST, DP-AdaFEST+) drawn with OS entropy on each "
            "worker does this: draw it once (e.g. on worker 0), save it, and build every worker's "
            "mechanism from the saved rows, or seed it identically."
        )


# -- the synchronous step -----------------------------------------------------------
def mean_loss(per_example_loss: tf.Tensor) -> tf.Tensor:
    """The loss whose gradient, summed over replicas, is the global-batch mean's.

        single device: mean_i loss_i;  R replicas: sum_{i in replica} loss_i / (global batch size)

    The global batch size is all-reduced (replicas may hold different counts).
    """
    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync == 1 or not is_synchronous_replicated():
        return tf.reduce_mean(per_example_loss)
    local = tf.cast(tf.shape(per_example_loss)[0], per_example_loss.dtype)
    total = ctx.all_reduce("sum", local)
    return tf.reduce_sum(per_example_loss) / tf.maximum(total, 1.0)


def noised_gradients(mechanism: NoiseMechanism, clipped: ClippedGradients) -> list:
    """`mechanism.update` on the global batch's clipped sums; `(gradient, variable)` pairs.

    On one device (and under ParameterServerStrategy) this is exactly
    `mechanism.update(clipped)`. Under synchronous replication the clipped
    sums are all-reduced first and the mechanism runs once in cross-replica
    context; every replica receives the same noised gradients.
    """
    ctx = tf.distribute.get_replica_context()
    if ctx is None or not is_synchronous_replicated():
        return user_code(mechanism.update)(clipped)  # a user's mechanism: converted, as before
    # Lookups and clip factors are all-gathered unless the class declares it never reads them.
    total = all_reduce_clipped(clipped, ctx, with_lookups=capabilities_of(mechanism).needs_lookups)
    variables = [t.variable for t in total.tables] + [v for v, _ in total.dense]
    order = {v.ref(): i for i, v in enumerate(variables)}
    flat, rebuild = _flatten(total)

    def merged(strategy, *per_replica):
        local = [strategy.experimental_local_results(x)[0] for x in per_replica]
        pairs = mechanism.update(rebuild(local))
        grads = [None] * len(variables)
        for grad, var in pairs:
            grads[order[var.ref()]] = grad
        # Plain tensors (not IndexedSlices) cross back from the merge.
        return [_encode_grad(g) for g in grads]

    encoded = ctx.merge_call(merged, args=tuple(flat))
    return [(_decode_grad(g), v) for g, v in zip(encoded, variables) if g is not None]


def apply_gradients(optimizer, pairs) -> None:
    """Applies `pairs`; under synchronous replication they are already summed and noised."""
    if is_synchronous_replicated() and tf.distribute.get_replica_context() is not None:
        user_code(optimizer.apply_gradients)(pairs, experimental_aggregate_gradients=False)
    else:
        user_code(optimizer.apply_gradients)(pairs)


__all__ = ["apply_gradients", "check_identical_state", "mean_loss", "noised_gradients", "synchronize_generator"]
