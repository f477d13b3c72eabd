"""Attack: read a LazyDP table row that still lacks its noise, through ordinary Keras/TF calls.

LazyDP adds a row's deferred noise only when the row is read by the model
(or at `flush`). Row R below is read by one example in step 1 and never
again, so inside training it holds exactly

    init_R - lr * c * g_R / B       (c: that example's clip factor)

with no noise at all: the clipped gradient of one example, in the clear.
The attacker knows init, the data and the clip norm, computes that value
by brute force, and reads row R through each public path a user (or a
callback such as TensorBoard's histograms) would use. A path leaks if it
returns the noiseless value; every path must instead return the row with
its owed noise (a flush), or refuse with an error naming
`export_saved_model`.
"""

from __future__ import annotations

import zipfile

import h5py
import numpy as np
import pytest
from tiny_model import embedding_dense_model

from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.training import DPModel
from tfdp_embed.mechanisms.lazy import LazyDP

VOCAB, DIM, BATCH, STEPS = 64, 4, 4, 4
CLIP, SIGMA, LR = 1.0, 1.0, 0.5
ROW = 0  # read by example 0 of step 1, never again
STEP_NOISE_STD = LR * SIGMA * CLIP / BATCH  # one step's noise on one weight


def _model() -> keras.Model:
    return embedding_dense_model(VOCAB, DIM, table_seed=3, dense_seed=4)


def _data():
    """Step 1 reads rows 0..7 (one example each pair), steps 2..4 rows 8..31; rows 32..63 never."""
    x = np.arange(STEPS * BATCH * 2, dtype=np.int32).reshape(STEPS * BATCH, 2)
    y = (np.arange(STEPS * BATCH) % 2).astype(np.float32)[:, None]
    return x, y


def _train(callbacks=()) -> DPModel:
    x, y = _data()
    dp = DPModel(
        _model(),
        mechanism=LazyDP(l2_norm_clip=CLIP, noise_multiplier=SIGMA, seed=5),
        expected_batch_size=BATCH,
    )
    dp.compile(
        optimizer=keras.optimizers.legacy.SGD(LR),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
    )
    dp.fit(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH),
        epochs=1,
        verbose=0,
        callbacks=list(callbacks),
    )
    return dp


def _noiseless_table() -> np.ndarray:
    """The table after 4 steps if no row got noise: step 1's clipped update on rows 0..7, init elsewhere."""
    x, y = _data()
    model = _model()
    table = model.get_weights()[0]
    for i in range(BATCH):  # step 1, one example at a time
        with tf.GradientTape() as tape:
            loss = tf.nn.sigmoid_cross_entropy_with_logits(y[i : i + 1], model(x[i : i + 1]))
        grads = [tf.convert_to_tensor(g).numpy() for g in tape.gradient(loss, model.trainable_variables)]
        factor = min(1.0, CLIP / np.sqrt(sum(float(np.sum(g * g)) for g in grads)))
        table = table - LR * factor * grads[0] / BATCH
    return table


NOISELESS = None


def _noiseless_row() -> np.ndarray:
    global NOISELESS
    if NOISELESS is None:
        NOISELESS = _noiseless_table()
    return NOISELESS[ROW]


# -- the read paths: each returns row ROW as an attacker sees it (None: refused) -------------
def _dp_get_weights(tmp_path):
    return _train().get_weights()[0][ROW]


def _inner_get_weights(tmp_path):
    return _train().inner.get_weights()[0][ROW]


def _callback_get_weights(tmp_path):
    seen = []

    class ReadWeights(keras.callbacks.Callback):  # what TensorBoard(histogram_freq=1) does
        def on_train_batch_end(self, batch, logs=None):
            if batch == STEPS - 1:
                seen.append(self.model.get_weights()[0][ROW].copy())

    _train(callbacks=[ReadWeights()])
    return seen[0]


def _table_in_h5(path):
    found = []
    with h5py.File(path, "r") as f:
        f.visititems(
            lambda name, obj: (
                found.append(obj[()]) if isinstance(obj, h5py.Dataset) and obj.shape == (VOCAB, DIM) else None
            )
        )
    assert found, "no table in the file"
    return found[0]


def _inner_save_weights_h5(tmp_path):
    path = str(tmp_path / "w.h5")
    _train().inner.save_weights(path)
    return _table_in_h5(path)[ROW]


def _table_in_checkpoint(path):
    (name,) = [n for n, shape in tf.train.list_variables(path) if shape == [VOCAB, DIM]]
    return tf.train.load_variable(path, name)


def _inner_save_weights_tf(tmp_path):
    path = str(tmp_path / "w")
    _train().inner.save_weights(path)
    return _table_in_checkpoint(path)[ROW]


def _inner_save_keras(tmp_path):
    path = str(tmp_path / "m.keras")
    _train().inner.save(path)
    with zipfile.ZipFile(path) as archive:
        archive.extract("model.weights.h5", tmp_path)
    return _table_in_h5(str(tmp_path / "model.weights.h5"))[ROW]


def _tf_checkpoint_of_inner(tmp_path):
    path = tf.train.Checkpoint(model=_train().inner).save(str(tmp_path / "ckpt"))
    return _table_in_checkpoint(path)[ROW]


def _tf_saved_model_of_dp(tmp_path):
    path = str(tmp_path / "saved")
    try:
        tf.saved_model.save(_train(), path)
    except PrivacyContractError as error:
        assert "export_saved_model" in str(error)
        return None
    return _table_in_checkpoint(f"{path}/variables/variables")[ROW]


def _variable_numpy(tmp_path):
    return _train().inner.get_layer("items").embeddings.numpy()[ROW]


def _tf_gather(tmp_path):
    return tf.gather(_train().inner.get_layer("items").embeddings, [ROW]).numpy()[0]


PATHS = {
    "dp.get_weights": _dp_get_weights,
    "inner.get_weights": _inner_get_weights,
    "callback self.model.get_weights": _callback_get_weights,
    "inner.save_weights h5": _inner_save_weights_h5,
    "inner.save_weights tf": _inner_save_weights_tf,
    "inner.save keras": _inner_save_keras,
    "tf.train.Checkpoint(model=inner)": _tf_checkpoint_of_inner,
    "tf.saved_model.save(dp)": _tf_saved_model_of_dp,
    "variable.numpy()": _variable_numpy,
    "tf.gather(variable)": _tf_gather,
}


@pytest.mark.parametrize("path", list(PATHS), ids=list(PATHS))
def test_a_row_read_once_never_leaves_without_its_noise(path, tmp_path):
    row = PATHS[path](tmp_path)
    if row is None:
        return  # refused, with an error naming export_saved_model
    deviation = float(np.abs(row - _noiseless_row()).max())
    # One coordinate of the owed noise is N(0, 4 steps x 0.125^2): |.| < 1e-3 on all four
    # coordinates has probability ~1e-9. The noiseless value itself matches to ~1e-7.
    assert deviation > 1e-3, (
        f"{path} returned row {ROW} without its noise: it equals init - lr c g / B to "
        f"{deviation:.1e}, one example's clipped gradient in the clear."
    )


def test_the_oracle_is_right_and_training_itself_never_flushes():
    """Positive control: inside training row R IS the noiseless value, and a plain fit reads nothing."""
    from tfdp_embed import read_guard

    dp = _train()
    mechanism = dp.mechanism
    assert int(mechanism.flushed_at.numpy()) == 0 and mechanism.owes_noise()  # no guard flush in fit
    with read_guard.unguarded():  # training-internal raw read
        raw = dp.inner.get_layer("items").embeddings.numpy()
    np.testing.assert_allclose(raw[ROW], _noiseless_row(), rtol=0, atol=1e-6)
    np.testing.assert_array_equal(raw[32:], _model().get_weights()[0][32:])  # never read: still init


def test_released_rows_carry_the_noise_they_owed():
    """Rows 0..7 and 32..63 owe steps 1..4: each released coordinate is noiseless + N(0, 4 (lr sigma C / B)^2)."""
    table = _train().get_weights()[0]
    rows = np.r_[0:8, 32:64]
    deviation = (table - _noiseless_table())[rows].ravel()  # 160 draws
    std = STEP_NOISE_STD * np.sqrt(STEPS)
    assert np.std(deviation) == pytest.approx(std, rel=0.25)  # sample sd has relative sd ~6%
    assert abs(np.mean(deviation)) < 5 * std / np.sqrt(deviation.size)


def test_a_checkpoint_of_model_and_mechanism_is_taken_after_one_flush(tmp_path):
    """The table, history and catch-up stream in the file are one consistent, flushed state.

    Flushing at the table's own read would come after the history and the stream
    were serialized: the file would hold noised rows whose history still owes the
    noise, and a stream that replays the flush's draws after a restore.
    """
    dp = _train()
    mechanism = dp.mechanism
    path = tf.train.Checkpoint(model=dp.inner, mechanism=mechanism).save(str(tmp_path / "ckpt"))
    assert not mechanism.owes_noise()
    entries = {n: tf.train.load_variable(path, n) for n, _ in tf.train.list_variables(path)}
    (history,) = [v for n, v in entries.items() if "_histories/0/" in n]
    np.testing.assert_array_equal(history, np.full(VOCAB, 2 * STEPS))  # every row current
    (stream,) = [v for n, v in entries.items() if "_stream/" in n]
    np.testing.assert_array_equal(stream, mechanism._stream.numpy())  # after the flush's draws
    assert float(np.abs(_table_in_checkpoint(path)[ROW] - _noiseless_row()).max()) > 1e-3


@pytest.mark.parametrize("save", ["tf.saved_model.save(inner)", "inner.save(dir)"])
def test_a_savedmodel_of_the_inner_model_is_flushed_and_traces_no_mechanism(save, tmp_path):
    dp = _train()
    path = str(tmp_path / "saved")
    if save == "inner.save(dir)":
        dp.inner.save(path)
    else:
        tf.saved_model.save(dp.inner, path)
    names = [n for n, _ in tf.train.list_variables(f"{path}/variables/variables")]
    assert len(names) == 1 + len(dp.inner.weights), names  # + the object graph: no mechanism state
    assert float(np.abs(_table_in_checkpoint(f"{path}/variables/variables")[ROW] - _noiseless_row()).max()) > 1e-3
    served = tf.saved_model.load(path)
    ids = np.array([[ROW, 40]], np.int32)
    np.testing.assert_allclose(served(ids).numpy(), dp.inner(ids).numpy(), rtol=1e-6)
