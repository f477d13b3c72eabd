"""ParameterServerStrategy: server processes, and where a mechanism's state lives.

`start_server` starts a server process with tfdp_embed's custom ops loaded;
`mechanism_state_scope` creates the mechanism's state on the servers, each
table's per-row state (LazyDP's history, DP-FEST's selection) colocated with
its table. The step itself runs as on one device: each worker is one
asynchronous replica.

Example:
    >>> start_server(cluster, job_name="ps", task_index=0).join()

References: TensorFlow `tf.distribute` guide (ClusterCoordinator); EANA
(RecSys 2022) §3 (parameter-server traffic); LazyDP (ASPLOS 2024) §5.2
(history table next to its table).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from tfdp_embed.keras2._keras import tf
from tfdp_embed.keras2.distribute.support import PARAMETER_SERVER, strategy_kind


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
def mechanism_state_scope(strategy: tf.distribute.Strategy, tables) -> Iterator[None]:
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


__all__ = ["PS_GROWABLE_CAPACITY", "mechanism_state_scope", "start_server"]
