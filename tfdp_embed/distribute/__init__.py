"""Every `tf.distribute` and TPU branch of tfdp_embed lives here; `DPModel` calls into it.

One DP step under a synchronous strategy (`MirroredStrategy`,
`MultiWorkerMirroredStrategy`) on R replicas is the single-device step on
the global batch:

    per replica r:  clip each of its examples once -> clipped sums S_r
    all replicas:   S = sum_r S_r  (all-reduce; sparse tables: union of touched rows)
    once:           g = mechanism.update(S)   (noise drawn once, in cross-replica context)
    every replica:  apply g to its copy of the mirrored variables (identical g)

`S` is gathered with collectives in replica context (`all_reduce` of the
dense sums and of the tables' `IndexedSlices`, whose duplicate rows are then
summed, so a row touched on one replica only is still one row of the union
and gets the full noise variance; `all_gather` of clip factors and lookups
for mechanisms that read them). The mechanism then runs once, inside
`ReplicaContext.merge_call`: in-process replicas share one draw of noise.
Under `MultiWorkerMirroredStrategy` each worker runs that merge once on the
same `S` with a generator whose state was copied from worker 0 at
`prepare`, before `mechanism.init` (`synchronize_generator`), so every
worker draws the same noise (and DP-FEST the same selection) and the
mirrored variables stay identical everywhere; `check_identical_state` then
refuses mechanism state that still differs between workers. Mechanism state
is made of plain (not mirrored) variables under these strategies: it is
only touched in the merge step. `after_apply` (the lookahead hook) runs in
replica context; it is a no-op for every mechanism supported there.

Under `ParameterServerStrategy` each worker is one replica that steps
asynchronously: the step runs as on one device, the tables live on the
parameter servers (created in the strategy scope; whole tables, spread
round-robin — tables split by a `variable_partitioner` are refused) and the
mechanism's state is created next to its table (`mechanism_state_scope`):
LazyDP's history table is colocated with the table it tracks. Sparse
mechanisms send `IndexedSlices` (touched or selected rows) to the servers,
dense DP-SGD a whole table per step (`benchmarks/traffic.py` measures it).
Keras `fit` drives it with a `DatasetCreator` and `steps_per_epoch`
(`ClusterCoordinator` underneath); server processes must be started with
`start_server`, which loads tfdp_embed's custom ops there.

Example (synchronous; the same code runs under MultiWorkerMirroredStrategy):
    >>> strategy = tf.distribute.MirroredStrategy()
    >>> with strategy.scope():
    ...     dp = DPModel(build_model(), mechanism=EANA(l2_norm_clip=1.0,
    ...                  noise_multiplier=1.0), expected_batch_size=1024)  # global batch
    ...     dp.compile(optimizer=keras.optimizers.legacy.SGD(0.1), loss=loss)
    >>> dp.fit(dataset.batch(1024))

Example (parameter servers; each server process runs
`start_server(cluster, job_name="ps", task_index=i).join()`):
    >>> strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    >>> with strategy.scope():
    ...     dp = DPModel(build_model(), mechanism=LazyDP(l2_norm_clip=1.0,
    ...                  noise_multiplier=1.0), expected_batch_size=1024)
    ...     dp.compile(optimizer=keras.optimizers.legacy.SGD(0.1), loss=loss)
    >>> dp.fit(keras.utils.experimental.DatasetCreator(dataset_fn), epochs=1,
    ...        steps_per_epoch=100)

Support (`SUPPORT`; anything else raises `DistributionNotSupportedError` at
`DPModel` construction and again at `prepare`, naming the strategy and why):

    mechanism  | one device | Mirrored | MultiWorkerMirrored | ParameterServer        | TPU
    none       | yes        | yes      | yes                 | yes                    | no (1)
    dense      | yes        | yes      | yes                 | yes                    | no (1)
    eana       | yes        | yes      | yes                 | yes                    | no (1)
    fest       | yes        | yes      | yes                 | yes                    | no (1)
    adafest    | yes        | yes      | yes                 | yes                    | no (1)
    adafest+   | yes        | yes      | yes                 | yes                    | no (1)
    lazy       | yes        | no (2)   | no (2)              | yes, one worker (3)    | no (1)

    (1) Keras `fit` on `TPUStrategy` with `DPEmbedding` is not implemented:
        tables on SparseCore are updated through `TPUEmbeddingV2`'s gradient
        path. `TpuDPStep` (below) is that step for none, eana, fest, adafest
        and adafest+ (tables on the engine, TensorCore model beside it; run it
        inside `strategy.run`); dense and lazy are refused there too. See
        docs/tpu_sparsecore.md and `tpu_embedding_plan`. CPU-tested with a
        CPU engine of the same interface; never run on a TPU.
    (2) LazyDP's read hook catches rows up (adds owed noise) inside each
        replica's forward pass for the ids that replica reads; replicas would
        add different noise to their copies of a mirrored table.
    (3) Concurrent workers would race on the history table and step counter.
    Other strategies (e.g. `CentralStorageStrategy`) are refused for every
    mechanism; so are tables sharded by a `variable_partitioner`.

References: TensorFlow `tf.distribute` guide (merge_call, all_reduce,
ClusterCoordinator); EANA (RecSys 2022) §3 (parameter-server traffic);
LazyDP (ASPLOS 2024) §5.2 (history table next to its table).
"""

from __future__ import annotations

import contextlib
import dataclasses

from tfdp_embed._keras import tf
from tfdp_embed.layers.embedding import DPEmbedding, EmbeddingOccurrences
from tfdp_embed.mechanisms.base import ClippedGradients, NoiseMechanism, TableGradient

DEFAULT = "default"
MIRRORED = "mirrored"
MULTI_WORKER_MIRRORED = "multi_worker_mirrored"
PARAMETER_SERVER = "parameter_server"
TPU = "tpu"
OTHER = "other"

_LAZY_SYNC_REASON = (
    "LazyDP adds each row's owed noise in its read hook, inside every replica's forward pass, "
    "for the ids that replica reads: the replicas of a synchronous strategy would add different "
    "noise to their copies of the mirrored table (and a row read on two replicas would get its "
    "owed noise twice). Use ParameterServerStrategy with one worker, one device, or a mechanism "
    "without deferred noise ('dense', 'fest', 'adafest', 'adafest+')."
)
_TPU_REASON = (
    "Keras fit on TPUStrategy with DPEmbedding tables is not implemented: tables on TPU "
    "SparseCore are only updated through the embedding engine's gradient path. Use "
    "tfdp_embed.distribute.TpuDPStep (the DP step with the tables on TPUEmbeddingV2, for the "
    "mechanisms none, eana, fest, adafest, adafest+) inside strategy.run; docs/tpu_sparsecore.md "
    "says what each mechanism needs and which are possible (tfdp_embed.distribute.tpu_embedding_plan)."
)

# mechanism name -> {strategy kind: None (supported) or the reason it is not}.
SUPPORT = {
    name: {DEFAULT: None, MIRRORED: None, MULTI_WORKER_MIRRORED: None, PARAMETER_SERVER: None, TPU: _TPU_REASON}
    for name in ("none", "dense", "eana", "fest", "adafest", "adafest+", "lazy")
}
SUPPORT["lazy"][MIRRORED] = _LAZY_SYNC_REASON
SUPPORT["lazy"][MULTI_WORKER_MIRRORED] = _LAZY_SYNC_REASON

# Mechanisms known not to read `TableGradient.occurrences` / `clip_factors`: their
# lookups are not all-gathered across replicas. Unknown mechanisms get them.
_NO_LOOKUPS_NEEDED = ("none", "dense", "eana", "fest", "lazy")


class DistributionNotSupportedError(ValueError):
    """A mechanism cannot run under the active `tf.distribute` strategy (the message says why)."""


# -- which strategy ---------------------------------------------------------------
def strategy_kind(strategy: tf.distribute.Strategy | None = None) -> str:
    """Names the kind of `strategy` (default: the active one).

    Returns:
      One of "default" (no strategy, the default one or `OneDeviceStrategy`),
      "mirrored", "multi_worker_mirrored", "parameter_server", "tpu", "other".
    """
    if strategy is None:
        strategy = tf.distribute.get_strategy()
    if strategy is tf.distribute.get_strategy() and not tf.distribute.has_strategy():
        return DEFAULT
    if isinstance(strategy, tf.distribute.OneDeviceStrategy):
        return DEFAULT
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return MULTI_WORKER_MIRRORED
    if isinstance(strategy, tf.distribute.MirroredStrategy):
        return MIRRORED
    if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        return PARAMETER_SERVER
    if isinstance(strategy, (tf.distribute.TPUStrategy, tf.distribute.experimental.TPUStrategy)):
        return TPU
    if type(strategy).__name__ == "_DefaultDistributionStrategy":
        return DEFAULT
    return OTHER


def check_supported(mechanism: NoiseMechanism, strategy: tf.distribute.Strategy | None = None) -> str:
    """Raises unless `mechanism` runs under `strategy`; returns the strategy kind.

    Raises:
      DistributionNotSupportedError: the mechanism does not support the
        strategy (the message names both and says why), or the strategy is
        one tfdp_embed does not know (e.g. `CentralStorageStrategy`).
    """
    if strategy is None:
        strategy = tf.distribute.get_strategy()
    kind = strategy_kind(strategy)
    if kind == OTHER:
        raise DistributionNotSupportedError(
            f"tfdp_embed does not support {type(strategy).__name__}: DP training runs on one "
            "device, MirroredStrategy, MultiWorkerMirroredStrategy or ParameterServerStrategy."
        )
    reason = unsupported_reason(mechanism.name, kind)
    if reason is not None:
        raise DistributionNotSupportedError(
            f"Mechanism {mechanism.name!r} does not support {type(strategy).__name__} "
            f"({kind}): {reason}"
        )
    if kind == PARAMETER_SERVER and mechanism.name == "lazy":
        workers = _parameter_server_workers(strategy)
        if workers != 1:
            raise DistributionNotSupportedError(
                f"Mechanism 'lazy' supports ParameterServerStrategy with exactly one worker; this "
                f"cluster has {workers}. Asynchronous workers would race on LazyDP's history table "
                "and step counter (a row could be caught up twice or read before its noise)."
            )
    return kind


def check_tables(model) -> None:
    """Refuses `DPEmbedding` tables split into shards by a `variable_partitioner`.

    `tf.gather` on a `ShardedVariable` takes 1-D ids only (a `[batch, n]`
    lookup fails inside the layer), and per-example clipping and every
    mechanism address a table as one variable (one `IndexedSlices`, one
    history per table).

    Raises:
      DistributionNotSupportedError: naming the sharded table.
    """
    from tfdp_embed.layers.embedding import DPEmbedding

    sharded = tf.__internal__.distribute.ShardedVariable
    for layer in [model, *getattr(model, "submodules", ())]:
        if isinstance(layer, DPEmbedding) and isinstance(getattr(layer, "embeddings", None), sharded):
            raise DistributionNotSupportedError(
                f"DPEmbedding {layer.name!r} is split into {len(layer.embeddings.variables)} shards by "
                "ParameterServerStrategy's variable_partitioner; sharded tables are not supported "
                "(per-example clipping and the noise mechanisms treat a table as one variable). Build "
                "the strategy without a variable_partitioner (whole tables, spread round-robin over "
                "the servers) or with one that returns one shard for tables."
            )


def unsupported_reason(mechanism_name: str, kind: str) -> str | None:
    """Why mechanism `mechanism_name` cannot run under strategy kind `kind`; None when it can.

    Mechanisms missing from `SUPPORT` (added later) are allowed everywhere but on TPU.
    """
    table = SUPPORT.get(mechanism_name)
    if table is None:
        return _TPU_REASON if kind == TPU else None
    return table.get(kind)


def _parameter_server_workers(strategy) -> int:
    # ParameterServerStrategy has no public accessor for its worker count (TF 2.21); it
    # stores the resolver it was built from.
    resolver = getattr(strategy, "_cluster_resolver", None) or strategy.cluster_resolver
    return len(resolver.cluster_spec().as_dict().get("worker", []))


def is_synchronous_replicated(strategy: tf.distribute.Strategy | None = None) -> bool:
    """True under Mirrored / MultiWorkerMirrored strategies (the all-reduce + merge path)."""
    return strategy_kind(strategy) in (MIRRORED, MULTI_WORKER_MIRRORED)


# -- cluster processes --------------------------------------------------------------
def start_server(cluster, *, job_name: str, task_index: int, config=None) -> tf.distribute.Server:
    """Starts a `tf.distribute.Server` able to run tfdp_embed's steps.

    Parameter-server and worker processes execute the functions the
    coordinator sends them, which contain tfdp_embed's custom ops (the fast
    Gaussian sampler and the fused sparse-row ops): the op library must be
    loaded in *their* process too, or the first step fails with "Op type not
    registered". This loads it (building it if needed; when it cannot be
    built the coordinator falls back to TensorFlow's sampler as well) and
    starts the server.

    Args:
      cluster: a `tf.train.ClusterSpec` or its dict form.
      job_name: "worker" or "ps" (or "chief").
      task_index: index of this task in its job.
      config: optional `tf.compat.v1.ConfigProto`.

    Returns:
      The started server (call `.join()` to serve until killed).

    Example:
        >>> server = start_server(cluster, job_name="ps", task_index=0)
        >>> server.join()
    """
    from tfdp_embed.ops import fast_normal

    fast_normal.available()  # loads (or builds) the op library; False means the fallback is used
    return tf.distribute.Server(
        tf.train.ClusterSpec(cluster), job_name=job_name, task_index=task_index, config=config, protocol="grpc"
    )


# -- state placement --------------------------------------------------------------
@contextlib.contextmanager
def mechanism_state_scope(strategy: tf.distribute.Strategy, tables) -> None:
    """Scope in which `mechanism.init` creates its state.

    One device and synchronous strategies: no scope. The mechanism only runs
    in cross-replica context there (`noised_gradients`' merge step), once per
    worker on identical inputs, so plain variables stay identical on every
    worker; mirrored variables would refuse some of the updates mechanisms
    make (`scatter_nd_update`, used by DP-FEST's selection).
    `ParameterServerStrategy`: inside its scope, so the servers hold the
    state, and a variable whose name starts with a prefix ending in a table
    layer's name (LazyDP's `history_<table>`, DP-FEST's `<table>/fest_*`) is
    colocated with that table: a table's per-row state lives on the same
    parameter server.
    """
    if strategy_kind(strategy) != PARAMETER_SERVER:
        yield
        return
    with strategy.scope():
        by_name = {layer.name: layer.embeddings for layer in tables}

        def colocate(next_creator, **kwargs):
            name = str(kwargs.get("name") or "")
            table = _table_for_state(name, by_name)
            if table is not None and not isinstance(table, tf.__internal__.distribute.ShardedVariable):
                kwargs["colocate_with"] = table
            return next_creator(**_fixed_shape(kwargs))

        with tf.variable_creator_scope(colocate):
            yield


# TF 2.21 aborts the process (CHECK failure in tensor_shape.cc) when a function scheduled
# on a worker reads a parameter-server variable whose shape has an unknown dimension.
# Growable state (LazyDP's per-step sums, shape [None], doubled when full) is therefore
# created under ParameterServerStrategy with this fixed first dimension (steps); growing
# beyond it fails with TensorFlow's shape error.
PS_GROWABLE_CAPACITY = 1 << 20


def _fixed_shape(kwargs: dict) -> dict:
    """Gives a rank-1 variable declared with shape [None] the fixed shape [PS_GROWABLE_CAPACITY]."""
    shape = kwargs.get("shape")
    if shape is None:
        return kwargs
    shape = tf.TensorShape(shape)
    if shape.rank != 1 or shape[0] is not None:
        return kwargs
    initial = kwargs["initial_value"]
    initial = tf.convert_to_tensor(initial() if callable(initial) else initial)
    padding = tf.maximum(PS_GROWABLE_CAPACITY - tf.shape(initial)[0], 0)
    return {**kwargs, "initial_value": tf.pad(initial, [[0, padding]]), "shape": None}


def _table_for_state(name: str, by_name: dict):
    for table_name, table in by_name.items():
        if name == f"history_{table_name}" or name.startswith(f"{table_name}/") or name.endswith(f"_{table_name}"):
            return table
    return None


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
        return mechanism.update(clipped)
    total = all_reduce_clipped(clipped, ctx, with_lookups=mechanism.name not in _NO_LOOKUPS_NEEDED)
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
        optimizer.apply_gradients(pairs, experimental_aggregate_gradients=False)
    else:
        optimizer.apply_gradients(pairs)


def all_reduce_clipped(clipped: ClippedGradients, ctx, *, with_lookups: bool) -> ClippedGradients:
    """The global batch's `ClippedGradients` from each replica's, with collectives.

        dense: sum_r S_r;  tables: IndexedSlices over the union of touched rows,
        values summed per row;  batch_size: sum_r B_r;  with_lookups: clip
        factors and lookups concatenated in replica order (example and
        segment ids offset by the replicas before).

    Every replica receives the same result.

    Args:
      clipped: this replica's clipped sums.
      ctx: the `tf.distribute.ReplicaContext`.
      with_lookups: also gather `clip_factors` and `occurrences` (DP-AdaFEST
        builds its contribution map from them).
    """
    dense_sums = ctx.all_reduce("sum", [g for _, g in clipped.dense]) if clipped.dense else []
    batch = tf.cast(clipped.batch_size, tf.int32)
    batches = ctx.all_gather(tf.reshape(batch, [1]), axis=0)
    example_offset = _offset(batches, ctx)
    tables = []
    for table in clipped.tables:
        summed = union_of_rows(ctx.all_reduce("sum", table.gradient))
        occurrences, factors = [], table.clip_factors
        if with_lookups:
            factors = ctx.all_gather(table.clip_factors, axis=0)
            occurrences = [_gather_occurrences(o, ctx, example_offset) for o in table.occurrences]
        tables.append(dataclasses.replace(table, gradient=summed, occurrences=occurrences, clip_factors=factors))
    return ClippedGradients(
        tables=tables,
        dense=[(v, g) for (v, _), g in zip(clipped.dense, dense_sums)],
        expected_batch_size=clipped.expected_batch_size,
        batch_size=tf.reduce_sum(batches),
    )


def union_of_rows(slices: tf.IndexedSlices) -> tf.IndexedSlices:
    """Sums the values of repeated indices: one row per distinct index (first-seen order)."""
    rows, position = tf.unique(tf.cast(slices.indices, tf.int64), out_idx=tf.int32)
    values = tf.math.unsorted_segment_sum(slices.values, position, tf.size(rows))
    return tf.IndexedSlices(values, rows, slices.dense_shape)


def _offset(sizes: tf.Tensor, ctx) -> tf.Tensor:
    """Sum of `sizes` of the replicas before this one (exclusive prefix sum)."""
    before = tf.range(tf.size(sizes)) < ctx.replica_id_in_sync_group
    return tf.reduce_sum(tf.where(before, sizes, tf.zeros_like(sizes)))


def _gather_occurrences(occ: EmbeddingOccurrences, ctx, example_offset) -> EmbeddingOccurrences:
    num_segments = tf.cast(occ.num_segments, tf.int32)
    segment_offset = _offset(ctx.all_gather(tf.reshape(num_segments, [1]), axis=0), ctx)
    batch = tf.cast(occ.batch_size, tf.int32)
    return EmbeddingOccurrences(
        ids=ctx.all_gather(occ.ids, axis=0),
        segments=ctx.all_gather(tf.cast(occ.segments, tf.int32) + segment_offset, axis=0),
        weights=ctx.all_gather(occ.weights, axis=0),
        num_segments=ctx.all_reduce("sum", num_segments),
        segment_examples=ctx.all_gather(tf.cast(occ.segment_examples, tf.int32) + example_offset, axis=0),
        batch_size=ctx.all_reduce("sum", batch),
    )


def _flatten(clipped: ClippedGradients):
    """Tensors of `clipped` as a flat list, and a function rebuilding it from such a list."""
    flat = []

    def push(x):
        flat.append(tf.convert_to_tensor(x))
        return len(flat) - 1

    plan = []
    for table in clipped.tables:
        g = table.gradient
        slots = (push(g.values), push(g.indices), push(g.dense_shape), push(table.clip_factors))
        occ_slots = [
            tuple(push(getattr(o, f.name)) for f in dataclasses.fields(EmbeddingOccurrences))
            for o in table.occurrences
        ]
        plan.append((table, slots, occ_slots))
    dense_slots = [push(g) for _, g in clipped.dense]
    batch_slot = push(clipped.batch_size)

    def rebuild(values) -> ClippedGradients:
        tables = []
        for table, (vs, ix, shape, factors), occ_slots in plan:
            occurrences = [EmbeddingOccurrences(*(values[i] for i in slots)) for slots in occ_slots]
            tables.append(
                TableGradient(
                    layer=table.layer,
                    variable=table.variable,
                    gradient=tf.IndexedSlices(values[vs], values[ix], values[shape]),
                    occurrences=occurrences,
                    clip_factors=values[factors],
                )
            )
        return ClippedGradients(
            tables=tables,
            dense=[(v, values[i]) for (v, _), i in zip(clipped.dense, dense_slots)],
            expected_batch_size=clipped.expected_batch_size,
            batch_size=values[batch_slot],
        )

    return flat, rebuild


def _encode_grad(grad):
    if isinstance(grad, tf.IndexedSlices):
        return (grad.values, grad.indices, grad.dense_shape)
    return grad


def _decode_grad(grad):
    if isinstance(grad, (tuple, list)):
        return tf.IndexedSlices(*grad)
    return grad


# -- TPU SparseCore (TPUEmbeddingV2): the gradient path ------------------------------
@dataclasses.dataclass(frozen=True)
class TpuEmbeddingPlan:
    """What one mechanism needs from the TPU embedding engine (docs/tpu_sparsecore.md).

    Attributes:
      mechanism: mechanism name.
      possible: True when the mechanism can run with tables on SparseCore today.
      path: how (the gradient-path recipe), or why not.
      needs: engine features the recipe relies on.
    """

    mechanism: str
    possible: bool
    path: str
    needs: tuple


_CLIP = "per-example clip factors c_i scale the activation gradients before apply_gradients"
_NOISE_FEATURE = (
    "a 'noise feature' on the same table whose ids are the global union of touched rows, each row "
    "owned by one replica (noise_feature_rows) and whose activation gradients are the noise "
    "(noise_feature_gradients): the engine sums all features' gradients per row, so each row gets "
    "exactly one draw"
)

TPU_PLANS = {
    "none": TpuEmbeddingPlan("none", True, "plain TPUEmbedding training (no clipping, no noise)", ()),
    "eana": TpuEmbeddingPlan(
        "eana", True, f"{_CLIP}; {_NOISE_FEATURE}.",
        ("TPUEmbeddingV2.apply_gradients with explicit activation gradients", "extra FeatureConfig on the table",
         "ids of the batch on the TensorCore (ghost norms, union of rows)"),
    ),
    "fest": TpuEmbeddingPlan(
        "fest", True,
        f"{_CLIP}; unselected rows must get no gradient: ids as sequence features "
        "(max_sequence_length > 0, pooling on the TensorCore) so each occurrence's gradient can be "
        "masked; noise feature over the k selected rows every step.",
        ("sequence features (per-id activations)", "extra FeatureConfig with k ids per step"),
    ),
    "adafest": TpuEmbeddingPlan(
        "adafest", True,
        f"{_CLIP}; contribution map and thresholding on the TensorCore from the ids; touched rows "
        "below tau masked per occurrence (sequence features); noise feature over the survivors "
        "(touched survivors plus noise-only rows, a variable count padded to a static maximum).",
        ("sequence features (per-id activations)", "static maximum of survivors per step"),
    ),
    "adafest+": TpuEmbeddingPlan(
        "adafest+", True, "as adafest, restricted to the DP-FEST selection.",
        ("sequence features (per-id activations)", "static maximum of survivors per step"),
    ),
    "dense": TpuEmbeddingPlan(
        "dense", False,
        "dense DP-SGD adds noise to every row every step; SparseCore updates only rows that appear in "
        "the step's features, so it would need all vocabulary ids as a feature each step (a "
        "table-sized activation gradient): not feasible beyond small tables.",
        (),
    ),
    "lazy": TpuEmbeddingPlan(
        "lazy", False,
        "LazyDP must add a row's owed noise before the row is read; TPUEmbedding reads rows inside "
        "the engine with no read hook. Plain SGD could be served by the lookahead (owed noise of the "
        "next batch's rows sent through the noise feature as gradient -owed/lr, history table on the "
        "TensorCore host), but momentum's deferred drift m <- beta^k m has no gradient-path form and "
        "the SparseCore optimizers apply to rows in the batch only; not implemented.",
        ("read hook or lookahead feature", "history table", "SGD without momentum"),
    ),
}


def tpu_embedding_plan(mechanism: NoiseMechanism | str) -> TpuEmbeddingPlan:
    """The TPU SparseCore plan of `mechanism` (a mechanism or its name).

    Raises:
      KeyError: for a mechanism with no plan (a new mechanism must add one).
    """
    name = mechanism if isinstance(mechanism, str) else mechanism.name
    if name not in TPU_PLANS:
        raise KeyError(f"No TPU SparseCore plan for mechanism {name!r}; plans exist for {sorted(TPU_PLANS)}.")
    return TPU_PLANS[name]


def noise_feature_rows(touched_rows: tf.Tensor, *, max_rows: int, ctx=None) -> tuple:
    """Rows this replica noises so that every row touched by any replica is noised exactly once.

        union = unique(all_gather(touched rows of every replica));  replica r owns union[j] for j % R == r

    Args:
      touched_rows: int `[n]` rows this replica's batch touched (repeats allowed).
      max_rows: static size of the returned ids (TPU shapes are static):
        padding rows are 0 with weight 0.
      ctx: the replica context (default: the current one; None or one replica
        means this replica owns the whole union).

    Returns:
      (ids int32 `[max_rows]`, weights float32 `[max_rows]` (1 for owned rows, 0
      for padding), count of owned rows). Feed ids/weights as the noise
      feature; give its activation gradients from `noise_feature_gradients`.

    Raises:
      tf.errors.InvalidArgumentError: when more than `max_rows` rows are owned.

    References: EANA §3 (noise on the rows of the batch); docs/tpu_sparsecore.md.
    """
    rows = tf.reshape(tf.cast(touched_rows, tf.int32), [-1])
    ctx = ctx or tf.distribute.get_replica_context()
    replicas, me = 1, 0
    if ctx is not None and ctx.num_replicas_in_sync > 1:
        rows = ctx.all_gather(rows, axis=0)
        replicas, me = ctx.num_replicas_in_sync, ctx.replica_id_in_sync_group
    union = tf.sort(tf.unique(rows).y)  # the same order on every replica
    return _owned_rows(
        union, max_rows, replicas, me, message=f"noise_feature_rows: more owned rows than max_rows={max_rows}; raise it."
    )


def noise_feature_gradients(generator, weights: tf.Tensor, *, dim: int, stddev: float) -> tf.Tensor:
    """Activation gradients of the noise feature: N(0, stddev^2) per owned row, 0 on padding.

    With `stddev = sigma C / B` and SGD on the engine, row j moves by
    -lr (clipped sum_j + N(0, sigma^2 C^2)) / B, EANA's update.

    Args:
      generator: a `tf.random.Generator` created inside the strategy scope:
        in replica context each replica then draws from its own stream, as
        its rows need independent noise.
      weights: `[max_rows]` from `noise_feature_rows`.
      dim: embedding dimension.
      stddev: per-coordinate standard deviation (>= 0).
    """
    from tfdp_embed.ops import fast_normal

    size = tf.shape(weights)[0]
    return fast_normal.normal(generator, [size, dim], stddev) * weights[:, None]


def clipped_activation_gradients(activation_gradients: tf.Tensor, clip_factors: tf.Tensor, *, expected_batch_size: float):
    """Per-example activation gradients scaled by c_i / B: the engine's per-row sum is then the clipped sum / B.

    Args:
      activation_gradients: `[batch, ...]` gradients of the loss *sum* w.r.t.
        one feature's activations (row i belongs to example i).
      clip_factors: `[batch]` c_i = C / max(||g_i||, C).
      expected_batch_size: B.
    """
    factors = tf.cast(clip_factors, activation_gradients.dtype) / expected_batch_size
    shape = tf.concat([tf.shape(factors), tf.ones([tf.rank(activation_gradients) - 1], tf.int32)], 0)
    return activation_gradients * tf.reshape(factors, shape)


# -- TPU SparseCore: the DP step through the engine's gradient path ------------------
NOISE_FEATURE_SUFFIX = "_dp_noise"


def noise_feature_name(table: str) -> str:
    """Name of the noise feature of engine table `table` in the engine's feature structure."""
    return f"{table}{NOISE_FEATURE_SUFFIX}"


@dataclasses.dataclass(frozen=True)
class TpuFeature:
    """One feature the TPU embedding engine looks up for the DP step.

    Attributes:
      name: key of the feature in the dicts given to the engine's `enqueue`
        and `apply_gradients` (and in the activations dict the TensorCore
        model receives).
      table: the engine table it reads (a key of `TpuDPStep`'s `table_sizes`).
      combiner: how the engine pools the feature's ids: "sum", "mean",
        "sqrtn" (activations `[batch, dim]`), or None for a sequence feature
        (`[batch, n, dim]`, one activation per id; the TensorCore pools).
        Mechanisms that freeze touched rows (DP-FEST, DP-AdaFEST(+)) need
        sequence features: only a per-id activation gradient can be masked.
    """

    name: str
    table: str
    combiner: str | None = "mean"


class EngineTable(DPEmbedding):
    """A table living on the TPU embedding engine, seen as a `DPEmbedding` by clipping and mechanisms.

    Never built and never called. `occurrences(ids)` flattens the batch's ids
    with the feature's combiner weights, exactly as the engine combines them;
    the clipping registry's `DPEmbedding` rule (through
    `engine_table_gradients`) and every mechanism then treat it like a table
    on the TensorCore. The table's values never reach the TensorCore:
    `embeddings` is a `[1, dim]` stand-in whose dtype and width the rule
    reads (TPUEmbeddingV2's own variables are stacked, padded and
    mod-sharded, not a `[vocabulary, dim]` array in row order); it also keys
    the table's gradient in the mechanism's `(gradient, variable)` pairs.

    Args:
      name: the engine table name.
      vocabulary_size: rows of the table (`TableConfig.vocabulary_size`).
      dim: its width (`TableConfig.dim`).
      combiner: the combiner of every feature reading this table.
    """

    def __init__(self, name: str, vocabulary_size: int, dim: int, combiner: str | None):
        super().__init__(vocabulary_size, dim, combiner=combiner, name=name, trainable=False)
        stand_in = tf.Variable(tf.zeros([1, dim]), trainable=False, name=f"{name}_engine_table")
        object.__setattr__(self, "_stand_in", stand_in)  # not tracked as this layer's weight
        self.built = True

    @property
    def embeddings(self):
        return self._stand_in

    @property
    def dense_shape(self) -> tf.Tensor:
        """int64 `[vocabulary, dim]`: the dense shape of this table's gradients."""
        return tf.constant([self.vocabulary_size, self.output_dim], tf.int64)


def engine_table_gradients(layer: EngineTable, taps, output_grads):
    """The `DPEmbedding` registry rule for an engine table, its clipped sums given the table's dense shape.

    Same per-example norms and clipped sums as `clipping.embedding_layer_gradients`
    (it is called); only the `IndexedSlices`' dense shape is the table's
    `[vocabulary, dim]` instead of the stand-in's.
    """
    from tfdp_embed.clipping import embedding_layer_gradients

    info = embedding_layer_gradients(layer, taps, output_grads)
    inner = info.clipped_sum

    def clipped_sum(clip_factors):
        return [tf.IndexedSlices(g.values, g.indices, layer.dense_shape) for g in inner(clip_factors)]

    return dataclasses.replace(info, clipped_sum=clipped_sum)


class TpuDPStep:
    """One DP training step with the embedding tables on the TPU embedding engine (SparseCore).

    Per replica (inside `strategy.run`), for one global batch:

        rows_t = the rows mechanism.update will change in table t this step (a
                 dry run on the batch's ids; the draws are then replayed)
        engine.enqueue(batch features + per table a noise feature listing the
                       rows of rows_t this replica owns)  ->  dequeue: activations
        TensorCore: model(activations) -> per-example losses; ghost norms (the
                    clipping registry: DPEmbedding rule from ids + activation
                    gradients, Dense/LayerNorm rules for the TensorCore layers)
                    -> c_i = C / max(||g_i||, C)
        M = mechanism.update(global clipped sums)   (once; merge_call on > 1 replica)
        engine.apply_gradients(
            batch features: c_i / B x activation gradients (sequence features:
                            masked to rows_t, so frozen rows get exactly 0),
            noise features: M[r] - S[r] for owned rows r, S = clipped sum / B)
        optimizer.apply_gradients(M's dense DP-SGD gradients)   (noised once)

    The engine sums every feature and replica per row, so row r of table t
    receives S[r] + (M[r] - S[r]) = M[r], the mechanism's own gradient (EANA:
    (clipped sum + N(0, sigma^2 C^2)) / B on the union of touched rows; DP-FEST:
    noise on all k selected rows, unselected rows 0; DP-AdaFEST: survivors),
    and every row of the cross-replica union once. Rows outside M get no
    gradient at all. With an SGD engine optimizer the tables then move as
    `DPModel`'s would (`tests/distributed/test_tpu_step.py` checks it against a
    `DPModel` step to float rounding, with a CPU engine of the same interface).

    Why a dry run: the noise feature is enqueued with the batch, before any
    gradient exists, but DP-AdaFEST draws its survivors inside `update`.
    Every TPU-possible mechanism decides its rows from the ids and its
    generator only, never from gradient values, so `update` is run once on
    zero gradients with the batch's touched rows, its rows are kept, and all
    mechanism state (generator included) is put back; the real `update` draws
    the same numbers and must return the same rows (checked). Cost: a second
    `update` (O(rows x dim)) and a copy of the mechanism's variables per step
    (DP-FEST: its [vocabulary] int32 position map).

    Never run on a TPU (none was available): the engine is an argument, tested
    with a CPU engine of the same interface. On a TPU, TPU shapes are static:
    `tf.unique` / boolean masks inside the clipping rules and mechanisms would
    need padding to static maxima for XLA (the noise feature already is padded
    to `max_noise_rows`). See docs/tpu_sparsecore.md.

    Args:
      engine: the embedding engine, with `TPUEmbeddingV2`'s interface:
        `enqueue(features, weights) -> partitioned`, `dequeue(partitioned) ->
        (activations, preserved)` and `apply_gradients(gradients, preserved)`.
        Its feature configuration must hold every feature of `features` and, for a
        clipping mechanism, per table the noise feature `noise_feature_name(table)`
        (one id per sample, `[max_noise_rows]` samples, combiner "sum"; ids
        arrive with weights 1, padding with 0). The engine's optimizer is the
        tables' optimizer (SGD gives DP-SGD's update).
      model: the TensorCore Keras model: {feature name: activations} ->
        predictions. Built, no `DPEmbedding` inside (tables go on the engine).
      features: the `TpuFeature`s of the batch.
      mechanism: a TPU-possible `NoiseMechanism` (`TPU_PLANS`), keyword-only.
      loss: per-example loss: a Keras `Loss` (applied unreduced) or a callable
        (labels, predictions) -> `[batch]`.
      optimizer: Keras optimizer of the TensorCore variables.
      expected_batch_size: B, the global expected batch size (q N).
      table_sizes: {table name: (vocabulary_size, dim)} of every table the
        features read (the engine's `TableConfig`s).
      max_noise_rows: static number of noise-feature ids per replica, an int
        or {table: int}; a step needing more fails with a clear error.
      registry: `LayerRegistry` of per-example norm rules (default:
        `tfdp_embed.clipping.default_registry()`).

    Raises:
      DistributionNotSupportedError: a mechanism that cannot run on the engine
        (dense DP-SGD, LazyDP: the reason from `TPU_PLANS`), or DP-FEST /
        DP-AdaFEST(+) with pooled features.
      ValueError: tables missing from `table_sizes` (or sizes that are not
        positive ints), repeated feature names, features of one
        table with different combiners, a non-positive `max_noise_rows` or
        `expected_batch_size`, an unbuilt model or a model holding tables.

    Example (one replica step; under TPUStrategy inside `strategy.run`):
        >>> step = TpuDPStep(engine, model=tower, features=[TpuFeature("movie", "movies")],
        ...                  table_sizes={"movies": (100_000, 32)},
        ...                  mechanism=EANA(l2_norm_clip=1.0, noise_multiplier=1.0),
        ...                  loss=keras.losses.BinaryCrossentropy(from_logits=True),
        ...                  optimizer=keras.optimizers.legacy.SGD(0.1),
        ...                  expected_batch_size=1024, max_noise_rows=4096)
        >>> logs = step({"movie": ids}, labels)

    References: EANA (RecSys 2022) §3, Alg. 2; DP-FEST / DP-AdaFEST
    (NeurIPS 2023) §3; Bu et al. 2022 (book-keeping); TensorFlow
    `tpu_embedding_v3.TPUEmbeddingV2` (enqueue / dequeue / apply_gradients).
    """

    def __init__(
        self,
        engine,
        *,
        model,
        features,
        mechanism: NoiseMechanism,
        loss,
        optimizer,
        expected_batch_size: float,
        table_sizes,
        max_noise_rows,
        registry=None,
    ):
        from tfdp_embed import clipping
        from tfdp_embed.clipping.taps import layers_owning_weights

        if not isinstance(mechanism, NoiseMechanism):
            raise TypeError(f"`mechanism` must be a tfdp_embed NoiseMechanism; received {type(mechanism).__name__}.")
        plan = TPU_PLANS.get(mechanism.name)
        if plan is None or not plan.possible:
            why = plan.path if plan is not None else f"no TPU plan exists for {mechanism.name!r} (TPU_PLANS)"
            raise DistributionNotSupportedError(
                f"Mechanism {mechanism.name!r} cannot run with its tables on the TPU embedding engine: {why} "
                f"TPU-possible mechanisms: {sorted(n for n, p in TPU_PLANS.items() if p.possible)} "
                "(docs/tpu_sparsecore.md)."
            )
        for method in ("enqueue", "dequeue", "apply_gradients"):
            if not callable(getattr(engine, method, None)):
                raise TypeError(
                    f"`engine` must have TPUEmbeddingV2's {method}(); {type(engine).__name__} has none."
                )
        table_sizes = _check_table_sizes(table_sizes)
        features = list(features)
        if not features or not all(isinstance(f, TpuFeature) for f in features):
            raise ValueError(f"`features` must be a non-empty sequence of TpuFeature; received {features!r}.")
        names = [f.name for f in features]
        if len(set(names)) != len(names):
            raise ValueError(f"Feature names repeat: {names}; each feature needs its own name.")
        combiners = {}
        for f in features:
            if f.table not in table_sizes:
                raise ValueError(
                    f"Feature {f.name!r} reads table {f.table!r}, which `table_sizes` does not have; it has "
                    f"{sorted(table_sizes)}."
                )
            if f.name.endswith(NOISE_FEATURE_SUFFIX):
                raise ValueError(f"Feature name {f.name!r} ends with {NOISE_FEATURE_SUFFIX!r}, reserved for noise features.")
            if combiners.setdefault(f.table, f.combiner) != f.combiner:
                raise ValueError(
                    f"The features of table {f.table!r} use different combiners ({combiners[f.table]!r}, "
                    f"{f.combiner!r}); one table, one combiner."
                )
        if mechanism.name in ("fest", "adafest", "adafest+"):
            pooled = [f.name for f in features if f.combiner is not None]
            if pooled:
                raise DistributionNotSupportedError(
                    f"Mechanism {mechanism.name!r} leaves some touched rows unchanged (unselected or below "
                    f"the threshold), which needs a per-id activation gradient to mask: features {pooled} "
                    "are pooled by the engine. Declare them as sequence features (combiner=None, engine "
                    "max_sequence_length = ids per example) and pool on the TensorCore."
                )
        if not model.built or not model.trainable_variables:
            raise ValueError(f"The TensorCore model {model.name!r} must be built (call it once on activations).")
        dense_layers = layers_owning_weights(model)
        inner_tables = [layer.name for layer in dense_layers if isinstance(layer, DPEmbedding)]
        if inner_tables:
            raise ValueError(
                f"The TensorCore model holds DPEmbedding tables {inner_tables}; with TpuDPStep every table "
                "lives on the engine (declare it in the engine's table config and as a TpuFeature)."
            )
        if expected_batch_size is None or not float(expected_batch_size) > 0:
            raise ValueError(f"`expected_batch_size` must be > 0; received {expected_batch_size!r}.")
        tables_used = sorted(combiners)
        limits = max_noise_rows if isinstance(max_noise_rows, dict) else {t: max_noise_rows for t in tables_used}
        for table in tables_used:
            limit = limits.get(table)
            if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
                raise ValueError(
                    f"`max_noise_rows` for table {table!r} must be an int > 0 (noise-feature ids per replica); "
                    f"received {limit!r}."
                )
        self.engine = engine
        self.model = model
        self.features = features
        self.mechanism = mechanism
        self.optimizer = optimizer
        self.expected_batch_size = float(expected_batch_size)
        self.max_noise_rows = {t: limits[t] for t in tables_used}
        registry = registry if registry is not None else clipping.default_registry()
        self.registry = clipping.LayerRegistry([(EngineTable, engine_table_gradients), *registry])
        self._fallback = clipping.vectorized_layer_gradients
        self._loss = loss
        self._dense_layers = dense_layers
        self.tables = [EngineTable(t, *table_sizes[t], combiners[t]) for t in tables_used]
        if mechanism.clips_per_example:
            mechanism.init(tables=self.tables, dense_variables=list(model.trainable_variables), optimizer=optimizer)

    # -- the step ---------------------------------------------------------------------
    def __call__(self, features: dict, labels) -> dict:
        """Runs one step on this replica's part of the batch.

        Args:
          features: {feature name: int ids} `[batch]` or `[batch, n]` (the
            engine's inputs; the TensorCore reads them for the ghost norms).
          labels: this replica's labels.

        Returns:
          {"loss": mean per-example loss of this replica's examples,
           "noise_rows": {table: rows this replica noised (int32 count)}}.
        """
        missing = sorted({f.name for f in self.features} - set(features))
        if missing:
            raise ValueError(f"`features` lacks {missing}; the step reads {[f.name for f in self.features]}.")
        ids = {f.name: tf.convert_to_tensor(features[f.name]) for f in self.features}
        for name, value in ids.items():
            if not value.dtype.is_integer:
                raise TypeError(f"Feature {name!r} must hold integer ids; received dtype {value.dtype.name}.")
        if not self.mechanism.clips_per_example:
            return self._non_private_step(ids, labels)
        return self._private_step(ids, labels)

    def _private_step(self, ids, labels) -> dict:
        ctx = tf.distribute.get_replica_context()
        occurrences = {t.name: [t.occurrences(ids[f.name]) for f in self._features_of(t)] for t in self.tables}
        batch_size = tf.shape(next(iter(ids.values())))[0]

        # 1. The rows the mechanism changes this step, before the lookup (a dry run).
        planned = self._planned_rows(occurrences, batch_size, ctx)
        noise_ids, noise_weights, counts = {}, {}, {}
        replicas, me = 1, 0
        if ctx is not None and ctx.num_replicas_in_sync > 1:
            replicas, me = ctx.num_replicas_in_sync, ctx.replica_id_in_sync_group
        for table, rows in zip(self.tables, planned):
            limit = self.max_noise_rows[table.name]
            owned, weights, count = _owned_rows(
                rows, limit, replicas, me,
                message=f"TpuDPStep: table {table.name!r} needs more noise-feature rows on this replica than "
                f"max_noise_rows={limit}; raise it (and the engine's noise feature size with it).",
            )
            key = noise_feature_name(table.name)
            noise_ids[key], noise_weights[key], counts[table.name] = owned, weights, count

        # 2. Lookup of the batch and the noise features.
        weights = {**{name: None for name in ids}, **noise_weights}
        partitioned = self.engine.enqueue({**ids, **noise_ids}, weights)
        activations, preserved = self.engine.dequeue(partitioned)

        # 3. TensorCore forward / backward, ghost norms, clip factors.
        from tfdp_embed.clipping.per_example import clipped_step
        from tfdp_embed.clipping.taps import LayerCall, LayerTaps, record_taps

        acts = {name: activations[name] for name in ids}
        with record_taps(self._dense_layers) as taps, tf.GradientTape(persistent=True) as tape:
            for value in acts.values():
                tape.watch(value)
            per_example_loss = self._per_example_loss(labels, self.model(acts, training=True))
        table_taps = [
            LayerTaps(
                layer=t,
                call_fn=None,
                calls=[LayerCall(args=(ids[f.name],), kwargs={}, outputs=acts[f.name]) for f in self._features_of(t)],
            )
            for t in self.tables
        ]
        step = clipped_step(
            list(taps) + table_taps,
            per_example_loss,
            tape,
            registry=self.registry,
            fallback=self._fallback,
            l2_norm_clip=self.mechanism.l2_norm_clip,
        )
        act_grads = tape.gradient(per_example_loss, acts, output_gradients=tf.ones_like(per_example_loss))
        del tape
        clipped = self._clipped(step, batch_size)

        # 4. The mechanism, once for the global batch.
        pairs, total = self._run_mechanism(clipped, ctx, dry=False)
        by_variable = {id(v): g for g, v in pairs}
        B = self.expected_batch_size
        gradients, checks = {}, []
        for table, rows, global_sum in zip(self.tables, planned, total.tables):
            update = by_variable[id(table.embeddings)]
            update_rows = tf.sort(tf.cast(update.indices, tf.int64))
            checks.append(
                tf.debugging.assert_equal(
                    update_rows,
                    rows,
                    message=f"TpuDPStep: mechanism {self.mechanism.name!r} changed different rows of table "
                    f"{table.name!r} than its dry run on the same ids and generator state",
                )
            )
            key = noise_feature_name(table.name)
            owned = noise_ids[key]
            sent = _values_at(update, owned) - _values_at(global_sum.gradient, owned) / B
            # The engine checks each gradient against its feature's static output shape.
            shape = [self.max_noise_rows[table.name], table.output_dim]
            gradients[key] = tf.ensure_shape(sent * noise_weights[key][:, None], shape)
            for f in self._features_of(table):
                grad = clipped_activation_gradients(act_grads[f.name], step.clip_factors, expected_batch_size=B)
                if f.combiner is None:  # sequence feature: occurrences of rows outside M get nothing
                    keep = _is_member(tf.cast(ids[f.name], tf.int64), rows)
                    grad = grad * tf.cast(keep, grad.dtype)[..., None]
                gradients[f.name] = tf.ensure_shape(grad, acts[f.name].shape)
        with tf.control_dependencies(checks):
            self.engine.apply_gradients(gradients, preserved)
        table_ids = {id(t.embeddings) for t in self.tables}
        dense = [(g, v) for g, v in pairs if id(v) not in table_ids]
        if ctx is not None and ctx.num_replicas_in_sync > 1:  # already the global, noised gradient
            self.optimizer.apply_gradients(dense, experimental_aggregate_gradients=False)
        else:
            self.optimizer.apply_gradients(dense)
        return {"loss": tf.reduce_mean(per_example_loss), "noise_rows": counts}

    def _non_private_step(self, ids, labels) -> dict:
        """`NonPrivate`: gradients of the global-batch mean loss, no clipping, no noise feature."""
        ctx = tf.distribute.get_replica_context()
        partitioned = self.engine.enqueue(ids, {name: None for name in ids})
        activations, preserved = self.engine.dequeue(partitioned)
        acts = {name: activations[name] for name in ids}
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            for value in acts.values():
                tape.watch(value)
            per_example_loss = self._per_example_loss(labels, self.model(acts, training=True))
            total = tf.cast(tf.shape(per_example_loss)[0], per_example_loss.dtype)
            if ctx is not None and ctx.num_replicas_in_sync > 1:
                total = ctx.all_reduce("sum", total)
            loss = tf.reduce_sum(per_example_loss) / tf.maximum(total, 1.0)
        grads = tape.gradient(loss, [acts, variables])
        self.engine.apply_gradients(grads[0], preserved)
        self.optimizer.apply_gradients([(g, v) for g, v in zip(grads[1], variables) if g is not None])
        return {"loss": tf.reduce_mean(per_example_loss), "noise_rows": {}}

    # -- helpers ------------------------------------------------------------------------
    def _features_of(self, table) -> list:
        return [f for f in self.features if f.table == table.name]

    def _per_example_loss(self, labels, predictions):
        from tfdp_embed._keras import keras
        from tfdp_embed.errors import PrivacyContractError

        fn = self._loss
        loss = fn.call(labels, predictions) if isinstance(fn, keras.losses.Loss) else fn(labels, predictions)
        loss = tf.convert_to_tensor(loss)
        if loss.shape.rank is not None and loss.shape.rank > 1:
            loss = tf.reduce_mean(loss, axis=list(range(1, loss.shape.rank)))
        if loss.shape.rank != 1:
            raise PrivacyContractError(
                f"The loss must be one value per example (shape [batch]); it has shape {loss.shape}."
            )
        return tf.debugging.assert_all_finite(loss, "TpuDPStep: the per-example loss is NaN or Inf.")

    def _clipped(self, step, batch_size) -> ClippedGradients:
        grads, occurrences = {}, {}
        for tap, info in step.layers:
            for variable, grad in zip(info.variables, info.clipped_sum(step.clip_factors)):
                grads[id(variable)] = grad
            if info.occurrences is not None:
                occurrences[id(tap.layer)] = info.occurrences
        tables = [
            TableGradient(
                layer=t,
                variable=t.embeddings,
                gradient=grads[id(t.embeddings)],
                occurrences=occurrences[id(t)],
                clip_factors=step.clip_factors,
            )
            for t in self.tables
        ]
        dense = [
            (v, grads[id(v)] if id(v) in grads else tf.zeros_like(v)) for v in self.model.trainable_variables
        ]
        return ClippedGradients(
            tables=tables, dense=dense, expected_batch_size=self.expected_batch_size, batch_size=batch_size
        )

    def _planned_rows(self, occurrences, batch_size, ctx) -> list:
        """Sorted int64 rows per table that `mechanism.update` will change for this batch."""
        tables = []
        for t in self.tables:
            occ = occurrences[t.name]
            touched, _ = tf.unique(tf.concat([tf.cast(o.ids, tf.int64) for o in occ], 0))  # the registry's order
            zeros = tf.zeros([tf.size(touched), t.output_dim], t.embeddings.dtype)
            tables.append(
                TableGradient(
                    layer=t,
                    variable=t.embeddings,
                    gradient=tf.IndexedSlices(zeros, touched, t.dense_shape),
                    occurrences=occ,
                    clip_factors=tf.ones([batch_size], tf.float32),
                )
            )
        dense = [(v, tf.zeros_like(v)) for v in self.model.trainable_variables]
        dry = ClippedGradients(tables=tables, dense=dense, expected_batch_size=self.expected_batch_size, batch_size=batch_size)
        pairs, _ = self._run_mechanism(dry, ctx, dry=True)
        by_variable = {id(v): g for g, v in pairs}
        return [tf.sort(tf.cast(by_variable[id(t.embeddings)].indices, tf.int64)) for t in self.tables]

    def _run_mechanism(self, clipped: ClippedGradients, ctx, *, dry: bool):
        """`mechanism.update` once for the global batch; (pairs, global clipped sums).

        `dry`: the mechanism's state (generator included) is restored afterwards.
        """
        mechanism = self.mechanism

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


def _check_table_sizes(table_sizes) -> dict:
    """{table: (vocabulary_size, dim)} with positive ints, or a ValueError naming the bad entry."""
    if not isinstance(table_sizes, dict) or not table_sizes:
        raise ValueError(
            f"`table_sizes` must map each engine table name to (vocabulary_size, dim); received {table_sizes!r}."
        )
    out = {}
    for name, size in table_sizes.items():
        ok = isinstance(size, (tuple, list)) and len(size) == 2
        ok = ok and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in size)
        if not ok:
            raise ValueError(
                f"`table_sizes[{name!r}]` must be (vocabulary_size, dim), two ints > 0; received {size!r}."
            )
        out[name] = (int(size[0]), int(size[1]))
    return out


def _mechanism_state(mechanism: NoiseMechanism) -> list:
    """Every variable `update` may write: the mechanism's variables and its generator's state."""
    seen, out = set(), []
    for variable in [*mechanism.variables, mechanism.generator.state]:
        if id(variable) not in seen:
            seen.add(id(variable))
            out.append(variable)
    return out


def _owned_rows(rows: tf.Tensor, max_rows: int, replicas, me, *, message: str) -> tuple:
    """(ids, weights, count): the rows of sorted, replica-identical `rows` replica `me` of
    `replicas` owns (position j % replicas == me), padded to `max_rows` (weight 0)."""
    rows = tf.cast(rows, tf.int32)
    owned = tf.boolean_mask(rows, tf.equal(tf.range(tf.size(rows)) % replicas, me))
    count = tf.size(owned)
    check = tf.debugging.assert_less_equal(count, max_rows, message=message)
    with tf.control_dependencies([check]):
        padding = max_rows - count
        ids = tf.pad(owned, [[0, padding]])
        weights = tf.pad(tf.ones([count], tf.float32), [[0, padding]])
    return ids, weights, count


def _values_at(slices: tf.IndexedSlices, ids: tf.Tensor) -> tf.Tensor:
    """Rows `ids` of `slices` (unique indices, any order); zeros for ids it does not hold."""
    indices = tf.cast(slices.indices, tf.int64)
    values = slices.values  # [n, dim]
    ids = tf.cast(ids, tf.int64)
    order = tf.argsort(indices)
    ordered = tf.concat([tf.gather(indices, order), tf.constant([-1], tf.int64)], 0)  # -1: no id matches
    at = tf.searchsorted(ordered[:-1], ids, side="left")  # in [0, n]; n reads the sentinel
    found = tf.equal(tf.gather(ordered, at), ids)
    padded = tf.concat([values, tf.zeros([1, tf.shape(values)[1]], values.dtype)], 0)
    rows = tf.gather(padded, tf.gather(tf.concat([order, [tf.size(indices)]], 0), at))
    return rows * tf.cast(found, values.dtype)[:, None]


def _is_member(values: tf.Tensor, ordered: tf.Tensor) -> tf.Tensor:
    """Mask (shape of `values`) of entries present in sorted int64 `ordered`."""
    flat = tf.reshape(values, [-1])
    padded = tf.concat([ordered, tf.constant([-1], tf.int64)], 0)
    at = tf.searchsorted(ordered, flat, side="left")
    return tf.reshape(tf.equal(tf.gather(padded, at), flat), tf.shape(values))
