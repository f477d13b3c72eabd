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

Support: each mechanism class declares the strategies it runs under, and
more, in its `capabilities` (`tfdp_embed.mechanisms.MechanismCapabilities`,
inherited by subclasses; never looked up by `name`). Anything not declared
raises `DistributionNotSupportedError` at `DPModel` construction and again at
`prepare`, naming the class, what it lacks and how to declare it; a new
`NoiseMechanism` subclass runs on one device only until it declares more.
The library's declarations (`support_table()`; a test checks this copy):

    mechanism | one device | Mirrored | MultiWorkerMirrored | ParameterServer | TpuDPStep | lookahead | defers noise | one-off events
    none      | yes        | yes      | yes                 | yes             | yes       | no        | no           | no
    dense     | yes        | yes      | yes                 | yes             | no        | no        | no           | no
    adafest   | yes        | yes      | yes                 | yes             | yes       | no        | no           | no
    adafest+  | yes        | yes      | yes                 | yes             | yes       | no        | no           | yes
    eana      | yes        | yes      | yes                 | yes             | yes       | no        | no           | no
    fest      | yes        | yes      | yes                 | yes             | yes       | no        | no           | yes
    lazy      | yes        | no       | no                  | yes, 1 worker   | no        | yes       | yes          | no

    Keras `fit` on `TPUStrategy` with `DPEmbedding` is not implemented for
    any mechanism: tables on SparseCore are updated through `TPUEmbeddingV2`'s
    gradient path. `TpuDPStep` (tpu_step.py) is that step for the mechanisms
    declaring `tpu` (tables on the engine, TensorCore model beside it; run it
    inside `strategy.run`); see docs/tpu_sparsecore.md and
    `tpu_embedding_plan`. CPU-tested with a CPU engine of the same
    interface; never run on a TPU.
    LazyDP does not declare the synchronous strategies: its read hook catches
    rows up (adds owed noise) inside each replica's forward pass for the ids
    that replica reads, so replicas would add different noise to their copies
    of a mirrored table. It declares one ParameterServerStrategy worker:
    concurrent workers would race on the history table and step counter.
    Other strategies (e.g. `CentralStorageStrategy`) are refused for every
    mechanism; so are tables sharded by a `variable_partitioner`.

Modules (device branching lives in this package only; import from
`tfdp_embed.keras2.distribute`, which re-exports every public name):

    support.py            strategy kinds, refusals from declared capabilities, support_table
    sync.py               the synchronous step (Mirrored / MultiWorkerMirrored)
    collectives.py        clipped sums made global (all_reduce / all_gather), merge_call plumbing
    parameter_server.py   start_server, mechanism_state_scope (state next to its table)
    tpu_plan.py           TPU_PLANS: what each mechanism needs from SparseCore
    tpu_gradient_path.py  the noise feature and clipped activation gradients
    tpu_engine_table.py   TpuFeature, EngineTable (an engine table seen as a DPEmbedding)
    tpu_step.py           TpuDPStep, the DP step with the tables on TPUEmbeddingV2
    tpu_mechanism_update.py  mechanism.update once per global batch, and its dry run (the rows planned)

References: TensorFlow `tf.distribute` guide (merge_call, all_reduce,
ClusterCoordinator); EANA (RecSys 2022) §3 (parameter-server traffic);
LazyDP (ASPLOS 2024) §5.2 (history table next to its table).
"""

from __future__ import annotations

import importlib

from tfdp_embed.keras2.distribute.collectives import all_reduce_clipped, union_of_rows
from tfdp_embed.keras2.distribute.parameter_server import (
    PS_GROWABLE_CAPACITY,
    mechanism_state_scope,
    start_server,
)
from tfdp_embed.keras2.distribute.support import (
    DEFAULT,
    MIRRORED,
    MULTI_WORKER_MIRRORED,
    OTHER,
    PARAMETER_SERVER,
    TPU,
    DistributionNotSupportedError,
    check_supported,
    check_tables,
    is_synchronous_replicated,
    strategy_kind,
    support_table,
    unsupported_reason,
)
from tfdp_embed.keras2.distribute.sync import (
    apply_gradients,
    check_identical_state,
    mean_loss,
    noised_gradients,
    synchronize_generator,
)

# The TPU parts load on first use (PEP 562), so `import tfdp_embed.keras2` loads no TPU code.
_TPU = {
    "EngineTable": "tpu_engine_table",
    "TpuFeature": "tpu_engine_table",
    "engine_table_gradients": "tpu_engine_table",
    "NOISE_FEATURE_SUFFIX": "tpu_gradient_path",
    "clipped_activation_gradients": "tpu_gradient_path",
    "noise_feature_gradients": "tpu_gradient_path",
    "noise_feature_name": "tpu_gradient_path",
    "noise_feature_rows": "tpu_gradient_path",
    "TPU_PLANS": "tpu_plan",
    "TpuEmbeddingPlan": "tpu_plan",
    "tpu_embedding_plan": "tpu_plan",
    "TpuDPStep": "tpu_step",
}


def __getattr__(name: str):
    if name not in _TPU:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_TPU[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted([*globals(), *_TPU])


__all__ = [
    "DEFAULT",
    "MIRRORED",
    "MULTI_WORKER_MIRRORED",
    "NOISE_FEATURE_SUFFIX",
    "OTHER",
    "PARAMETER_SERVER",
    "PS_GROWABLE_CAPACITY",
    "TPU",
    "TPU_PLANS",
    "DistributionNotSupportedError",
    "EngineTable",
    "TpuDPStep",
    "TpuEmbeddingPlan",
    "TpuFeature",
    "all_reduce_clipped",
    "apply_gradients",
    "check_identical_state",
    "check_supported",
    "check_tables",
    "clipped_activation_gradients",
    "engine_table_gradients",
    "is_synchronous_replicated",
    "mean_loss",
    "mechanism_state_scope",
    "noise_feature_gradients",
    "noise_feature_name",
    "noise_feature_rows",
    "noised_gradients",
    "start_server",
    "strategy_kind",
    "support_table",
    "synchronize_generator",
    "tpu_embedding_plan",
    "union_of_rows",
    "unsupported_reason",
]
