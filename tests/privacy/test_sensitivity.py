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

Both front ends (the `fe` fixture of tests/conftest.py): the zoo's layers and
subclasses are built on each front end's Keras (`_zoo`). The two-tower
models (`compute_loss`, TFRS, `ItemEmbedding`) and SyncBatchNormalization
are tf-keras's; a tied `SharedEmbedding` and the full softmax over an item
tower run on the whole catalogue in `shared_computation` (the model of
examples/keras3_two_tower.py) are checked on both.
"""

from __future__ import annotations

import functools
import re
import types
import warnings

import numpy as np
import pytest

from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.layers.embedding import DPEmbedding  # the two-tower models (tf-keras)
from tfdp_embed.keras2.models.two_tower import ItemEmbedding, two_tower_registry
from tfdp_embed.mechanisms.dense import DenseDPSGD

VOCAB, DIM, IDS, N = 12, 4, 3, 6
C = 0.5  # small: every example below is clipped, so mixing shows in the sensitivity
B = float(N)  # expected batch size
BCE = "bce"  # the front end's BinaryCrossentropy(from_logits=True)


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


def _loss(fe, loss):
    return fe.keras.losses.BinaryCrossentropy(from_logits=True) if loss == BCE else loss


def _dp(fe, model, clip, loss=BCE, **kwargs):
    dp = fe.DPModel(
        model,
        mechanism=DenseDPSGD(l2_norm_clip=clip, noise_multiplier=0.0, seed=0),
        expected_batch_size=B,
        **kwargs,
    )
    dp.compile(optimizer=fe.sgd(1.0), loss=_loss(fe, loss))
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


def sensitivity(fe, model, batch, loss=BCE, **dp_kwargs) -> float:
    """max_j ||S(B) - S(B minus j)|| with clip C."""
    dp = _dp(fe, model, C, loss, **dp_kwargs)
    dp.prepare(tf.data.Dataset.from_tensors(batch))  # builds a subclassed model
    whole = _clipped_sum(dp, batch)
    return max(float(np.linalg.norm(whole - _clipped_sum(dp, _without(batch, j)))) for j in range(N))


def per_example_gradients(fe, model, batch, loss=BCE, **dp_kwargs) -> np.ndarray:
    """[n, params]: S of each one-example batch with a huge clip, i.e. the gradient DPModel computes."""
    dp = _dp(fe, model, 1e9, loss, **dp_kwargs)
    dp.prepare(tf.data.Dataset.from_tensors(batch))  # the contract check needs >= 2 examples
    return np.stack([_clipped_sum(dp, tuple(part[i : i + 1] for part in batch)) for i in range(N)])


def jacobian(fe, model, batch, loss=BCE) -> np.ndarray:
    """[n, params]: the brute-force per-example gradients d loss_i / d w."""
    x, y = batch
    loss = _loss(fe, loss)
    with tf.GradientTape() as tape:
        if loss is None:
            losses = model.compute_loss((tf.constant(x), tf.constant(y)), training=True)
        else:
            logits = model(x, training=True)
            losses = loss.call(y, logits) if isinstance(loss, fe.keras.losses.Loss) else loss(y, logits)
    rows = tape.jacobian(losses, model.trainable_variables)
    return np.concatenate([np.reshape(r.numpy(), [N, -1]) for r in rows], axis=1)


def _assert_exact_and_bounded(fe, build, loss=BCE, batch=None, **dp_kwargs):
    batch = batch if batch is not None else _batch()
    got = per_example_gradients(fe, build(), batch, loss, **dp_kwargs)
    expected = jacobian(fe, build(), batch, loss)
    ratio = np.linalg.norm(got, axis=1) / np.linalg.norm(expected, axis=1)
    np.testing.assert_allclose(
        got,
        expected,
        rtol=1e-4,
        atol=1e-4 * np.abs(expected).max(),
        err_msg=f"per-example gradient norms / true norms = {ratio}",
    )
    assert np.linalg.norm(expected, axis=1).min() > C  # every example is clipped
    measured = sensitivity(fe, build(), batch, loss, **dp_kwargs)
    assert measured <= C * (1 + 1e-5), f"sensitivity {measured:.4f} > C = {C}"
    return measured


def _assert_refused(fe, build, match, loss=BCE, batch=None):
    """Refused with a message matching `match`; if accepted, fails with what the attack measures."""
    batch = batch if batch is not None else _batch()
    try:
        measured = sensitivity(fe, build(), batch, loss)
    except PrivacyContractError as error:
        assert re.search(match, str(error)), str(error)
        return str(error)
    found = [f"sensitivity {measured:.4f} (C = {C})"]
    try:
        got = per_example_gradients(fe, build(), batch, loss)
        norms = np.linalg.norm(got, axis=1) / np.linalg.norm(jacobian(fe, build(), batch, loss), axis=1)
        found.append(f"per-example norms / true norms = {np.round(norms, 3)}")
    except PrivacyContractError:
        pass
    found.append(f"state written by training: {_state_written(fe, build(), batch, loss)}")
    pytest.fail("accepted: " + "; ".join(found))


def _state_written(fe, model, batch, loss) -> list:
    """Names of the non-trainable variables one DPModel step changed (raw, un-noised statistics)."""
    dp = _dp(fe, model, C, loss)
    dp.prepare(tf.data.Dataset.from_tensors(batch))
    before = [v.numpy().copy() for v in model.non_trainable_variables]
    dp.fit(tf.data.Dataset.from_tensors(batch), epochs=1, verbose=0)
    variables = model.non_trainable_variables
    return [v.name for v, b in zip(variables, before) if not np.array_equal(v.numpy(), b)]


# -- the zoo ------------------------------------------------------------------------


def _functional(fe, *middle, table=None, seed=3):
    keras = fe.keras
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((IDS,), dtype="int32")
    # `table`: a zoo class's name, made after the seed (Keras 3 seeds an initializer when it is made).
    embedding = (
        _table(fe, table) if table else fe.DPEmbedding(VOCAB, DIM, combiner="mean", embeddings_initializer="normal")
    )
    x = embedding(inputs)
    x = keras.layers.Dense(6, activation="tanh", kernel_initializer="normal")(x)
    for layer in middle:
        x = layer(x)
    return keras.Model(inputs, keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant(3.0))(x))


@functools.cache
def _zoo(name: str) -> types.SimpleNamespace:
    """The zoo's layers and subclasses on front end `name`'s Keras and DPEmbedding."""
    from front_ends.front_ends import front_end

    fe = front_end(name)
    keras, DPEmbedding = fe.keras, fe.DPEmbedding

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

    return types.SimpleNamespace(**{c.__name__: c for c in locals().values() if isinstance(c, type)})


def _table(fe, cls_name):
    return getattr(_zoo(fe.name), cls_name)(VOCAB, DIM, combiner="mean", embeddings_initializer="normal")


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


def test_plain_embedding_dense_model_is_bounded_and_exact(fe):
    _assert_exact_and_bounded(fe, lambda: _functional(fe))


def test_layer_norm_model_is_bounded_and_exact(fe):
    _assert_exact_and_bounded(fe, lambda: _functional(fe, fe.keras.layers.LayerNormalization()))


@pytest.mark.parametrize("cls", ["TenTimes", "Normalised"], ids=["ten_times", "l2_normalize"])
def test_embedding_subclass_overriding_call_gets_exact_norms(fe, cls):
    # Old code: the rule read call's output as the lookup's, norms 0.1x (TenTimes) or off by
    # the normalisation's Jacobian (Normalised).
    _assert_exact_and_bounded(fe, lambda: _functional(fe, table=cls))


def test_dense_subclass_overriding_call_gets_exact_norms(fe):
    # Old code: the Dense rule read y = x W + b where the layer computes (x W + b)^2.
    def build():
        keras = fe.keras
        keras.utils.set_random_seed(3)
        inputs = keras.Input((IDS,), dtype="int32")
        x = fe.DPEmbedding(VOCAB, DIM, combiner="mean", embeddings_initializer="normal")(inputs)
        x = _zoo(fe.name).SquaredDense(6, kernel_initializer="normal")(x)
        return keras.Model(inputs, keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant(3.0))(x))

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "No per-example clipping rule", RuntimeWarning)
        _assert_exact_and_bounded(fe, build)


def test_sigmoid_output_with_a_probability_loss_is_bounded_and_exact(fe):
    # Old code: Keras' loss read the sigmoid's logits past the recorded output, so the rule saw
    # no gradient for the last layer: it got zero per-example norm and trained on noise alone.
    _assert_exact_and_bounded(fe, lambda: _sigmoid_head(fe), loss=fe.keras.losses.BinaryCrossentropy())


def _sigmoid_head(fe):
    keras = fe.keras
    keras.utils.set_random_seed(3)
    inputs = keras.Input((IDS,), dtype="int32")
    x = fe.DPEmbedding(VOCAB, DIM, combiner="mean", embeddings_initializer="normal")(inputs)
    x = keras.layers.Dense(6, activation="tanh", kernel_initializer="normal")(x)
    head = keras.layers.Dense(1, activation="sigmoid", kernel_initializer=keras.initializers.Constant(3.0))
    return keras.Model(inputs, head(x))


def _tied(fe):
    """ids -> SharedEmbedding -> Dense -> LayerNorm -> last position -> the same table as output projection."""
    import importlib

    keras = fe.keras
    keras.utils.set_random_seed(3)
    table = importlib.import_module(f"tfdp_embed.{fe.name}").SharedEmbedding(
        VOCAB, DIM, embeddings_initializer="normal", name="tied"
    )
    inputs = keras.Input((IDS,), dtype="int32")
    hidden = keras.layers.Dense(DIM, activation="tanh", kernel_initializer="normal")(table(inputs))
    hidden = keras.layers.LayerNormalization()(hidden)[:, -1]
    return keras.Model(inputs, table(hidden, mode="logits"))


def test_tied_input_and_output_embedding_is_bounded_and_exact(fe):
    loss = fe.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    _assert_exact_and_bounded(fe, lambda: _tied(fe), loss=loss, batch=_pairs())


def _catalogue_softmax(fe):
    """As examples/keras3_two_tower.py: each query scored against the item tower run over the whole catalogue."""
    from tfdp_embed.clipping import shared_computation

    keras = fe.keras

    class CatalogueSoftmax(keras.Model):
        def __init__(self):
            super().__init__()
            keras.utils.set_random_seed(3)
            unit = keras.initializers.RandomNormal(stddev=1.0)  # gradients large enough that every example is clipped
            self.history = fe.DPEmbedding(VOCAB, DIM, combiner="mean", embeddings_initializer=unit)
            self.query = keras.layers.Dense(DIM, kernel_initializer=unit)
            self.items = fe.DPEmbedding(VOCAB, DIM, embeddings_initializer=unit)
            self.item_dense = keras.layers.Dense(DIM, kernel_initializer=unit)

        def call(self, ids):
            queries = self.query(self.history(ids))
            with shared_computation() as shared:
                candidates = shared.output(self.item_dense(self.items(tf.range(VOCAB))))
            return shared.scored_by(queries, tf.matmul(queries, candidates, transpose_b=True))

    model = CatalogueSoftmax()
    model(tf.constant(_pairs()[0][:2]))  # builds every layer
    return model


def test_full_softmax_over_a_shared_catalogue_tower_is_bounded_and_exact(fe):
    loss = fe.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    _assert_exact_and_bounded(fe, lambda: _catalogue_softmax(fe), loss=loss, batch=_pairs())


KERAS2 = pytest.mark.parametrize("fe", ["keras2"], indirect=True)  # two-tower models, TFRS, SyncBatchNormalization


@KERAS2
def test_full_softmax_over_the_item_table_is_bounded_and_exact(fe):
    _assert_exact_and_bounded(fe, FullSoftmax, loss=None, batch=_pairs(), registry=two_tower_registry())


# -- refused: mixing examples or keeping state --------------------------------------


@KERAS2
def test_sync_batch_normalization_is_refused(fe):
    _assert_refused(
        fe,
        lambda: _functional(fe, keras.layers.experimental.SyncBatchNormalization()),
        r"sync_batch_normalization.*SyncBatchNormalization",
    )


def test_batch_normalization_is_refused(fe):
    _assert_refused(fe, lambda: _functional(fe, fe.keras.layers.BatchNormalization()), "BatchNormalization")


def test_layer_that_stores_training_data_in_its_state_is_refused(fe):
    remembers = _zoo(fe.name).RemembersInputs
    _assert_refused(fe, lambda: _functional(fe, remembers(name="remembers")), r"'remembers' \(RemembersInputs\)")


def test_batch_centring_layer_is_refused(fe):
    centre = _zoo(fe.name).CentreOverBatch
    _assert_refused(fe, lambda: _functional(fe, centre(name="centre")), r"'centre' \(CentreOverBatch\) mixes examples")


@KERAS2
def test_custom_in_batch_negative_loss_is_refused(fe):
    _assert_refused(fe, InBatchSoftmax, r"InBatchSoftmax\.compute_loss.*mixes examples", loss=None, batch=_pairs())


@KERAS2
def test_retrieval_task_created_inside_compute_loss_is_refused(fe):
    message = _assert_refused(
        fe, RetrievalInsideComputeLoss, r"compute_loss.*mixes examples", loss=None, batch=_pairs()
    )
    assert "full item table" in message and "Retrieval" in message


def test_loss_function_that_mixes_examples_is_refused(fe):
    def centred_bce(y, logits):  # subtracts the batch mean of the logits
        return fe.keras.losses.binary_crossentropy(y, logits - tf.reduce_mean(logits), from_logits=True)

    _assert_refused(fe, lambda: _functional(fe), r"centred_bce.*mixes examples", loss=centred_bce)


# -- refused: subclasses the clipping rule cannot describe ---------------------------


@pytest.mark.parametrize("cls", ["ReadsTableItself", "ReadsTableTwice"], ids=["only", "besides_lookup"])
def test_embedding_subclass_reading_its_table_itself_is_refused(fe, cls):
    _assert_refused(fe, lambda: _functional(fe, table=cls), cls)


def test_embedding_subclass_overriding_lookup_is_refused(fe):
    message = _assert_refused(fe, lambda: _functional(fe, table="OverridesLookup"), "OverridesLookup.*`lookup`")
    assert "override `call` instead" in message


# -- what the refusal leaves behind ------------------------------------------------------

NORMS = [("keras2", "BatchNormalization"), ("keras2", "SyncBatchNormalization"), ("keras3", "BatchNormalization")]


@pytest.mark.parametrize(("fe", "norm"), NORMS, ids=[f"{f}-{n}" for f, n in NORMS], indirect=["fe"])
def test_refusal_leaves_every_variable_and_the_moving_statistics_untouched(fe, norm):
    # Old code: SyncBatchNormalization trained, and the per-example fallback's re-runs folded
    # single training rows into `moving_mean`.
    layers = fe.keras.layers
    norm = layers.experimental.SyncBatchNormalization if norm == "SyncBatchNormalization" else layers.BatchNormalization
    model = _functional(fe, norm(name="norm"))
    before = [v.numpy().copy() for v in model.variables]
    with pytest.raises(PrivacyContractError):
        _dp(fe, model, C).fit(tf.data.Dataset.from_tensors(_batch()), epochs=1, verbose=0)
    for v, b in zip(model.variables, before):
        np.testing.assert_array_equal(v.numpy(), b, err_msg=v.name)
    moving_mean = model.get_layer("norm").moving_mean.numpy()
    np.testing.assert_array_equal(moving_mean, np.zeros_like(moving_mean))
