"""DP-AdaFEST under MirroredStrategy on 2 logical CPUs, run in a subprocess by test_adafest_mirrored.py.

Issue 34 (bug B): a user reported DP-AdaFEST crashing under MirroredStrategy
with a shape mismatch between replicas ([484,16] vs [530,16]), as if each
replica thresholded its own contribution map. Here the two replicas touch
different numbers of rows (replica 0's examples read 4 rows, replica 1's 24),
the map noise lets ~p V untouched rows survive every step (noise-only rows,
drawn by geometric skips) and every example's gradient is ~0 (weight 1e-20),
so each step's update is the noise on the survivors alone (case `selection`).

Case `scored`: a full-softmax item table (`ItemEmbedding`, every row scored
whatever the data, `TableGradient.shared_rows`). Its scored rows always
survive DP-AdaFEST's threshold and DP-FEST refuses the table, on one device;
the replicated step used to drop `shared_rows` on its way into the merge
step, so neither held under MirroredStrategy.

    python tests/distributed/adafest_mirrored_cases.py selection scored

Prints one JSON object (measured numbers) as its last line.
"""

from __future__ import annotations

import json
import sys
import warnings

import numpy as np

from tfdp_embed.keras2._keras import keras, tf

_CPU = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(_CPU, [tf.config.LogicalDeviceConfiguration()] * 2)

# After the split: these modules may touch the devices when imported.
from tfdp_embed.keras2.layers.embedding import DPEmbedding  # noqa: E402
from tfdp_embed.keras2.models.two_tower import ItemEmbedding, two_tower_registry  # noqa: E402
from tfdp_embed.keras2.training import DPModel  # noqa: E402
from tfdp_embed.mechanisms import DPFEST, DPAdaFEST  # noqa: E402

VOCAB, DIM, IDS, BATCH, STEPS, LR = 2000, 16, 3, 8, 12, 1.0
SIGMA2, C2, SIGMA1, C1, TAU = 1.0, 0.5, 1.0, 1.0, 2.0  # p = P(N(0, 1) >= 2) = 0.02275
FEW = np.array([[0, 1, 2], [1, 2, 3], [3, 0, 0], [2, 2, 1]], "int32")  # replica 0: rows 0..3
MANY = 100 + np.arange(12, dtype="int32").reshape(4, IDS)  # replica 1: 12 distinct rows per batch


def _data():
    batches = [np.concatenate([FEW, MANY + 12 * (step % 2)]) for step in range(STEPS)]
    ids = np.concatenate(batches)
    y = np.ones([len(ids), 1], "float32")
    w = np.full([len(ids)], 1e-20, "float32")
    return tf.data.Dataset.from_tensor_slices((ids, y, w)).batch(BATCH)


def _model():
    keras.utils.set_random_seed(3)
    inp = keras.Input((IDS,), dtype="int32")
    x = DPEmbedding(VOCAB, DIM, combiner="mean", name="table")(inp)
    return keras.Model(inp, keras.layers.Dense(1)(keras.layers.Dense(4, activation="tanh")(x)))


class _Snapshots(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.tables = []

    def on_train_batch_end(self, batch, logs=None):
        self.tables.append(self.model.inner.get_weights()[0].copy())


def _train(strategy):
    mechanism = DPAdaFEST(
        l2_norm_clip=C2,
        noise_multiplier=SIGMA2,
        contribution_clip=C1,
        contribution_noise_multiplier=SIGMA1,
        threshold=TAU,
        seed=1,
    )
    with strategy.scope():
        dp = DPModel(_model(), mechanism=mechanism, expected_batch_size=BATCH)
        dp.compile(optimizer=keras.optimizers.legacy.SGD(LR), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    snapshots = _Snapshots()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the epoch note on tuning tau
        dp.fit(_data(), epochs=1, verbose=0, callbacks=[snapshots])
    initial = _model().get_weights()[0]
    tables = np.stack([initial, *snapshots.tables])  # [steps + 1, vocab, dim]
    return dp, mechanism, np.diff(tables, axis=0) * BATCH / LR  # = -noise on each step's survivors


def _replica_spread(dp) -> float:
    spread = 0.0
    for var in dp.inner.trainable_variables:
        copies = [v.numpy() for v in var.values]
        spread = max(spread, max(float(np.abs(c - copies[0]).max()) for c in copies))
    return spread


def _summary(mechanism, deltas) -> dict:
    updated = np.any(deltas != 0, axis=2)  # [steps, vocab]: the survivors of each step
    touched = np.zeros([VOCAB], bool)
    touched[np.concatenate([FEW.ravel(), MANY.ravel(), MANY.ravel() + 12])] = True
    return {
        "steps": int(mechanism.steps.numpy()),
        "rows_noised": int(mechanism.rows_noised.numpy()[0]),
        "updated_rows": int(updated.sum()),
        "noise_std_on_survivors": float(deltas[updated].std()),
        "noise_mean_on_survivors": float(deltas[updated].mean()),
        "noise_samples": int(deltas[updated].size),
        "untouched_survivors": int(updated[:, ~touched].sum()),
        "untouched_trials": int((~touched).sum() * STEPS),
    }


def case_selection() -> dict:
    two_dp, two_mechanism, two = _train(_mirrored())
    _, one_mechanism, one = _train(tf.distribute.get_strategy())
    return {
        "replicas": two_dp.distribute_strategy.num_replicas_in_sync,
        "replica_spread": _replica_spread(two_dp),
        "two": _summary(two_mechanism, two),
        "one": _summary(one_mechanism, one),
        "max_abs_diff_one_vs_two": float(np.abs(one - two).max()),
        "expected_std": SIGMA2 * C2,
    }


ITEMS, USERS = 50, 20


def _scored_model():
    """user id -> DPEmbedding -> Dense -> query; logits over every item of an ItemEmbedding (full softmax)."""
    keras.utils.set_random_seed(5)
    users = keras.Input((), dtype="int32")
    query = keras.layers.Dense(DIM, name="query")(DPEmbedding(USERS, DIM, name="users")(users))
    return keras.Model(users, ItemEmbedding(ITEMS, DIM, name="items")(query))


def _scored_fit(strategy, mechanism) -> np.ndarray:
    """Rows of the item table that one step changed (sorted)."""
    data = tf.data.Dataset.from_tensors((np.arange(BATCH, dtype="int32"), np.arange(BATCH, dtype="int32")))
    with strategy.scope():
        model = _scored_model()
        dp = DPModel(model, mechanism=mechanism, expected_batch_size=BATCH, registry=two_tower_registry())
        dp.compile(
            optimizer=keras.optimizers.legacy.SGD(LR),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    before = model.get_layer("items").embeddings.numpy().copy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        dp.fit(data, epochs=1, verbose=0)
    after = model.get_layer("items").embeddings.numpy()
    return np.flatnonzero(np.any(after != before, axis=1))


def case_scored() -> dict:
    def adafest():  # tau no noisy count reaches on the items: only the scored rows can survive
        return DPAdaFEST(
            l2_norm_clip=1.0,
            noise_multiplier=0.5,
            contribution_clip=1.0,
            contribution_noise_multiplier=0.01,
            threshold={"items": 1e9, "users": 0.3},
            seed=0,
        )

    out = {}
    for name, strategy in (("one", tf.distribute.get_strategy()), ("two", _mirrored())):
        out[f"adafest_{name}"] = _scored_fit(strategy, adafest()).tolist()
        fest = DPFEST(
            l2_norm_clip=1.0,
            noise_multiplier=0.5,
            selection_epsilon=1.0,
            top_k=10,
            seed=0,
            counts={"items": np.arange(ITEMS + 1), "users": np.arange(USERS)},
        )
        try:
            _scored_fit(strategy, fest)
            out[f"fest_{name}"] = "trained"
        except Exception as error:  # noqa: BLE001 - reported to the test
            out[f"fest_{name}"] = f"{type(error).__name__}: {error}"
    return out


_STRATEGY: list = []


def _mirrored():
    """One MirroredStrategy per process: two of them can reuse collective instance keys."""
    if not _STRATEGY:
        _STRATEGY.append(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))
    return _STRATEGY[0]


if __name__ == "__main__":
    print(json.dumps({name: globals()[f"case_{name}"]() for name in sys.argv[1:]}))
