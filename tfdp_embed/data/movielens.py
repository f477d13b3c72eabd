"""MovieLens ratings as next-movie examples: timelines, a user split, (context, label) pairs.

The EANA next-movie task (EANA §4.1.1): each user's rated movies, sorted by
time, form a *timeline*; 80% of the users train and 20% test; an example is
one position p of a timeline: the movie at p is the **label**, the (up to)
`context_length` movies before it are the **context**.

Conventions (used by `tfdp_embed.keras2.models.two_tower` and the serving export):

* Item ids inside the model are **dense**: the file's own movie ids (sparse
  in ml-latest / ML-20M, up to 6 digits) are numbered 1..n by an `ItemIdMap`
  built from the dataset's catalogue (`movies.csv` / `u.item` beside the
  ratings: public, independent of who rated what) or, without one, from the
  distinct ids of the ratings. `MovieLensData.item_ids` holds the map; the
  serving export looks original ids up in it. ml-100k's ids are already
  1..1682, so there dense id == original id. **Id 0 is reserved for
  padding** and is never an item; tables have `num_items + 1` rows (n + 1)
  and row 0 is never read.
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

Files: `read_ratings` (in `tfdp_embed.data.movielens_files`) reads ml-100k
`u.data`, ml-latest / ML-20M `ratings.csv` and ML-1M `ratings.dat`, or a
dataset directory holding one.

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
from typing import TYPE_CHECKING

import numpy as np

from tfdp_embed._checks import check_int
from tfdp_embed.data.item_ids import ItemIdMap
from tfdp_embed.data.movielens_files import (
    MovieLensFormatError,
    Ratings,
    catalogue_path,
    line_of_item,
    read_catalogue,
    read_item_genres,
    read_ratings,
)

if TYPE_CHECKING:  # tfdp_embed.data.vocabulary imports the planning package, which imports this package
    from tfdp_embed.data.vocabulary import DPVocabulary

PADDING_ID = 0
"""The id that pads contexts; never an item."""


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
    """The split MovieLens task: timelines and the example pools, in dense item ids.

    Attributes:
      train_timelines / test_timelines: `{user: dense item ids in time order}`.
      num_items: n, the number of dense item ids (tables have n + 1 rows, row 0 = padding).
      num_users: users in the file (train + test).
      context_length: L.
      train_contexts, train_labels: every training (context, label) pair (the privacy units).
      test_contexts, test_labels: every test pair.
      path: the ratings file read.
      item_ids: the map between original movie ids and dense ids 1..n.
      rated_items: distinct movies in the ratings (<= n when a catalogue numbers the items).
      test_positions: test positions of the ratings before movies outside `item_ids` were dropped (each a
        test example when every movie is in the map; the others cannot be ranked: misses).
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
    item_ids: ItemIdMap | None = None
    rated_items: int | None = None
    test_positions: int | None = None
    item_release: DPVocabulary | None = None

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
            "rated_items": self.rated_items,
            "item_ids": None if self.item_ids is None else self.item_ids.summary(),
            "context_length": self.context_length,
            "train_examples": self.num_train_examples,
            "test_examples": self.num_test_examples,
        }


def item_id_map(ratings: Ratings, *, catalogue: str | None = "auto") -> ItemIdMap:
    """The dense numbering of `ratings`' items: from a catalogue, or from the ratings' distinct ids.

    Args:
      ratings: what `read_ratings` returned.
      catalogue: "auto" (the catalogue beside the ratings file if there is one, see
        `movielens_files.CATALOGUES`), a catalogue file, or None (the distinct ids of the ratings).

    Raises:
      MovieLensFormatError: a rated movie the catalogue does not list (file and line named).
    """
    path = catalogue_path(ratings.path) if catalogue == "auto" else catalogue
    if path is None:
        return ItemIdMap.from_ids(ratings.items, source=f"distinct movie ids of {ratings.path}")
    ids = ItemIdMap(read_catalogue(path), source=f"catalogue {path}")
    unknown = ~ids.contains(ratings.items)
    if np.any(unknown):
        item = int(ratings.items[np.argmax(unknown)])
        raise MovieLensFormatError(
            f"{ratings.path}:{line_of_item(ratings, item)}: field 'item' {item} is not a movie of the catalogue "
            f"{path}; pass the matching catalogue, or none (items are then numbered from the ratings)."
        )
    return ids


def load_movielens_data(
    path: str | os.PathLike,
    *,
    context_length: int = 20,
    test_fraction: float = 0.2,
    split_seed: int = 0,
    catalogue: str | None = "auto",
    item_ids: ItemIdMap | None = None,
) -> MovieLensData:
    """Reads the ratings, numbers items densely, builds timelines, splits users, builds every example.

    Args:
      path: the ratings file (`u.data`, `ratings.csv`, `ratings.dat`) or a dataset directory.
      context_length: L, the most previous movies in a context.
      test_fraction: share of users held out for testing.
      split_seed: seed of the user split.
      catalogue: how items are numbered; see `item_id_map`.
      item_ids: a map to number items by instead (e.g. a DP vocabulary of the ratings): movies it does not
        hold are dropped from the timelines (after the user split, which stays the ratings' own).

    Returns:
      `MovieLensData` (dense item ids; `item_ids` maps them back).

    Raises:
      FileNotFoundError, MovieLensFormatError: unreadable input.
      ValueError: bad arguments, or no training example (every training timeline has one rating).
    """
    ratings = read_ratings(path)
    ids = item_id_map(ratings, catalogue=catalogue) if item_ids is None else item_ids
    original = user_timelines(ratings)
    train_users, test_users = split_users(list(original), test_fraction=test_fraction, seed=split_seed)

    def dense(user) -> np.ndarray:
        timeline = ids.to_dense(original[int(user)])
        return timeline[timeline != PADDING_ID].astype(np.int32)  # movies outside the map dropped

    train = {int(u): dense(u) for u in train_users}
    test = {int(u): dense(u) for u in test_users}
    train_contexts, train_labels = timeline_examples(list(train.values()), context_length=context_length)
    test_contexts, test_labels = timeline_examples(list(test.values()), context_length=context_length)
    if train_labels.size == 0:
        raise ValueError(f"{ratings.path}: no training example (every training user has fewer than 2 ratings).")
    return MovieLensData(
        train_timelines=train,
        test_timelines=test,
        num_items=ids.num_items,
        num_users=len(original),
        context_length=context_length,
        train_contexts=train_contexts,
        train_labels=train_labels,
        test_contexts=test_contexts,
        test_labels=test_labels,
        path=ratings.path,
        item_ids=ids,
        rated_items=int(np.unique(ratings.items).size),
        test_positions=int(sum(max(len(original[int(u)]) - 1, 0) for u in test_users)),
    )


__all__ = [
    "PADDING_ID",
    "MovieLensData",
    "MovieLensFormatError",
    "Ratings",
    "context_windows",
    "item_id_map",
    "load_movielens_data",
    "read_item_genres",
    "read_ratings",
    "split_users",
    "timeline_examples",
    "user_timelines",
]
