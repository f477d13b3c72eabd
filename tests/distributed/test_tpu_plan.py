"""TPU SparseCore design on CPU: plans, branch selection and the gradient-path functions.

Everything except the TPU calls themselves: the engine's per-row sum of
activation gradients (SparseCore SGD) is emulated with a scatter-add.
The 2-replica ownership of noise rows is tested in test_mirrored.py.
"""

import numpy as np
import pytest

from tfdp_embed.keras2 import distribute
from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.layers.embedding import DPEmbedding
from tfdp_embed.keras2.training import DPModel
from tfdp_embed.mechanisms import EANA, MECHANISMS, LazyDP

VOCAB, DIM, IDS, BATCH = 20, 3, 3, 6


def test_every_mechanism_has_a_tpu_plan_and_tpu_training_is_refused_with_the_reason():
    assert set(distribute.TPU_PLANS) == set(MECHANISMS)
    possible = {name for name, plan in distribute.TPU_PLANS.items() if plan.possible}
    assert possible == {"none", "eana", "fest", "adafest", "adafest+"}
    for name in MECHANISMS:
        reason = distribute.unsupported_reason(name, distribute.TPU)
        assert reason is not None and "docs/tpu_sparsecore.md" in reason
        assert "tfdp_embed.keras2.distribute.TpuDPStep" in reason  # DPModel's refusal points at the TPU step
    assert distribute.tpu_embedding_plan(EANA(l2_norm_clip=1.0, noise_multiplier=1.0)).possible
    with pytest.raises(KeyError, match="No TPU SparseCore plan for mechanism 'nope'"):
        distribute.tpu_embedding_plan("nope")


def test_support_table_branches():
    assert distribute.unsupported_reason("lazy", distribute.MIRRORED) is not None
    assert distribute.unsupported_reason("lazy", distribute.PARAMETER_SERVER) is None
    for name in MECHANISMS:
        assert distribute.unsupported_reason(name, distribute.DEFAULT) is None
        if name != "lazy":
            assert distribute.unsupported_reason(name, distribute.MULTI_WORKER_MIRRORED) is None
    assert distribute.strategy_kind() == distribute.DEFAULT
    assert distribute.strategy_kind(tf.distribute.OneDeviceStrategy("/cpu:0")) == distribute.DEFAULT


def test_unknown_strategy_is_refused_at_construction():
    strategy = tf.distribute.experimental.CentralStorageStrategy()
    with strategy.scope():
        model = keras.Sequential([DPEmbedding(VOCAB, DIM), keras.layers.Dense(1)])
        with pytest.raises(distribute.DistributionNotSupportedError, match="does not support CentralStorageStrategy"):
            DPModel(model, mechanism=LazyDP(l2_norm_clip=1.0, noise_multiplier=1.0), expected_batch_size=4)


def test_noise_feature_rows_on_one_replica_own_the_whole_union_padded():
    ids, weights, count = distribute.noise_feature_rows(tf.constant([4, 2, 4, 9]), max_rows=6)
    assert ids.numpy().tolist() == [2, 4, 9, 0, 0, 0]
    assert weights.numpy().tolist() == [1, 1, 1, 0, 0, 0]
    assert int(count) == 3
    with pytest.raises(tf.errors.InvalidArgumentError, match="more owned rows than max_rows=2"):
        distribute.noise_feature_rows(tf.constant([1, 2, 3]), max_rows=2)


def test_noise_feature_gradients_have_the_stated_std_and_zero_padding():
    generator = tf.random.Generator.from_seed(5)
    weights = tf.constant([1.0] * 500 + [0.0] * 20)
    grads = distribute.noise_feature_gradients(generator, weights, dim=8, stddev=0.25).numpy()
    assert np.all(grads[500:] == 0)
    # 4,000 normals: relative sd of the sample std 1/sqrt(8000) = 1.1%; allow 5%.
    assert abs(grads[:500].std() / 0.25 - 1) < 0.05


def _model():
    keras.utils.set_random_seed(1)
    inp = keras.Input((IDS,), dtype="int32")
    pooled = DPEmbedding(VOCAB, DIM, combiner="mean", name="table")(inp)
    return keras.Model(inp, keras.layers.Dense(1)(pooled))


def test_gradient_path_with_zero_noise_equals_eana_step():
    """Clip factors on the activation gradients + the engine's per-row sum = EANA's clipped update."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, (BATCH, IDS)).astype("int32")
    ids[:, 1] = ids[:, 0]  # a repeated id inside an example
    y = rng.integers(0, 2, (BATCH, 1)).astype("float32")
    loss_fn = keras.losses.BinaryCrossentropy(from_logits=True, reduction="none")
    clip = 0.05  # small: every example is clipped

    # Reference: DPModel + EANA (sigma 0), one step, lr 1: table moves by -clipped sum / B.
    model = _model()
    before = model.get_layer("table").embeddings.numpy().copy()
    dp = DPModel(model, mechanism=EANA(l2_norm_clip=clip, noise_multiplier=0.0, seed=0), expected_batch_size=BATCH)
    dp.compile(optimizer=keras.optimizers.legacy.SGD(1.0), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    dp.fit(tf.data.Dataset.from_tensor_slices((ids, y)).batch(BATCH), epochs=1, verbose=0)
    reference = model.get_layer("table").embeddings.numpy() - before

    # Gradient path: per-example norms (brute force here), activation gradients scaled by c_i / B.
    twin = _model()
    table, dense = twin.get_layer("table"), twin.layers[-1]
    norms = []
    for i in range(BATCH):
        with tf.GradientTape() as tape:
            loss = loss_fn(y[i : i + 1], twin(ids[i : i + 1]))
        grads = tape.gradient(loss, twin.trainable_variables)
        norms.append(np.sqrt(sum(float(tf.reduce_sum(tf.square(tf.convert_to_tensor(g)))) for g in grads)))
    clip_factors = clip / np.maximum(np.array(norms), clip)
    with tf.GradientTape() as tape:
        activations = table(ids)  # what TPUEmbedding's lookup returns: [batch, dim]
        tape.watch(activations)
        total = tf.reduce_sum(loss_fn(y, dense(activations)))
    activation_grads = tape.gradient(total, activations)
    scaled = distribute.clipped_activation_gradients(activation_grads, clip_factors, expected_batch_size=BATCH)
    # SparseCore's mean combiner backward + SGD(lr 1): row j -= sum over occurrences of scaled_i / n_ids.
    engine = np.zeros([VOCAB, DIM])
    for i in range(BATCH):
        for row in ids[i]:
            engine[row] -= scaled[i].numpy() / IDS
    np.testing.assert_allclose(engine, reference, atol=1e-6)
