"""Shared pieces of the user-level tests: skewed users, a model over units, one DP step, per-user references.

Hand-checkable sizes: 5 users with 1, 2, 3, 5 and 40 rows (the last one far
above k = 4), ids [rows, 3] in a 20-row table, labels [rows, 1].
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfdp_embed.clipping.layer_kinds import tf_variable
from tfdp_embed.data.user_batches import poisson_user_batches

K = 4
COUNTS = (1, 2, 3, 5, 40)
VOCAB = 20


def skewed_rows(counts=COUNTS, *, seed: int = 0, first_user: int = 100):
    """`((ids [rows, 3] int32, labels [rows, 1] float32), user ids [rows] int64)`; users first_user, first_user + 7, ..."""
    rng = np.random.default_rng(seed)
    users = np.repeat(first_user + 7 * np.arange(len(counts)), counts).astype(np.int64)
    ids = rng.integers(1, VOCAB, size=(len(users), 3)).astype(np.int32)
    labels = rng.integers(0, 2, size=(len(users), 1)).astype(np.float32)
    order = rng.permutation(len(users))  # users' rows interleaved, as in a ratings file
    return (ids[order], labels[order]), users[order]


def unit_model(fe, *, k: int = K, seed: int = 0, vocabulary: int = VOCAB, dim: int = 4):
    """ids [users, k, 3] -> DPEmbedding(mean) [users, k, dim] -> Dense(6, tanh) -> Dense(1): the same weights per front end."""
    keras = fe.keras
    inputs = keras.Input((k, 3), dtype="int32")
    rows = fe.DPEmbedding(vocabulary, dim, combiner="mean", name="items")(inputs)
    hidden = keras.layers.Dense(6, activation="tanh", name="hidden")(rows)
    model = keras.Model(inputs, keras.layers.Dense(1, name="logit")(hidden))
    rng = np.random.default_rng(seed)
    model.set_weights([rng.normal(0, 0.5, w.shape).astype("float32") for w in model.get_weights()])
    return model


def first_batch(examples, user_ids, *, k: int = K, q: float = 1.0, seed: int = 3):
    """The first batch `(ids [b, k, 3], labels [b, k, 1], weight [b, k])` of `poisson_user_batches`, as numpy."""
    batches, _ = poisson_user_batches(
        examples, user_ids=user_ids, max_examples_per_user=k, sampling_probability=q, seed=seed
    )
    return tuple(t.numpy() for t in next(iter(batches)))


def variables(model) -> list:
    return [tf_variable(v) for v in model.trainable_variables]


def row_logits(model, ids):
    """The unit model's layers on plain rows `[rows, 3]` (no unit axis): the non-private, example-level view."""
    hidden = model.get_layer("hidden")(model.get_layer("items")(ids))
    return tf.cast(model.get_layer("logit")(hidden), tf.float32)


def dp_step_sum(fe, model, batch, mechanism, *, expected_batch_size: float = 1.0) -> list:
    """One DP step on `batch` with SGD(lr=1): (before - after) * B, i.e. the noised clipped sum, per variable."""
    before = [v.numpy().copy() for v in variables(model)]
    dp = fe.dp_model(model, mechanism, batch=expected_batch_size, lr=1.0, loss=bce(fe))
    dp.fit(tf.data.Dataset.from_tensors(batch), epochs=1, verbose=0)
    return [(b - v.numpy()) * expected_batch_size for b, v in zip(before, variables(model))]


def bce(fe):
    return fe.keras.losses.BinaryCrossentropy(from_logits=True)


def user_loss(model, ids, labels, weight):
    """The per-user loss of one user's slot block: sum over its real rows of the rows' cross-entropy."""
    logits = tf.cast(model(ids[None]), tf.float32)
    per_row = tf.nn.sigmoid_cross_entropy_with_logits(labels[None], logits)[0, :, 0]
    return tf.reduce_sum(per_row * tf.cast(weight > 0, tf.float32))


def per_user_gradients(model, batch) -> list:
    """Brute force: one tape per user, on that user's rows alone; dense numpy gradients per variable."""
    out = []
    for ids, labels, weight in zip(*batch):
        with tf.GradientTape() as tape:
            loss = user_loss(model, ids, labels, weight)
        grads = tape.gradient(loss, variables(model))
        out.append([tf.convert_to_tensor(g).numpy() for g in grads])
    return out


def clipped_reference(grads: list, clip: float) -> list:
    """sum_u min(1, C / ||g_u||) g_u over the users' flattened gradients."""
    total = [np.zeros_like(g) for g in grads[0]]
    for user in grads:
        norm = np.sqrt(sum(float(np.sum(np.square(g))) for g in user))
        factor = min(1.0, clip / max(norm, 1e-12))
        total = [t + factor * g for t, g in zip(total, user)]
    return total


def global_norm(arrays) -> float:
    return float(np.sqrt(sum(float(np.sum(np.square(a))) for a in arrays)))
