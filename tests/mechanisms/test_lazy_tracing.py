"""LazyDP traces each of its functions once: no `tf.function` retracing over epochs, flushes and evaluations.

A model of several tables trains for a few epochs under `DPModel.fit`,
flushing at every epoch end (as a checkpoint or an evaluation callback
would) and evaluating in between. Tracing is the largest fixed cost of a
LazyDP run, so each traced function must be traced exactly once: the train
step, every table's flush function and every table's catch-up (momentum:
the TensorFlow path), and TensorFlow must log no retracing warning (it
counts traces of functions sharing one code object together, so one
function per table built from a shared lambda would warn from the sixth
table on).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from tensorflow.python.eager.polymorphic_function import polymorphic_function

from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.layers.embedding import DPEmbedding
from tfdp_embed.keras2.training import DPModel
from tfdp_embed.mechanisms.lazy import LazyDP

TABLES, VOCAB, DIM, BATCH, STEPS, EPOCHS = 7, 16, 2, 4, 3, 3


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _data():
    rng = np.random.default_rng(3)
    ids = rng.integers(0, VOCAB, size=(STEPS, BATCH, TABLES)).astype(np.int32)
    labels = rng.integers(0, 2, size=(STEPS, BATCH, 1)).astype(np.float32)

    def batches():
        for t in range(STEPS):
            following = ids[(t + 1) % STEPS]
            yield ids[t], labels[t], {f"t{k}": np.unique(following[:, k]) for k in range(TABLES)}

    signature = (
        tf.TensorSpec([BATCH, TABLES], tf.int32),
        tf.TensorSpec([BATCH, 1], tf.float32),
        {f"t{k}": tf.TensorSpec([None], tf.int32) for k in range(TABLES)},
    )
    return tf.data.Dataset.from_generator(batches, output_signature=signature)


def _model():
    inputs = keras.Input((TABLES,), dtype="int32")
    columns = [
        DPEmbedding(VOCAB, DIM, name=f"t{k}")(keras.layers.Lambda(lambda x, k=k: x[:, k : k + 1])(inputs))
        for k in range(TABLES)
    ]
    features = keras.layers.Flatten()(keras.layers.Concatenate()(columns))
    return keras.Model(inputs, keras.layers.Dense(1)(features))


class _FlushEachEpoch(keras.callbacks.Callback):
    def __init__(self, dp_model, data):
        super().__init__()
        self.dp_model, self.data = dp_model, data

    def on_epoch_end(self, epoch, logs=None):
        self.dp_model.flush()
        self.dp_model.evaluate(self.data, verbose=0)  # reads every table through the read hooks


@pytest.mark.parametrize("momentum", [0.9, 0.0], ids=["momentum_tf_path", "plain_sgd_fused"])
def test_no_retracing_over_epochs_flushes_and_evaluations(momentum, monkeypatch):
    # TensorFlow counts traces per Python function code across the process: every Keras model's
    # `test_function` shares one counter, so earlier tests' models would warn here. Count this test's only.
    monkeypatch.setattr(
        polymorphic_function,
        "_frequent_tracing_detector_manager",
        polymorphic_function._FrequentTracingDetectorManager(),
    )
    keras.utils.set_random_seed(0)
    mechanism = LazyDP(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0)
    dp_model = DPModel(_model(), mechanism=mechanism, expected_batch_size=BATCH, lookahead=True)
    dp_model.compile(
        optimizer=keras.optimizers.legacy.SGD(0.1, momentum=momentum),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
    )
    data = _data()
    records = _Records()
    tf.get_logger().addHandler(records)
    try:
        dp_model.fit(data, epochs=EPOCHS, verbose=0, callbacks=[_FlushEachEpoch(dp_model, data)])
        dp_model.flush()
    finally:
        tf.get_logger().removeHandler(records)

    assert int(mechanism.steps.numpy()) == STEPS * EPOCHS and not mechanism.owes_noise()
    assert dp_model.train_function.experimental_get_tracing_count() == 1
    assert dp_model.test_function.experimental_get_tracing_count() == 1
    assert mechanism._traced("flush").experimental_get_tracing_count() == 1  # one trace for all tables
    if momentum > 0:  # the TensorFlow path: one catch-up for all tables, shared by step, flush and evaluation
        # Traced once for tables of any shape.
        # Every call site (read, stamp, lookahead, evaluation, flush) calls it the same way: one trace.
        assert mechanism._traced("bring_current").traced.experimental_get_tracing_count() == 1
    retracing = [m for m in records.messages if "retracing" in m]
    assert retracing == []
