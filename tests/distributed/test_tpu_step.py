"""`distribute.TpuDPStep` on CPU: the TPU DP step with a CPU engine of TPUEmbeddingV2's interface.

`CpuEngine` (cpu_engine.py) keeps each table in a `tf.Variable`, looks rows
up on `dequeue` and, on `apply_gradients`, back-propagates each feature's
activation gradient through the combiner, sums every feature's
contributions per row and runs SGD, as SparseCore does; it records every
call. What is checked: zero noise + huge clip is non-private SGD; with
noise, the tables and TensorCore weights equal a `DPModel` step of the same
mechanism on the same model, batch and generator state (EANA, DP-FEST,
DP-AdaFEST); the noise feature lists exactly the mechanism's rows, rows
outside them never move, and its gradients have std sigma C / B; refused
mechanisms and bad input raise clear errors. Two replicas
(MirroredStrategy as the stand-in for TPUStrategy's replica context) are
tested in test_mirrored.py (`tpu_step`). Never run on a TPU.
"""

from __future__ import annotations

import numpy as np
import pytest
from cpu_engine import CpuEngine

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

VOCAB, DIM, IDS, BATCH, LR = 40, 4, 3, 8, 0.5
BCE = keras.losses.BinaryCrossentropy(from_logits=True)


# -- the same model twice: DPModel with a DPEmbedding, and TensorCore tower + engine ---------
def _data(seed=0, batch=BATCH, vocab=VOCAB):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, (batch, IDS)).astype("int32")
    ids[:, 1] = ids[:, 0]  # a repeated id inside an example
    y = rng.integers(0, 2, (batch, 1)).astype("float32")
    return ids, y


def _reference(combiner, vocab=VOCAB, dim=DIM):
    keras.utils.set_random_seed(4)
    inp = keras.Input((IDS,), dtype="int32")
    x = DPEmbedding(vocab, dim, combiner=combiner, name="table")(inp)
    if combiner is None:
        x = keras.layers.GlobalAveragePooling1D()(x)
    x = keras.layers.Dense(3, activation="tanh")(x)
    return keras.Model(inp, keras.layers.Dense(1)(x))


def _tower(reference, combiner, dim=DIM):
    shape = (dim,) if combiner is not None else (IDS, dim)
    inp = keras.Input(shape, name="f")
    x = keras.layers.GlobalAveragePooling1D()(inp) if combiner is None else inp
    hidden = keras.layers.Dense(3, activation="tanh")
    out = keras.layers.Dense(1)
    tower = keras.Model({"f": inp}, out(hidden(x)))
    dense = [layer for layer in reference.layers if isinstance(layer, keras.layers.Dense)]
    hidden.set_weights(dense[0].get_weights())
    out.set_weights(dense[1].get_weights())
    return tower


def _tpu_setup(mechanism, combiner, *, max_noise_rows=64, vocab=VOCAB, dim=DIM, expected_batch_size=BATCH):
    reference = _reference(combiner, vocab, dim)
    table = reference.get_layer("table").embeddings.numpy()
    engine = CpuEngine(
        {"table": table},
        {"f": ("table", combiner), distribute.noise_feature_name("table"): ("table", "sum")},
        LR,
    )
    step = distribute.TpuDPStep(
        engine,
        model=_tower(reference, combiner, dim),
        features=[distribute.TpuFeature("f", "table", combiner)],
        mechanism=mechanism,
        loss=BCE,
        optimizer=keras.optimizers.legacy.SGD(LR),
        expected_batch_size=expected_batch_size,
        table_sizes={"table": (vocab, dim)},
        max_noise_rows=max_noise_rows,
    )
    return engine, step, table


def _dp_model_step(mechanism, combiner, ids, y):
    model = _reference(combiner)
    dp = DPModel(model, mechanism=mechanism, expected_batch_size=BATCH)
    dp.compile(optimizer=keras.optimizers.legacy.SGD(LR), loss=BCE)
    dp.fit(tf.data.Dataset.from_tensor_slices((ids, y)).batch(BATCH), epochs=1, verbose=0)
    return model.get_weights()  # [table, kernel, bias, kernel, bias]


def _tpu_weights(engine, step):
    return [engine.embedding_tables["table"].numpy()] + step.model.get_weights()


def _assert_weights_equal(got, want, atol=1e-6):
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_allclose(a, b, rtol=0, atol=atol, err_msg=f"weight {i}")


# -- (a) zero noise + huge clip: non-private SGD ---------------------------------------------
def test_zero_noise_huge_clip_equals_non_private_sgd():
    ids, y = _data()
    want = _dp_model_step(NonPrivate(), "mean", ids, y)  # DPModel's non-private step is plain SGD
    for mechanism in (EANA(l2_norm_clip=1e6, noise_multiplier=0.0, seed=0), NonPrivate()):
        engine, step, _ = _tpu_setup(mechanism, "mean")
        step({"f": ids}, y)
        _assert_weights_equal(_tpu_weights(engine, step), want, atol=1e-6)


# -- (b) with noise: equal to a DPModel step of the same mechanism --------------------------
def test_eana_with_noise_equals_dp_model_step_in_eager_and_tf_function():
    ids, y = _data(1)
    # Clip 0.05: every example is clipped (the ghost norms decide the update).
    want = _dp_model_step(EANA(l2_norm_clip=0.05, noise_multiplier=2.0, seed=3), "mean", ids, y)
    engine, step, _ = _tpu_setup(EANA(l2_norm_clip=0.05, noise_multiplier=2.0, seed=3), "mean")
    step({"f": ids}, y)
    _assert_weights_equal(_tpu_weights(engine, step), want)
    engine, step, _ = _tpu_setup(EANA(l2_norm_clip=0.05, noise_multiplier=2.0, seed=3), "mean")
    tf.function(step)({"f": tf.constant(ids)}, tf.constant(y))
    _assert_weights_equal(_tpu_weights(engine, step), want)


def _fest(seed=5, k=10):
    counts = {"table": np.arange(VOCAB)[::-1].astype("float64")}
    return DPFEST(l2_norm_clip=0.05, noise_multiplier=1.5, selection_epsilon=1.0, top_k=k, counts=counts, seed=seed)


def _adafest(seed=6):
    return DPAdaFEST(
        l2_norm_clip=0.05,
        noise_multiplier=1.5,
        contribution_clip=1.0,
        contribution_noise_multiplier=0.5,
        threshold=0.6,
        seed=seed,
    )


def _adafest_plus(seed=6):
    import dp_accounting

    return DPAdaFESTPlus(
        selected_rows={"table": range(0, VOCAB, 2)},
        selection_event=dp_accounting.NoOpDpEvent(),
        l2_norm_clip=0.05,
        noise_multiplier=1.5,
        contribution_clip=1.0,
        contribution_noise_multiplier=0.5,
        threshold=0.6,
        seed=seed,
    )


@pytest.mark.filterwarnings("ignore:DP-AdaFEST.*lets each untouched row through")
@pytest.mark.parametrize("make", [_fest, _adafest, _adafest_plus], ids=["fest", "adafest", "adafest+"])
def test_fest_and_adafest_on_sequence_features_equal_dp_model_and_freeze_dropped_rows(make):
    ids, y = _data(2)
    want = _dp_model_step(make(), None, ids, y)
    engine, step, before = _tpu_setup(make(), None)
    step({"f": ids}, y)
    _assert_weights_equal(_tpu_weights(engine, step), want)
    # The noise feature lists exactly the rows the mechanism changed; every other row,
    # touched or not, is bit-for-bit unchanged (masked per id, never cancelled).
    ((noise_ids, noise_weights, _),) = engine.applied(distribute.noise_feature_name("table"))
    noised = sorted(int(r) for r, w in zip(noise_ids, noise_weights) if w == 1)
    after = engine.embedding_tables["table"].numpy()
    changed = sorted(np.flatnonzero(np.any(after != before, axis=1)).tolist())
    assert changed == noised
    touched = set(ids.ravel().tolist())
    frozen_touched = sorted(touched - set(noised))
    assert frozen_touched, "the case must drop some touched rows"
    assert np.array_equal(after[frozen_touched], before[frozen_touched])
    if isinstance(step.mechanism, DPFEST):
        assert noised == sorted(step.mechanism.selected_rows("table").tolist())
    elif isinstance(step.mechanism, DPAdaFESTPlus):
        assert all(r % 2 == 0 for r in noised)  # only pre-selected rows ever update
        assert any(r % 2 for r in frozen_touched)  # touched rows outside the selection stay frozen
    else:
        assert set(noised) - touched, "the case must noise some untouched (noise-only) rows"


# -- (c) the noised rows and the noise's std -------------------------------------------------
def test_eana_noise_feature_is_the_union_of_touched_rows_with_std_sigma_c_over_b():
    vocab, dim, steps, sigma, clip, batch = 400, 8, 5, 2.0, 0.5, 4 * BATCH
    engine, step, before = _tpu_setup(
        EANA(l2_norm_clip=clip, noise_multiplier=sigma, seed=9),
        "mean",
        max_noise_rows=64,
        vocab=vocab,
        dim=dim,
        expected_batch_size=batch,
    )
    ids_seen, noise = set(), []
    for s in range(steps):
        ids, y = _data(10 + s, batch=batch, vocab=vocab)
        ids_seen |= set(ids.ravel().tolist())
        step({"f": ids}, y)
        ((noise_ids, noise_weights, grads),) = engine.applied(distribute.noise_feature_name("table"))[-1:]
        owned = noise_weights == 1
        assert sorted(noise_ids[owned].tolist()) == sorted(set(ids.ravel().tolist()))  # the union, once each
        assert np.all(grads[~owned] == 0) and np.all(noise_ids[~owned] == 0)
        noise.append(grads[owned])
    noise = np.concatenate(noise)
    expected = sigma * clip / batch
    # 5 steps x ~56 rows x 8 dims > 2,000 draws: the sample std's relative sd is
    # 1/sqrt(2n) < 1.6%; allow 8% (5 sd).
    assert noise.size > 2000
    assert abs(noise.std() / expected - 1) < 0.08
    untouched = sorted(set(range(vocab)) - ids_seen)
    after = engine.embedding_tables["table"].numpy()
    assert np.array_equal(after[untouched], before[untouched])


def test_every_engine_call_has_the_interface_shapes():
    ids, y = _data(3)
    engine, step, _ = _tpu_setup(EANA(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0), "mean", max_noise_rows=32)
    logs = step({"f": ids}, y)
    kinds = [(c[0], c[1]) for c in engine.calls]
    noise = distribute.noise_feature_name("table")
    assert kinds == [("enqueue", "f"), ("enqueue", noise), ("apply_gradients", "f"), ("apply_gradients", noise)]
    ((f_ids, f_weights, f_grads),) = engine.applied("f")
    assert f_ids.shape == (BATCH, IDS) and f_weights is None and f_grads.shape == (BATCH, DIM)
    ((n_ids, n_weights, n_grads),) = engine.applied(noise)
    assert n_ids.shape == (32,) and n_weights.shape == (32,) and n_grads.shape == (32, DIM)
    assert int(logs["noise_rows"]["table"]) == len(set(ids.ravel().tolist()))


# -- (d) refused mechanisms and bad input ----------------------------------------------------
def test_mechanisms_the_engine_cannot_run_are_refused_with_the_reason():
    with pytest.raises(distribute.DistributionNotSupportedError, match="'dense' cannot run .* every row every step"):
        _tpu_setup(DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0), "mean")
    with pytest.raises(distribute.DistributionNotSupportedError, match="'lazy' cannot run .* no read hook"):
        _tpu_setup(LazyDP(l2_norm_clip=1.0, noise_multiplier=1.0), "mean")
    with pytest.raises(distribute.DistributionNotSupportedError, match="features \\['f'\\] are pooled"):
        _tpu_setup(_fest(), "mean")


def test_bad_input_is_refused_with_clear_errors():
    ids, y = _data()
    engine, step, _ = _tpu_setup(EANA(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0), "mean", max_noise_rows=4)
    with pytest.raises(
        tf.errors.InvalidArgumentError, match="more noise-feature rows on this replica than max_noise_rows=4"
    ):
        step({"f": ids}, y)
    with pytest.raises(ValueError, match="lacks \\['f'\\]"):
        step({"g": ids}, y)
    with pytest.raises(TypeError, match="integer ids"):
        step({"f": ids.astype("float32")}, y)
    reference = _reference("mean")
    tower = _tower(reference, "mean")
    common = {
        "model": tower,
        "mechanism": EANA(l2_norm_clip=1.0, noise_multiplier=1.0),
        "loss": BCE,
        "optimizer": keras.optimizers.legacy.SGD(LR),
        "expected_batch_size": BATCH,
        "max_noise_rows": 8,
        "table_sizes": {"table": (VOCAB, DIM)},
    }
    with pytest.raises(ValueError, match="reads table 'nope', which `table_sizes` does not have"):
        distribute.TpuDPStep(engine, features=[distribute.TpuFeature("f", "nope")], **common)
    with pytest.raises(ValueError, match="different combiners"):
        distribute.TpuDPStep(
            engine,
            features=[distribute.TpuFeature("f", "table", "mean"), distribute.TpuFeature("g", "table", "sum")],
            **common,
        )
    with pytest.raises(ValueError, match="`max_noise_rows` for table 'table' must be an int > 0"):
        distribute.TpuDPStep(engine, features=[distribute.TpuFeature("f", "table")], **{**common, "max_noise_rows": 0})
    with pytest.raises(ValueError, match=r"`table_sizes\['table'\]` must be \(vocabulary_size, dim\)"):
        distribute.TpuDPStep(
            engine, features=[distribute.TpuFeature("f", "table")], **{**common, "table_sizes": {"table": (VOCAB, 0)}}
        )
    with pytest.raises(TypeError, match="TPUEmbeddingV2's enqueue"):
        distribute.TpuDPStep(object(), features=[distribute.TpuFeature("f", "table")], **common)
    with pytest.raises(ValueError, match="holds DPEmbedding tables"):
        distribute.TpuDPStep(engine, features=[distribute.TpuFeature("f", "table")], **{**common, "model": reference})
