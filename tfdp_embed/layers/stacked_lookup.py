"""The lookup math of `StackedEmbedding`: several features' tables of one width in one variable.

Feature f (in the layer's feature order) owns rows `[o_f, o_f + V_f)` of one
table of `sum_f V_f` rows, `o_f = V_1 + ... + V_{f-1}`. A batch of one id
per example per feature, `{f: ids_f [batch]}`, is read as

    ids [batch, F] = stack_f(ids_f) + o_f,   rows = table[ids]  ([batch, F, dim]),

one gather instead of F, and the layer returns `{f: rows[:, f]}`. Each
feature's id is range-checked against its own `V_f` first, so an id that
would be out of range in the feature's own table is refused, never read from
the next feature's rows; row 0 of feature f (the reader's "missing" bucket)
is row `o_f` of the table, trained like any other row, as in an unstacked
table.

Because the features' rows are disjoint, the existing `DPEmbedding`
clipping rule (which records `lookup`, so it sees the offset ids `[batch, F]`)
gives the exact per-example norm over all the stacked tables, and every
noise mechanism sees one table variable: one read hook, catch-up, noise and
scatter per stack per step instead of one per feature. DP-FEST selects its
top-k over all the stack's buckets at once (DP-FEST App. B.1).

A front end's layer mixes `StackedLookup` in before its `DPEmbedding`
(`tfdp_embed.keras2.layers.stacked_embedding`, `tfdp_embed.keras3.layers`);
`stacked_arguments` checks its arguments and `stacked_layers` builds one
layer per width group, for either front end.

Example:
    >>> layer = StackedEmbedding({"C1": 10, "C2": 4}, output_dim=8)
    >>> out = layer({"C1": tf.constant([3, 9]), "C2": tf.constant([0, 3])})  # {"C1": [2, 8], "C2": [2, 8]}

References: TPU embedding "table stacking" (`tf.tpu.experimental.embedding`);
DP-FEST (Zhang et al., NeurIPS 2023) App. B.1; LazyDP (ASPLOS 2024) §5.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tfdp_embed.layers.asserts import string_assert
from tfdp_embed.traced_as_written import as_written


def check_vocabulary_sizes(vocabulary_sizes) -> dict:
    """`{feature: int rows}` checked: a non-empty mapping of feature names to positive ints."""
    if not isinstance(vocabulary_sizes, Mapping) or not vocabulary_sizes:
        raise ValueError(
            "`vocabulary_sizes` must be a non-empty mapping {feature name: rows of its table}; "
            f"received {vocabulary_sizes!r}."
        )
    sizes = {}
    for name, size in vocabulary_sizes.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"`vocabulary_sizes` keys must be feature names (non-empty str); received {name!r}.")
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size <= 0:
            raise ValueError(f"`vocabulary_sizes[{name!r}]` must be a positive int; received {size!r}.")
        sizes[name] = int(size)
    return sizes


def check_one_width(output_dim, features: Sequence[str]) -> int:
    """`output_dim` as one int: an int, or a per-feature mapping whose widths all agree.

    Raises:
      ValueError: a mapping with several widths (one stack holds tables of one
        width), missing features, or a width that is not a positive int.
    """
    if isinstance(output_dim, Mapping):
        missing = [f for f in features if f not in output_dim]
        if missing:
            raise ValueError(f"`output_dim` has no width for features {missing}; it has {sorted(output_dim)}.")
        widths = {f: output_dim[f] for f in features}
        if len(set(widths.values())) > 1:
            raise ValueError(
                f"A StackedEmbedding holds tables of one width; `output_dim` gives several: {widths}. Allowed: one "
                "width for all its features (group the features by width: `width_groups`)."
            )
        output_dim = widths[features[0]]
    if isinstance(output_dim, bool) or not isinstance(output_dim, (int, np.integer)) or output_dim <= 0:
        raise ValueError(f"`output_dim` must be a positive int; received {output_dim!r}.")
    return int(output_dim)


def width_groups(tables: Mapping[str, tuple]) -> list[tuple[Any, list[str]]]:
    """Features grouped by (width, dtype), each group in the features' order, groups by first feature.

    Args:
      tables: `{feature: (vocabulary_size, width)}` or `{feature: (vocabulary_size, width, dtype)}`.

    Returns:
      `[((width, dtype), [features])]`: one `StackedEmbedding` per group.

    Example:
        >>> width_groups({"C1": (10, 8), "C2": (5, 4), "C3": (7, 8)})
        [((8, 'float32'), ['C1', 'C3']), ((4, 'float32'), ['C2'])]
    """
    groups: dict = {}
    for feature, spec in tables.items():
        key = (int(spec[1]), str(spec[2]) if len(spec) > 2 else "float32")
        groups.setdefault(key, []).append(feature)
    return list(groups.items())


def stack_name(width: int, dtype: str = "float32") -> str:
    """The default layer name of a width group's stack: `embedding_stack_{width}` (dtype appended unless float32)."""
    return f"embedding_stack_{width}" + ("" if dtype == "float32" else f"_{dtype}")


_NOT_TAKEN = ("combiner", "hash_ids", "vocabulary_size")


def stacked_arguments(vocabulary_sizes, output_dim, kwargs: dict) -> tuple[dict, int]:
    """`(sizes, width)` of a `StackedEmbedding`, checked; removes the arguments it does not take from `kwargs`.

    Raises:
      ValueError: bad sizes, several widths, or a `combiner`/`hash_ids`/`vocabulary_size` argument.
    """
    for key in _NOT_TAKEN:
        if kwargs.pop(key, None) not in (None, False):
            raise ValueError(
                f"StackedEmbedding takes no `{key}`: each feature gives one int id per example, already "
                "bucketed (use one DPEmbedding per feature for pooled or hashed ids)."
            )
    sizes = check_vocabulary_sizes(vocabulary_sizes)
    return sizes, check_one_width(output_dim, list(sizes))


def stacked_layers(layer_class, tables: Mapping[str, tuple], *, name_fn=None, **kwargs) -> list:
    """One `layer_class` (a front end's `StackedEmbedding`) per width group of `tables` (`width_groups`).

    Args:
      layer_class: the front end's `StackedEmbedding`.
      tables: `{feature: (vocabulary_size, width)}` (or with a dtype third).
      name_fn: `name_fn(width, features)` -> layer name; default `embedding_stack_{width}`
        (with the dtype appended for a group that is not float32).
      **kwargs: passed to every layer.
    """
    layers = []
    for (width, dtype), features in width_groups(tables):
        name = name_fn(width, features) if name_fn is not None else stack_name(width, dtype)
        sizes = {f: int(tables[f][0]) for f in features}
        layers.append(layer_class(sizes, width, name=name, dtype=dtype, **kwargs))
    return layers


class StackedLookup:
    """The Keras-free part of `StackedEmbedding`: per-feature ids in, offset ids through `lookup`, per-feature rows out.

    Mixed in before a front end's `DPEmbedding`: the layer's `__init__` passes
    the stack's total rows to `DPEmbedding.__init__`, then calls `_init_stack`.
    """

    # Provided by `EmbeddingLookup` / the layer; declared for type checkers.
    name: str
    output_dim: int
    lookup: Any

    def _init_stack(self, vocabulary_sizes: Mapping[str, int]) -> int:
        """Checks and stores the features' sizes (after the layer's `__init__`); returns the stack's total rows."""
        sizes = check_vocabulary_sizes(vocabulary_sizes)
        self.features = tuple(sizes)
        self.vocabulary_sizes = dict(sizes)
        self.offsets = dict(zip(self.features, np.cumsum([0] + list(sizes.values()))[:-1].tolist()))
        return int(sum(sizes.values()))

    def feature_rows(self, feature: str) -> tuple[int, int]:
        """`(offset, rows)` of `feature`'s table inside the stack: its rows are `[offset, offset + rows)`."""
        if feature not in self.offsets:
            raise KeyError(
                f"StackedEmbedding {self.name!r} has no feature {feature!r}; it stacks {list(self.features)}."
            )
        return self.offsets[feature], self.vocabulary_sizes[feature]

    @as_written  # straight-line TF: AutoGraph would only slow the trace (0.8 s for 14 stacks)
    def stack_ids(self, features: Mapping) -> tf.Tensor:
        """int64 `[batch, F]`: each feature's ids `[batch]`, range-checked against its own table, plus its offset.

        What `lookup` reads and the clipping rule records; LazyDP's lookahead
        for the stack takes these ids too. Extra entries of `features` are ignored.

        Raises:
          ValueError: a feature missing from `features`, or ids not of shape `[batch]`.
          tf.errors.InvalidArgumentError: at run time, an id outside `[0, V_f)` of its feature.
        """
        if not isinstance(features, Mapping):
            raise TypeError(
                f"StackedEmbedding {self.name!r} takes a dict {{feature: ids [batch]}} for features "
                f"{list(self.features)}; received {type(features).__name__}."
            )
        missing = [f for f in self.features if f not in features]
        if missing:
            raise ValueError(
                f"StackedEmbedding {self.name!r}: the input has no ids for features {missing}; it needs "
                f"{list(self.features)} (received {sorted(features)})."
            )
        columns = []
        for feature in self.features:
            ids = tf.convert_to_tensor(features[feature])
            if not ids.dtype.is_integer or ids.shape.rank != 1:
                raise ValueError(
                    f"StackedEmbedding {self.name!r}: feature {feature!r} needs integer ids of shape [batch] (one "
                    f"id per example); received dtype {ids.dtype.name}, shape {ids.shape}."
                )
            columns.append(tf.cast(ids, tf.int64))
        ids = tf.stack(columns, axis=1)
        with tf.control_dependencies([self._range_check(ids)]):
            stacked = ids + tf.constant([self.offsets[f] for f in self.features], tf.int64)
        # Remembered (weakly, past Keras' attribute tracking) so that `lookup` and the clipping rule,
        # handed this very tensor, do not check it again (`_from_stack_ids`).
        object.__setattr__(self, "_stacked_ids", weakref.ref(stacked))
        return stacked

    def _from_stack_ids(self, ids) -> bool:
        """True when `ids` is the tensor `stack_ids` last returned: range-checked, column f in feature f's rows."""
        last = getattr(self, "_stacked_ids", None)
        return last is not None and last() is ids

    @as_written
    def bucket_ids(self, ids, *, check_range: bool = True):
        """`DPEmbedding.bucket_ids`, without the range check for the ids `stack_ids` returned (checked per feature)."""
        return super().bucket_ids(ids, check_range=check_range and not self._from_stack_ids(ids))  # type: ignore[misc]

    def _range_check(self, ids: tf.Tensor):
        """Asserts each column f of `ids` `[batch, F]` lies in `[0, V_f)`; the message shows each column's range.

        Two reductions per column: its smallest and largest id are the ones
        that can be out of range, and they are what the message shows (one
        `Assert` op, no `tf.cond`: `string_assert`).
        """
        smallest, largest = tf.reduce_min(ids, axis=0), tf.reduce_max(ids, axis=0)  # [F]; empty batch: passes
        bad = tf.logical_or(smallest < 0, largest >= tf.constant(list(self.vocabulary_sizes.values()), tf.int64))
        message = (
            f"StackedEmbedding {self.name!r}: each feature's ids must lie in [0, its vocabulary size) "
            f"({self.vocabulary_sizes}); an offending feature is one whose smallest or largest id is out of "
            f"range. Features {list(self.features)}, their smallest and largest ids:"
        )
        return string_assert(tf.logical_not(tf.reduce_any(bad)), [message, smallest, largest])

    def checked_distinct_rows(self, ids) -> tf.Tensor:
        """`ids` `[batch, F]`, asserted to hold feature f's rows in column f: no example reads a row twice.

        The clipping rule's premise for skipping the (example, row) grouping
        (`tfdp_embed.clipping.embedding`); the ids `stack_ids` returned hold it by construction
        and are returned as they are, with no op added.
        """
        if self._from_stack_ids(ids):
            return ids
        ids = tf.convert_to_tensor(ids)
        low = tf.constant([self.offsets[f] for f in self.features], ids.dtype)
        high = low + tf.constant([self.vocabulary_sizes[f] for f in self.features], ids.dtype)
        inside = tf.logical_and(ids >= low, ids < high) if ids.shape.rank == 2 else tf.constant(False)
        check = tf.debugging.Assert(
            tf.reduce_all(inside),
            [
                f"StackedEmbedding {self.name!r}: `lookup` needs ids [batch, {len(self.features)}] with column f in "
                "feature f's rows (`stack_ids`); call the layer on the dict of features instead."
            ],
        )
        with tf.control_dependencies([check]):
            return tf.identity(ids)

    def call(self, features):
        """`{feature: rows [batch, dim]}`: one lookup of the offset ids `[batch, F]`, split per feature."""
        rows = self.lookup(self.stack_ids(features))  # [batch, F, dim]
        return dict(zip(self.features, tf.unstack(rows, num=len(self.features), axis=1)))

    def _stack_config(self, config: dict) -> dict:
        """The layer's `get_config` for a stack: the features' sizes, not the derived total or lookup options."""
        for key in _NOT_TAKEN:
            config.pop(key, None)
        return {**config, "vocabulary_sizes": dict(self.vocabulary_sizes), "output_dim": self.output_dim}


__all__ = [
    "StackedLookup",
    "check_one_width",
    "check_vocabulary_sizes",
    "stack_name",
    "stacked_arguments",
    "stacked_layers",
    "width_groups",
]
