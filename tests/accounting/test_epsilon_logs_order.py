"""Epsilon reaches TensorBoard, and every callback's epoch logs, whatever the order of the callbacks.

The budget has no `log_dir` here: Keras' own `TensorBoard` callback is the
only writer, so it writes `epoch_epsilon` only if epsilon is in the epoch
logs when it runs. Before the fix a `TensorBoard` listed before the budget
wrote no epsilon. The oracle is `History` (Keras appends it after every
user callback).
"""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest

from tfdp_embed import DPModel, data, keras, plan_run, tf

N, Q, EPOCHS = 64, 0.25, 3


class _Reader(keras.callbacks.Callback):
    """Keeps the epsilon it finds in the epoch logs (None when absent)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def on_epoch_end(self, epoch, logs=None):
        self.seen.append((logs or {}).get("epsilon"))


def _train(order, tmp_path):
    plan = plan_run(
        "dense", target_epsilon=8.0, target_delta=1e-3, sampling_probability=Q, steps=100, accountant="rdp", seed=0
    )
    parts = {"tensorboard": keras.callbacks.TensorBoard(str(tmp_path)), "budget": plan.budget(), "reader": _Reader()}
    rng = np.random.default_rng(0)
    dataset = tf.data.Dataset.from_tensor_slices(
        (rng.normal(size=(N, 3)).astype("float32"), rng.normal(size=(N, 1)).astype("float32"))
    )
    batches, _ = data.poisson_batches(dataset, sampling_probability=Q, num_examples=N, seed=0)
    inputs = keras.Input((3,))
    dp = DPModel(
        keras.Model(inputs, keras.layers.Dense(1)(inputs)), mechanism=plan.mechanism, expected_batch_size=Q * N
    )
    dp.compile(optimizer=keras.optimizers.legacy.SGD(0.1), loss=keras.losses.MeanSquaredError(reduction="none"))
    history = dp.fit(batches, epochs=EPOCHS, callbacks=[parts[name] for name in order], verbose=0)
    return history.history["epsilon"], parts["reader"].seen


def _tensorboard_epsilon(log_dir) -> dict:
    """{epoch: value} of the `epoch_epsilon` scalars under `log_dir`."""
    out = {}
    for path in glob.glob(os.path.join(str(log_dir), "**", "*tfevents*"), recursive=True):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == "epoch_epsilon":
                    out[event.step] = float(tf.make_ndarray(value.tensor))
    return out


@pytest.mark.parametrize(
    "order", [("tensorboard", "reader", "budget"), ("budget", "tensorboard", "reader")], ids=["budget_last", "first"]
)
def test_tensorboard_and_every_callback_see_epsilon_whatever_the_order(order, tmp_path):
    epsilons, seen = _train(order, tmp_path)
    assert len(epsilons) == EPOCHS and epsilons[0] < epsilons[1] < epsilons[2] <= 8.0
    assert _tensorboard_epsilon(tmp_path) == {e: float(np.float32(v)) for e, v in enumerate(epsilons)}
    assert seen == epsilons  # a callback listed before the budget reads the same value


def test_epsilon_first_leaves_a_list_without_a_budget_as_it_is():
    from tfdp_embed.keras2.callbacks import epsilon_first  # here: the module is new (the file runs on old code)

    callbacks = [keras.callbacks.TensorBoard("unused"), _Reader()]
    assert epsilon_first(callbacks) == callbacks
