"""Dense item ids: a file's own (possibly sparse) item ids mapped to 1..n, 0 kept for padding.

Public datasets number items sparsely (a ml-latest-small copy has movieIds
up to 163,949 for 9,066 movies). An embedding table
indexed by the raw id would hold a row for every unused number: slower,
larger, and (under DP-SGD) noising rows that never occur. `ItemIdMap` sorts
the distinct original ids and numbers them 1..n, so tables have n + 1 rows
(row 0 is padding and never an item). The map ships with a model (the
MovieLens SavedModel looks original ids up in it) so that callers keep using
the ids of their files.

What the map reveals: the set of ids it holds. Built from a public catalogue
(MovieLens' `movies.csv` / `u.item`) it reveals nothing about the ratings;
built from the ratings themselves it lists every item somebody rated, which
DP does not protect: DP runs of the pipelines build it from a DP release of
the item set instead (`tfdp_embed.data.vocabulary.dp_vocabulary`).

Example:
    >>> ids = ItemIdMap.from_ids([10, 163949, 10, 3], source="ratings")
    >>> ids.to_dense([3, 10, 163949, 7]).tolist()     # 7 is unknown: 0 (the fallback)
    [1, 2, 3, 0]
    >>> ids.to_original([1, 2, 3]).tolist()
    [3, 10, 163949]
"""

from __future__ import annotations

import dataclasses

import numpy as np

UNKNOWN_ID = 0
"""The dense id an unknown original id maps to: the padding id (dropped from histories)."""


@dataclasses.dataclass(frozen=True)
class ItemIdMap:
    """Sorted distinct original item ids; original id `ids[j]` has dense id `j + 1`.

    Attributes:
      ids: int64 `[n]`, strictly increasing original ids (all >= 1: 0 pads requests).
      source: where the ids came from, in words (a catalogue file, or "ratings ...").
    """

    ids: np.ndarray
    source: str = ""

    def __post_init__(self):
        ids = np.asarray(self.ids)
        if ids.ndim != 1 or ids.size == 0 or ids.dtype.kind not in "iu":
            raise ValueError(f"`ids` must be a non-empty 1-D integer array; received {ids.dtype} {ids.shape}.")
        if np.any(np.diff(ids) <= 0) or ids[0] < 1:
            raise ValueError("`ids` must be strictly increasing original ids >= 1 (0 is the padding id).")

    @classmethod
    def from_ids(cls, ids, *, source: str = "") -> ItemIdMap:
        """The map of the distinct values of `ids` (any order, repeats allowed)."""
        return cls(np.unique(np.asarray(ids, dtype=np.int64)), source=source)

    @property
    def num_items(self) -> int:
        """n: dense ids are 1..n."""
        return int(self.ids.size)

    @property
    def is_identity(self) -> bool:
        """True when original ids are already 1..n (then dense id == original id)."""
        return bool(self.ids[-1] == self.ids.size)

    def to_dense(self, original) -> np.ndarray:
        """Dense ids (int32) of original ids; ids not in the map (and 0) give `UNKNOWN_ID`."""
        original = np.asarray(original, dtype=np.int64)
        position = np.searchsorted(self.ids, original)
        clipped = np.minimum(position, self.ids.size - 1)
        known = self.ids[clipped] == original
        return np.where(known, clipped + 1, UNKNOWN_ID).astype(np.int32)

    def contains(self, original) -> np.ndarray:
        """Boolean mask: which original ids are in the map."""
        return self.to_dense(original) != UNKNOWN_ID

    def to_original(self, dense) -> np.ndarray:
        """Original ids (int64) of dense ids in [1, n].

        Raises:
          ValueError: a dense id outside [1, n].
        """
        dense = np.asarray(dense, dtype=np.int64)
        if dense.size and (dense.min() < 1 or dense.max() > self.num_items):
            raise ValueError(
                f"Dense item ids must lie in [1, {self.num_items}]; received {dense.min()}..{dense.max()}."
            )
        return self.ids[dense - 1]

    def summary(self) -> dict:
        """For reports: how many ids, the largest original id, and where they came from."""
        return {"items": self.num_items, "largest_original_id": int(self.ids[-1]), "source": self.source}


def table_size_warning(*, table_rows: int, distinct_ids: int, what: str) -> str | None:
    """A warning when an embedding table has far more rows than the ids that occur (None otherwise).

    Rows beyond the ids in use cost time and memory and, under DP-SGD, get noise
    every step for nothing; more than twice the distinct ids (plus padding) is "far more".
    """
    if table_rows <= 2 * distinct_ids + 1:
        return None
    return (
        f"The {what} table has {table_rows} rows for {distinct_ids} distinct ids in the data "
        f"({table_rows / max(distinct_ids, 1):.1f}x): every unused row costs time and memory (and is noised "
        "under DP-SGD). Number the ids densely (1..n) before training."
    )


__all__ = ["UNKNOWN_ID", "ItemIdMap", "table_size_warning"]
