"""Mixed precision under DP, as a user turns it on: `keras.mixed_precision.set_global_policy(...)`.

Every mechanism trains under `mixed_float16` and `mixed_bfloat16` with
float32 weights, and the noise it adds to a coordinate whose gradient is
zero has the standard deviation of the formula (sigma C lr / B per step);
the clipped sum's sensitivity stays <= C; float16's loss scaling keeps
small gradients from underflowing; policies with float16/bfloat16
variables, and mechanisms whose class does not declare
`capabilities.mixed_precision`, are refused up front.
"""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.layers.embedding import DPEmbedding
from tfdp_embed.keras2.training import DPModel
from tfdp_embed.mechanisms import DenseDPSGD, LazyDP, MechanismCapabilities, create

VOCAB, DIM, IDS, B = 200, 4, 3, 8
TOUCHED = 5  # the data reads rows 0..4 only
PROBE_IN, PROBE_OUT = 32, 64  # a Dense kernel fed zeros: its gradient is 0, its update pure noise
SIGMA, CLIP, LR = 1.5, 0.5, 1.0
POLICIES = ["mixed_float16", "mixed_bfloat16"]
COUNTS = {"items": np.arange(VOCAB, 0, -1, dtype=np.int64)}  # the data's rows count most
NOISE = dict(l2_norm_clip=CLIP, noise_multiplier=SIGMA, seed=0)
ADAFEST = dict(NOISE, contribution_clip=1.0, contribution_noise_multiplier=1.0, threshold=2.0)
MECHANISMS = {
    "none": dict(seed=0),
    "dense": NOISE,
    "lazy": NOISE,
    "eana": NOISE,
    "fest": dict(NOISE, selection_epsilon=1.0, top_k=50, counts=COUNTS),
    "adafest": ADAFEST,
    "adafest+": dict(ADAFEST, selection_epsilon=1.0, top_k={"items": 50}, counts=COUNTS),
}
BCE = keras.losses.BinaryCrossentropy(from_logits=True)


@pytest.fixture
def policy(request):
    keras.mixed_precision.set_global_policy(request.param)
    yield request.param
    keras.mixed_precision.set_global_policy("float32")


def ctr_model(seed=3):
    """ids -> table -> Dense -> LayerNorm, beside a probe Dense on an all-zero feature; a float32 head."""
    keras.utils.set_random_seed(seed)
    ids = keras.Input((IDS,), dtype="int32", name="ids")
    zeros = keras.Input((PROBE_IN,), name="zeros")
    x = DPEmbedding(VOCAB, DIM, combiner="mean", name="items")(ids)
    x = keras.layers.Dense(8, activation="relu", name="hidden")(x)
    x = keras.layers.LayerNormalization(name="norm")(x)
    probe = keras.layers.Dense(PROBE_OUT, use_bias=False, name="probe")(zeros)
    x = keras.layers.Concatenate()([x, probe])
    return keras.Model({"ids": ids, "zeros": zeros}, keras.layers.Dense(1, dtype="float32", name="out")(x))


def _dataset(batches, seed=0, batch=B):
    rng = np.random.default_rng(seed)
    n = batches * batch
    features = {
        "ids": rng.integers(0, TOUCHED, (n, IDS)).astype("int32"),  # rows >= TOUCHED: never
        "zeros": np.zeros((n, PROBE_IN), "float32"),
    }
    labels = rng.integers(0, 2, (n, 1)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((features, labels)).batch(batch)


def _dp(model, mechanism, lr=LR, optimizer=None):
    dp = DPModel(model, mechanism=mechanism, expected_batch_size=B)
    dp.compile(optimizer=optimizer or keras.optimizers.legacy.SGD(lr), loss=BCE)
    return dp


def _assert_std(noise: np.ndarray, expected: float) -> None:
    # The sample std of n normals is within 4 of its standard errors expected / sqrt(2n).
    n = noise.size
    assert abs(noise.std() - expected) < 4 * expected / np.sqrt(2 * n), (noise.std(), expected)
    assert abs(noise.mean()) < 4 * expected / np.sqrt(n)


@pytest.mark.parametrize("policy", POLICIES, indirect=True)
@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_every_mechanism_trains_with_float32_weights_and_the_formula_noise(policy, name):
    model = ctr_model()
    assert model.get_layer("hidden").compute_dtype == policy.split("_")[1]
    probe_before = model.get_layer("probe").kernel.numpy().copy()
    table_before = model.get_layer("items").embeddings.numpy().copy()
    dp = _dp(model, create(name, **MECHANISMS[name]))
    dp.fit(_dataset(1), epochs=1, verbose=0)  # one step

    noise = (probe_before - model.get_layer("probe").kernel.numpy()) * B / LR
    if name == "none":
        assert np.array_equal(noise, np.zeros_like(noise))  # zero gradient, no noise
    else:
        _assert_std(noise, SIGMA * CLIP)
    if name in ("dense", "lazy"):  # every row gets noise; LazyDP's is added when the table is read
        untouched = (table_before - model.get_weights()[0])[TOUCHED:] * B / LR
        _assert_std(untouched, SIGMA * CLIP)

    history = dp.fit(_dataset(3, seed=1), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    weights = model.get_weights()
    assert all(w.dtype == np.float32 and np.isfinite(w).all() for w in weights)
    assert all(v.dtype == tf.float32 for v in model.trainable_variables)
    assert not np.allclose(weights[0], table_before)  # the table trained


def _clipped_sum(dp, batch) -> np.ndarray:
    """S(batch) = (w_before - w_after) * B with sigma = 0 and lr = 1; the weights are put back."""
    variables = dp.inner.trainable_variables
    before = [v.numpy().copy() for v in variables]
    dp.fit(tf.data.Dataset.from_tensors(batch), epochs=1, verbose=0)
    step = np.concatenate([(b - v.numpy()).ravel() for v, b in zip(variables, before)])
    for v, b in zip(variables, before):
        v.assign(b)
    return step * B


def _without(batch, j):
    features, labels = batch
    return {k: np.delete(v, j, axis=0) for k, v in features.items()}, np.delete(labels, j, axis=0)


@pytest.mark.parametrize("policy", POLICIES, indirect=True)
def test_the_clipped_sum_moves_by_at_most_c_when_one_example_is_removed(policy):
    batch = next(iter(_dataset(1).as_numpy_iterator()))
    dp = _dp(ctr_model(), create("dense", l2_norm_clip=CLIP, noise_multiplier=0.0, seed=0))
    dp.prepare(tf.data.Dataset.from_tensors(batch))
    whole = _clipped_sum(dp, batch)
    moves = [np.linalg.norm(whole - _clipped_sum(dp, _without(batch, j))) for j in range(B)]
    assert max(moves) <= CLIP * (1 + 1e-4), moves
    assert min(moves) > 0.9 * CLIP  # every example is clipped: its removal moves S by about C


@pytest.mark.parametrize("policy", POLICIES, indirect=True)
def test_tiny_gradients_do_not_underflow(policy):
    # The loss times 1e-6: per-example output gradients near float16's smallest subnormal (6e-8).
    # With sigma = 0 and a huge clip the update must match the float32 model's.
    def tiny_bce(y_true, y_pred):
        return 1e-6 * keras.losses.binary_crossentropy(y_true, y_pred, from_logits=True)

    data = _dataset(1)
    updates = []
    for active in (policy, "float32"):
        keras.mixed_precision.set_global_policy(active)
        model = ctr_model()
        before = [w.copy() for w in model.get_weights()]
        dp = DPModel(
            model, mechanism=create("dense", l2_norm_clip=1e6, noise_multiplier=0.0, seed=0), expected_batch_size=B
        )
        dp.compile(optimizer=keras.optimizers.legacy.SGD(1e6), loss=tiny_bce)
        dp.fit(data, epochs=1, verbose=0)
        updates.append(np.concatenate([(b - w).ravel() for b, w in zip(before, model.get_weights())]))
    reduced, full = updates
    assert np.abs(full).max() > 1e-3  # the float32 update is not nothing
    tolerance = {"mixed_float16": 0.02, "mixed_bfloat16": 0.05}[policy]
    assert np.linalg.norm(reduced - full) < tolerance * np.linalg.norm(full)


@pytest.mark.parametrize("policy", POLICIES, indirect=True)
def test_lazydp_sees_sgd_inside_the_loss_scale_optimizer(policy):
    model = ctr_model()
    dp = _dp(model, create("lazy", **NOISE))
    dp.fit(_dataset(2), epochs=1, verbose=0)
    if policy == "mixed_float16":  # Keras wraps the optimizer; the update goes through its SGD
        assert isinstance(dp.optimizer, keras.mixed_precision.LossScaleOptimizer)
        assert int(dp.optimizer.inner_optimizer.iterations.numpy()) == 2


@pytest.mark.parametrize("policy", ["mixed_float16"], indirect=True)
def test_a_fixed_loss_scale_optimizer_is_honoured_and_a_momentum_optimizer_refused_by_lazydp(policy):
    model = ctr_model()
    optimizer = keras.mixed_precision.LossScaleOptimizer(
        keras.optimizers.legacy.SGD(LR), dynamic=False, initial_scale=2.0**4
    )
    dp = _dp(model, create("dense", **NOISE), optimizer=optimizer)
    history = dp.fit(_dataset(2), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    lazy = _dp(ctr_model(), create("lazy", **NOISE), optimizer=keras.optimizers.legacy.Adam(0.1))
    with pytest.raises(ValueError, match="LazyDP supports only SGD .* received optimizer Adam"):
        lazy.fit(_dataset(1), epochs=1, verbose=0)


@pytest.mark.parametrize("policy", ["float16", "bfloat16"], indirect=True)
def test_policies_with_reduced_precision_variables_are_refused(policy):
    dp = _dp(ctr_model(), create("dense", **NOISE))
    with pytest.raises(ValueError, match=rf"is {policy} \(dtype policy '{policy}'\): use .*'mixed_{policy}'"):
        dp.fit(_dataset(1), epochs=1, verbose=0)


class _Undeclared(DenseDPSGD):
    """DenseDPSGD's update under a capabilities declaration without `mixed_precision`."""

    capabilities = MechanismCapabilities(needs_lookups=False)


class _MyLazy(LazyDP):
    name = "my_lazy"  # inherits LazyDP's declaration


@pytest.mark.parametrize("policy", POLICIES, indirect=True)
def test_a_mechanism_not_declaring_mixed_precision_is_refused_at_construction(policy):
    dtype = policy.split("_")[1]
    with pytest.raises(
        ValueError,
        match=rf"_Undeclared \(name 'dense'\) does not declare `mixed_precision` .* computes in {dtype} "
        rf"\(policy '{policy}'\): train under .*'float32'\), or declare",
    ):
        DPModel(ctr_model(), mechanism=_Undeclared(**NOISE), expected_batch_size=B)
    DPModel(ctr_model(), mechanism=_MyLazy(**NOISE), expected_batch_size=B)  # inherited: accepted
    keras.mixed_precision.set_global_policy("float32")
    DPModel(ctr_model(), mechanism=_Undeclared(**NOISE), expected_batch_size=B)  # float32: accepted
