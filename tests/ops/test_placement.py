"""Device-aware dispatch: the CPU kernels run only on CPU variables when an accelerator is visible.

This machine has no GPU, so the accelerator is simulated by patching
`placement.accelerator_visible` (and, for "every variable on the GPU",
`placement.on_cpu`): the tests check which path a traced LazyDP step takes
and that the reference path trains to the same weights without noise. The
real-device checks are in test_gpu.py (marked `gpu`).
"""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed import DPEmbedding, DPModel
from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.mechanisms import LazyDP
from tfdp_embed.ops import fast_normal, placement, sparse_rows

FUSED_VARIABLE_OPS = {"TfdpEmbedLazyCatchUp", "TfdpEmbedLazyCatchUpGather", "TfdpEmbedLazyRecordStep"}


@pytest.mark.parametrize(
    "accelerator, devices, allowed",
    [
        (False, [], True),
        (False, ["/job:localhost/replica:0/task:0/device:GPU:0"], True),  # no accelerator: device strings moot
        (True, [], False),  # tensor-only ops follow the default placement: the reference
        (True, ["/job:localhost/replica:0/task:0/device:CPU:0"], True),
        (True, ["/cpu:0", "/job:ps/replica:0/task:0/device:CPU:0"], True),
        (True, ["/job:localhost/replica:0/task:0/device:CPU:0", "/device:GPU:0"], False),
        (True, ["/job:worker/task:0/device:TPU:0"], False),
        (True, [""], False),  # unplaced (graph-mode) variables may land on the accelerator
    ],
)
def test_fused_allowed_truth_table(accelerator, devices, allowed):
    assert placement.fused_allowed(accelerator=accelerator, devices=devices) is allowed


def _lazy_model(sigma: float, seed: int = 0):
    keras.utils.set_random_seed(seed)
    ids = keras.Input((3,), dtype="int64")
    x = DPEmbedding(40, 4, combiner="sum", name="t")(ids)
    model = keras.Model(ids, keras.layers.Dense(1)(x))
    dp = DPModel(model, mechanism=LazyDP(l2_norm_clip=1e6, noise_multiplier=sigma, seed=seed), expected_batch_size=8)
    dp.compile(optimizer=keras.optimizers.legacy.SGD(0.05), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    return model, dp


def _data():
    rng = np.random.default_rng(1)
    x = rng.integers(0, 40, (32, 3))
    y = rng.integers(0, 2, (32, 1)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(8)


def _step_op_types(dp) -> set:
    batch = next(iter(_data()))
    graph = tf.function(dp.train_step).get_concrete_function(batch).graph
    return {op.type for op in graph.get_operations()}


@pytest.fixture
def simulated_gpu(monkeypatch):
    """An accelerator is visible and no variable lives on the CPU."""
    monkeypatch.setattr(placement, "accelerator_visible", lambda: True)
    monkeypatch.setattr(placement, "on_cpu", lambda device: False)


def test_cpu_machine_runs_the_fused_ops():
    if not sparse_rows.available():
        pytest.skip(f"the op library is unavailable: {fast_normal.unavailable_reason()}")
    _, dp = _lazy_model(sigma=1.0)
    dp.prepare()
    assert FUSED_VARIABLE_OPS & _step_op_types(dp)


def test_accelerator_variables_take_the_stock_tensorflow_path(simulated_gpu):
    _, dp = _lazy_model(sigma=1.0)
    dp.prepare()
    types = _step_op_types(dp)
    assert not {t for t in types if t.startswith("TfdpEmbed")} - {"TfdpEmbedFastNormal"}, sorted(types)


def test_accelerator_cpu_variables_keep_the_fused_ops(monkeypatch):
    """A parameter-server-style table on the CPU keeps the CPU kernels on a GPU machine."""
    if not sparse_rows.available():
        pytest.skip(f"the op library is unavailable: {fast_normal.unavailable_reason()}")
    monkeypatch.setattr(placement, "accelerator_visible", lambda: True)
    _, dp = _lazy_model(sigma=1.0)
    dp.prepare()
    assert FUSED_VARIABLE_OPS & _step_op_types(dp)


def test_reference_path_trains_to_the_same_weights_without_noise(monkeypatch):
    """sigma = 0: the accelerator path and the fused path reach the same table (the ops are bit-identical)."""
    weights = {}
    for mode in ("fused", "reference"):
        with monkeypatch.context() as patch:
            if mode == "reference":
                patch.setattr(placement, "accelerator_visible", lambda: True)
                patch.setattr(placement, "on_cpu", lambda device: False)
            model, dp = _lazy_model(sigma=0.0)
            dp.fit(_data(), epochs=2, verbose=0)
            dp.flush()
            weights[mode] = model.get_weights()
    for fused, reference in zip(weights["fused"], weights["reference"]):
        np.testing.assert_allclose(fused, reference, rtol=1e-6, atol=1e-7)


def test_noise_on_the_accelerator_path_has_the_formula_std(simulated_gpu):
    """`fast_normal.normal` falls back to the generator's own normals there: still N(0, s^2)."""
    generator = tf.random.Generator.from_seed(3)
    z = fast_normal.normal(generator, [200_000], stddev=2.5).numpy()
    assert abs(z.std() - 2.5) < 0.02 and abs(z.mean()) < 0.02
    noised = sparse_rows.noised_values(generator, tf.zeros([200_000]), stddev=2.5, divisor=5.0).numpy()
    assert abs(noised.std() - 0.5) < 0.005
