"""Poisson batches over users, for user-level DP: each sampled user brings at most k of their examples.

The privacy unit is the user: neighbouring datasets differ by one user's
whole history. Each step samples every user independently, and each
sampled user contributes a uniformly random subset of at most k rows:

    P[user u in batch t] = q, independently over u and t;   q = expected users per batch / U
    rows of u in batch t = min(k, n_u) of u's n_u rows, uniformly without replacement

The batch packs each sampled user's rows along a second axis: every
component `[rows, ...]` of the examples becomes `[users, k, ...]`, padded
with zeros, and a third element, the sample weight `[users, k]`, is k on a
user's rows and 0 on padding. One user is then one "example" of the
per-example machinery (`DPModel`'s per-example loss, ghost norms, clip
factors, DP-AdaFEST's contribution counts, the rows LazyDP and EANA see):
Keras' loss takes the mean over the non-batch axes, so the weight k makes a
user's loss the *sum* of their rows' losses,

    loss_u = sum_{r < k} mask_ur * loss(x_ur, y_ur),

and a user's gradient, clipped to C, is the gradient of that sum. The
model must take the unit axis (`keras.Input((k, ...))`; Dense,
LayerNormalization and `DPEmbedding` with ids `[users, k]` or, pooled,
`[users, k, n]` have exact rules for it: `tfdp_embed.contract.unit_axis`
refuses the others). Accounting is unchanged in form, with q, N and delta
counted in users (`BatchingInfo.num_examples` is the number of users).

Padding rows are zeros: with weight 0 they add nothing to any loss or
gradient, and they read row 0 of a table, inside their own user's
contribution (never another user's data).

Example:
    >>> batches, info = poisson_user_batches((features, labels), user_ids=user_ids,
    ...     max_examples_per_user=32, sampling_probability=64 / num_users)
    >>> dp = DPModel(model, mechanism=mechanism, expected_batch_size=info.expected_batch_size)
    >>> dp.fit(batches, epochs=10)   # privacy_report(batching=dp.batching) states privacy_unit "user"

References: Chua et al., "Mind the Privacy Unit! User-Level Differential
Privacy for Language Model Fine-Tuning", COLM 2024 (user-wise DP-SGD with
per-user example sampling); Abadi et al. 2016 §3.1 (Poisson lots).
"""

from __future__ import annotations

import numbers

import numpy as np
import tensorflow as tf

from tfdp_embed._rng import make_generator
from tfdp_embed.data.poisson import _MASK_THRESHOLD, _check_cap, _check_q, _poisson_indices, _poisson_info, _truncate
from tfdp_embed.data.provenance import BatchingInfo, register
from tfdp_embed.data.tuning import without_autotuning

USER = "user"


def poisson_user_batches(
    examples,
    *,
    user_ids,
    max_examples_per_user: int,
    sampling_probability: float,
    seed: int | None = None,
    max_batch_size: int | None = None,
    num_users: int | None = None,
) -> tuple[tf.data.Dataset, BatchingInfo]:
    """Exactly Poisson-sampled batches of users, each user packed as `[k, ...]` rows with a mask.

    P[user u in batch t] = q independently; a sampled user's rows: min(k, n_u) drawn uniformly without replacement.

    Args:
      examples: `(features, labels)`: nests of arrays / tensors whose leading
        dimension indexes the rows (examples), fully defined per-row shapes.
      user_ids: integer `[rows]`, the user of each row (any integers: ids need not be dense).
      max_examples_per_user: k >= 1, the most rows a user contributes to one step.
      sampling_probability: q in (0, 1], per user (expected users per batch / users).
      seed: int for reproducible batches, None for OS entropy.
      max_batch_size: optional cap on the users of a batch (truncation, counted as in `poisson_batches`).
      num_users: optional U, checked: every user must have at least one row.

    Returns:
      `(batches, info)`: round(1/q) batches `(features [b, k, ...], labels [b, k, ...], sample_weight [b, k])`
      per iteration, and the `BatchingInfo` (`privacy_unit="user"`, N = users).

    Raises:
      ValueError: missing, non-integer or misaligned user ids, a user with no rows, bad k / q / cap.

    References: Chua et al. 2024 (user-level DP-SGD); Abadi et al. 2016 §3.1.
    """
    q = _check_q(sampling_probability)
    k = _check_k(max_examples_per_user)
    cap = _check_cap(max_batch_size)
    data = _rows(examples)
    order, starts, counts = _group_by_user(user_ids, _num_rows(data), num_users)
    data = tf.nest.map_structure(lambda t: tf.gather(t, order), data)  # each user's rows contiguous
    info = _user_info(len(counts), q, k, cap, seed, num_rows=len(order))
    generator = make_generator(seed, seed_as="counter")
    starts, counts = tf.constant(starts, tf.int64), tf.constant(counts, tf.int64)

    def make_batch(_):
        seed_ = generator.make_seeds(1)[:, 0]
        users = _poisson_indices(seed_, info.num_examples, q)
        if cap is not None:
            users = _truncate(users, seed_, cap, info, ordered=q < _MASK_THRESHOLD)
        rows = unit_rows(tf.random.experimental.stateless_fold_in(seed_, 3), starts, counts, users, k)
        features, labels = (tf.nest.map_structure(lambda t: _pack(t, rows, k), part) for part in data)
        weight = float(k) * tf.cast(tf.sequence_mask(rows.row_lengths(), k), tf.float32)
        return features, labels, weight

    batches = tf.data.Dataset.range(info.batches_per_epoch).map(make_batch)  # sequential: RNG order fixed
    return register(without_autotuning(batches), info), info


def unit_rows(seed, starts, counts, users, k: int) -> tf.RaggedTensor:
    """Ragged `[users, <= k]` row positions: for each user, min(k, n_u) of its rows, uniformly without replacement.

    The rows of user u are starts[u] .. starts[u] + counts[u] - 1. Every row of the
    sampled users gets a uniform key; sorting by key, then stably by user, orders
    each user's rows uniformly at random, and the first k of each are kept.
    """
    first, sizes = tf.gather(starts, users), tf.gather(counts, users)
    candidates = tf.ragged.range(first, first + sizes)
    owner = candidates.value_rowids()
    keys = tf.random.stateless_uniform(tf.shape(owner), seed=seed, dtype=tf.float64)
    by_key = tf.argsort(keys, stable=True)
    order = tf.gather(by_key, tf.argsort(tf.gather(owner, by_key), stable=True))
    owner = tf.gather(owner, order)  # ascending, each user's rows in random order
    rank = tf.range(tf.size(owner, out_type=tf.int64)) - tf.gather(candidates.row_starts(), owner)
    keep = rank < k
    chosen = tf.boolean_mask(tf.gather(candidates.flat_values, order), keep)
    return tf.RaggedTensor.from_value_rowids(chosen, tf.boolean_mask(owner, keep), nrows=tf.size(users, tf.int64))


def _pack(values: tf.Tensor, rows: tf.RaggedTensor, k: int) -> tf.Tensor:
    """`values[rows]` as `[users, k, ...]`, zeros where a user has fewer than k rows."""
    gathered = tf.RaggedTensor.from_row_splits(tf.gather(values, rows.flat_values), rows.row_splits)
    shape = tf.TensorShape([None, k]).concatenate(values.shape[1:])
    return gathered.to_tensor(default_value=tf.zeros([], values.dtype), shape=shape)


def _group_by_user(user_ids, num_rows: int, num_users) -> tuple:
    """(row order grouping users, each user's first position in it, each user's row count), checked."""
    ids = _check_user_ids(user_ids, num_rows)
    order = np.argsort(ids, kind="stable")
    _, starts, counts = np.unique(ids[order], return_index=True, return_counts=True)
    if num_users is not None and num_users != len(counts):
        raise ValueError(
            f"`num_users`={num_users!r} but the rows name {len(counts)} distinct users: a unit with zero "
            "examples would count in q and N without being sampled; pass only users that have rows."
        )
    return order, starts.astype(np.int64), counts.astype(np.int64)


def _check_user_ids(user_ids, num_rows: int) -> np.ndarray:
    """`user_ids` as an int64 numpy vector, one per row: missing, non-integer or misaligned ids are refused."""
    if user_ids is None:
        raise ValueError("`user_ids` is required: user-level sampling needs the user of every row.")
    values = user_ids.numpy() if hasattr(user_ids, "numpy") else np.asarray(user_ids)
    if values.dtype.kind not in "iu" or values.ndim != 1:
        raise ValueError(
            f"`user_ids` must be a 1-D array of integers (no missing values); received dtype {values.dtype} "
            f"and shape {values.shape}."
        )
    if len(values) != num_rows:
        raise ValueError(f"`user_ids` has {len(values)} entries but the examples have {num_rows} rows.")
    if num_rows == 0:
        raise ValueError("`examples` is empty: user-level sampling needs at least one row.")
    return values.astype(np.int64)


def _rows(examples) -> tuple:
    """`(features, labels)` as nests of tensors with a common leading (row) dimension."""
    if not isinstance(examples, tuple) or len(examples) != 2:
        raise ValueError(
            f"`examples` must be a tuple `(features, labels)` of arrays with one row per example; received "
            f"{type(examples).__name__}."
        )
    data = tf.nest.map_structure(tf.convert_to_tensor, examples)
    leading = {t.shape[0] if t.shape.rank else None for t in tf.nest.flatten(data)}
    if len(leading) != 1 or None in leading:
        raise ValueError(
            f"`examples` components must share one leading (row) dimension; received {sorted(leading, key=str)}."
        )
    return data


def _num_rows(data) -> int:
    return int(tf.nest.flatten(data)[0].shape[0])


def _check_k(k) -> int:
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
        raise ValueError(f"`max_examples_per_user` must be an int >= 1; received {k!r}.")
    return int(k)


def _user_info(num_users: int, q: float, k: int, cap, seed, *, num_rows: int) -> BatchingInfo:
    info = _poisson_info(num_users, q, cap, seed, streaming=False, batches_per_pass=None)
    info.sampler = "in_memory_users"
    info.privacy_unit, info.max_examples_per_unit, info.num_rows = USER, k, num_rows
    return info


__all__ = ["USER", "poisson_user_batches", "unit_rows"]
