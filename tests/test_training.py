"""DPModel: degenerate settings, the tf-privacy cross-check, noise, model kinds, bad input."""

import sys

import numpy as np
import pytest

from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.layers.embedding import DPEmbedding
from tfdp_embed.keras2.training import DPModel
from tfdp_embed.mechanisms.dense import DenseDPSGD
from tfdp_embed.mechanisms.none import NonPrivate

VOCAB, DIM, IDS, BATCH = 30, 4, 3, 8
BCE = keras.losses.BinaryCrossentropy(from_logits=True)


def _data(n=32, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, (n, IDS)).astype("int32")
    ids[:, 1] = ids[:, 0]  # repeated ids inside one example
    y = rng.integers(0, 2, (n, 1)).astype("float32")
    return ids, y


def _dataset(n=32, seed=0):
    return tf.data.Dataset.from_tensor_slices(_data(n, seed)).batch(BATCH)


def functional_model(seed=3):
    keras.utils.set_random_seed(seed)
    inp = keras.Input((IDS,), dtype="int32")
    x = DPEmbedding(VOCAB, DIM, combiner="mean")(inp)
    x = keras.layers.Dense(8, activation="tanh")(x)
    x = keras.layers.LayerNormalization()(x)
    return keras.Model(inp, keras.layers.Dense(1)(x))


def sequential_model(seed=3):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [DPEmbedding(VOCAB, DIM, combiner="sum"), keras.layers.Dense(8, "relu"), keras.layers.Dense(1)]
    )
    model(tf.zeros([1, IDS], tf.int32))
    return model


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.emb = DPEmbedding(VOCAB, DIM, combiner="sqrtn")
        self.hidden = keras.layers.Dense(8, "relu")
        self.out = keras.layers.Dense(1)

    def call(self, ids):
        return self.out(self.hidden(self.emb(ids)))


def subclassed_model(seed=3):
    keras.utils.set_random_seed(seed)
    model = Subclassed()
    model(tf.zeros([1, IDS], tf.int32))
    return model


def _train(model, mechanism, epochs=2, lr=0.5, ds=None):
    dp = DPModel(model, mechanism=mechanism, expected_batch_size=BATCH)
    dp.compile(optimizer=keras.optimizers.legacy.SGD(lr), loss=BCE)
    history = dp.fit(ds if ds is not None else _dataset(), epochs=epochs, verbose=0)
    return dp, history


def _max_diff(a, b):
    return max(float(np.abs(x - y).max()) for x, y in zip(a.get_weights(), b.get_weights()))


@pytest.mark.parametrize("build", [functional_model, sequential_model, subclassed_model])
def test_zero_noise_huge_clip_reproduces_non_private_sgd(build):
    reference, _ = _train(build(), NonPrivate())
    private, history = _train(build(), DenseDPSGD(l2_norm_clip=1e6, noise_multiplier=0.0, seed=0))
    assert _max_diff(reference.inner, private.inner) < 1e-5
    # The models did move: the comparison is not between two untrained models.
    assert _max_diff(build(), private.inner) > 1e-3
    assert np.isfinite(history.history["loss"]).all()


def test_tfrs_model_with_per_example_compute_loss():
    import tensorflow_recommenders as tfrs

    class Ranker(tfrs.Model):
        def __init__(self):
            super().__init__()
            self.emb = DPEmbedding(VOCAB, DIM, combiner="mean")
            self.out = keras.layers.Dense(1)
            self.task = tfrs.tasks.Ranking(
                loss=keras.losses.BinaryCrossentropy(from_logits=True, reduction=keras.losses.Reduction.NONE)
            )

        def call(self, features):
            return self.out(self.emb(features["ids"]))

        def compute_loss(self, features, training=False):
            return self.task(labels=features["label"], predictions=self(features))

    ids, y = _data()
    ds = tf.data.Dataset.from_tensor_slices({"ids": ids, "label": y}).batch(BATCH)
    results = []
    for mechanism in (NonPrivate(), DenseDPSGD(l2_norm_clip=1e6, noise_multiplier=0.0, seed=0)):
        keras.utils.set_random_seed(5)
        model = Ranker()
        dp = DPModel(model, mechanism=mechanism, expected_batch_size=BATCH)
        dp.compile(optimizer=keras.optimizers.legacy.SGD(0.5))
        dp.fit(ds, epochs=2, verbose=0)
        results.append(model)
    assert _max_diff(*results) < 1e-5


@pytest.mark.peer
def test_matches_tensorflow_privacy_dp_keras_sgd_with_zero_noise():
    sys.skip_tf_privacy_import = True  # tensorflow_privacy/__init__ fails on TF 2.21
    pytest.importorskip("tensorflow_privacy", reason="the peer runs in .venv-peers (make test-peers)")
    from tensorflow_privacy.privacy.optimizers.dp_optimizer_keras import DPKerasSGDOptimizer

    clip = 0.05  # small enough that most examples are clipped
    peer = sequential_model()
    peer.compile(
        optimizer=DPKerasSGDOptimizer(
            l2_norm_clip=clip, noise_multiplier=0.0, num_microbatches=BATCH, learning_rate=0.5
        ),
        loss=keras.losses.BinaryCrossentropy(from_logits=True, reduction=keras.losses.Reduction.NONE),
    )
    peer.fit(_dataset(), epochs=2, verbose=0)
    ours, _ = _train(sequential_model(), DenseDPSGD(l2_norm_clip=clip, noise_multiplier=0.0, seed=0))
    assert _max_diff(peer, ours.inner) < 1e-5
    assert _max_diff(sequential_model(), ours.inner) > 1e-4


def test_dense_noise_std_matches_formula():
    # One step, lr 1: w1 - w1(sigma=0) = -noise / B, noise ~ N(0, (sigma C)^2) per coordinate.
    sigma, clip, lr = 2.0, 0.5, 1.0
    ds = _dataset(BATCH)
    weights = []
    for noise_multiplier in (sigma, 0.0):
        dp, _ = _train(
            functional_model(),
            DenseDPSGD(l2_norm_clip=clip, noise_multiplier=noise_multiplier, seed=11),
            epochs=1,
            lr=lr,
            ds=ds,
        )
        weights.append(np.concatenate([w.ravel() for w in dp.inner.get_weights()]))
    noise = (weights[1] - weights[0]) * BATCH / lr
    n = noise.size  # 30*4 + 4*8 + 8 + 8 + 8 + 8 + 1 = 185 coordinates
    expected = sigma * clip
    # std of the sample std of n normals is about expected / sqrt(2n): allow 4 of those.
    assert abs(noise.std() - expected) < 4 * expected / np.sqrt(2 * n)
    assert abs(noise.mean()) < 4 * expected / np.sqrt(n)


def test_explicit_seed_reproduces_noise_and_default_seed_does_not():
    def run(seed):
        dp, _ = _train(functional_model(), DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0, seed=seed), epochs=1)
        return dp.inner

    assert _max_diff(run(7), run(7)) == 0.0
    assert _max_diff(run(None), run(None)) > 1e-3


def test_mechanism_rng_state_is_checkpointed(tmp_path):
    mechanism = DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0, seed=1)
    checkpoint = tf.train.Checkpoint(mechanism=mechanism)
    path = checkpoint.save(str(tmp_path / "ckpt"))
    first = mechanism.generator.normal([4]).numpy()
    checkpoint.restore(path)
    again = mechanism.generator.normal([4]).numpy()
    np.testing.assert_array_equal(first, again)


def test_callbacks_and_metrics_work():
    seen = []

    class Count(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(logs["loss"])

    dp = DPModel(
        functional_model(),
        mechanism=DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=0.5, seed=0),
        expected_batch_size=BATCH,
    )
    dp.compile(
        optimizer=keras.optimizers.legacy.SGD(0.1), loss=BCE, metrics=[keras.metrics.AUC(from_logits=True, name="auc")]
    )
    history = dp.fit(_dataset(), epochs=1, verbose=0, callbacks=[Count()])
    assert len(seen) == 4
    assert "auc" in history.history
    assert "auc" in dp.evaluate(_dataset(), verbose=0, return_dict=True)


# -- bad input ---------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(l2_norm_clip=0.0, noise_multiplier=1.0), "`l2_norm_clip`"),
        (dict(l2_norm_clip=-1.0, noise_multiplier=1.0), "`l2_norm_clip`"),
        (dict(l2_norm_clip=1.0, noise_multiplier=-0.1), "`noise_multiplier`"),
        (dict(l2_norm_clip=1.0, noise_multiplier=float("nan")), "`noise_multiplier`"),
    ],
)
def test_bad_hyperparameters_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DenseDPSGD(**kwargs)


def test_privacy_arguments_are_keyword_only():
    with pytest.raises(TypeError):
        DenseDPSGD(1.0, 1.0)


def test_missing_expected_batch_size_raises():
    with pytest.raises(ValueError, match="expected_batch_size"):
        DPModel(functional_model(), mechanism=DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0))


def test_nan_loss_does_not_stop_training_diverged_weights_do():
    # A NaN loss (here every example's) contributes zero: training goes on (tests/privacy/test_nonfinite_example.py).
    dp = DPModel(
        functional_model(),
        mechanism=DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0),
        expected_batch_size=BATCH,
    )
    dp.compile(optimizer=keras.optimizers.legacy.SGD(0.1), loss=lambda y, p: tf.math.log(-tf.abs(p[:, 0]) - 1.0))
    history = dp.fit(_dataset(), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert all(np.isfinite(w).all() for w in dp.get_weights())
    # Weights that overflow (an infinite learning rate) stop it, naming the divergence.
    dp.compile(optimizer=keras.optimizers.legacy.SGD(float("inf")), loss="mse")
    with pytest.raises(tf.errors.InvalidArgumentError, match="weights are NaN or Inf"):
        dp.fit(_dataset(), epochs=1, verbose=0)


def test_scalar_loss_is_rejected():
    dp = DPModel(
        functional_model(),
        mechanism=DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0),
        expected_batch_size=BATCH,
    )
    dp.compile(optimizer=keras.optimizers.legacy.SGD(0.1), loss=lambda y, p: tf.reduce_mean(p))
    with pytest.raises(PrivacyContractError, match="one value per example"):
        dp.fit(_dataset(), epochs=1, verbose=0)


def test_empty_dataset_raises():
    model = Subclassed()  # unbuilt: fit must build it from the first batch
    dp = DPModel(model, mechanism=DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0), expected_batch_size=BATCH)
    dp.compile(optimizer=keras.optimizers.legacy.SGD(0.1), loss=BCE)
    with pytest.raises(ValueError, match="empty"):
        dp.fit(_dataset().take(0), epochs=1, verbose=0)


def test_in_batch_negative_retrieval_task_is_rejected():
    import tensorflow_recommenders as tfrs

    class TwoTower(tfrs.Model):
        def __init__(self):
            super().__init__()
            self.task = tfrs.tasks.Retrieval()

    with pytest.raises(PrivacyContractError, match="in-batch negatives"):
        DPModel(TwoTower(), mechanism=DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0), expected_batch_size=8)


def test_batch_normalization_is_rejected():
    inp = keras.Input((IDS,), dtype="int32")
    x = keras.layers.BatchNormalization()(DPEmbedding(VOCAB, DIM, combiner="sum")(inp))
    model = keras.Model(inp, keras.layers.Dense(1)(x))
    with pytest.raises(PrivacyContractError, match="batch statistics"):
        DPModel(model, mechanism=DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0), expected_batch_size=8)


def test_mechanism_type_is_checked():
    with pytest.raises(TypeError, match="NoiseMechanism"):
        DPModel(functional_model(), mechanism="dense", expected_batch_size=8)


def test_step_counter_counts_only_real_batches():
    # Keras runs the step function once more at the end of each epoch; nothing
    # that does not depend on the batch may run then (4 batches x 3 epochs = 12).
    mechanism = DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0)
    _train(functional_model(), mechanism, epochs=3)
    assert int(mechanism.steps.numpy()) == 12


def test_neighbouring_seeds_give_unrelated_noise_streams():
    a = DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0, seed=1).generator.normal([64]).numpy()
    b = DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0, seed=2).generator.normal([64]).numpy()
    assert not np.intersect1d(np.round(a, 6), np.round(b, 6)).size


def test_a_variable_the_mechanism_leaves_out_is_an_error():
    class DropsDense(DenseDPSGD):
        def update(self, clipped):
            return [(g, v) for g, v in super().update(clipped) if "embedding" in v.name]

    dp = DPModel(
        functional_model(),
        mechanism=DropsDense(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0),
        expected_batch_size=BATCH,
    )
    dp.compile(optimizer=keras.optimizers.legacy.SGD(0.1), loss=BCE)
    with pytest.raises(PrivacyContractError, match="not handled by mechanism"):
        dp.fit(_dataset(), epochs=1, verbose=0)


def test_table_gradient_averaged_is_the_clipped_sum_over_the_expected_batch_size():
    """`TableGradient.averaged` (c_i / B inside the clipping) equals `gradient / B`, same rows."""
    seen = []

    class Recording(DenseDPSGD):
        def update(self, clipped):
            table = clipped.tables[0]
            seen.append((table.gradient, table.averaged(), table.averaged_gradient(clipped.expected_batch_size)))
            return super().update(clipped)

    dp = DPModel(
        functional_model(),
        mechanism=Recording(l2_norm_clip=0.1, noise_multiplier=0.0, seed=0),
        expected_batch_size=BATCH,
    )
    dp.compile(optimizer=keras.optimizers.legacy.SGD(0.5), loss=BCE, run_eagerly=True)
    dp.fit(_dataset(16), epochs=1, verbose=0)
    assert len(seen) == 2
    for total, averaged, via_method in seen:
        np.testing.assert_array_equal(averaged.indices.numpy(), total.indices.numpy())
        np.testing.assert_allclose(averaged.values.numpy(), total.values.numpy() / BATCH, rtol=1e-6, atol=1e-9)
        np.testing.assert_array_equal(via_method.values.numpy(), averaged.values.numpy())
        assert float(np.abs(total.values.numpy()).max()) > 0  # a real gradient, clipped (C = 0.1)
