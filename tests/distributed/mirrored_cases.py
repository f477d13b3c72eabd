"""MirroredStrategy cases on 2 logical CPUs, run in a subprocess by test_mirrored.py.

The logical-device split must happen before TensorFlow initialises its
devices, and it must not leak into other tests: this script configures it in
its own process, runs the cases named on the command line and prints one
JSON object (case -> measured numbers) as its last line.

    python tests/distributed/mirrored_cases.py exact noise_eana noise_dense unsupported
"""

from __future__ import annotations

import json
import sys

from tfdp_embed.keras2._keras import keras, tf

_CPU = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(_CPU, [tf.config.LogicalDeviceConfiguration()] * 2)

import numpy as np

from tfdp_embed.keras2 import distribute
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

VOCAB, IDS, BATCH = 30, 3, 8
BCE = keras.losses.BinaryCrossentropy(from_logits=True)


_STRATEGY = []


def _strategy():
    """One MirroredStrategy per process: two of them can reuse collective instance keys."""
    if not _STRATEGY:
        _STRATEGY.append(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))
    return _STRATEGY[0]


def _model(dim, seed=3):
    keras.utils.set_random_seed(seed)
    inp = keras.Input((IDS,), dtype="int32")
    x = DPEmbedding(VOCAB, dim, combiner="mean", name="table")(inp)
    x = keras.layers.Dense(4, activation="tanh")(x)
    return keras.Model(inp, keras.layers.Dense(1)(x))


def _exact_data():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, (4 * BATCH, IDS)).astype("int32")
    ids[:, 1] = ids[:, 0]
    y = rng.integers(0, 2, (4 * BATCH, 1)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((ids, y)).batch(BATCH)


def _train(mechanism, strategy, data, *, dim=4, lr=0.5, epochs=1, callbacks=()):
    with strategy.scope():
        dp = DPModel(_model(dim), mechanism=mechanism, expected_batch_size=BATCH)
        dp.compile(optimizer=keras.optimizers.legacy.SGD(lr), loss=BCE)
    dp.fit(data, epochs=epochs, verbose=0, callbacks=list(callbacks))
    return dp


def _replica_spread(dp) -> float:
    """Largest difference between two replicas' copies of any variable."""
    spread = 0.0
    for var in dp.inner.trainable_variables:
        copies = [v.numpy() for v in var.values]
        spread = max(spread, max(float(np.abs(c - copies[0]).max()) for c in copies))
    return spread


def case_exact() -> dict:
    """Zero noise, huge clip on 2 replicas vs one-device non-private SGD on the global batch."""
    return _exact(
        {
            "none": NonPrivate(),
            "eana": EANA(l2_norm_clip=1e6, noise_multiplier=0.0, seed=1),
            # threshold 0 with a tiny map noise keeps every touched row (and about half of the
            # untouched ones, which get a zero gradient): the update equals plain SGD.
            "adafest": DPAdaFEST(
                l2_norm_clip=1e6,
                noise_multiplier=0.0,
                contribution_clip=1.0,
                contribution_noise_multiplier=1e-3,
                threshold=0.0,
                seed=1,
            ),
        }
    )


def case_exact_more() -> dict:
    """As `exact` for DP-FEST and DP-AdaFEST+ with every row selected."""
    import dp_accounting

    return _exact(
        {
            "dense": DenseDPSGD(l2_norm_clip=1e6, noise_multiplier=0.0, seed=1),
            "fest": DPFEST(
                l2_norm_clip=1e6,
                noise_multiplier=0.0,
                selection_epsilon=1.0,
                top_k=VOCAB,
                counts={"table": np.arange(VOCAB)},
                seed=1,
            ),
            "adafest+": DPAdaFESTPlus(
                selected_rows={"table": range(VOCAB)},
                selection_event=dp_accounting.NoOpDpEvent(),
                l2_norm_clip=1e6,
                noise_multiplier=0.0,
                contribution_clip=1.0,
                contribution_noise_multiplier=1e-3,
                threshold=0.0,
                seed=1,
            ),
        }
    )


def _exact(mechanisms: dict) -> dict:
    reference = _train(NonPrivate(), tf.distribute.get_strategy(), _exact_data())
    want = reference.inner.get_weights()
    out = {}
    for name, mechanism in mechanisms.items():
        dp = _train(mechanism, _strategy(), _exact_data())
        got = dp.inner.get_weights()
        out[name] = {
            "max_abs_diff": max(float(np.abs(a - b).max()) for a, b in zip(want, got)),
            "replica_spread": _replica_spread(dp),
            "steps": int(mechanism.steps.numpy()) if name != "none" else None,
        }
    return out


def case_padding() -> dict:
    """Weight-0 padding on 2 replicas (issue 33, N1): EANA and DP-AdaFEST, sigma 0.

    A batch of 4 real examples padded to 8 with weight-0 examples puts the
    real ones on replica 0 and only padding on replica 1; a batch of padding
    alone leaves both replicas without a lookup (TensorFlow's collectives
    crash on all-empty inputs unless `collectives` guards them). Each run
    is compared with the same mechanism on the 4 examples unpadded.
    """
    rng = np.random.default_rng(2)
    ids = rng.integers(1, VOCAB, (4, IDS)).astype("int32")
    y = np.ones((4, 1), "float32")
    pad_ids, pad_y = np.zeros((4, IDS), "int32"), np.zeros((4, 1), "float32")
    padded = (np.concatenate([ids, pad_ids]), np.concatenate([y, pad_y]), np.array([1.0] * 4 + [0.0] * 4, "float32"))
    only_padding = (pad_ids.repeat(2, 0), pad_y.repeat(2, 0), np.zeros([8], "float32"))
    mechanisms = {
        "eana": lambda: EANA(l2_norm_clip=0.5, noise_multiplier=0.0, seed=1),
        "adafest": lambda: DPAdaFEST(
            l2_norm_clip=0.5,
            noise_multiplier=0.0,
            contribution_clip=1.0,
            contribution_noise_multiplier=1e-3,
            threshold=0.3,
            seed=1,
        ),
    }
    out = {}
    for name, make in mechanisms.items():
        two = _train(
            make(),
            _strategy(),
            tf.data.Dataset.from_tensors(padded).concatenate(tf.data.Dataset.from_tensors(only_padding)),
            lr=5.0,
        )
        one = _train(make(), tf.distribute.get_strategy(), tf.data.Dataset.from_tensors((ids, y)), lr=5.0)
        initial = _model(4).get_weights()[0]
        out[name] = {
            "max_abs_diff": max(
                float(np.abs(a - b).max()) for a, b in zip(one.inner.get_weights(), two.inner.get_weights())
            ),
            "row0_moved": float(np.abs(two.inner.get_weights()[0][0] - initial[0]).max()),
            "table_moved": float(np.abs(two.inner.get_weights()[0] - initial).max()),
        }
    return out


def case_uneven() -> dict:
    """DP-AdaFEST (sigma 0, clip 0.05: clipping active) on 37 examples: batches of 8 and a last of 5.

    The last global batch splits 3 + 2 over the replicas, so example, segment
    and lookup offsets differ between replicas. Compared with the same
    mechanism on one device (same seed: the same map-noise draws).
    """
    rng = np.random.default_rng(1)
    ids = rng.integers(0, VOCAB, (37, IDS)).astype("int32")
    y = rng.integers(0, 2, (37, 1)).astype("float32")

    def data():
        return tf.data.Dataset.from_tensor_slices((ids, y)).batch(BATCH)

    def mechanism():
        return DPAdaFEST(
            l2_norm_clip=0.05,
            noise_multiplier=0.0,
            contribution_clip=0.5,
            contribution_noise_multiplier=1e-3,
            threshold=0.3,
            seed=1,
        )

    one_mechanism, two_mechanism = mechanism(), mechanism()
    one = _train(one_mechanism, tf.distribute.get_strategy(), data(), lr=20.0)
    two = _train(two_mechanism, _strategy(), data(), lr=20.0)
    moved = np.abs(two.inner.get_weights()[0] - _model(4).get_weights()[0]).max()
    return {
        "max_abs_diff": max(
            float(np.abs(a - b).max()) for a, b in zip(one.inner.get_weights(), two.inner.get_weights())
        ),
        "table_moved": float(moved),
        "replica_spread": _replica_spread(two),
        "steps": int(two_mechanism.steps.numpy()),
        "rows_noised": [two_mechanism.rows_noised.numpy().tolist(), one_mechanism.rows_noised.numpy().tolist()],
        "dropped_touched_rows": [
            two_mechanism.dropped_touched_rows.numpy().tolist(),
            one_mechanism.dropped_touched_rows.numpy().tolist(),
        ],
    }


class _Snapshots(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.weights = []

    def on_train_batch_end(self, batch, logs=None):
        self.weights.append([w.copy() for w in self.model.inner.get_weights()])


def _zero_gradient_data(steps):
    """Replica 0's half of each batch reads rows 0-3 only, replica 1's half rows 10-13 only.

    Sample weights are 1e-20, so every clipped gradient is ~1e-20 and each step's
    update is the noise alone: -lr * noise / B. (Not 0: a weight-0 example is
    absent, its lookups touch no row; `tfdp_embed.absent_examples`.)
    """
    first = np.array([[0, 1, 2], [1, 2, 3], [3, 0, 0], [2, 2, 1]], "int32")
    ids = np.concatenate([first, first + 10])  # 8 examples = one global batch
    ids = np.tile(ids, (steps, 1))
    y = np.ones([len(ids), 1], "float32")
    w = np.full([len(ids)], 1e-20, "float32")
    return tf.data.Dataset.from_tensor_slices((ids, y, w)).batch(BATCH)


def _noise_case(mechanism, steps=40, dim=16, lr=1.0) -> dict:
    snapshots = _Snapshots()
    dp = _train(mechanism, _strategy(), _zero_gradient_data(steps), dim=dim, lr=lr, callbacks=[snapshots])
    table = np.stack([s[0] for s in snapshots.weights])  # [steps, vocab, dim]
    deltas = np.diff(table, axis=0) * BATCH / lr  # = -noise per step
    other = [
        np.diff(np.stack([s[i] for s in snapshots.weights]), axis=0) * BATCH / lr
        for i in range(1, len(snapshots.weights[0]))
    ]
    rows_replica0, rows_replica1 = [0, 1, 2, 3], [10, 11, 12, 13]
    untouched = [r for r in range(VOCAB) if r not in rows_replica0 + rows_replica1]
    return {
        "expected_std": mechanism.noise_multiplier * mechanism.l2_norm_clip,
        "std_rows_replica0": float(deltas[:, rows_replica0].std()),
        "std_rows_replica1": float(deltas[:, rows_replica1].std()),
        "samples_per_half": int(deltas[:, rows_replica0].size),
        "std_untouched_rows": float(deltas[:, untouched].std()),
        "std_dense_variables": float(np.concatenate([o.ravel() for o in other]).std()),
        "samples_dense": int(sum(o.size for o in other)),
        "replica_spread": _replica_spread(dp),
        "steps": int(mechanism.steps.numpy()),
    }


def case_noise_eana() -> dict:
    return _noise_case(EANA(l2_norm_clip=0.5, noise_multiplier=2.0, seed=7))


def case_noise_dense() -> dict:
    return _noise_case(DenseDPSGD(l2_norm_clip=0.5, noise_multiplier=2.0, seed=7))


def case_unsupported() -> dict:
    with _strategy().scope():
        model = _model(4)
        try:
            DPModel(model, mechanism=LazyDP(l2_norm_clip=1.0, noise_multiplier=1.0), expected_batch_size=BATCH)
        except distribute.DistributionNotSupportedError as error:
            lazy = f"{type(error).__name__}: {error}"
        else:
            lazy = "no error"
        try:
            DPModel(
                model,
                mechanism=DPFEST(l2_norm_clip=1.0, noise_multiplier=1.0, selection_epsilon=1.0, top_k=4),
                expected_batch_size=BATCH,
            )
            fest = "accepted"
        except Exception as error:  # noqa: BLE001 - reported to the test
            fest = f"{type(error).__name__}: {error}"
    return {"lazy": lazy, "fest": fest, "kind": distribute.strategy_kind(_strategy())}


def case_tpu_noise_feature(draws=300, dim=8, stddev=0.5) -> dict:
    """The TPU gradient-path noise on 2 replicas, with the engine's per-row sum done in numpy.

    Replica 0 touches rows {0, 1, 2, 3, 5}, replica 1 rows {3, 5, 10, 11}
    (3 and 5 on both). Each replica feeds `noise_feature_rows` ids with
    `noise_feature_gradients` as their activation gradients; SparseCore sums
    every gradient per row, emulated with np.add.at.
    """
    strategy = _strategy()
    with strategy.scope():
        generator = tf.random.Generator.from_seed(11)
    touched = tf.constant([[0, 1, 2, 3, 5, 5], [3, 5, 10, 11, 11, 10]], tf.int32)

    @tf.function
    def step():
        def replica_fn():
            ctx = tf.distribute.get_replica_context()
            rows = tf.gather(touched, ctx.replica_id_in_sync_group)
            ids, weights, count = distribute.noise_feature_rows(rows, max_rows=8)
            grads = distribute.noise_feature_gradients(generator, weights, dim=dim, stddev=stddev)
            return ids, weights, grads, count

        return strategy.run(replica_fn)

    owned, deltas = [], []
    for _ in range(draws):
        ids, weights, grads, _counts = (strategy.experimental_local_results(x) for x in step())
        delta = np.zeros([VOCAB, dim], np.float64)
        rows_this_step = []
        for i, w, g in zip(ids, weights, grads):
            np.add.at(delta, i.numpy(), g.numpy())
            rows_this_step.append(sorted(int(r) for r, keep in zip(i.numpy(), w.numpy()) if keep))
        owned.append(rows_this_step)
        deltas.append(delta)
    deltas = np.stack(deltas)
    union = [0, 1, 2, 3, 5, 10, 11]
    others = [r for r in range(VOCAB) if r not in union]
    return {
        "owned_first_step": owned[0],
        "owned_always_same": all(o == owned[0] for o in owned),
        "std_per_union_row": [float(deltas[:, r].std()) for r in union],
        "max_abs_other_rows": float(np.abs(deltas[:, others]).max()),
        "expected_std": stddev,
        "samples_per_row": draws * dim,
    }


def case_tpu_step() -> dict:
    """`TpuDPStep` (EANA, clipping active, sigma 1) on 2 replicas vs the same step on one device.

    A CPU engine of TPUEmbeddingV2's interface (cpu_engine.py) holds one table
    for both replicas and sums their gradients per row; MirroredStrategy stands
    in for TPUStrategy's replica context. Global batch 8 = 4 + 4; same seed, so
    the merged mechanism draws what the one-device step draws.
    """
    from cpu_engine import CpuEngine

    rng = np.random.default_rng(5)
    ids = rng.integers(0, VOCAB, (BATCH, IDS)).astype("int32")
    y = rng.integers(0, 2, (BATCH, 1)).astype("float32")
    noise = distribute.noise_feature_name("table")

    def build(strategy):
        reference = _model(4)
        table = reference.get_layer("table").embeddings.numpy()
        engine = CpuEngine({"table": table}, {"f": ("table", "mean"), noise: ("table", "sum")}, 0.5)
        mechanism = EANA(l2_norm_clip=0.05, noise_multiplier=1.0, seed=4)
        with strategy.scope():
            inp = keras.Input((4,), name="f")
            hidden, out = keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)
            tower = keras.Model({"f": inp}, out(hidden(inp)))
            hidden.set_weights(reference.layers[2].get_weights())
            out.set_weights(reference.layers[3].get_weights())
            step = distribute.TpuDPStep(
                engine,
                model=tower,
                features=[distribute.TpuFeature("f", "table", "mean")],
                mechanism=mechanism,
                loss=BCE,
                optimizer=keras.optimizers.legacy.SGD(0.5),
                expected_batch_size=BATCH,
                table_sizes={"table": (VOCAB, 4)},
                max_noise_rows=24,
            )
        return engine, step, table

    one_engine, one_step, before = build(tf.distribute.get_strategy())
    one_step({"f": ids}, y)
    strategy = _strategy()
    two_engine, two_step, _ = build(strategy)
    halves = strategy.experimental_distribute_values_from_function(
        lambda ctx: (ids[ctx.replica_id_in_sync_group * 4 :][:4], y[ctx.replica_id_in_sync_group * 4 :][:4])
    )
    strategy.run(lambda part: two_step({"f": part[0]}, part[1]), args=(halves,))

    owned = [sorted(int(r) for r, w in zip(call[0], call[1]) if w == 1) for call in two_engine.applied(noise)]
    one = [one_engine.embedding_tables["table"].numpy()] + one_step.model.get_weights()
    two = [two_engine.embedding_tables["table"].numpy()] + two_step.model.get_weights()
    spread = 0.0
    for var in two_step.model.trainable_variables:
        copies = [v.numpy() for v in var.values]
        spread = max(spread, max(float(np.abs(c - copies[0]).max()) for c in copies))
    return {
        "max_abs_diff": max(float(np.abs(a - b).max()) for a, b in zip(one, two)),
        "table_moved": float(np.abs(two[0] - before).max()),
        "owned_per_replica": owned,
        "union": sorted(set(ids.ravel().tolist())),
        "mechanism_steps": int(two_step.mechanism.steps.numpy()),
        "replica_spread": spread,
    }


def main(names):
    results = {name: globals()[f"case_{name}"]() for name in names}
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1:])
