"""What only the Keras 3 front end has to show: it keeps the user's Keras, its exits, its layers and optimizers.

Each exit is tested as an attack where one applies: LazyDP owes noise to
rows it has not read, so a weights read that skipped the flush would
release rows with less noise than DP-SGD gives (the raw table is shown to
hold exactly that before the exit, and the exit to add it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest
import tensorflow as tf

from tfdp_embed import mechanisms, read_guard
from tfdp_embed.errors import PrivacyContractError

from .front_ends import ctr_batches, front_end

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def k3():
    return front_end("keras3")


def _lazy(sigma=1.0):
    return mechanisms.LazyDP(l2_norm_clip=1.0, noise_multiplier=sigma, seed=3)


def test_lazy_weights_leave_flushed_through_every_exit(k3, tmp_path):
    model = k3.ctr_model()
    before = model.get_weights()[0]
    dp = k3.dp_model(model, _lazy(), batch=64)
    dp.fit(ctr_batches(n=64, batch=64, vocabulary=1000), epochs=1, verbose=0)
    ids = ctr_batches(n=64, batch=64).unbatch().map(lambda x, y: x).batch(64)
    touched = np.unique(np.concatenate([b.numpy().ravel() for b in ids]))
    untouched = np.setdiff1d(np.arange(1000), touched)
    with read_guard.unguarded():  # the attacker's view if an exit skipped the flush
        raw = model.layers[1].embeddings.numpy()
    np.testing.assert_array_equal(raw[untouched], before[untouched])  # the noise is owed there
    released = model.get_weights()[0]  # the wrapped model read directly: the read guard flushes
    assert np.abs(released[untouched] - before[untouched]).mean() > 0
    dp.save(str(tmp_path / "m.keras"))
    assert not dp.mechanism.owes_noise()


def test_the_keras_archive_holds_the_model_alone(k3, tmp_path):
    dp = k3.dp_model(k3.ctr_model(), _lazy(), batch=64)
    dp.fit(ctr_batches(n=128, batch=64), epochs=1, verbose=0)
    path = tmp_path / "m.keras"
    dp.save(str(path))
    with zipfile.ZipFile(path) as archive:
        config = json.loads(archive.read("config.json"))
        names = archive.namelist()
    text = json.dumps(config).lower()
    assert "lazy" not in text and "noise" not in text and "optimizer" not in text
    assert sorted(n for n in names if not n.endswith(".json")) == ["model.weights.h5"]
    loaded = k3.keras.saving.load_model(str(path))
    for got, want in zip(loaded.get_weights(), dp.inner.get_weights()):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(PrivacyContractError, match="wrapped model"):
        dp.get_config()


def test_a_diverged_model_is_not_exported(k3, tmp_path):
    """As tests/privacy/test_diverged_model.py on tf-keras: `dp.export` refuses a NaN weight and writes nothing."""
    model = k3.ctr_model()
    dp = k3.dp_model(model, _lazy(), batch=64)
    dp.fit(ctr_batches(n=64, batch=64), epochs=1, verbose=0)
    kernel = model.get_layer("hidden").kernel
    kernel.assign(tf.fill(kernel.shape, float("nan")))
    with pytest.raises(ValueError, match="diverged"):
        dp.export(str(tmp_path / "served"))
    assert not (tmp_path / "served").exists()


def test_a_strategy_and_reduced_precision_are_refused_in_one_line(k3):
    """Not yet in the Keras 3 front end: refused naming the tf-keras front end, never silently run."""
    keras = k3.keras
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        dp = k3.dp_model(k3.ctr_model(), _lazy(), batch=64)
        with pytest.raises(ValueError, match="tf.distribute strategy") as error:
            dp.fit(ctr_batches(n=64, batch=64), epochs=1, verbose=0)
    assert "\n" not in str(error.value) and "tfdp_embed.keras2" in str(error.value)
    inputs = keras.Input((4,), dtype="int32")
    half = keras.layers.Dense(1, dtype="mixed_float16")(k3.DPEmbedding(1000, 8, combiner="mean")(inputs))
    dp = k3.dp_model(keras.Model(inputs, half), _lazy(), batch=64)
    with pytest.raises(ValueError, match="float16") as error:
        dp.fit(ctr_batches(n=64, batch=64), epochs=1, verbose=0)
    assert "\n" not in str(error.value)


def test_keras3_sgd_gets_the_table_gradient_sparse_under_lazydp(k3, monkeypatch):
    from tfdp_embed import sparse_sgd

    # The optimizer's own path (a plain SGD's tables go to sparse_sgd's fused op: tests/test_sparse_sgd.py).
    monkeypatch.setattr(sparse_sgd, "fused_sgd", lambda optimizer: None)
    dp = k3.dp_model(k3.ctr_model(), _lazy(), batch=64)
    seen = []
    apply = dp.optimizer.apply_gradients

    def recording(pairs, *args, **kwargs):
        pairs = list(pairs)
        seen.append({v.name: type(g).__name__ for g, v in pairs})
        return apply(pairs, *args, **kwargs)

    dp.optimizer.apply_gradients = recording
    dp.fit(ctr_batches(n=64, batch=64), epochs=1, verbose=0)
    assert seen and seen[0]["embeddings"] == "IndexedSlices"  # the Dense kernels and biases are dense
    assert sorted(seen[0].values()).count("IndexedSlices") == 1


@pytest.mark.parametrize("nesterov", [False, True])
def test_lazy_with_keras3_momentum_is_dense_dp_sgd(k3, nesterov):
    """Zero noise: LazyDP (tables stepped sparsely, idle rows caught up) ends where dense DP-SGD does.

    Keras 3's own momentum step on the table would move idle rows every step, and LazyDP's catch-up
    would then move them a second time: the comparison fails by the drift if the sparse step is skipped.
    """
    results = []
    for mech in (
        mechanisms.DenseDPSGD(l2_norm_clip=1e6, noise_multiplier=0.0, seed=0),
        mechanisms.LazyDP(l2_norm_clip=1e6, noise_multiplier=0.0, seed=0),
    ):
        dp = k3.DPModel(k3.ctr_model(), mechanism=mech, expected_batch_size=64)
        loss = k3.keras.losses.BinaryCrossentropy(from_logits=True)
        dp.compile(optimizer=k3.keras.optimizers.SGD(0.3, momentum=0.9, nesterov=nesterov), loss=loss)
        dp.fit(ctr_batches(n=256, batch=64), epochs=1, verbose=0)
        results.append(dp.get_weights())
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_lazy_with_keras3_momentum_has_dense_noise_law(k3):
    """Noise only (zero gradient): LazyDP's flushed table against dense DP-SGD's, momentum 0.9, KS test."""
    from scipy import stats

    deltas = []
    for name in ("DenseDPSGD", "LazyDP"):
        mech = getattr(mechanisms, name)(l2_norm_clip=1.0, noise_multiplier=1.0, seed=11)
        dp = k3.DPModel(k3.ctr_model(), mechanism=mech, expected_batch_size=64)
        dp.compile(optimizer=k3.keras.optimizers.SGD(0.5, momentum=0.9), loss=lambda y, p: tf.reduce_sum(p, -1) * 0.0)
        dp.fit(ctr_batches(n=256, batch=64), epochs=1, verbose=0)
        deltas.append((dp.get_weights()[0] - k3.ctr_model().get_weights()[0]).ravel())
    assert stats.ks_2samp(*deltas).pvalue > 1e-3
    assert np.std(deltas[1]) == pytest.approx(np.std(deltas[0]), rel=0.05)


def test_a_batch_reduced_loss_and_batch_statistics_are_refused(k3):
    keras = k3.keras
    dp = k3.DPModel(k3.ctr_model(), mechanism=_lazy(), expected_batch_size=64)
    dp.compile(optimizer=keras.optimizers.SGD(0.1), loss=lambda y, p: tf.reduce_mean(p))
    with pytest.raises(PrivacyContractError, match="one value for the whole batch"):
        dp.fit(ctr_batches(n=64, batch=64), epochs=1, verbose=0)
    inputs = keras.Input((4,), dtype="int32")
    x = keras.layers.BatchNormalization()(k3.DPEmbedding(1000, 8, combiner="mean")(inputs))
    dp = k3.dp_model(keras.Model(inputs, keras.layers.Dense(1)(x)), _lazy(), batch=64)
    with pytest.raises(PrivacyContractError, match="mixes the examples"):
        dp.fit(ctr_batches(n=64, batch=64), epochs=1, verbose=0)


def test_einsum_dense_gets_the_dense_rule(k3):
    """A Dense-like EinsumDense trains exactly as the Dense it computes (zero noise, a clip that binds)."""
    keras = k3.keras
    weights = None
    results = []
    for make in (
        lambda: keras.layers.Dense(1, name="out"),
        lambda: keras.layers.EinsumDense("ab,bc->ac", output_shape=(1,), bias_axes="c", name="out"),
    ):
        inputs = keras.Input((4,), dtype="int32")
        model = keras.Model(inputs, make()(k3.DPEmbedding(1000, 8, combiner="mean")(inputs)))
        weights = weights or [np.random.default_rng(0).normal(0, 0.3, w.shape) for w in model.get_weights()]
        model.set_weights(weights)
        dp = k3.dp_model(model, mechanisms.DenseDPSGD(l2_norm_clip=0.05, noise_multiplier=0.0), batch=128)
        dp.fit(ctr_batches(), epochs=1, verbose=0)
        results.append(dp.get_weights())
    assert k3.DPModel  # both trained through the rules, not the fallback (no warning asserted here)
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


KERAS_3_PROCESS = """
    import json, os, subprocess, sys, tempfile
    import dp_accounting
    import numpy as np
    import keras, tensorflow as tf
    import tfdp_embed
    from tfdp_embed import mechanisms
    from tfdp_embed.keras3 import DPEmbedding, DPModel, PrivacyBudget

    ids = np.random.default_rng(0).integers(0, 500, size=(1024, 4)).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((ids, (ids.sum(1) % 2).astype("float32"))).batch(128)
    trained = {}
    for name, mech in [("NonPrivate", mechanisms.NonPrivate(seed=0)),
                       ("DenseDPSGD", mechanisms.DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0)),
                       ("LazyDP", mechanisms.LazyDP(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0)),
                       ("EANA", mechanisms.EANA(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0)),
                       ("DPFEST", mechanisms.DPFEST(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0,
                                                    selection_epsilon=1.0, top_k=100,
                                                    counts={"table": np.ones(500)})),
                       ("DPAdaFEST", mechanisms.DPAdaFEST(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0,
                                                          contribution_clip=1.0, contribution_noise_multiplier=1.0,
                                                          threshold=0.5)),
                       ("DPAdaFESTPlus", mechanisms.DPAdaFESTPlus(
                           l2_norm_clip=1.0, noise_multiplier=1.0, seed=0, selected_rows={"table": range(100)},
                           selection_event=dp_accounting.LaplaceDpEvent(1.0), contribution_clip=1.0,
                           contribution_noise_multiplier=1.0, threshold=0.5))]:
        inputs = keras.Input((4,), dtype="int32")
        x = keras.layers.LayerNormalization()(DPEmbedding(500, 8, combiner="mean", name="table")(inputs))
        model = keras.Model(inputs, keras.layers.Dense(1)(x))
        dp = DPModel(model, mechanism=mech, expected_batch_size=128)
        dp.compile(optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.BinaryCrossentropy(from_logits=True))
        callbacks = [] if name in ("NonPrivate", "EANA") else [PrivacyBudget(mech, sampling_probability=0.125,
                                                                            target_epsilon=50.0, target_delta=1e-5)]
        history = dp.fit(data, epochs=1, verbose=0, callbacks=callbacks)
        trained[name] = {k: float(v[-1]) for k, v in history.history.items()}
    path = os.path.join(tempfile.mkdtemp(), "served")
    dp.export(path)
    served = subprocess.run([sys.executable, "-c", f"import tensorflow as tf; m = tf.saved_model.load({path!r}); "
                             "print(m.serve(tf.constant([[1, 2, 3, 4]], tf.int32)).numpy().tolist())"],
                            capture_output=True, text=True)
    print(json.dumps({
        "tf_keras_is_keras_3": tf.keras.layers.Layer is keras.layers.Layer,
        "env": os.environ.get("TF_USE_LEGACY_KERAS"),
        "tf_keras_loaded": any(m == "tf_keras" or m.startswith("tf_keras.") for m in sys.modules),
        "trained": trained,
        "served": served.stdout.strip().splitlines()[-1] if served.returncode == 0 else served.stderr[-2000:],
    }))
"""


def _in_a_keras_3_process(script: str) -> dict:
    """Runs `script` in a fresh Python whose `tf.keras` is TensorFlow's default (Keras 3); its last line is JSON."""
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    env.update(TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_keras_3_process_keeps_keras_3_trains_and_serves():
    facts = _in_a_keras_3_process(KERAS_3_PROCESS)
    assert facts["tf_keras_is_keras_3"] is True and facts["env"] is None and facts["tf_keras_loaded"] is False
    every = {"NonPrivate", "DenseDPSGD", "LazyDP", "EANA", "DPFEST", "DPAdaFEST", "DPAdaFESTPlus"}
    assert set(facts["trained"]) == every  # every mechanism trains in a Keras 3 process
    assert all(np.isfinite(v) for logs in facts["trained"].values() for v in logs.values())
    assert "epsilon" in facts["trained"]["LazyDP"]  # the budget callback put epsilon into the logs
    assert np.isfinite(json.loads(facts["served"])).all() and np.array(json.loads(facts["served"])).shape == (1, 1)


PLAN_BUDGET_UNDER_KERAS_3 = """
    import json, os
    import keras, tensorflow as tf
    from tfdp_embed import plan_run
    from tfdp_embed.keras3 import PrivacyBudget

    plan = plan_run("dense", target_epsilon=3.0, target_delta=1e-5, sampling_probability=0.01, steps=100)
    budget = plan.budget()
    print(json.dumps({
        "keras3_callback": isinstance(budget, keras.callbacks.Callback) and isinstance(budget, PrivacyBudget),
        "env": os.environ.get("TF_USE_LEGACY_KERAS"),
        "tf_keras_is_keras_3": tf.keras.layers.Layer is keras.layers.Layer,
    }))
"""


def test_a_plans_budget_in_a_keras_3_process_is_a_keras_3_callback():
    """`RunPlan.budget()` used to load the tf-keras callbacks, switching the process's `tf.keras` to tf-keras."""
    assert _in_a_keras_3_process(PLAN_BUDGET_UNDER_KERAS_3) == {
        "keras3_callback": True,
        "env": None,
        "tf_keras_is_keras_3": True,
    }
