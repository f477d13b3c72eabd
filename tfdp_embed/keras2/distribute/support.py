"""Which `tf.distribute` strategy is active, and whether a mechanism may run under it.

`strategy_kind` names the strategy; a mechanism runs under the strategy
kinds its class declares in `capabilities` (`MechanismCapabilities`,
inherited by subclasses; the base `NoiseMechanism` declares one device
only), never by its `name`. `check_supported` and `check_tables` raise
`DistributionNotSupportedError` naming the mechanism class, what it lacks
and how to declare it, at `DPModel` construction and again at `prepare`.
`support_table` renders the declarations of the library's mechanisms (the
table in the package docstring, `tfdp_embed.keras2.distribute`).

Example:
    >>> check_supported(EANA(l2_norm_clip=1.0, noise_multiplier=1.0),
    ...                 tf.distribute.MirroredStrategy())
    'mirrored'

References: TensorFlow `tf.distribute` guide (strategy types); LazyDP
(ASPLOS 2024) §5.2 (why its read hook cannot run on mirrored replicas).
"""

from __future__ import annotations

from tfdp_embed.keras2._keras import tf
from tfdp_embed.mechanisms.base import NoiseMechanism
from tfdp_embed.mechanisms.capabilities import (
    MIRRORED,
    MULTI_WORKER_MIRRORED,
    ONE_DEVICE,
    PARAMETER_SERVER,
    STRATEGY_KINDS,
    STRATEGY_TITLES,
    capabilities_of,
    how_to_declare,
)

DEFAULT = ONE_DEVICE
TPU = "tpu"
OTHER = "other"

_TPU_REASON = (
    "Keras fit on TPUStrategy with DPEmbedding tables is not implemented: tables on TPU "
    "SparseCore are only updated through the embedding engine's gradient path. Use "
    "tfdp_embed.keras2.distribute.TpuDPStep (the DP step with the tables on TPUEmbeddingV2, for "
    "mechanisms that declare `tpu=True`: none, eana, fest, adafest, adafest+) inside strategy.run; "
    "docs/tpu_sparsecore.md says what each mechanism needs and which are possible "
    "(tfdp_embed.keras2.distribute.tpu_embedding_plan)."
)
_OTHER_REASON = (
    "tfdp_embed does not know this strategy: DP training runs on one device, MirroredStrategy, "
    "MultiWorkerMirroredStrategy or ParameterServerStrategy."
)


class DistributionNotSupportedError(ValueError):
    """A mechanism cannot run under the active `tf.distribute` strategy (the message says why)."""


# -- which strategy ---------------------------------------------------------------
@tf.autograph.experimental.do_not_convert
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
    """Raises unless `mechanism`'s class declares `strategy`'s kind; returns the strategy kind.

    Raises:
      DistributionNotSupportedError: the mechanism does not declare the
        strategy (the message names the class, what it lacks and how to
        declare it), declares fewer ParameterServerStrategy workers than the
        cluster has, or the strategy is one tfdp_embed does not know (e.g.
        `CentralStorageStrategy`).
    """
    if strategy is None:
        strategy = tf.distribute.get_strategy()
    kind = strategy_kind(strategy)
    reason = unsupported_reason(mechanism, kind)
    if reason is not None:
        raise DistributionNotSupportedError(
            f"Mechanism {mechanism.name!r} does not support {type(strategy).__name__} ({kind}): {reason}"
        )
    limit = capabilities_of(mechanism).parameter_server_workers
    if kind == PARAMETER_SERVER and limit is not None:
        workers = _parameter_server_workers(strategy)
        if workers > limit:
            most = "exactly one worker" if limit == 1 else f"at most {limit} workers"
            raise DistributionNotSupportedError(
                f"Mechanism {mechanism.name!r} supports ParameterServerStrategy with {most} (class "
                f"{type(mechanism).__name__} declares `parameter_server_workers={limit}`); this cluster has "
                f"{workers}. Asynchronous workers would race on its state (LazyDP: a row could be caught up "
                "twice or read before its noise)."
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
    from tfdp_embed.keras2.layers.embedding import DPEmbedding

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


def unsupported_reason(mechanism, kind: str) -> str | None:
    """Why `mechanism` cannot run under strategy kind `kind`; None when it can.

    Args:
      mechanism: a `NoiseMechanism`, its class, or the name of a library
        mechanism (`tfdp_embed.mechanisms.MECHANISMS`; the name selects the
        library class, whose declaration is read).
      kind: a strategy kind (`strategy_kind`).
    """
    cls = _mechanism_class(mechanism)
    if kind == TPU:
        return _TPU_REASON
    if kind not in STRATEGY_KINDS:
        return _OTHER_REASON
    capabilities = capabilities_of(cls)
    if capabilities.supports(kind):
        return None
    declared = ", ".join(STRATEGY_TITLES[k] for k in capabilities.strategies)
    why = capabilities.reason(kind)
    return (
        f"it declares {declared} only"
        + (f" ({why})" if why else "")
        + ". "
        + how_to_declare(cls, f"{STRATEGY_TITLES[kind]} (`strategies` holding {kind!r})")
    )


def support_table() -> str:
    """The library mechanisms' declared capabilities as the text table of the package docstring."""
    from tfdp_embed.mechanisms import MECHANISMS

    header = ["mechanism", "one device", "Mirrored", "MultiWorkerMirrored", "ParameterServer", "TpuDPStep",
              "lookahead", "defers noise", "one-off events"]  # fmt: skip
    rows = [header]
    for name, cls in MECHANISMS.items():
        caps = capabilities_of(cls)

        def yes(flag: bool) -> str:
            return "yes" if flag else "no"

        workers = caps.parameter_server_workers
        server = yes(caps.supports(PARAMETER_SERVER))
        if caps.supports(PARAMETER_SERVER) and workers is not None:
            server = f"yes, {workers} worker" + ("s" if workers > 1 else "")
        rows.append([
            name, yes(caps.supports(ONE_DEVICE)), yes(caps.supports(MIRRORED)),
            yes(caps.supports(MULTI_WORKER_MIRRORED)), server, yes(caps.tpu), yes(caps.lookahead),
            yes(caps.defers_noise), yes(caps.one_off_events),
        ])  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(" | ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def _mechanism_class(mechanism) -> type:
    if isinstance(mechanism, str):
        from tfdp_embed.mechanisms import MECHANISMS

        if mechanism not in MECHANISMS:
            raise KeyError(f"No library mechanism named {mechanism!r}; known: {sorted(MECHANISMS)}.")
        return MECHANISMS[mechanism]
    return mechanism if isinstance(mechanism, type) else type(mechanism)


def _parameter_server_workers(strategy) -> int:
    # ParameterServerStrategy has no public accessor for its worker count (TF 2.21); it
    # stores the resolver it was built from.
    resolver = getattr(strategy, "_cluster_resolver", None) or strategy.cluster_resolver
    return len(resolver.cluster_spec().as_dict().get("worker", []))


def is_synchronous_replicated(strategy: tf.distribute.Strategy | None = None) -> bool:
    """True under Mirrored / MultiWorkerMirrored strategies (the all-reduce + merge path)."""
    return strategy_kind(strategy) in (MIRRORED, MULTI_WORKER_MIRRORED)


__all__ = [
    "DEFAULT",
    "OTHER",
    "TPU",
    "DistributionNotSupportedError",
    "check_supported",
    "check_tables",
    "is_synchronous_replicated",
    "strategy_kind",
    "support_table",
    "unsupported_reason",
]
