"""Which `tf.distribute` strategy is active, and whether a mechanism may run under it.

`strategy_kind` names the strategy; `SUPPORT` maps each mechanism name to
the strategy kinds it runs under (None) or the reason it does not;
`check_supported` and `check_tables` raise `DistributionNotSupportedError`
with that reason, at `DPModel` construction and again at `prepare`. The
support table and its footnotes are in the package docstring
(`tfdp_embed.distribute`).

Example:
    >>> check_supported(EANA(l2_norm_clip=1.0, noise_multiplier=1.0),
    ...                 tf.distribute.MirroredStrategy())
    'mirrored'

References: TensorFlow `tf.distribute` guide (strategy types); LazyDP
(ASPLOS 2024) §5.2 (why its read hook cannot run on mirrored replicas).
"""

from __future__ import annotations

from tfdp_embed._keras import tf
from tfdp_embed.mechanisms.base import NoiseMechanism

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
