"""Attack: reconstruct the noise-free gradient sum from a released weights file.

DP-SGD's update is w_t = w_{t-1} - lr (S_t + Z_t) / B, with S_t the clipped
gradient sum and Z_t Gaussian noise drawn from the mechanism's Philox
generator. The generator's counter advances by a data-independent constant
per step. If a weights file holds the generator state, an attacker with two
consecutive files (e.g. `ModelCheckpoint(save_weights_only=True,
save_freq=1)`) rewinds the counter of the last one by that constant,
regenerates Z_t with a copy of the (public) mechanism, and recovers
S_t = -(w_t - w_{t-1}) B / lr - Z_t: the noise-free sum, i.e. no privacy.

The tests train a small model with known data and seeds, write the files
every way Keras offers (`DPModel.save_weights` in TF and HDF5 format,
`ModelCheckpoint(save_weights_only=True)`, `tf.train.Checkpoint(m=dp)`)
and check that a file holds the wrapped model's weights and nothing else.
The attack itself runs too: with the trainer's own generator states (a
positive control: it recovers S_t to float rounding, so the attack is
sound) and with whatever state the released files hold (none).

Both front ends (the `fe` fixture of tests/conftest.py); Keras 3's files are
`.weights.h5` (`save_weights`, `ModelCheckpoint`), the `.keras` archive and
`tf.train.Checkpoint` / `tf.saved_model.save` of the `DPModel`.
"""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import tensorflow as tf
from tiny_model import embedding_dense_model

from tfdp_embed.clipping.layer_kinds import tf_variable
from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.mechanisms.base import ClippedGradients, TableGradient
from tfdp_embed.mechanisms.dense import DenseDPSGD
from tfdp_embed.mechanisms.lazy import LazyDP
from tfdp_embed.release import export_saved_model

VOCAB, DIM, BATCH, STEPS = 8, 3, 4, 3
CLIP, SIGMA, LR = 1.0, 1.0, 0.1
MECHANISMS = {"dense": DenseDPSGD, "lazy": LazyDP}


def _model(fe):
    return embedding_dense_model(VOCAB, DIM, table_seed=1, dense_seed=2, fe=fe)


def _data():
    rng = np.random.default_rng(0)
    x = rng.integers(0, VOCAB, (STEPS * BATCH, 2)).astype(np.int32)
    y = rng.integers(0, 2, (STEPS * BATCH, 1)).astype(np.float32)
    return x, y


def _trainer_view(fe):
    """A callback keeping the trainer's own record of the generator state after each step (positive control only)."""

    class TrainerView(fe.keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.states = []

        def on_train_batch_end(self, batch, logs=None):
            self.states.append(self.model.mechanism.generator.state.numpy().copy())

    return TrainerView()


def _train(fe, name: str, callbacks=()):
    x, y = _data()
    mechanism = MECHANISMS[name](l2_norm_clip=CLIP, noise_multiplier=SIGMA, seed=11)
    dp = fe.dp_model(_model(fe), mechanism, batch=BATCH, lr=LR)
    dp.fit(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH),
        epochs=1,
        verbose=0,
        callbacks=list(callbacks),
    )
    return dp


def _entries(path: str) -> dict:
    """Every array a weights file holds, by name (what an attacker with the file sees)."""
    if path.endswith(".h5"):
        found = {}
        with h5py.File(path, "r") as f:
            f.visititems(lambda name, obj: found.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
        return found
    return {
        name: tf.train.load_variable(path, name)
        for name, _ in tf.train.list_variables(path)
        if name != "_CHECKPOINTABLE_OBJECT_GRAPH"
    }


def _weights_in(entries: dict) -> list:
    """[table, kernel, bias] of the model in a weights file, by their (distinct) shapes."""
    found = []
    for shape in ((VOCAB, DIM), (DIM, 1), (1,)):
        (value,) = [v for v in entries.values() if np.shape(v) == shape]
        found.append(value)
    return found


def _generator_state(entries: dict):
    states = [v for n, v in entries.items() if "generator" in n and "_state_var" in n]
    return states[0] if states else None


# -- the attack ---------------------------------------------------------------------
def _regenerated_dense_noise(fe, name: str, state: np.ndarray) -> list:
    """Z of the step that starts at generator `state`, for [kernel, bias]: a copy of the mechanism replays it."""
    model = _model(fe)
    model(np.zeros((1, 2), np.int32))
    table = model.get_layer("items")
    dense = [tf_variable(v) for v in model.trainable_variables if tf_variable(v) is not table.embeddings]
    mechanism = MECHANISMS[name](l2_norm_clip=CLIP, noise_multiplier=SIGMA, seed=0)
    mechanism.init(tables=[table], dense_variables=dense, optimizer=fe.sgd(LR))
    mechanism.generator.reset(state)
    empty = tf.IndexedSlices(tf.zeros([0, DIM]), tf.zeros([0], tf.int64), tf.constant([VOCAB, DIM], tf.int64))
    zero_sums = ClippedGradients(
        tables=[TableGradient(table, table.embeddings, empty, [], tf.ones([BATCH]))],
        dense=[(v, tf.zeros_like(v)) for v in dense],
        expected_batch_size=float(BATCH),
        batch_size=tf.constant(BATCH),
    )
    by_variable = {id(v): g for g, v in mechanism.update(zero_sums)}
    return [np.asarray(by_variable[id(v)]) * BATCH for v in dense]  # (0 + Z) / B, times B


def _true_clipped_dense_sum(fe, weights: list, step: int) -> list:
    """S of step `step` (1-based) for [kernel, bias], by brute force at the weights it started from."""
    x, y = _data()
    x, y = x[(step - 1) * BATCH : step * BATCH], y[(step - 1) * BATCH : step * BATCH]
    model = _model(fe)
    model(np.zeros((1, 2), np.int32))
    model.set_weights(weights)
    sums = [np.zeros_like(w) for w in weights]
    for i in range(BATCH):
        with tf.GradientTape() as tape:
            loss = tf.nn.sigmoid_cross_entropy_with_logits(y[i : i + 1], model(x[i : i + 1]))
        grads = [tf.convert_to_tensor(g).numpy() for g in tape.gradient(loss, model.trainable_variables)]
        norm = np.sqrt(sum(float(np.sum(g * g)) for g in grads))
        factor = min(1.0, CLIP / norm)
        sums = [s + factor * g for s, g in zip(sums, grads)]
    return sums[1:]


def _recovery_error(fe, name: str, before: list, after: list, state_before_step: np.ndarray, step: int) -> float:
    """Max |S_recovered - S_true| over the dense variables, for step `step`."""
    noise = _regenerated_dense_noise(fe, name, state_before_step)
    recovered = [-(a - b) * BATCH / LR - z for a, b, z in zip(after[1:], before[1:], noise)]
    truth = _true_clipped_dense_sum(fe, before, step)
    return max(float(np.abs(r - t).max()) for r, t in zip(recovered, truth))


def _weights_suffix(fe) -> str:
    """What a weights file's name ends with: TF format for tf-keras, `.weights.h5` (required) for Keras 3."""
    return "" if fe.name == "keras2" else ".weights.h5"


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_modelcheckpoint_files_do_not_let_an_attacker_regenerate_the_noise(fe, name, tmp_path):
    trainer = _trainer_view(fe)
    suffix = _weights_suffix(fe)
    checkpoint = fe.keras.callbacks.ModelCheckpoint(
        str(tmp_path / f"w-{{batch:02d}}{suffix}"), save_weights_only=True, save_freq=1
    )
    dp = _train(fe, name, callbacks=[checkpoint, trainer])
    files = [_entries(str(tmp_path / f"w-{t:02d}{suffix}")) for t in range(1, STEPS + 1)]
    before, after = _weights_in(files[-2]), _weights_in(files[-1])

    # The generator's counter advances by the same amount every step, whatever the data.
    advance = trainer.states[1] - trainer.states[0]
    assert np.array_equal(trainer.states[-1] - trainer.states[-2], advance)
    # Positive control: with the state the trainer holds after the last step, rewound by one
    # step, the attack recovers the noise-free sum (noise std per coordinate is sigma C = 1;
    # float rounding is ~1e-6).
    assert _recovery_error(fe, name, before, after, trainer.states[-1] - advance, STEPS) < 1e-4

    # The attack on the released files: they must not hold what it needs.
    last = _generator_state(files[-1])
    if last is not None:
        error = _recovery_error(fe, name, before, after, last - advance, STEPS)
        pytest.fail(
            f"A ModelCheckpoint weights file holds the noise generator state {last.tolist()}: "
            f"rewinding it regenerated the last step's noise and recovered the noise-free clipped "
            f"gradient sum to {error:.1e}."
        )
    for entries in files:
        assert len(entries) == len(dp.inner.weights), sorted(entries)


def _write_tf(fe, dp, tmp_path):
    path = str(tmp_path / "weights")
    dp.save_weights(path)
    return path


def _write_h5(fe, dp, tmp_path):
    path = str(tmp_path / ("weights.h5" if fe.name == "keras2" else "weights.weights.h5"))
    dp.save_weights(path)
    return path


def _write_model_checkpoint(fe, dp, tmp_path):
    path = str(tmp_path / f"callback_weights{_weights_suffix(fe)}")
    callback = fe.keras.callbacks.ModelCheckpoint(path, save_weights_only=True)
    callback.set_model(dp)
    callback.on_epoch_end(0, {})
    return path


def _write_tf_checkpoint(fe, dp, tmp_path):
    return tf.train.Checkpoint(m=dp).save(str(tmp_path / "ckpt"))


WRITERS = {
    "save_weights_tf": _write_tf,
    "save_weights_h5": _write_h5,
    "model_checkpoint": _write_model_checkpoint,
    "tf_train_checkpoint_of_dp": _write_tf_checkpoint,
}
WRITE_CASES = [pytest.param("keras2", w, id=f"keras2-{w}") for w in WRITERS] + [
    pytest.param("keras3", w, id=f"keras3-{w}") for w in WRITERS if w != "save_weights_tf"
]


@pytest.mark.parametrize("name", sorted(MECHANISMS))
@pytest.mark.parametrize(("fe", "write"), WRITE_CASES, indirect=["fe"])
def test_a_weights_file_of_dp_holds_the_flushed_model_weights_and_nothing_else(fe, name, write, tmp_path):
    dp = _train(fe, name)
    path = WRITERS[write](fe, dp, tmp_path)
    entries = _entries(path)
    if write == "tf_train_checkpoint_of_dp":
        entries.pop("save_counter/.ATTRIBUTES/VARIABLE_VALUE")  # the Checkpoint object's own counter
    released = dp.inner.get_weights()  # flushed (LazyDP) by the write, and by this read
    assert not dp.mechanism.owes_noise()
    leaked = [n for n in entries if any(s in n for s in ("mechanism", "generator", "optimizer", "loss_tracker"))]
    assert not leaked, f"the file holds training state: {leaked}"
    assert len(entries) == len(released), sorted(entries)
    got = sorted((np.asarray(v).shape, np.asarray(v).tobytes()) for v in entries.values())
    want = sorted((w.shape, w.tobytes()) for w in released)
    assert got == want  # exactly the released weights, bit for bit


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_dp_weights_and_variables_are_the_wrapped_models(fe, name):
    dp = _train(fe, name)
    inner = {tf_variable(v).ref() for v in dp.inner.weights}
    for listing in (
        dp.weights,
        dp.variables,
        dp.non_trainable_weights + dp.trainable_weights,
    ):
        assert {tf_variable(v).ref() for v in listing} == inner, [v.name for v in listing]
    assert len(dp.get_weights()) == len(dp.inner.weights)


SUFFIXES = [("keras2", ""), ("keras2", ".h5"), ("keras3", ".weights.h5")]


@pytest.mark.parametrize(("fe", "suffix"), SUFFIXES, ids=["keras2-tf", "keras2-h5", "keras3-h5"], indirect=["fe"])
def test_dp_weights_file_loads_into_the_bare_model_and_back(fe, suffix, tmp_path):
    dp = _train(fe, "lazy")
    path = str(tmp_path / f"weights{suffix}")
    dp.save_weights(path)
    bare = _model(fe)
    bare(np.zeros((1, 2), np.int32))
    bare.load_weights(path)
    for got, want in zip(bare.get_weights(), dp.inner.get_weights()):
        np.testing.assert_array_equal(got, want)
    other = _train(fe, "lazy")
    other.load_weights(path)
    for got, want in zip(other.inner.get_weights(), dp.inner.get_weights()):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("fe", ["keras2"], indirect=True)
@pytest.mark.parametrize("filename", ["saved", "model.keras"])
def test_saving_the_training_wrapper_itself_is_refused_with_the_export_path(fe, filename, tmp_path):
    """tf.saved_model.save(dp) and keras.models.save_model(dp, ...) would write the wrapper's training state."""
    keras = fe.keras
    dp = _train(fe, "dense")
    dp(np.zeros((1, 2), np.int32))  # built, so Keras gets as far as serializing it
    with pytest.raises(PrivacyContractError, match="export_saved_model"):
        tf.saved_model.save(dp, str(tmp_path / filename))
    with pytest.raises(PrivacyContractError, match="export_saved_model"):
        keras.models.save_model(dp, str(tmp_path / filename))


@pytest.mark.parametrize("fe", ["keras3"], indirect=True)
def test_keras3_saving_the_training_wrapper_is_refused(fe, tmp_path):
    """As tf-keras: a SavedModel or `.keras` archive of `dp` itself is refused, naming what to save instead.

    (A SavedModel of the Keras 3 wrapper held its optimizer's state and traced training step.)
    """
    dp = _train(fe, "lazy")
    with pytest.raises(PrivacyContractError, match=r"dp\.export"):
        tf.saved_model.save(dp, str(tmp_path / "saved"))
    with pytest.raises(PrivacyContractError, match="wrapped model"):
        fe.keras.models.save_model(dp, str(tmp_path / "model.keras"))
    path = export_saved_model(dp, str(tmp_path / "released"))  # the way the refusal names, for either front end
    arrays = {(np.shape(v), np.asarray(v).tobytes()) for v in _entries(f"{path}/variables/variables").values()}
    assert {(w.shape, w.tobytes()) for w in dp.inner.get_weights()} <= arrays  # the flushed weights


SAVES = [("keras2", "model.keras"), ("keras2", "saved_model"), ("keras3", "model.keras")]


@pytest.mark.parametrize("name", sorted(MECHANISMS))
@pytest.mark.parametrize(
    ("fe", "filename"), SAVES, ids=["keras2-keras", "keras2-savedmodel", "keras3-keras"], indirect=["fe"]
)
def test_dp_save_writes_the_released_model_only(fe, name, filename, tmp_path):
    dp = _train(fe, name)
    path = str(tmp_path / filename)
    dp.save(path)
    assert not dp.mechanism.owes_noise()
    loaded = fe.keras.models.load_model(path)  # DPEmbedding is registered: no custom_objects
    assert len(loaded.weights) == len(dp.inner.weights)
    for got, want in zip(loaded.get_weights(), dp.inner.get_weights()):
        np.testing.assert_array_equal(got, want)
    if filename == "saved_model":
        names = [n for n, _ in tf.train.list_variables(f"{path}/variables/variables")]
        assert len(names) == 1 + len(dp.inner.weights), names  # + the object graph
        served = tf.saved_model.load(path)
        ids = np.array([[1, 2], [3, 3]], np.int32)
        np.testing.assert_allclose(served(ids).numpy(), dp.inner(ids).numpy(), rtol=1e-6)
