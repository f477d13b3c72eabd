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

Both front ends (the `fe` fixture of tests/conftest.py): tf-keras's paths
above, and Keras 3's (`dp.save_weights` / `.keras` / `dp.export` /
`inner.export`, `tf.saved_model.save` of `dp` and of the inner model,
`tf.train.Checkpoint`, `numpy()` and `tf.gather` on the table's `tf.Variable`).
"""

from __future__ import annotations

import zipfile

import h5py
import numpy as np
import pytest
import tensorflow as tf
from tiny_model import embedding_dense_model

from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.mechanisms.lazy import LazyDP

VOCAB, DIM, BATCH, STEPS = 64, 4, 4, 4
CLIP, SIGMA, LR = 1.0, 1.0, 0.5
ROW = 0  # read by example 0 of step 1, never again
STEP_NOISE_STD = LR * SIGMA * CLIP / BATCH  # one step's noise on one weight


def _model(fe):
    return embedding_dense_model(VOCAB, DIM, table_seed=3, dense_seed=4, fe=fe)


def _data():
    """Step 1 reads rows 0..7 (one example each pair), steps 2..4 rows 8..31; rows 32..63 never."""
    x = np.arange(STEPS * BATCH * 2, dtype=np.int32).reshape(STEPS * BATCH, 2)
    y = (np.arange(STEPS * BATCH) % 2).astype(np.float32)[:, None]
    return x, y


def _train(fe, callbacks=()):
    x, y = _data()
    dp = fe.dp_model(_model(fe), LazyDP(l2_norm_clip=CLIP, noise_multiplier=SIGMA, seed=5), batch=BATCH, lr=LR)
    dp.fit(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH),
        epochs=1,
        verbose=0,
        callbacks=list(callbacks),
    )
    return dp


def _noiseless_table(fe) -> np.ndarray:
    """The table after 4 steps if no row got noise: step 1's clipped update on rows 0..7, init elsewhere."""
    x, y = _data()
    model = _model(fe)
    table = model.get_weights()[0]
    for i in range(BATCH):  # step 1, one example at a time
        with tf.GradientTape() as tape:
            loss = tf.nn.sigmoid_cross_entropy_with_logits(y[i : i + 1], model(x[i : i + 1]))
        grads = [tf.convert_to_tensor(g).numpy() for g in tape.gradient(loss, model.trainable_variables)]
        factor = min(1.0, CLIP / np.sqrt(sum(float(np.sum(g * g)) for g in grads)))
        table = table - LR * factor * grads[0] / BATCH
    return table


NOISELESS: dict = {}  # front end -> the noiseless table


def _noiseless_row(fe) -> np.ndarray:
    if fe.name not in NOISELESS:
        NOISELESS[fe.name] = _noiseless_table(fe)
    return NOISELESS[fe.name][ROW]


def _table(dp):
    return dp.inner.get_layer("items").embeddings


# -- the read paths: each returns row ROW as an attacker sees it (None: refused) -------------
def _dp_get_weights(fe, tmp_path):
    return _train(fe).get_weights()[0][ROW]


def _inner_get_weights(fe, tmp_path):
    return _train(fe).inner.get_weights()[0][ROW]


def _callback_get_weights(fe, tmp_path):
    seen = []

    class ReadWeights(fe.keras.callbacks.Callback):  # what TensorBoard(histogram_freq=1) does
        def on_train_batch_end(self, batch, logs=None):
            if batch == STEPS - 1:
                seen.append(self.model.get_weights()[0][ROW].copy())

    _train(fe, callbacks=[ReadWeights()])
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


def _inner_save_weights_h5(fe, tmp_path):
    path = str(tmp_path / "w.h5")
    _train(fe).inner.save_weights(path)
    return _table_in_h5(path)[ROW]


def _table_in_checkpoint(path):
    """The table in a checkpoint; Keras 3's `export` writes each variable twice (`variables`, `_all_variables`)."""
    tables = [tf.train.load_variable(path, n) for n, shape in tf.train.list_variables(path) if shape == [VOCAB, DIM]]
    assert tables and all(np.array_equal(t, tables[0]) for t in tables), f"{len(tables)} different tables"
    return tables[0]


def _inner_save_weights_tf(fe, tmp_path):
    path = str(tmp_path / "w")
    _train(fe).inner.save_weights(path)
    return _table_in_checkpoint(path)[ROW]


def _inner_save_keras(fe, tmp_path):
    path = str(tmp_path / "m.keras")
    _train(fe).inner.save(path)
    with zipfile.ZipFile(path) as archive:
        archive.extract("model.weights.h5", tmp_path)
    return _table_in_h5(str(tmp_path / "model.weights.h5"))[ROW]


def _tf_checkpoint_of_inner(fe, tmp_path):
    path = tf.train.Checkpoint(model=_train(fe).inner).save(str(tmp_path / "ckpt"))
    return _table_in_checkpoint(path)[ROW]


def _tf_saved_model_of_dp(fe, tmp_path):
    path = str(tmp_path / "saved")
    try:
        tf.saved_model.save(_train(fe), path)
    except PrivacyContractError as error:
        assert "export_saved_model" in str(error)
        return None
    return _table_in_checkpoint(f"{path}/variables/variables")[ROW]


def _variable_numpy(fe, tmp_path):
    return _table(_train(fe)).numpy()[ROW]


def _tf_gather(fe, tmp_path):
    return tf.gather(_table(_train(fe)), [ROW]).numpy()[0]


# Keras 3's own exits: weights files end in `.weights.h5`, the `.keras` archive, `export` (a SavedModel).
def _dp_save_weights_keras3(fe, tmp_path):
    path = str(tmp_path / "w.weights.h5")
    _train(fe).save_weights(path)
    return _table_in_h5(path)[ROW]


def _inner_save_weights_keras3(fe, tmp_path):
    path = str(tmp_path / "w.weights.h5")
    _train(fe).inner.save_weights(path)
    return _table_in_h5(path)[ROW]


def _dp_save_keras(fe, tmp_path):
    path = str(tmp_path / "m.keras")
    _train(fe).save(path)
    with zipfile.ZipFile(path) as archive:
        archive.extract("model.weights.h5", tmp_path)
    return _table_in_h5(str(tmp_path / "model.weights.h5"))[ROW]


def _dp_export(fe, tmp_path):
    path = str(tmp_path / "exported")
    _train(fe).export(path)
    return _table_in_checkpoint(f"{path}/variables/variables")[ROW]


def _inner_export(fe, tmp_path):
    path = str(tmp_path / "exported")
    _train(fe).inner.export(path)
    return _table_in_checkpoint(f"{path}/variables/variables")[ROW]


def _tf_saved_model_of_inner(fe, tmp_path):
    path = str(tmp_path / "saved")
    tf.saved_model.save(_train(fe).inner, path)
    return _table_in_checkpoint(f"{path}/variables/variables")[ROW]


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
    "dp.save_weights .weights.h5": _dp_save_weights_keras3,
    "inner.save_weights .weights.h5": _inner_save_weights_keras3,
    "dp.save keras": _dp_save_keras,
    "dp.export": _dp_export,
    "inner.export": _inner_export,
    "tf.saved_model.save(inner)": _tf_saved_model_of_inner,
}
KERAS2_PATHS = list(PATHS)[:10]
KERAS3_PATHS = [
    "dp.get_weights",
    "inner.get_weights",
    "callback self.model.get_weights",
    "dp.save_weights .weights.h5",
    "inner.save_weights .weights.h5",
    "dp.save keras",
    "inner.save keras",
    "dp.export",
    "inner.export",
    "tf.saved_model.save(inner)",
    "tf.saved_model.save(dp)",
    "tf.train.Checkpoint(model=inner)",
    "variable.numpy()",
    "tf.gather(variable)",
]
CASES = [("keras2", p) for p in KERAS2_PATHS] + [("keras3", p) for p in KERAS3_PATHS]


@pytest.mark.parametrize(("fe", "path"), CASES, ids=[f"{f}-{p}" for f, p in CASES], indirect=["fe"])
def test_a_row_read_once_never_leaves_without_its_noise(fe, path, tmp_path):
    row = PATHS[path](fe, tmp_path)
    if row is None:
        return  # refused, with an error naming export_saved_model
    deviation = float(np.abs(row - _noiseless_row(fe)).max())
    # One coordinate of the owed noise is N(0, 4 steps x 0.125^2): |.| < 1e-3 on all four
    # coordinates has probability ~1e-9. The noiseless value itself matches to ~1e-7.
    assert deviation > 1e-3, (
        f"{path} returned row {ROW} without its noise: it equals init - lr c g / B to "
        f"{deviation:.1e}, one example's clipped gradient in the clear."
    )


def test_the_oracle_is_right_and_training_itself_never_flushes(fe):
    """Positive control: inside training row R IS the noiseless value, and a plain fit reads nothing."""
    from tfdp_embed import read_guard

    dp = _train(fe)
    mechanism = dp.mechanism
    assert int(mechanism.flushed_at.numpy()) == 0 and mechanism.owes_noise()  # no guard flush in fit
    with read_guard.unguarded():  # training-internal raw read
        raw = _table(dp).numpy()
    np.testing.assert_allclose(raw[ROW], _noiseless_row(fe), rtol=0, atol=1e-6)
    np.testing.assert_array_equal(raw[32:], _model(fe).get_weights()[0][32:])  # never read: still init


def test_released_rows_carry_the_noise_they_owed(fe):
    """Rows 0..7 and 32..63 owe steps 1..4: each released coordinate is noiseless + N(0, 4 (lr sigma C / B)^2)."""
    table = _train(fe).get_weights()[0]
    rows = np.r_[0:8, 32:64]
    deviation = (table - _noiseless_table(fe))[rows].ravel()  # 160 draws
    std = STEP_NOISE_STD * np.sqrt(STEPS)
    assert np.std(deviation) == pytest.approx(std, rel=0.25)  # sample sd has relative sd ~6%
    assert abs(np.mean(deviation)) < 5 * std / np.sqrt(deviation.size)


def test_a_checkpoint_of_model_and_mechanism_is_taken_after_one_flush(fe, tmp_path):
    """The table, history and catch-up stream in the file are one consistent, flushed state.

    Flushing at the table's own read would come after the history and the stream
    were serialized: the file would hold noised rows whose history still owes the
    noise, and a stream that replays the flush's draws after a restore.
    """
    dp = _train(fe)
    mechanism = dp.mechanism
    path = tf.train.Checkpoint(model=dp.inner, mechanism=mechanism).save(str(tmp_path / "ckpt"))
    assert not mechanism.owes_noise()
    entries = {n: tf.train.load_variable(path, n) for n, _ in tf.train.list_variables(path)}
    (history,) = [v for n, v in entries.items() if "_histories/0/" in n]
    np.testing.assert_array_equal(history, np.full(VOCAB, 2 * STEPS))  # every row current
    (stream,) = [v for n, v in entries.items() if "_stream/" in n]
    np.testing.assert_array_equal(stream, mechanism._stream.numpy())  # after the flush's draws
    assert float(np.abs(_table_in_checkpoint(path)[ROW] - _noiseless_row(fe)).max()) > 1e-3


SAVEDMODELS = [
    ("keras2", "tf.saved_model.save(inner)"),
    ("keras2", "inner.save(dir)"),
    ("keras3", "tf.saved_model.save(inner)"),
    ("keras3", "dp.export"),
    ("keras3", "inner.export"),
]


@pytest.mark.parametrize(("fe", "save"), SAVEDMODELS, ids=[f"{f}-{s}" for f, s in SAVEDMODELS], indirect=["fe"])
def test_a_savedmodel_of_the_inner_model_is_flushed_and_traces_no_mechanism(fe, save, tmp_path):
    dp = _train(fe)
    path = str(tmp_path / "saved")
    if save == "inner.save(dir)":
        dp.inner.save(path)
    elif save == "dp.export":
        dp.export(path)
    elif save == "inner.export":
        dp.inner.export(path)
    else:
        tf.saved_model.save(dp.inner, path)
    prefix = f"{path}/variables/variables"
    names = [n for n, _ in tf.train.list_variables(prefix) if n != "_CHECKPOINTABLE_OBJECT_GRAPH"]
    held = {(tf.train.load_variable(prefix, n).tobytes(), tf.train.load_variable(prefix, n).shape) for n in names}
    weights = {(w.tobytes(), w.shape) for w in dp.inner.get_weights()}
    assert held == weights, names  # the model's weights alone (Keras 3's export: each twice), no mechanism state
    assert float(np.abs(_table_in_checkpoint(f"{path}/variables/variables")[ROW] - _noiseless_row(fe)).max()) > 1e-3
    served = tf.saved_model.load(path)
    ids = np.array([[ROW, 40]], np.int32)
    np.testing.assert_allclose(_serve(served, ids), dp.inner(ids).numpy(), rtol=1e-6)


def _serve(served, ids) -> np.ndarray:
    """Calls a loaded SavedModel: tf-keras's is callable, `export`'s has `serve`, else the default signature."""
    if callable(served):
        return served(ids).numpy()
    if hasattr(served, "serve"):
        return served.serve(ids).numpy()
    (output,) = served.signatures["serving_default"](tf.constant(ids)).values()
    return output.numpy()
