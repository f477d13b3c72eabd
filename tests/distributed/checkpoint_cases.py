"""Checkpoint / resume under MirroredStrategy on 2 logical CPUs, run in a subprocess by
test_checkpoint_distributed.py.

For each mechanism named on the command line, in one process and one
MirroredStrategy:

  full       train 2 epochs of Poisson batches (8 per epoch) with a PrivacyBudget;
  stopped    the same with DPCheckpoint every 5 steps, stopped after step 13
             (epoch 1, batch 5) WITHOUT a final save, as if killed: the newest
             checkpoint is step 10, steps 11-13 are lost;
  resumed    a fresh model, mechanism, optimizer and budget built under the
             same strategy, restored from that checkpoint, trained on the rest
             of the interrupted epoch.

Prints one JSON object (mechanism -> what the test compares) as its last line.

    python tests/distributed/checkpoint_cases.py eana dense
"""

from __future__ import annotations

import json
import sys
import tempfile

from tfdp_embed.keras2._keras import keras, tf

_CPU = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(_CPU, [tf.config.LogicalDeviceConfiguration()] * 2)

import numpy as np

from tfdp_embed.accounting import PrivacyBudget
from tfdp_embed.data import poisson_batches
from tfdp_embed.keras2.checkpointing import DPCheckpoint, rest_of_epoch
from tfdp_embed.keras2.layers.embedding import DPEmbedding
from tfdp_embed.keras2.training import DPModel
from tfdp_embed.mechanisms import DPFEST, EANA, DenseDPSGD

VOCAB, DIM, N, Q, EPOCHS = 30, 4, 64, 0.125, 2  # 8 batches per epoch, 16 steps
EVERY, STOP_AFTER = 5, 13
SAMPLER_SEED, NOISE_SEED = 3, 7
_STRATEGY = []


def _strategy():
    """One MirroredStrategy per process: two of them can reuse collective instance keys."""
    if not _STRATEGY:
        _STRATEGY.append(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))
    return _STRATEGY[0]


def _data():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, (N, 2)).astype("int32")
    labels = (ids.sum(1, keepdims=True) % 2).astype("float32")
    return ids, labels


def _build(name: str):
    """(dp, batches, budget, info), every seed fixed, built inside the strategy's scope."""
    ids, labels = _data()
    batches, info = poisson_batches(
        tf.data.Dataset.from_tensor_slices((ids, labels)), sampling_probability=Q, seed=SAMPLER_SEED
    )
    kwargs = {"l2_norm_clip": 1.0, "noise_multiplier": 1.0, "seed": NOISE_SEED}
    with _strategy().scope():
        keras.utils.set_random_seed(0)
        inp = keras.Input((2,), dtype="int32")
        hidden = DPEmbedding(VOCAB, DIM, combiner="mean", name="emb")(inp)
        model = keras.Model(inp, keras.layers.Dense(1, name="out")(hidden))
        if name == "eana":
            mechanism = EANA(**kwargs)
        elif name == "fest":
            counts = {"emb": np.bincount(ids.ravel(), minlength=VOCAB)}
            mechanism = DPFEST(**kwargs, selection_epsilon=1.0, top_k=10, counts=counts)
        else:
            mechanism = DenseDPSGD(**kwargs)
        dp = DPModel(model, mechanism=mechanism, expected_batch_size=info.expected_batch_size)
        dp.compile(
            optimizer=keras.optimizers.legacy.SGD(0.5, momentum=0.9),
            loss=keras.losses.BinaryCrossentropy(from_logits=True),
        )
    budget = PrivacyBudget(mechanism, sampling_probability=Q, target_epsilon=50.0, target_delta=1e-5, accountant="rdp")
    # Built from fixed batches, not from the seeded sampler (see checkpoint_worker.build).
    dp.prepare(tf.data.Dataset.from_tensor_slices((ids[:8], labels[:8])).batch(4))
    return dp, batches, budget, info


class _StopAfter(keras.callbacks.Callback):
    """Stops `fit` after `steps` batches (the stand-in for a kill: nothing is saved on the way out)."""

    def __init__(self, steps: int):
        super().__init__()
        self.steps, self.seen = steps, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen >= self.steps:
            self.model.stop_training = True


def _state(dp, budget) -> dict:
    weights = dp.inner.weights
    spread = 0.0
    for var in weights:
        copies = [v.numpy() for v in getattr(var, "values", [var])]
        spread = max(spread, max(float(np.abs(c - copies[0]).max()) for c in copies))
    epsilon = budget.spent_epsilon() if dp.mechanism.is_dp else None
    return {
        "weights": [w.numpy().tolist() for w in weights],
        "replica_spread": spread,
        "generator_state": dp.mechanism.generator.state.numpy().tolist(),
        "steps": int(dp.mechanism.steps.numpy()),
        "iterations": int(dp.optimizer.iterations.numpy()),
        "ledger": budget.ledger.to_json(),
        "ledger_steps": budget.ledger.steps,
        "epsilon": epsilon,
    }


def case(name: str) -> dict:
    dp, batches, budget, _ = _build(name)
    dp.fit(batches, epochs=EPOCHS, callbacks=[budget], verbose=0)
    full = _state(dp, budget)

    directory = tempfile.mkdtemp(prefix=f"ckpt_mirrored_{name}_")
    dp, batches, budget, info = _build(name)
    checkpoint = DPCheckpoint(
        directory,
        dp_model=dp,
        budget=budget,
        every_n_steps=EVERY,
        save_at_train_end=False,
        batches_per_epoch=info.batches_per_epoch,
        sampler_seed=SAMPLER_SEED,
    )
    dp.fit(batches, epochs=EPOCHS, callbacks=[checkpoint, budget, _StopAfter(STOP_AFTER)], verbose=0)
    stopped_steps = int(dp.mechanism.steps.numpy())

    dp, batches, budget, info = _build(name)  # fresh objects, same strategy
    initial = [w.numpy() for w in dp.inner.weights]
    checkpoint = DPCheckpoint(
        directory,
        dp_model=dp,
        budget=budget,
        every_n_steps=EVERY,
        batches_per_epoch=info.batches_per_epoch,
        sampler_seed=SAMPLER_SEED,
    )
    resumed = checkpoint.restore_or_initialize()
    position = resumed.position
    restored = {
        "step": resumed.step,
        "epoch": position.epoch,
        "batch_in_epoch": position.batch_in_epoch,
        "ledger_steps": resumed.ledger.steps,
        "budget_ledger_steps": budget.ledger.steps,
        "mechanism_steps": int(dp.mechanism.steps.numpy()),
        "iterations": int(dp.optimizer.iterations.numpy()),
        "replica_spread": _state(dp, budget)["replica_spread"],
        "moved_from_initial": max(float(np.abs(w.numpy() - i).max()) for w, i in zip(dp.inner.weights, initial)),
    }
    rest = rest_of_epoch(batches, position)
    dp.fit(rest, epochs=position.epoch + 1, initial_epoch=position.epoch, callbacks=[budget, checkpoint], verbose=0)
    if position.next_full_epoch < EPOCHS:
        dp.fit(
            batches, epochs=EPOCHS, initial_epoch=position.next_full_epoch, callbacks=[budget, checkpoint], verbose=0
        )
    return {"full": full, "resumed": _state(dp, budget), "restored": restored, "stopped_steps": stopped_steps}


def main(names):
    print(json.dumps({name: case(name) for name in names}))


if __name__ == "__main__":
    main(sys.argv[1:])
