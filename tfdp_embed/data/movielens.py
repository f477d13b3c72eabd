"""MovieLens ratings as next-movie examples: timelines, a user split, (context, label) pairs.

The EANA next-movie task (EANA §4.1.1): each user's rated movies, sorted by
time, form a *timeline*; 80% of the users train and 20% test; an example is
one position p of a timeline: the movie at p is the **label**, the (up to)
`context_length` movies before it are the **context**.

Conventions (used by `tfdp_embed.models.two_tower` and the serving export):

* Item ids are MovieLens' own positive ids (ml-100k: 1..1682), unchanged.
  **Id 0 is reserved for padding** and is never an item; `num_items` is the
  largest id, so tables have `num_items + 1` rows and row 0 is never read.
* A context is int32 `[context_length]`, the movies at positions
  p - context_length .. p - 1 in time order, **left-aligned and padded with
  0 at the end** when p < context_length. Position 0 has no context and is
  never a label, so every context has at least one movie.
* Timelines are sorted by timestamp with a stable sort, so ratings with the
  same timestamp keep their order in the file (the tie-break).
* The user split is a seeded permutation of the sorted user ids:
  `round(test_fraction * users)` test users, the rest train.

What one "example" is (the privacy unit): a single (context, label) pair,
i.e. one position of one training timeline. `training_examples` returns
every such pair of the training users (position 1 .. len - 1); Poisson
batches over that pool pick a random set of positions at every step, which
is the paper's "a random position is the label, sampled on the fly" with
each position an independent unit. This is **example-level** privacy, as in
EANA: a DP epsilon computed over this pool protects one (context, label)
pair. A user with a timeline of length n contributes n - 1 labels and each
movie also appears in up to `context_length` contexts, so the guarantee for
a whole user is much weaker (group privacy over all their examples); it is
not user-level DP.

Test examples: every position 1 .. len - 1 of every test user's timeline
(deterministic, no sampling), so metrics do not depend on a seed.

Example:
    >>> ratings = read_ratings("../shared/data/movielens/ml-100k/u.data")
    >>> timelines = user_timelines(ratings)
    >>> train_users, test_users = split_users(sorted(timelines), test_fraction=0.2, seed=0)
    >>> contexts, labels = timeline_examples([timelines[u] for u in train_users], context_length=20)

References: Berlowitz et al., "EANA", RecSys 2022, §4.1.1; Harper &
Konstan, "The MovieLens Datasets", TiiS 2015 (u.data format).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import numpy as np

from tfdp_embed._checks import check_int

PADDING_ID = 0
"""The id that pads contexts; never an item."""

_FIELDS = ("user", "item", "rating", "timestamp")
_NUM_GENRES = 19  # u.genre: unknown, Action, ..., Western


class MovieLensFormatError(ValueError):
    """A ratings file that is not MovieLens `u.data` format; the message names file and line."""


@dataclasses.dataclass(frozen=True)
class Ratings:
    """All ratings of a file, in file order, as int64 numpy arrays of equal length."""

    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray
    timestamps: np.ndarray
    path: str = ""

    def __len__(self) -> int:
        return int(self.users.shape[0])

    @property
    def num_items(self) -> int:
        """The largest item id (tables need `num_items + 1` rows; row 0 is padding)."""
        return int(self.items.max())


def read_ratings(path: str | os.PathLike) -> Ratings:
    """Reads a MovieLens `u.data` file: tab-separated user, item, rating, timestamp per line.

    Args:
      path: the `u.data` file.

    Returns:
      `Ratings` in file order.

    Raises:
      FileNotFoundError: the file does not exist (the message says where the data should be).
      MovieLensFormatError: a line without exactly 4 tab-separated integers, an id < 1, or
        an empty file; the message names the file and the 1-based line.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"MovieLens ratings file {path!r} does not exist; expected ml-100k's u.data "
            "(user<TAB>item<TAB>rating<TAB>timestamp per line), e.g. "
            "../shared/data/movielens/ml-100k/u.data."
        )
    rows = []
    with open(path, encoding="utf-8", errors="strict") as f:
        try:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                rows.append(_parse_line(line, path, number))
        except UnicodeDecodeError as error:
            raise MovieLensFormatError(f"{path}: not a UTF-8 text file ({error}).") from None
    if not rows:
        raise MovieLensFormatError(f"{path}: no ratings (the file is empty).")
    table = np.asarray(rows, dtype=np.int64)
    return Ratings(table[:, 0], table[:, 1], table[:, 2], table[:, 3], path=path)


def read_item_genres(path: str | os.PathLike) -> tuple:
    """Reads a MovieLens `u.item` file: each movie's id and genres (item features for a candidate tower).

    A line is `id|title|release date|video date|url|g_0|...|g_18`, latin-1
    encoded, with one 0/1 flag per genre of `u.genre` (genre 0 is "unknown").

    Args:
      path: the `u.item` file.

    Returns:
      `(ids, genres)`: int64 `[N]` movie ids in file order and, per movie, the
      list of its genre indices (a movie with no flag set gets [0], "unknown").

    Raises:
      FileNotFoundError: the file does not exist.
      MovieLensFormatError: a line without an integer id and 19 0/1 flags
        (the message names the file and the 1-based line), or an empty file.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"MovieLens items file {path!r} does not exist; expected ml-100k's u.item.")
    ids, genres = [], []
    with open(path, encoding="latin-1") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            fields = line.rstrip("\r\n").split("|")
            flags = fields[-_NUM_GENRES:]
            if len(fields) < 5 + _NUM_GENRES or not fields[0].isdigit() or any(g not in ("0", "1") for g in flags):
                raise MovieLensFormatError(
                    f"{path}:{number}: expected 'id|title|date|video date|url' and {_NUM_GENRES} 0/1 genre "
                    f"flags separated by '|'; received {line.strip()[:80]!r}."
                )
            ids.append(int(fields[0]))
            genres.append([g for g, flag in enumerate(flags) if flag == "1"] or [0])
    if not ids:
        raise MovieLensFormatError(f"{path}: no movies (the file is empty).")
    return np.asarray(ids, np.int64), genres


def _parse_line(line: str, path: str, number: int) -> tuple:
    fields = line.rstrip("\r\n").split("\t")
    if len(fields) != 4:
        raise MovieLensFormatError(
            f"{path}:{number}: expected 4 tab-separated fields ({', '.join(_FIELDS)}); found "
            f"{len(fields)} in {line.strip()[:80]!r}."
        )
    values = []
    for name, text in zip(_FIELDS, fields):
        try:
            values.append(int(text))
        except ValueError:
            raise MovieLensFormatError(
                f"{path}:{number}: field {name!r} must be an integer; found {text[:40]!r}."
            ) from None
    if values[0] < 1 or values[1] < 1:
        raise MovieLensFormatError(
            f"{path}:{number}: user and item ids must be >= 1 (id 0 is reserved for padding); "
            f"found user {values[0]}, item {values[1]}."
        )
    return tuple(values)


def user_timelines(ratings: Ratings) -> dict:
    """Each user's items sorted by timestamp (stable: equal timestamps keep file order).

    Returns:
      `{user_id: int32 array of item ids}` for every user in `ratings`.
    """
    order = np.lexsort((np.arange(len(ratings)), ratings.timestamps, ratings.users))
    users, items = ratings.users[order], ratings.items[order].astype(np.int32)
    starts = np.flatnonzero(np.r_[True, users[1:] != users[:-1]])
    ends = np.r_[starts[1:], len(users)]
    return {int(users[s]): items[s:e] for s, e in zip(starts, ends)}


def split_users(user_ids: Sequence[int], *, test_fraction: float = 0.2, seed: int = 0) -> tuple:
    """A seeded split of users into (train, test), each a sorted int array.

    Args:
      user_ids: distinct user ids.
      test_fraction: share of users for testing, in (0, 1).
      seed: the permutation's seed (the split is part of the dataset, not of the noise).

    Returns:
      `(train_users, test_users)`, sorted int64 arrays; `round(test_fraction * n)` test users.

    Raises:
      ValueError: a fraction outside (0, 1), fewer than 2 users, or duplicate ids.
    """
    if not isinstance(test_fraction, (int, float)) or not 0 < test_fraction < 1:
        raise ValueError(f"`test_fraction` must be a number in (0, 1); received {test_fraction!r}.")
    users = np.asarray(sorted(user_ids), dtype=np.int64)
    if users.size < 2:
        raise ValueError(f"Splitting users needs at least 2 users; received {users.size}.")
    if np.unique(users).size != users.size:
        raise ValueError("`user_ids` must be distinct.")
    n_test = min(users.size - 1, max(1, round(test_fraction * users.size)))
    permuted = np.random.default_rng(seed).permutation(users)
    return np.sort(permuted[n_test:]), np.sort(permuted[:n_test])


def context_windows(timeline: np.ndarray, positions: np.ndarray, *, context_length: int) -> np.ndarray:
    """The contexts of `positions` in one timeline: int32 `[len(positions), context_length]`.

    Row j holds timeline[max(0, p - L) : p] for p = positions[j], left-aligned, 0-padded.
    """
    timeline = np.asarray(timeline, dtype=np.int32)
    positions = np.asarray(positions, dtype=np.int64)
    offsets = np.arange(context_length, dtype=np.int64)
    starts = np.maximum(positions - context_length, 0)
    index = starts[:, None] + offsets[None, :]
    valid = index < positions[:, None]
    out = np.where(valid, timeline[np.minimum(index, max(len(timeline) - 1, 0))], PADDING_ID)
    return out.astype(np.int32)


def timeline_examples(timelines: Sequence[np.ndarray], *, context_length: int) -> tuple:
    """Every (context, label) pair of the timelines: positions 1 .. len - 1 of each.

    Args:
      timelines: item-id arrays in time order.
      context_length: L >= 1, the most movies in a context.

    Returns:
      `(contexts, labels)`: int32 `[n, L]` (0-padded at the end) and int32 `[n]`,
      timelines in the given order, positions ascending.

    Raises:
      ValueError: L < 1.
    """
    context_length = check_int("context_length", context_length)
    contexts, labels = [], []
    for timeline in timelines:
        timeline = np.asarray(timeline, dtype=np.int32)
        if len(timeline) < 2:
            continue
        positions = np.arange(1, len(timeline))
        contexts.append(context_windows(timeline, positions, context_length=context_length))
        labels.append(timeline[1:])
    if not contexts:
        return np.zeros([0, context_length], np.int32), np.zeros([0], np.int32)
    return np.concatenate(contexts), np.concatenate(labels).astype(np.int32)


@dataclasses.dataclass(frozen=True)
class MovieLensData:
    """The split MovieLens task: timelines and the example pools.

    Attributes:
      train_timelines / test_timelines: `{user: items in time order}`.
      num_items: the largest item id (tables have num_items + 1 rows, row 0 = padding).
      num_users: users in the file (train + test).
      context_length: L.
      train_contexts, train_labels: every training (context, label) pair (the privacy units).
      test_contexts, test_labels: every test pair.
      path: the ratings file.
    """

    train_timelines: dict
    test_timelines: dict
    num_items: int
    num_users: int
    context_length: int
    train_contexts: np.ndarray
    train_labels: np.ndarray
    test_contexts: np.ndarray
    test_labels: np.ndarray
    path: str = ""

    @property
    def num_train_examples(self) -> int:
        return int(self.train_labels.shape[0])

    @property
    def num_test_examples(self) -> int:
        return int(self.test_labels.shape[0])

    def summary(self) -> dict:
        """Sizes for reports."""
        return {
            "path": self.path,
            "num_users": self.num_users,
            "train_users": len(self.train_timelines),
            "test_users": len(self.test_timelines),
            "num_items": self.num_items,
            "context_length": self.context_length,
            "train_examples": self.num_train_examples,
            "test_examples": self.num_test_examples,
        }


def load_movielens_data(
    path: str | os.PathLike,
    *,
    context_length: int = 20,
    test_fraction: float = 0.2,
    split_seed: int = 0,
) -> MovieLensData:
    """Reads `u.data`, builds timelines, splits users, and builds every example.

    Args:
      path: the ratings file (`u.data`).
      context_length: L, the most previous movies in a context.
      test_fraction: share of users held out for testing.
      split_seed: seed of the user split.

    Returns:
      `MovieLensData`.

    Raises:
      FileNotFoundError, MovieLensFormatError: unreadable input.
      ValueError: bad arguments, or no training example (every training timeline has one rating).
    """
    ratings = read_ratings(path)
    timelines = user_timelines(ratings)
    train_users, test_users = split_users(list(timelines), test_fraction=test_fraction, seed=split_seed)
    train = {int(u): timelines[int(u)] for u in train_users}
    test = {int(u): timelines[int(u)] for u in test_users}
    train_contexts, train_labels = timeline_examples(list(train.values()), context_length=context_length)
    test_contexts, test_labels = timeline_examples(list(test.values()), context_length=context_length)
    if train_labels.size == 0:
        raise ValueError(f"{os.fspath(path)}: no training example (every training user has fewer than 2 ratings).")
    return MovieLensData(
        train_timelines=train,
        test_timelines=test,
        num_items=ratings.num_items,
        num_users=len(timelines),
        context_length=context_length,
        train_contexts=train_contexts,
        train_labels=train_labels,
        test_contexts=test_contexts,
        test_labels=test_labels,
        path=os.fspath(path),
    )


__all__ = [
    "PADDING_ID",
    "MovieLensData",
    "MovieLensFormatError",
    "Ratings",
    "context_windows",
    "load_movielens_data",
    "read_item_genres",
    "read_ratings",
    "split_users",
    "timeline_examples",
    "user_timelines",
]
