"""The candidate catalogue: every item's features, and the map from item identifiers to catalogue rows.

A retrieval task scores queries against items computed by a candidate
tower from the items' features. The catalogue holds those features for
all N items as tensors with a leading axis of N (a tensor, or a dict of
tensors and ragged tensors, e.g. `{"item_id": [N], "genres": ragged [N, None]}`),
plus optional identifiers `[N]` (ints or strings) so that positives can be
named the way the data names them (TFRS' `candidate_ids`). Row i of every
feature describes the item with identifier `identifiers[i]` (or, without
identifiers, the item with index i).

The features are public: they describe the catalogue, not any user, and
the candidate tower is run over them (or over a data-independent sample of
them) every step.

Example:
    >>> catalogue = Catalogue({"movie_id": ids, "genres": tf.ragged.constant(genres)}, identifiers=ids)
    >>> catalogue.indices(tf.constant([50, 172]))   # rows of movies 50 and 172
"""

from __future__ import annotations

import numpy as np

from tfdp_embed.keras2._keras import tf


def _as_tensor(leaf, name: str):
    if isinstance(leaf, (tf.RaggedTensor, tf.Tensor)):
        return leaf
    array = np.asarray(leaf)
    if array.dtype == object:
        raise TypeError(
            f"Catalogue feature {name!r} must be a tensor, a ragged tensor or a rectangular array; "
            "received an object array (use tf.ragged.constant for variable-length features)."
        )
    return tf.constant(array)


def _leading(leaf) -> int | None:
    if isinstance(leaf, tf.RaggedTensor):
        return int(leaf.nrows())
    return None if leaf.shape.rank == 0 else leaf.shape[0]


class Catalogue:
    """All N candidate items' features, gathered by row, with identifiers mapped to rows.

    Args:
      features: a tensor or a (nested) dict of tensors / ragged tensors /
        arrays, each with leading axis N (the items).
      identifiers: optional int or string `[N]`, distinct: the ids the data uses
        for positives. Without them, positives are given as rows in [0, N).

    Raises:
      ValueError: an empty catalogue, features of different lengths, or
        repeated identifiers.
      TypeError: a feature that is not a tensor-like value.
    """

    def __init__(self, features, *, identifiers=None):
        flat = tf.nest.flatten(features)
        if not flat:
            raise ValueError("`candidates` holds no feature: give at least one [num_items, ...] tensor.")
        paths = [str(p) for p in _paths(features)]
        leaves = [_as_tensor(leaf, path) for leaf, path in zip(flat, paths)]
        sizes = {path: _leading(leaf) for path, leaf in zip(paths, leaves)}
        known = {size for size in sizes.values() if size is not None}
        if None in sizes.values() or len(known) != 1 or 0 in known:
            raise ValueError(
                f"Every catalogue feature needs the same leading size N >= 1 (one row per item); "
                f"received leading sizes {sizes}."
            )
        self.size = known.pop()
        self.features = tf.nest.pack_sequence_as(features, leaves)
        self.identifiers = None
        self._table = None
        if identifiers is not None:
            self._set_identifiers(identifiers)

    def _set_identifiers(self, identifiers) -> None:
        ids = np.asarray(identifiers.numpy() if isinstance(identifiers, tf.Tensor) else identifiers)
        if ids.shape != (self.size,):
            raise ValueError(f"`identifiers` needs one id per item, shape ({self.size},); received {ids.shape}.")
        if len(np.unique(ids)) != self.size:
            raise ValueError("`identifiers` must be distinct: each names one item of the catalogue.")
        if ids.dtype.kind in "iu":
            ids = ids.astype(np.int64)
        elif ids.dtype.kind in "SUO":
            ids = ids.astype(bytes)
        else:
            raise TypeError(f"`identifiers` must be ints or strings; received dtype {ids.dtype}.")
        self.identifiers = tf.constant(ids)
        self._table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(self.identifiers, tf.range(self.size, dtype=tf.int64)),
            default_value=-1,
        )

    def indices(self, candidate_ids) -> tf.Tensor:
        """int32 `[B]` catalogue rows of `candidate_ids` (identifiers, or rows when there are none).

        Raises:
          tf.errors.InvalidArgumentError (at run time): an id not in the catalogue.
        """
        ids = tf.reshape(tf.convert_to_tensor(candidate_ids), [-1])
        if self._table is not None:
            key_dtype = self.identifiers.dtype
            ids = tf.cast(ids, key_dtype) if key_dtype.is_integer and ids.dtype.is_integer else ids
            rows = self._table.lookup(ids)
            message = (
                "Retrieval: `candidate_ids` holds ids that are not in the catalogue's `identifiers`; first unknown:"
            )
            bad = tf.boolean_mask(ids, rows < 0)[:3]
        else:
            if not ids.dtype.is_integer:
                raise TypeError(
                    "Without catalogue `identifiers`, `candidate_ids` must be int rows of the catalogue; "
                    f"received dtype {ids.dtype.name}."
                )
            rows = tf.cast(ids, tf.int64)
            rows = tf.where((rows >= 0) & (rows < self.size), rows, -tf.ones_like(rows))
            message = f"Retrieval: `candidate_ids` must be catalogue rows in [0, {self.size}); first out of range:"
            bad = tf.boolean_mask(ids, rows < 0)[:3]
        check = tf.debugging.Assert(tf.reduce_all(rows >= 0), [message, bad])
        with tf.control_dependencies([check]):
            return tf.cast(rows, tf.int32)

    def gather(self, rows):
        """The features of catalogue rows `rows` (int `[n]`), same structure as `features`."""
        return tf.nest.map_structure(lambda leaf: tf.gather(leaf, rows), self.features)

    def ids_of(self, rows) -> tf.Tensor:
        """The identifiers of `rows` (the rows themselves, as int64, without identifiers)."""
        if self.identifiers is None:
            return tf.cast(rows, tf.int64)
        return tf.gather(self.identifiers, rows)


def _paths(structure) -> list:
    """Names of the leaves of a nested structure, for error messages."""
    if isinstance(structure, dict):
        return [
            f"{key}/{sub}" if sub != "" else str(key) for key in sorted(structure) for sub in _paths(structure[key])
        ]
    if isinstance(structure, (list, tuple)):
        return [f"{i}/{sub}" if sub != "" else str(i) for i, item in enumerate(structure) for sub in _paths(item)]
    return [""]


__all__ = ["Catalogue"]
