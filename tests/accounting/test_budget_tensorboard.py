"""Epsilon reaches TensorBoard whatever the order of the callbacks (PrivacyBudget's `log_dir`), as a user trains.

The oracle is the epoch logs (`History`, which runs after every user
callback and so sees the budget's epsilon): TensorBoard's event files must
hold the same value at every epoch.
"""

from __future__ import annotations

import glob
import os

import numpy as np

from tfdp_embed import DPModel, data, keras, plan_run, tf

N, Q, EPOCHS = 64, 0.25, 3


def _train(callbacks, plan):
    rng = np.random.default_rng(0)
    features = rng.normal(size=(N, 3)).astype("float32")
    labels = rng.normal(size=(N, 1)).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices((features, labels))
    batches, _ = data.poisson_batches(dataset, sampling_probability=Q, num_examples=N, seed=0)
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    dp = DPModel(model, mechanism=plan.mechanism, expected_batch_size=Q * N)
    dp.compile(optimizer=keras.optimizers.legacy.SGD(0.1), loss=keras.losses.MeanSquaredError(reduction="none"))
    return dp.fit(batches, epochs=EPOCHS, callbacks=callbacks, verbose=0)


def _plan():
    # 100 planned steps: the 3 epochs of about 4 steps each stay well within the budget.
    return plan_run(
        "dense", target_epsilon=8.0, target_delta=1e-3, sampling_probability=Q, steps=100, accountant="rdp", seed=0
    )


def _scalars(log_dir) -> dict:
    """{tag: {step: value}} of every event file under `log_dir`."""
    out: dict = {}
    for path in glob.glob(os.path.join(str(log_dir), "**", "*tfevents*"), recursive=True):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.HasField("tensor") and value.metadata.plugin_data.plugin_name == "scalars":
                    out.setdefault(value.tag, {})[event.step] = float(tf.make_ndarray(value.tensor))
    return out


def test_tensorboard_first_then_the_budget_still_logs_epsilon_every_epoch(tmp_path):
    plan = _plan()
    budget = plan.budget(log_dir=str(tmp_path))
    history = _train([keras.callbacks.TensorBoard(str(tmp_path)), budget], plan)
    scalars = _scalars(tmp_path)
    assert "epoch_loss" in scalars  # TensorBoard wrote its own scalars there
    expected = dict(enumerate(history.history["epsilon"]))
    assert len(expected) == EPOCHS and expected[0] < expected[1] < expected[2] <= 8.0
    assert scalars["epoch_epsilon"] == {epoch: float(np.float32(eps)) for epoch, eps in expected.items()}


def test_budget_first_writes_the_same_values(tmp_path):
    plan = _plan()
    history = _train([plan.budget(log_dir=str(tmp_path)), keras.callbacks.TensorBoard(str(tmp_path))], plan)
    assert _scalars(tmp_path)["epoch_epsilon"] == {
        e: float(np.float32(v)) for e, v in enumerate(history.history["epsilon"])
    }


def test_without_log_dir_epsilon_goes_to_the_active_summary_writer(tmp_path):
    plan = _plan()
    with tf.summary.create_file_writer(str(tmp_path / "mine")).as_default():
        history = _train([plan.budget()], plan)
    assert _scalars(tmp_path / "mine")["epoch_epsilon"] == {
        e: float(np.float32(v)) for e, v in enumerate(history.history["epsilon"])
    }


def test_without_log_dir_or_writer_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = _plan()
    _train([plan.budget()], plan)
    assert glob.glob(str(tmp_path / "**" / "*tfevents*"), recursive=True) == []
