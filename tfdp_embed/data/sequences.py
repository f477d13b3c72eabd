"""Next-item sequences: read sequence files, split leave-one-out, pad to a fixed length.

Two file layouts (`tfdp_embed.data.sequence_files`): the SASRec format
(Kang & McAuley 2018), used by DPFormer on Amazon Games, one interaction
"user item" per line, and the S3-Rec format, one user per line
"user item item ..."; 1-based integer ids, each user's items in time
order. Per user u with items s_1..s_n:

    test:        history s_1..s_{n-1} -> target s_n
    validation:  history s_1..s_{n-2} -> target s_{n-1}
    training:    input s_1..s_{n-3} -> targets s_2..s_{n-2} (next item at every position)

Users with fewer than 3 interactions have no validation/test item (SASRec
practice): all their items train and they are left out of evaluation.
Sequences keep their *last* `max_len` items and are LEFT-padded with 0
(item ids are 1..num_items, 0 is padding). One training sequence per user,
so one example = one user and DP on examples is user-level DP.

Example:
    >>> data = load_sequences("amazon_games.txt", max_len=50)
    >>> data.train_inputs.shape, data.num_items
    ((31013, 50), 23715)

References: Kang & McAuley 2018 (SASRec data split); DPFormer App. A.9.1
(same preprocessing, user-level DP).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from tfdp_embed._checks import check_int
from tfdp_embed.data.item_ids import ItemIdMap
from tfdp_embed.data.sequence_files import SequenceFormatError, read_sequence_file


@dataclasses.dataclass(frozen=True)
class SequenceData:
    """Leave-one-out split of per-user item sequences (all arrays int32).

    Attributes:
      num_users: users read (training examples: one per user).
      num_items: largest item id (ids are 1..num_items; 0 pads).
      max_len: L, the padded length.
      train_inputs: `[U, L]` left-padded training inputs.
      train_targets: `[U, L]` the next item at each input position (0 = no target).
      valid_histories: `[U_eval, L]` histories for the validation targets.
      valid_targets: `[U_eval]`.
      test_histories: `[U_eval, L]` (the validation item included).
      test_targets: `[U_eval]`.
      eval_users: `[U_eval]` the 1-based user ids that are evaluated.
      truncated_users: users whose training sequence was longer than L (oldest items cut).
      layout: the file layout read ("pairs" or "sequences"; "" when not read from a file).
      distinct_items: how many different item ids occur (num_items is the largest).
      user_ids: `[U]` the user id of each training row (None when not known).
    """

    num_users: int
    num_items: int
    max_len: int
    train_inputs: np.ndarray
    train_targets: np.ndarray
    valid_histories: np.ndarray
    valid_targets: np.ndarray
    test_histories: np.ndarray
    test_targets: np.ndarray
    eval_users: np.ndarray
    truncated_users: int
    layout: str = ""
    distinct_items: int | None = None
    user_ids: np.ndarray | None = None

    def item_user_counts(self) -> np.ndarray:
        """`[num_items + 1]` number of users whose training input contains each item (index 0: padding, 0).

        count_i = |{u : i in train_inputs[u]}|; p_i = count_i / num_users is
        the item frequency of DPFormer Claim 4.4 (P[item i in a sequence]).
        """
        return distinct_item_counts(self.train_inputs, self.num_items)

    def summary(self) -> dict:
        lengths = (self.train_inputs > 0).sum(axis=1)
        return {
            "users": self.num_users,
            "items": self.num_items,
            "max_len": self.max_len,
            "eval_users": len(self.eval_users),
            "train_targets": int((self.train_targets > 0).sum()),
            "mean_train_length": float(lengths.mean()),
            "truncated_users": self.truncated_users,
            "layout": self.layout,
            "distinct_items": self.distinct_items,
        }


def distinct_item_counts(sequences: np.ndarray, num_items: int) -> np.ndarray:
    """Per item, in how many rows of `sequences` `[U, L]` it occurs (each row counts once)."""
    sequences = np.asarray(sequences)
    rows = np.repeat(np.arange(sequences.shape[0]), sequences.shape[1])
    flat = sequences.reshape(-1)
    keep = flat > 0
    pairs = np.unique(np.stack([rows[keep], flat[keep]]), axis=1)
    return np.bincount(pairs[1], minlength=num_items + 1).astype(np.int64)


def read_user_sequences(path: str, *, layout: str = "auto") -> dict[int, list[int]]:
    """Reads a sequence file into `{user: [items in file order]}`.

    Args:
      path: text file in the SASRec "user item" pairs layout or the S3-Rec
        "user item item ..." layout (see `tfdp_embed.data.sequence_files`).
      layout: "auto" (from the first line), "pairs" or "sequences".

    Returns:
      dict from user id to its items, in the order of the file.

    Raises:
      FileNotFoundError: `path` does not exist.
      SequenceFormatError: a malformed line (the message names the file, line and field).
    """
    return read_sequence_file(path, layout=layout)[0]


def left_pad(items, max_len: int) -> np.ndarray:
    """The last `max_len` of `items`, left-padded with 0 to length `max_len` (int32)."""
    out = np.zeros(max_len, np.int32)
    tail = list(items)[-max_len:] if max_len > 0 else []
    if tail:
        out[max_len - len(tail) :] = tail
    return out


def split_sequences(users: dict[int, list[int]], *, max_len: int) -> SequenceData:
    """Leave-one-out split (last item test, second-last validation) and left padding.

    Args:
      users: `{user: items in time order}` (from `read_user_sequences`).
      max_len: L >= 2, the padded length of every sequence.

    Returns:
      A `SequenceData`.

    Raises:
      ValueError: `max_len` < 2 or no user.
    """
    max_len = check_int("max_len", max_len, minimum=2)
    if not users:
        raise ValueError("`users` is empty: no sequences to split.")
    order = sorted(users)
    num_items = max(max(items) for items in users.values())
    train_in, train_out = [], []
    valid_h, valid_t, test_h, test_t, eval_users = [], [], [], [], []
    truncated = 0
    for user in order:
        items = users[user]
        train = items[:-2] if len(items) >= 3 else items
        truncated += int(len(train) - 1 > max_len)
        train_in.append(left_pad(train[:-1], max_len))
        train_out.append(left_pad(train[1:], max_len))
        if len(items) >= 3:
            valid_h.append(left_pad(items[:-2], max_len))
            valid_t.append(items[-2])
            test_h.append(left_pad(items[:-1], max_len))
            test_t.append(items[-1])
            eval_users.append(user)

    def as_matrix(rows):
        return np.stack(rows).astype(np.int32) if rows else np.zeros((0, max_len), np.int32)

    return SequenceData(
        num_users=len(order),
        num_items=int(num_items),
        max_len=max_len,
        train_inputs=as_matrix(train_in),
        train_targets=as_matrix(train_out),
        valid_histories=as_matrix(valid_h),
        valid_targets=np.asarray(valid_t, np.int32),
        test_histories=as_matrix(test_h),
        test_targets=np.asarray(test_t, np.int32),
        eval_users=np.asarray(eval_users, np.int32),
        truncated_users=truncated,
        distinct_items=len({item for items in users.values() for item in items}),
        user_ids=np.asarray(order, np.int64),
    )


def user_item_keys(data: SequenceData) -> list[list[int]]:
    """Per user (training row), the item ids the model sees, most recent first: the keys of a vocabulary.

    The test target and history, the validation target and history, then the training targets and inputs,
    each newest first (items cut by `max_len` never reach the model and are not listed).
    """
    if data.user_ids is None:
        raise ValueError("`data.user_ids` is None: build the data with `split_sequences` / `load_sequences`.")
    eval_row = {int(user): j for j, user in enumerate(data.eval_users)}
    keys = []
    for row, user in enumerate(data.user_ids):
        parts = []
        j = eval_row.get(int(user))
        if j is not None:
            parts += [[data.test_targets[j]], data.test_histories[j][::-1], [data.valid_targets[j]]]
            parts += [data.valid_histories[j][::-1]]
        parts += [data.train_targets[row][::-1], data.train_inputs[row][::-1]]
        flat = np.concatenate([np.asarray(p, np.int64) for p in parts])
        keys.append([int(item) for item in flat if item > 0])
    return keys


def remap_items(data: SequenceData, id_map: ItemIdMap) -> SequenceData:
    """`data` in the dense ids of `id_map` (1..n); items the map does not hold become 0.

    Training inputs and targets keep their positions (an unknown input is masked like padding, an unknown
    target has no loss); evaluation histories drop unknown items and are left-padded again (what serving
    does); an unknown evaluation target stays 0 (`pipelines.sequential.evaluation` counts it as a miss).
    """

    def dense(array):
        return id_map.to_dense(array).astype(np.int32)

    def compact(histories):
        rows = [left_pad(row[row > 0], data.max_len) for row in dense(histories)]
        return np.stack(rows).astype(np.int32) if rows else np.zeros((0, data.max_len), np.int32)

    arrays = dict(
        train_inputs=dense(data.train_inputs),
        train_targets=dense(data.train_targets),
        valid_histories=compact(data.valid_histories),
        valid_targets=dense(data.valid_targets),
        test_histories=compact(data.test_histories),
        test_targets=dense(data.test_targets),
    )
    seen = np.unique(np.concatenate([a.ravel() for a in arrays.values()]))
    return dataclasses.replace(data, num_items=id_map.num_items, distinct_items=int((seen > 0).sum()), **arrays)


def load_sequences(path: str, *, max_len: int = 50, layout: str = "auto") -> SequenceData:
    """`split_sequences(read_user_sequences(path, layout=layout), max_len=max_len)`, with the layout read."""
    users, layout = read_sequence_file(path, layout=layout)
    return dataclasses.replace(split_sequences(users, max_len=max_len), layout=layout)


def training_dataset(data: SequenceData) -> tf.data.Dataset:
    """Unbatched `(inputs [L], targets [L])` per user, for `tfdp_embed.data.poisson_batches`."""
    return tf.data.Dataset.from_tensor_slices((data.train_inputs, data.train_targets))


def write_synthetic_sequences(
    path: str, *, num_users: int, num_items: int, min_length: int = 5, max_length: int = 12, seed: int = 0
) -> str:
    """Writes a small "user item" file with a learnable signal, for tests and notebooks.

    Each user walks the items with step +1 from a Zipf-like random start
    (popular items first), so the next item is predictable from the last one.

    Returns:
      `path`.
    """
    if num_users < 1 or num_items < 2 or not 3 <= min_length <= max_length:
        raise ValueError(
            f"Need num_users >= 1, num_items >= 2 and 3 <= min_length <= max_length; received "
            f"{num_users}, {num_items}, {min_length}, {max_length}."
        )
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, num_items + 1)
    weights /= weights.sum()
    with open(path, "w") as f:
        for user in range(1, num_users + 1):
            start = int(rng.choice(num_items, p=weights))
            length = int(rng.integers(min_length, max_length + 1))
            f.writelines(f"{user} {(start + t) % num_items + 1}\n" for t in range(length))
    return path


__all__ = [
    "SequenceData",
    "SequenceFormatError",
    "distinct_item_counts",
    "left_pad",
    "load_sequences",
    "read_user_sequences",
    "remap_items",
    "split_sequences",
    "training_dataset",
    "user_item_keys",
    "write_synthetic_sequences",
]
