"""Attack: measure the clipped sum's sensitivity max_j ||S(B) - S(B minus j)|| through DPModel.

DP-SGD's guarantee needs every example's influence on the clipped sum S(B)
= sum_i c_i g_i to be at most C: removing example j must change S by at
most C. Layers that mix examples (batch statistics, centring with the batch
mean, in-batch negatives) or that store training data in their state break
this; subclasses whose math the clipping rule does not describe get wrong
norms. S is read through DPModel itself: DenseDPSGD with no noise and
plain SGD with learning rate 1 move the weights by S / B, so
S = (w_before - w_after) * B.

Each model of the zoo is either accepted, and then its sensitivity is <= C
and its per-example gradients (S of a one-example batch, C huge) equal the
brute-force jacobian, or refused with a PrivacyContractError naming the
culprit. When a model that must be refused is accepted, the test fails with
what the attack measured (the sensitivity, or how wrong the gradients are).
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.layers.embedding import DPEmbedding
from tfdp_embed.keras2.models.two_tower import ItemEmbedding, two_tower_registry
from tfdp_embed.keras2.training import DPModel
from tfdp_embed.mechanisms.dense import DenseDPSGD

VOCAB, DIM, IDS, N = 12, 4, 3, 6
C = 0.5  # small: every example below is clipped, so mixing shows in the sensitivity
B = float(N)  # expected batch size
BCE = keras.losses.BinaryCrossentropy(from_logits=True)


def _batch(n=N, seed=1):
    """Ids and binary labels; example 0 is the odd one out (label 0), which mixing layers amplify."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, (n, IDS)).astype("int32")
    labels = np.ones((n, 1), "float32")
    labels[0] = 0.0
    return ids, labels


def _pairs(n=N, seed=1):
    """Histories and distinct item ids in [1, VOCAB) (as float labels), for the two-tower models."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, (n, IDS)).astype("int32")
    items = (rng.permutation(VOCAB - 1)[:n] + 1).reshape(n, 1).astype("float32")
    return ids, items


def _without(batch, j):
    return tuple(np.delete(part, j, axis=0) for part in batch)


# -- the attack -------------------------------------------------------------------


def _dp(model, clip, loss=BCE, **kwargs):
    dp = DPModel(
        model,
        mechanism=DenseDPSGD(l2_norm_clip=clip, noise_multiplier=0.0, seed=0),
        expected_batch_size=B,
        **kwargs,
    )
    dp.compile(optimizer=keras.optimizers.legacy.SGD(1.0), loss=loss)
    return dp


def _clipped_sum(dp, batch) -> np.ndarray:
    """S(batch) from one DPModel step; the model's weights (all of them) are put back after."""
    variables = dp.inner.variables
    before = [v.numpy().copy() for v in variables]
    dp.fit(tf.data.Dataset.from_tensors(batch), epochs=1, verbose=0)
    step = [
        (b - v.numpy()).ravel() for v, b in zip(variables, before) if any(v is t for t in dp.inner.trainable_variables)
    ]
    for v, b in zip(variables, before):
        v.assign(b)
    return np.concatenate(step) * B


def sensitivity(model, batch, loss=BCE, **dp_kwargs) -> float:
    """max_j ||S(B) - S(B minus j)|| with clip C."""
    dp = _dp(model, C, loss, **dp_kwargs)
    dp.prepare(tf.data.Dataset.from_tensors(batch))  # builds a subclassed model
    whole = _clipped_sum(dp, batch)
    return max(float(np.linalg.norm(whole - _clipped_sum(dp, _without(batch, j)))) for j in range(N))


def per_example_gradients(model, batch, loss=BCE, **dp_kwargs) -> np.ndarray:
    """[n, params]: S of each one-example batch with a huge clip, i.e. the gradient DPModel computes."""
    dp = _dp(model, 1e9, loss, **dp_kwargs)
    dp.prepare(tf.data.Dataset.from_tensors(batch))  # the contract check needs >= 2 examples
    return np.stack([_clipped_sum(dp, tuple(part[i : i + 1] for part in batch)) for i in range(N)])


def jacobian(model, batch, loss=BCE) -> np.ndarray:
    """[n, params]: the brute-force per-example gradients d loss_i / d w."""
    x, y = batch
    with tf.GradientTape() as tape:
        if loss is None:
            losses = model.compute_loss((tf.constant(x), tf.constant(y)), training=True)
        else:
            logits = model(x, training=True)
            losses = loss.call(y, logits) if isinstance(loss, keras.losses.Loss) else loss(y, logits)
    rows = tape.jacobian(losses, model.trainable_variables)
    return np.concatenate([np.reshape(r.numpy(), [N, -1]) for r in rows], axis=1)


def _assert_exact_and_bounded(build, loss=BCE, batch=None, **dp_kwargs):
    batch = batch if batch is not None else _batch()
    got = per_example_gradients(build(), batch, loss, **dp_kwargs)
    expected = jacobian(build(), batch, loss)
    ratio = np.linalg.norm(got, axis=1) / np.linalg.norm(expected, axis=1)
    np.testing.assert_allclose(
        got,
        expected,
        rtol=1e-4,
        atol=1e-4 * np.abs(expected).max(),
        err_msg=f"per-example gradient norms / true norms = {ratio}",
    )
    assert np.linalg.norm(expected, axis=1).min() > C  # every example is clipped
    measured = sensitivity(build(), batch, loss, **dp_kwargs)
    assert measured <= C * (1 + 1e-5), f"sensitivity {measured:.4f} > C = {C}"
    return measured


def _assert_refused(build, match, loss=BCE, batch=None):
    """Refused with a message matching `match`; if accepted, fails with what the attack measures."""
    batch = batch if batch is not None else _batch()
    try:
        measured = sensitivity(build(), batch, loss)
    except PrivacyContractError as error:
        assert re.search(match, str(error)), str(error)
        return str(error)
    found = [f"sensitivity {measured:.4f} (C = {C})"]
    try:
        got = per_example_gradients(build(), batch, loss)
        norms = np.linalg.norm(got, axis=1) / np.linalg.norm(jacobian(build(), batch, loss), axis=1)
        found.append(f"per-example norms / true norms = {np.round(norms, 3)}")
    except PrivacyContractError:
        pass
    found.append(f"state written by training: {_state_written(build(), batch, loss)}")
    pytest.fail("accepted: " + "; ".join(found))


def _state_written(model, batch, loss) -> list:
    """Names of the non-trainable variables one DPModel step changed (raw, un-noised statistics)."""
    dp = _dp(model, C, loss)
    dp.prepare(tf.data.Dataset.from_tensors(batch))
    before = {v.name: v.numpy().copy() for v in model.non_trainable_variables}
    dp.fit(tf.data.Dataset.from_tensors(batch), epochs=1, verbose=0)
    return [v.name for v in model.non_trainable_variables if not np.array_equal(v.numpy(), before[v.name])]


# -- the zoo ------------------------------------------------------------------------


def _functional(*middle, table=None, seed=3):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((IDS,), dtype="int32")
    x = (table or DPEmbedding(VOCAB, DIM, combiner="mean", embeddings_initializer="normal"))(inputs)
    x = keras.layers.Dense(6, activation="tanh", kernel_initializer="normal")(x)
    for layer in middle:
        x = layer(x)
    return keras.Model(inputs, keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant(3.0))(x))


class CentreOverBatch(keras.layers.Layer):
    """x - mean over the batch: no weights, no state, mixes examples."""

    def call(self, x):
        return x - tf.reduce_mean(x, axis=0, keepdims=True)


class RemembersInputs(keras.layers.Layer):
    """Stores the batch mean of its inputs in a non-trainable variable during training."""

    def build(self, input_shape):
        self.seen = self.add_weight(name="seen", shape=input_shape[1:], trainable=False, initializer="zeros")

    def call(self, x, training=None):
        if training:
            self.seen.assign(tf.reduce_mean(x, axis=0))
        return x


class TenTimes(DPEmbedding):
    def call(self, ids):
        return 10.0 * super().call(ids)


class Normalised(DPEmbedding):
    def call(self, ids):
        return tf.nn.l2_normalize(super().call(ids), axis=-1)


class SquaredDense(keras.layers.Dense):
    def call(self, x):
        return tf.square(super().call(x))


class ReadsTableItself(DPEmbedding):
    """Sums the rows itself (not through `lookup`), though built with combiner "mean"."""

    def call(self, ids):
        return tf.reduce_sum(tf.gather(self.embeddings, ids), axis=1)


class ReadsTableTwice(DPEmbedding):
    def call(self, ids):
        return super().call(ids) + tf.reduce_mean(tf.gather(self.embeddings, ids), axis=1)


class OverridesLookup(DPEmbedding):
    def lookup(self, ids):
        return 2.0 * super().lookup(ids)


def _table(cls):
    return cls(VOCAB, DIM, combiner="mean", embeddings_initializer="normal")


def _unit_normal():
    return keras.initializers.RandomNormal(stddev=1.0)


class _Towers(keras.Model):
    """Query tower (pooled history) and item tower (label = item id); a loss of the subclass's choosing."""

    def __init__(self):
        super().__init__()
        keras.utils.set_random_seed(3)
        self.history = DPEmbedding(VOCAB, DIM, combiner="mean", embeddings_initializer=_unit_normal())
        self.query = keras.layers.Dense(DIM, kernel_initializer=_unit_normal())
        self.items = DPEmbedding(VOCAB, DIM, embeddings_initializer=_unit_normal())

    def towers(self, ids, labels):
        item_ids = tf.cast(tf.reshape(labels, [-1]), tf.int32)
        return self.query(self.history(ids)), self.items(item_ids)

    def call(self, ids):
        return self.query(self.history(ids))


class InBatchSoftmax(_Towers):
    """A custom in-batch-negative loss: softmax of each query over the batch's items."""

    def compute_loss(self, inputs, training=False):
        queries, items = self.towers(*inputs)
        scores = tf.matmul(queries, items, transpose_b=True)
        return tf.nn.sparse_softmax_cross_entropy_with_logits(tf.range(tf.shape(scores)[0]), scores)


class RetrievalInsideComputeLoss(_Towers):
    """`tfrs.tasks.Retrieval` created inside `compute_loss`: DPModel cannot see it at construction."""

    def compute_loss(self, inputs, training=False):
        import tensorflow_recommenders as tfrs

        task = tfrs.tasks.Retrieval(loss=keras.losses.CategoricalCrossentropy(from_logits=True, reduction="none"))
        queries, items = self.towers(*inputs)
        return task(queries, items, compute_metrics=False)


class FullSoftmax(_Towers):
    """The DP-safe alternative: each query scored against the whole item table (`ItemEmbedding`)."""

    def __init__(self):
        super().__init__()
        self.items = ItemEmbedding(VOCAB - 1, DIM, embeddings_initializer=_unit_normal())

    def compute_loss(self, inputs, training=False):
        ids, labels = inputs
        scores = self.items(self.query(self.history(ids)))  # [batch, VOCAB - 1]: column k is item k + 1
        item_ids = tf.cast(tf.reshape(labels, [-1]), tf.int32)
        return tf.nn.sparse_softmax_cross_entropy_with_logits(item_ids - 1, scores)


# -- accepted: bounded and exact ------------------------------------------------------


def test_plain_embedding_dense_model_is_bounded_and_exact():
    _assert_exact_and_bounded(lambda: _functional())


def test_layer_norm_model_is_bounded_and_exact():
    _assert_exact_and_bounded(lambda: _functional(keras.layers.LayerNormalization()))


@pytest.mark.parametrize("cls", [TenTimes, Normalised], ids=["ten_times", "l2_normalize"])
def test_embedding_subclass_overriding_call_gets_exact_norms(cls):
    # Old code: the rule read call's output as the lookup's, norms 0.1x (TenTimes) or off by
    # the normalisation's Jacobian (Normalised).
    _assert_exact_and_bounded(lambda: _functional(table=_table(cls)))


def test_dense_subclass_overriding_call_gets_exact_norms():
    # Old code: the Dense rule read y = x W + b where the layer computes (x W + b)^2.
    def build():
        keras.utils.set_random_seed(3)
        inputs = keras.Input((IDS,), dtype="int32")
        x = DPEmbedding(VOCAB, DIM, combiner="mean", embeddings_initializer="normal")(inputs)
        x = SquaredDense(6, kernel_initializer="normal")(x)
        return keras.Model(inputs, keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant(3.0))(x))

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "No per-example clipping rule", RuntimeWarning)
        _assert_exact_and_bounded(build)


def test_sigmoid_output_with_a_probability_loss_is_bounded_and_exact():
    # Old code: Keras' loss read the sigmoid's logits past the recorded output, so the rule saw
    # no gradient for the last layer: it got zero per-example norm and trained on noise alone.
    _assert_exact_and_bounded(_sigmoid_head, loss=keras.losses.BinaryCrossentropy())


def _sigmoid_head():
    keras.utils.set_random_seed(3)
    inputs = keras.Input((IDS,), dtype="int32")
    x = DPEmbedding(VOCAB, DIM, combiner="mean", embeddings_initializer="normal")(inputs)
    x = keras.layers.Dense(6, activation="tanh", kernel_initializer="normal")(x)
    head = keras.layers.Dense(1, activation="sigmoid", kernel_initializer=keras.initializers.Constant(3.0))
    return keras.Model(inputs, head(x))


def test_full_softmax_over_the_item_table_is_bounded_and_exact():
    _assert_exact_and_bounded(FullSoftmax, loss=None, batch=_pairs(), registry=two_tower_registry())


# -- refused: mixing examples or keeping state --------------------------------------


def test_sync_batch_normalization_is_refused():
    _assert_refused(
        lambda: _functional(keras.layers.experimental.SyncBatchNormalization()),
        r"sync_batch_normalization.*SyncBatchNormalization",
    )


def test_batch_normalization_is_refused():
    _assert_refused(lambda: _functional(keras.layers.BatchNormalization()), "BatchNormalization")


def test_layer_that_stores_training_data_in_its_state_is_refused():
    _assert_refused(lambda: _functional(RemembersInputs(name="remembers")), r"'remembers' \(RemembersInputs\)")


def test_batch_centring_layer_is_refused():
    _assert_refused(lambda: _functional(CentreOverBatch(name="centre")), r"'centre' \(CentreOverBatch\) mixes examples")


def test_custom_in_batch_negative_loss_is_refused():
    _assert_refused(InBatchSoftmax, r"InBatchSoftmax\.compute_loss.*mixes examples", loss=None, batch=_pairs())


def test_retrieval_task_created_inside_compute_loss_is_refused():
    message = _assert_refused(RetrievalInsideComputeLoss, r"compute_loss.*mixes examples", loss=None, batch=_pairs())
    assert "full item table" in message and "Retrieval" in message


def test_loss_function_that_mixes_examples_is_refused():
    def centred_bce(y, logits):  # subtracts the batch mean of the logits
        return keras.losses.binary_crossentropy(y, logits - tf.reduce_mean(logits), from_logits=True)

    _assert_refused(lambda: _functional(), r"centred_bce.*mixes examples", loss=centred_bce)


# -- refused: subclasses the clipping rule cannot describe ---------------------------


@pytest.mark.parametrize("cls", [ReadsTableItself, ReadsTableTwice], ids=["only", "besides_lookup"])
def test_embedding_subclass_reading_its_table_itself_is_refused(cls):
    _assert_refused(lambda: _functional(table=_table(cls)), cls.__name__)


def test_embedding_subclass_overriding_lookup_is_refused():
    message = _assert_refused(lambda: _functional(table=_table(OverridesLookup)), "OverridesLookup.*`lookup`")
    assert "override `call` instead" in message


# -- what the refusal leaves behind ------------------------------------------------------


@pytest.mark.parametrize("norm", [keras.layers.BatchNormalization, keras.layers.experimental.SyncBatchNormalization])
def test_refusal_leaves_every_variable_and_the_moving_statistics_untouched(norm):
    # Old code: SyncBatchNormalization trained, and the per-example fallback's re-runs folded
    # single training rows into `moving_mean`.
    model = _functional(norm(name="norm"))
    before = [v.numpy().copy() for v in model.variables]
    with pytest.raises(PrivacyContractError):
        _dp(model, C).fit(tf.data.Dataset.from_tensors(_batch()), epochs=1, verbose=0)
    for v, b in zip(model.variables, before):
        np.testing.assert_array_equal(v.numpy(), b, err_msg=v.name)
    moving_mean = model.get_layer("norm").moving_mean.numpy()
    np.testing.assert_array_equal(moving_mean, np.zeros_like(moving_mean))
