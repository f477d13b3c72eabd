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
        tables on SparseCore are updated through `TPUEmbedding`, see
        docs/tpu_sparsecore.md and `tpu_embedding_plan` below.
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
from tfdp_embed.layers.embedding import EmbeddingOccurrences
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
    "SparseCore are only updated through TPUEmbedding's gradient path. docs/tpu_sparsecore.md "
    "says what each mechanism needs and which are possible (tfdp_embed.distribute."
    "tpu_embedding_plan)."
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
    owned = tf.boolean_mask(union, tf.equal(tf.range(tf.size(union)) % replicas, me))
    count = tf.size(owned)
    check = tf.debugging.assert_less_equal(
        count, max_rows, message=f"noise_feature_rows: more owned rows than max_rows={max_rows}; raise it."
    )
    with tf.control_dependencies([check]):
        padding = max_rows - count
        ids = tf.pad(owned, [[0, padding]])
        weights = tf.pad(tf.ones([count], tf.float32), [[0, padding]])
    return ids, weights, count


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
