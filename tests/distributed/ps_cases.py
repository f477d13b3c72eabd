"""ParameterServerStrategy cases on an in-process loopback cluster, run by test_parameter_server.py.

The cluster (workers and parameter servers as `tf.distribute.Server`s in
this process, TensorFlow's `create_in_process_cluster` pattern) lives only
in this process. Prints one JSON object (case -> results) as its last line,
or {"skip": reason} when the sandbox forbids loopback sockets.

    python tests/distributed/ps_cases.py --workers 1 --ps 2 exact lazy
"""

from __future__ import annotations

import argparse
import json
import socket

import numpy as np

from tfdp_embed.keras2 import distribute
from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.layers.embedding import DPEmbedding
from tfdp_embed.keras2.training import DPModel
from tfdp_embed.mechanisms import (
    DPFEST,
    EANA,
    DenseDPSGD,
    DPAdaFEST,
    DPAdaFESTPlus,
    LazyDP,
    NonPrivate,
)

VOCAB, DIM, IDS, BATCH, STEPS = 50, 4, 3, 8, 4
BCE = keras.losses.BinaryCrossentropy(from_logits=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def in_process_cluster(workers: int, ps: int):
    """Starts `workers` + `ps` gRPC servers in this process; returns (resolver, servers)."""
    spec = tf.train.ClusterSpec(
        {
            "worker": [f"localhost:{free_port()}" for _ in range(workers)],
            "ps": [f"localhost:{free_port()}" for _ in range(ps)],
        }
    )
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=workers + 1)
    servers = [
        tf.distribute.Server(spec, job_name="worker", task_index=i, config=config, protocol="grpc")
        for i in range(workers)
    ]
    servers += [tf.distribute.Server(spec, job_name="ps", task_index=i, protocol="grpc") for i in range(ps)]
    return tf.distribute.cluster_resolver.SimpleClusterResolver(spec, rpc_layer="grpc"), servers


class RecordingSGD(keras.optimizers.legacy.SGD):
    """Legacy SGD that records, at trace time, the gradient type applied to each variable."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.applied = {}

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        for grad, var in grads_and_vars:
            self.applied[var.name] = type(grad).__name__
        return super().apply_gradients(grads_and_vars, *args, **kwargs)


def _arrays():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, (STEPS * BATCH, IDS)).astype("int32")
    y = rng.integers(0, 2, (STEPS * BATCH, 1)).astype("float32")
    return ids, y


def _dataset_fn(_context=None):
    return tf.data.Dataset.from_tensor_slices(_arrays()).batch(BATCH)


def _model(seed=3):
    keras.utils.set_random_seed(seed)
    inp = keras.Input((IDS,), dtype="int32")
    a = DPEmbedding(VOCAB, DIM, combiner="mean", name="table_a")(inp)
    b = DPEmbedding(VOCAB, DIM, combiner="sum", name="table_b")(inp)
    x = keras.layers.Dense(4, activation="tanh")(keras.layers.Concatenate()([a, b]))
    return keras.Model(inp, keras.layers.Dense(1)(x))


def _fit(strategy, mechanism, lr=0.5):
    with strategy.scope():
        model = _model()
        dp = DPModel(model, mechanism=mechanism, expected_batch_size=BATCH)
        dp.compile(optimizer=RecordingSGD(lr), loss=BCE)
    creator = keras.utils.experimental.DatasetCreator(_dataset_fn)
    dp.fit(creator, epochs=1, steps_per_epoch=STEPS, verbose=0)
    return dp


def case_exact(strategy) -> dict:
    """EANA, zero noise, huge clip, one worker: equals local non-private SGD; tables on PS."""
    local = DPModel(_model(), mechanism=NonPrivate(), expected_batch_size=BATCH)
    local.compile(optimizer=keras.optimizers.legacy.SGD(0.5), loss=BCE)
    local.fit(_dataset_fn(), epochs=1, verbose=0)
    dp = _fit(strategy, EANA(l2_norm_clip=1e6, noise_multiplier=0.0, seed=1))
    tables = [layer.embeddings for layer in dp.inner.layers if isinstance(layer, DPEmbedding)]
    return {
        "max_abs_diff": max(
            float(np.abs(a - b).max()) for a, b in zip(local.inner.get_weights(), dp.inner.get_weights())
        ),
        "table_devices": [t.device for t in tables],
        "applied": dp.optimizer.applied,
        "steps": int(dp.mechanism.steps.numpy()),
    }


def case_lazy(strategy) -> dict:
    """LazyDP (per-step stateless noise, momentum, lookahead) under PS vs dense DP-SGD on one device.

    With `aggregate=False, row_noise="stateless"` LazyDP adds exactly the numbers
    `DenseDPSGD(row_noise="stateless")` adds, only later: after `flush` the
    weights must match. Also: each history on its table's parameter server.
    """
    from tfdp_embed.data.lookahead import with_lookahead
    from tfdp_embed.mechanisms import DenseDPSGD

    kwargs = {"l2_norm_clip": 1.0, "noise_multiplier": 0.5, "seed": 7, "row_noise": "stateless"}

    def lookahead_fn(_context=None):
        return with_lookahead(_dataset_fn(), lambda ids: {"table_a": ids, "table_b": ids})

    local = DPModel(_model(), mechanism=DenseDPSGD(**kwargs), expected_batch_size=BATCH)
    local.compile(optimizer=keras.optimizers.legacy.SGD(0.1, momentum=0.9), loss=BCE)
    local.fit(_dataset_fn(), epochs=1, verbose=0)

    mechanism = LazyDP(aggregate=False, **kwargs)
    with strategy.scope():
        dp = DPModel(_model(), mechanism=mechanism, expected_batch_size=BATCH, lookahead=True)
        dp.compile(optimizer=RecordingSGD(0.1, momentum=0.9), loss=BCE)
    dp.fit(keras.utils.experimental.DatasetCreator(lookahead_fn), epochs=1, steps_per_epoch=STEPS, verbose=0)
    tables = [layer for layer in dp.inner.layers if isinstance(layer, DPEmbedding)]
    owed_before = mechanism.owes_noise()
    dp.flush()
    return {
        "pairs": [[t.embeddings.device, h.device] for t, h in zip(tables, mechanism._histories)],
        "owed_before_flush": owed_before,
        "owed_after_flush": mechanism.owes_noise(),
        "steps": int(mechanism.steps.numpy()),
        "applied": dp.optimizer.applied,
        "max_abs_diff_vs_dense": max(
            float(np.abs(a - b).max()) for a, b in zip(local.inner.get_weights(), dp.inner.get_weights())
        ),
    }


def case_mechanisms(strategy) -> dict:
    """dense, fest, adafest, adafest+ train under PS: gradient types applied to the tables, finite weights."""
    import dp_accounting

    common = {"l2_norm_clip": 1.0, "noise_multiplier": 0.5, "seed": 4}
    adafest = {"contribution_clip": 1.0, "contribution_noise_multiplier": 1.0, "threshold": 0.5}
    mechanisms = {
        "dense": DenseDPSGD(**common),
        "fest": DPFEST(
            **common, selection_epsilon=1.0, top_k=10, counts={"table_a": np.arange(VOCAB), "table_b": np.arange(VOCAB)}
        ),
        "adafest": DPAdaFEST(**common, **adafest),
        "adafest+": DPAdaFESTPlus(
            **common,
            **adafest,
            selected_rows={"table_a": range(0, 50, 2), "table_b": range(10)},
            selection_event=dp_accounting.NoOpDpEvent(),
        ),
    }
    out = {}
    for name, mechanism in mechanisms.items():
        dp = _fit(strategy, mechanism, lr=0.1)
        out[name] = {
            "applied": {k: v for k, v in dp.optimizer.applied.items() if k.startswith("table_")},
            "steps": int(mechanism.steps.numpy()),
            "finite": bool(all(np.isfinite(w).all() for w in dp.inner.get_weights())),
        }
    return out


def case_lazy_refused(strategy) -> dict:
    with strategy.scope():
        try:
            DPModel(_model(), mechanism=LazyDP(l2_norm_clip=1.0, noise_multiplier=1.0), expected_batch_size=BATCH)
        except distribute.DistributionNotSupportedError as error:
            return {"error": f"{type(error).__name__}: {error}"}
    return {"error": None}


def case_sharded_refused(strategy) -> dict:
    """Under a partitioner that splits the table (800 bytes) in two, DPModel refuses it."""
    del strategy
    sharded = tf.distribute.experimental.ParameterServerStrategy(
        _RESOLVER[0],
        variable_partitioner=tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=256, max_shards=2
        ),
    )
    with sharded.scope():
        keras.utils.set_random_seed(3)
        inp = keras.Input((), dtype="int32")  # 1-D ids: the only lookup tf.gather allows on shards
        model = keras.Model(inp, keras.layers.Dense(1)(DPEmbedding(VOCAB, DIM, name="table_a")(inp)))
        try:
            DPModel(model, mechanism=EANA(l2_norm_clip=1.0, noise_multiplier=1.0), expected_batch_size=BATCH)
        except distribute.DistributionNotSupportedError as error:
            return {"error": f"{type(error).__name__}: {error}"}
    return {"error": None}


_RESOLVER = []


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--ps", type=int, default=2)
    parser.add_argument("cases", nargs="+")
    args = parser.parse_args()
    try:
        resolver, _servers = in_process_cluster(args.workers, args.ps)
    except (OSError, tf.errors.OpError) as error:
        print(json.dumps({"skip": f"cannot start loopback gRPC servers in this sandbox: {error}"}))
        return
    _RESOLVER.append(resolver)
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    results = {"kind": distribute.strategy_kind(strategy)}
    results.update({name: globals()[f"case_{name}"](strategy) for name in args.cases})
    print(json.dumps(results))


if __name__ == "__main__":
    main()
