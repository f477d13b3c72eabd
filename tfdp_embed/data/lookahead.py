"""One-batch lookahead: pair each batch with the next batch's unique ids per table.

LazyDP (§5) adds a row's deferred noise right before the row is read again;
for that the train step must know which rows the *next* batch reads:

    element t: (features_t, labels_t) -> (features_t, labels_t, {table: unique(ids_fn(features_{t+1})[table])})

The last batch gets empty id vectors (nothing is read after it; the model is
flushed before it leaves training).

Implementation: the source is read exactly once. A naive
`zip(ds, ds.skip(1))` iterates the source twice (two file readers, double
I/O, and for a Poisson pipeline two *different* random batch streams, which
would be wrong). Instead `Dataset.scan` carries the previous element as its
state (as its flat component tensors) and emits (previous, ids of current); a sentinel element appended with
`concatenate` (zeros of the element's shape, never passed on) flushes the
last real batch with empty ids, and the first scan output (no previous
element yet) is filtered out. The state holds one batch: memory is one batch.

Example:
    >>> ds = with_lookahead(batches, lambda f: {"item_embedding": f["item_id"]})
    >>> for features, labels, lookahead in ds: ...

References: Lim et al., "LazyDP", ASPLOS 2024, §5 (lookahead and
aggregated noise sampling).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import tensorflow as tf

from tfdp_embed.data.provenance import register, registered_info


def with_lookahead(dataset: tf.data.Dataset, ids_fn: Callable[[object], Mapping[str, tf.Tensor]]) -> tf.data.Dataset:
    """Appends the next batch's unique int64 ids per table to every batch.

    Args:
      dataset: batched `(features, labels)` (or `(features, labels,
        sample_weight)`) elements; `features` is element[0].
      ids_fn: maps a batch's features to `{table_name: ids}`; ids of any
        shape or integer dtype, dense or ragged (flattened, made unique and
        cast to int64 here).

    Returns:
      A dataset of `(*element, lookahead)`, `lookahead[table]` an int64 `[k]`
      vector of unique ids of the next batch (`[0]` for the last batch). It
      carries `dataset`'s batching (`tfdp_embed.data.provenance`) when
      `dataset` came from a `tfdp_embed.data` sampler.

    Raises:
      ValueError: elements that are not tuples, or `ids_fn` not returning a
        non-empty dict of integer tensors.

    References: LazyDP (ASPLOS 2024) §5.
    """
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"`dataset` must be a `tf.data.Dataset`; received {type(dataset).__name__}.")
    if not callable(ids_fn):
        raise TypeError(f"`ids_fn` must be callable; received {ids_fn!r}.")
    spec = dataset.element_spec
    if not isinstance(spec, tuple) or len(spec) < 2:
        raise ValueError(
            f"`dataset` elements must be tuples `(features, labels[, sample_weight])`; received element spec {spec}."
        )
    sentinel = tf.nest.map_structure(_empty_like, spec)

    # Scan states must be plain tensors (tf.data's scan rejects ragged/sparse
    # state), so the carried element is kept as its flat component tensors.
    def rebuild(components):
        return tf.nest.pack_sequence_as(spec, list(components), expand_composites=True)

    def step(state, item):
        previous, has_previous = state
        components, is_real = item
        ids = _unique_ids(ids_fn, rebuild(components)[0])
        keep = tf.cast(is_real, tf.int32)
        ids = {name: v[: keep * tf.shape(v)[0]] for name, v in ids.items()}  # empty after the last batch
        return (components, tf.constant(True)), (has_previous, previous, ids)

    def with_ids(valid, previous, ids):
        return (*rebuild(previous), ids)

    # Named functions, not lambdas on one line: AutoGraph cannot tell such lambdas apart and warns on every call.
    sentinel_components = _flat(sentinel)
    flagged = dataset.map(_real).concatenate(tf.data.Dataset.from_tensors((sentinel_components, tf.constant(False))))
    paired = flagged.scan((sentinel_components, tf.constant(False)), step)
    out = paired.filter(_is_valid).map(with_ids)
    # The same batches, in order, each with ids appended: the batching of `dataset` carries over.
    info = registered_info(dataset)
    return out if info is None else register(out, info)


def _flat(element) -> tuple:
    return tuple(tf.nest.flatten(element, expand_composites=True))


def _real(*element):
    return _flat(element), tf.constant(True)


def _is_valid(valid, previous, ids):
    return valid


def _unique_ids(ids_fn: Callable[[object], Mapping[str, tf.Tensor]], features) -> dict:
    """`{table: unique int64 ids}` of `ids_fn(features)` (flattened; ragged and sparse ids by their values)."""
    ids = ids_fn(features)
    if not isinstance(ids, Mapping) or not ids:
        raise ValueError(f"`ids_fn` must return a non-empty dict table_name -> ids; returned {ids!r}.")
    out = {}
    for name, value in ids.items():
        if isinstance(value, tf.RaggedTensor):
            value = value.flat_values
        elif isinstance(value, tf.SparseTensor):
            value = value.values
        value = tf.convert_to_tensor(value)
        if not value.dtype.is_integer:
            raise ValueError(f"`ids_fn` must return integer ids; table {name!r} has dtype {value.dtype.name}.")
        out[name] = tf.unique(tf.cast(tf.reshape(value, [-1]), tf.int64)).y
    return out


def _empty_like(spec):
    """A zero-size value of `spec` (unknown dimensions become 0)."""
    if isinstance(spec, tf.TensorSpec):
        shape = [0 if d is None else d for d in spec.shape.as_list()] if spec.shape.rank is not None else [0]
        return tf.zeros(shape, spec.dtype)
    if isinstance(spec, tf.RaggedTensorSpec):
        shape = spec.shape.as_list()
        flat_shape = [0] + [0 if d is None else d for d in shape[spec.ragged_rank + 1 :]]
        value = tf.zeros(flat_shape, spec.dtype)
        for _ in range(spec.ragged_rank):
            value = tf.RaggedTensor.from_row_splits(value, tf.zeros([1], spec.row_splits_dtype), validate=False)
        return value
    if isinstance(spec, tf.SparseTensorSpec):
        rank = spec.shape.rank
        return tf.SparseTensor(
            tf.zeros([0, rank], tf.int64),
            tf.zeros([0], spec.dtype),
            [0 if d is None else d for d in spec.shape.as_list()],
        )
    raise ValueError(f"`with_lookahead` supports tensors, ragged and sparse tensors; received a component {spec}.")


__all__ = ["with_lookahead"]
