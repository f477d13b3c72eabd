"""The lookup math of `DPEmbedding`, shared by the tf-keras and the Keras 3 front end.

Each front end's `DPEmbedding` is this mixin on its own `keras.layers.Layer`
(the mixin owns `call`, `lookup`, `occurrences` and the read hook; the layer
owns the weight, the initializer and the config). Below, as for either layer:

`DPEmbedding`: an embedding table whose gradient stays sparse under DP.

The layer looks rows up with `tf.gather`, so the table's gradient is a
`tf.IndexedSlices` over the rows a batch touches. It also exposes the
lookup as data (`occurrences`): which row each id reads, which output
segment it lands in, with which combiner weight. The per-example clipping
registry (`tfdp_embed.clipping`) computes exact per-example gradient norms
from that and the output gradient, and builds the clipped sum of gradients
as an `IndexedSlices` over touched rows: a dense `[batch, vocab, dim]`
tensor is never built.

Noise mechanisms that defer noise (LazyDP) install a *read hook* with
`set_read_hook`: it runs on the bucket ids right before rows are read, so a
row is always brought up to date before anybody reads it (a hook with a
`gather` attribute also reads the rows for the lookup, gradient included).
The hook is training machinery: a SavedModel trace (`tf.saved_model.save`,
Keras `save`) never runs it, so no mechanism op or state is exported.
Reads of the table outside the layer are guarded by the mechanism instead
(`tfdp_embed.read_guard`).

Subclass it by overriding `call` around `self.lookup(ids)` (e.g.
`return 10 * self.lookup(ids)`): the clipping taps record `lookup`, so the
per-example norms include what `call` adds. Read rows only through
`lookup`; `DPModel` refuses a table read another way.

Example:
    >>> layer = DPEmbedding(vocabulary_size=1000, output_dim=8, combiner="mean")
    >>> pooled = layer(tf.ragged.constant([[1, 2, 2], [7]]))  # shape [2, 8]
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tfdp_embed import front_end, read_guard
from tfdp_embed.layers.asserts import string_assert
from tfdp_embed.traced_as_written import as_written, user_code

try:  # TensorFlow's flag for "a SavedModel is being traced" (no public accessor)
    from tensorflow.python.saved_model.save_context import in_save_context as _in_save_context
except ImportError:  # pragma: no cover

    def _in_save_context() -> bool:
        return False


_COMBINERS = (None, "sum", "mean", "sqrtn")


@dataclasses.dataclass(frozen=True)
class EmbeddingOccurrences:
    """Every id a batch looks up, as flat tensors.

    Attributes:
      ids: int32/int64 `[n]` table rows read (after hashing), one per occurrence.
      segments: int32 `[n]` the output row (segment) each occurrence adds into.
      weights: float32 `[n]` combiner weight of each occurrence
        (1 for sum and no combiner, 1/len for mean, 1/sqrt(len) for sqrtn).
      num_segments: scalar int32, number of output rows (flattened output).
      segment_examples: int32 `[num_segments]` the example each segment belongs to.
      batch_size: scalar int32.
    """

    ids: tf.Tensor
    segments: tf.Tensor
    weights: tf.Tensor
    num_segments: tf.Tensor
    segment_examples: tf.Tensor
    batch_size: tf.Tensor


def _pooled(ids, segments, weights, batch) -> EmbeddingOccurrences:
    """Occurrences whose segments are the examples (a combiner pools each example's ids)."""
    return EmbeddingOccurrences(
        ids=ids,
        segments=segments,
        weights=weights,
        num_segments=batch,
        segment_examples=tf.range(batch),
        batch_size=batch,
    )


class EmbeddingLookup:
    """The Keras-free part of `DPEmbedding`: ids -> rows, occurrences and the read hook.

    A front end's layer mixes it in before its `keras.layers.Layer`, calls
    `_init_lookup` in `__init__`, and exposes the table as `embeddings`, a
    `tf.Variable` (Keras 3: the `tf.Variable` inside its `keras.Variable`).
    """

    # Provided by the front end's layer (a Keras `Layer` and its weight); declared for type checkers.
    name: str
    compute_dtype: Any
    embeddings: Any

    def _init_lookup(self, vocabulary_size, output_dim, *, combiner, hash_ids) -> None:
        """Checks and stores the lookup's arguments (the layer's `__init__` calls it)."""
        if isinstance(vocabulary_size, bool) or not isinstance(vocabulary_size, int) or vocabulary_size <= 0:
            raise ValueError(f"`vocabulary_size` must be a positive int; received {vocabulary_size!r}.")
        if isinstance(output_dim, bool) or not isinstance(output_dim, int) or output_dim <= 0:
            raise ValueError(f"`output_dim` must be a positive int; received {output_dim!r}.")
        if combiner not in _COMBINERS:
            raise ValueError(f"`combiner` must be one of {_COMBINERS}; received {combiner!r}.")
        self.vocabulary_size = vocabulary_size
        self.output_dim = output_dim
        self.combiner = combiner
        self.hash_ids = bool(hash_ids)
        self._read_hook: Callable[[tf.Tensor], None] | None = None

    def _lookup_config(self) -> dict:
        """The lookup's part of the layer's `get_config`."""
        return dict(
            vocabulary_size=self.vocabulary_size,
            output_dim=self.output_dim,
            combiner=self.combiner,
            hash_ids=self.hash_ids,
        )

    # -- hooks --------------------------------------------------------------
    def set_read_hook(self, hook: Callable[[tf.Tensor], None] | None) -> None:
        """Installs `hook(ids)`, run on the bucket ids before rows are read.

        A hook may carry `hook.gather(ids)`: the lookup then calls it instead,
        and it returns the rows of `ids` (`[n, dim]`, read after the hook's
        work, with `tf.gather`'s gradient), or None to fall back to `hook(ids)`
        and `tf.gather`. LazyDP's catch-up returns the rows it has just
        brought up to date this way, saving the lookup's own gather.
        """
        self._read_hook = hook

    @property
    def read_hook(self):
        return self._read_hook

    def _active_read_hook(self):
        """The read hook, or None while a SavedModel traces the layer (exports carry no mechanism)."""
        return None if _in_save_context() else self._read_hook

    def _own_read(self):
        """Context of the layer's table read: with a hook, the rows it reads were just caught up."""
        return read_guard.unguarded() if self._active_read_hook() is not None else contextlib.nullcontext()

    # -- ids ----------------------------------------------------------------
    @as_written
    def bucket_ids(self, ids, *, check_range: bool = True):
        """Maps raw ids to table rows (hashing or range check); keeps structure.

        `check_range=False` skips the range assertion, for ids that already went
        through `call` (which always checks) in the same step.
        """
        if isinstance(ids, tf.RaggedTensor):
            return ids.with_flat_values(self.bucket_ids(ids.flat_values, check_range=check_range))
        if isinstance(ids, tf.SparseTensor):
            return tf.SparseTensor(ids.indices, self.bucket_ids(ids.values, check_range=check_range), ids.dense_shape)
        ids = tf.convert_to_tensor(ids)
        if self.hash_ids:
            if ids.dtype != tf.string:
                ids = tf.strings.as_string(ids)
            return tf.strings.to_hash_bucket_fast(ids, self.vocabulary_size)
        if not ids.dtype.is_integer:
            raise TypeError(
                f"DPEmbedding {self.name!r} needs integer ids (or `hash_ids=True` for "
                f"strings); received dtype {ids.dtype.name}."
            )
        if not check_range:
            return ids
        # Two reductions, not a mask: the smallest and largest id are the ones that
        # can be out of range, and they are what the message shows.
        flat = tf.reshape(ids, [-1])
        smallest, largest = tf.reduce_min(flat), tf.reduce_max(flat)  # empty: +inf/-inf, passes
        ok = tf.logical_and(smallest >= 0, largest < self.vocabulary_size)
        message = (
            f"DPEmbedding {self.name!r}: ids must lie in [0, {self.vocabulary_size}) "
            "(or construct it with hash_ids=True); smallest and largest id received:"
        )
        with tf.control_dependencies([string_assert(ok, [message, smallest, largest])]):
            return tf.identity(ids)

    def occurrences(self, ids, *, check_range: bool = True) -> EmbeddingOccurrences:
        """Flattens a batch of raw ids into `EmbeddingOccurrences`."""
        ids = self.bucket_ids(ids, check_range=check_range)
        if isinstance(ids, tf.SparseTensor):
            ids = tf.RaggedTensor.from_sparse(ids)
        if isinstance(ids, tf.RaggedTensor):
            if _is_ragged_units(ids):
                return self._ragged_unit_occurrences(ids)
            if ids.ragged_rank != 1:
                raise ValueError(
                    f"DPEmbedding {self.name!r} takes ragged ids of shape [batch, None] (or, for user units, "
                    f"[batch, k, None] with a uniform k); received ragged_rank {ids.ragged_rank}."
                )
            self._require_combiner("ragged or sparse ids")
            flat = ids.flat_values
            batch = tf.cast(ids.nrows(), tf.int32)
            segments = tf.cast(ids.value_rowids(), tf.int32)
            lengths = tf.cast(ids.row_lengths(), tf.float32)
            weights = self._combiner_weights(tf.gather(lengths, segments))
            return _pooled(flat, segments, weights, batch)
        rank = ids.shape.rank
        if rank not in (1, 2, 3):
            raise ValueError(
                f"DPEmbedding {self.name!r} takes ids of shape [batch], [batch, n] or (user units, "
                f"`tfdp_embed.data.poisson_user_batches`) [batch, k, n]; received shape {ids.shape}."
            )
        if rank == 3:
            return self._unit_occurrences(ids)
        batch = tf.shape(ids)[0]
        per_example = 1 if rank == 1 else (ids.shape[1] if ids.shape[1] is not None else tf.shape(ids)[1])
        flat = tf.reshape(ids, [-1])
        n = tf.size(flat)
        positions = tf.range(n)
        # Each id's example, row-major: positions // per_example without the integer division
        # (int32 FloorDiv: ~70 us a stack at batch 2,048 on a CPU, in every DP step).
        examples = (
            positions if rank == 1 else tf.reshape(tf.broadcast_to(tf.range(batch)[:, None], tf.shape(ids)), [-1])
        )
        if rank == 1 or self.combiner is None:
            return EmbeddingOccurrences(
                ids=flat,
                segments=positions,
                weights=tf.ones([n], tf.float32),
                num_segments=n,
                segment_examples=examples,
                batch_size=batch,
            )
        segments = examples
        weights = self._combiner_weights(tf.fill([n], tf.cast(per_example, tf.float32)))
        return _pooled(flat, segments, weights, batch)

    def _unit_occurrences(self, ids) -> EmbeddingOccurrences:
        """Ids `[batch, k, n]` (k rows of one unit): one output row per (unit, row), pooled over n by the combiner.

        Without a combiner every id is its own output row; either way every
        segment belongs to unit segment // (its segments per unit).
        """
        shape = tf.shape(ids)
        batch, per_unit = shape[0], shape[1] * shape[2]
        flat = tf.reshape(ids, [-1])
        n = tf.size(flat)
        if self.combiner is None:
            segments, weights, num_segments, per_segment_unit = tf.range(n), tf.ones([n], tf.float32), n, per_unit
        else:
            segments = tf.range(n) // shape[2]
            weights = self._combiner_weights(tf.fill([n], tf.cast(shape[2], tf.float32)))
            num_segments, per_segment_unit = batch * shape[1], shape[1]
        return EmbeddingOccurrences(
            ids=flat,
            segments=segments,
            weights=weights,
            num_segments=num_segments,
            segment_examples=tf.range(num_segments) // per_segment_unit,
            batch_size=batch,
        )

    def _ragged_unit_occurrences(self, ids: tf.RaggedTensor) -> EmbeddingOccurrences:
        """Ragged ids `[batch, k, None]` (k uniform): one pooled output row per (unit, row), owned by its unit.

        A row with no ids (a padding row of a user with fewer than k rows) has no occurrence.
        """
        self._require_combiner("ragged ids")
        rows = ids.values  # [batch * k, None]
        flat = rows.flat_values
        segments = tf.cast(rows.value_rowids(), tf.int32)
        weights = self._combiner_weights(tf.gather(tf.cast(rows.row_lengths(), tf.float32), segments))
        return EmbeddingOccurrences(
            ids=flat,
            segments=segments,
            weights=weights,
            num_segments=tf.cast(rows.nrows(), tf.int32),
            segment_examples=tf.cast(ids.value_rowids(), tf.int32),
            batch_size=tf.cast(ids.nrows(), tf.int32),
        )

    def _require_combiner(self, what: str) -> None:
        if self.combiner is None:
            raise ValueError(
                f"DPEmbedding {self.name!r} received {what}, which need a `combiner` "
                f"('sum', 'mean' or 'sqrtn'); it was built with combiner=None."
            )

    def _combiner_weights(self, lengths):
        if self.combiner == "mean":
            return 1.0 / tf.maximum(lengths, 1.0)
        if self.combiner == "sqrtn":
            return tf.math.rsqrt(tf.maximum(lengths, 1.0))
        return tf.ones_like(lengths)

    # -- forward ------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        """The Keras layer's `__call__`, refusing the other Keras's symbolic input in one line (`front_end`)."""
        front_end.refuse_foreign_input(self, args, kwargs)
        return super().__call__(*args, **kwargs)

    def call(self, ids):
        """Looks `ids` up (`lookup`); subclasses override this to transform the rows."""
        return self.lookup(ids)

    def lookup(self, ids):
        """The pooled (or per-id) rows of `ids`: the math the clipping rule describes.

        Per-example clipping records this method, not `call`, so a subclass's
        `call` may do anything with what it returns (scale, normalise, mask)
        and its norms stay exact. Do not override it: `DPModel` refuses a
        subclass that does (override `call` instead). Rows are read and
        pooled in the table's dtype and returned in the compute dtype.
        """
        return tf.cast(self._pooled_rows(ids), self.compute_dtype)

    @as_written  # the layer's own lookup; the read hook (a mechanism's) and a subclass's bucket_ids: user_code
    def _pooled_rows(self, ids):
        ids = user_code(self.bucket_ids)(ids)
        if isinstance(ids, tf.SparseTensor):
            ids = tf.RaggedTensor.from_sparse(ids)
        read = None  # the rows of `ids`, flat, when the read hook gathered them
        hook = self._active_read_hook()
        if hook is not None:
            flat = ids.flat_values if isinstance(ids, tf.RaggedTensor) else tf.reshape(ids, [-1])
            gather = getattr(hook, "gather", None)
            read = user_code(gather)(flat) if gather is not None else None
            if read is None:
                user_code(hook)(flat)
            else:
                read = tf.cast(read, self.embeddings.dtype)
        if isinstance(ids, tf.RaggedTensor) and _is_ragged_units(ids):
            return self._pool_ragged_units(ids, read)
        if isinstance(ids, tf.RaggedTensor):
            self._require_combiner("ragged or sparse ids")
            # ragged [batch, None, dim]
            if read is None:
                with self._own_read():
                    rows = tf.gather(self.embeddings, ids)
            else:
                rows = ids.with_flat_values(read)
            if self.combiner == "sum":
                return tf.reduce_sum(rows, axis=1)
            if self.combiner == "mean":
                return tf.reduce_mean(rows, axis=1)
            lengths = tf.cast(ids.row_lengths(), rows.dtype)[:, None]
            return tf.reduce_sum(rows, axis=1) * tf.math.rsqrt(tf.maximum(lengths, 1.0))
        if ids.shape.rank not in (1, 2, 3):
            raise ValueError(
                f"DPEmbedding {self.name!r} takes ids of shape [batch], [batch, n] or [batch, k, n]; received "
                f"shape {ids.shape}."
            )
        if read is None:
            with self._own_read():
                rows = tf.gather(self.embeddings, ids)
        else:
            rows = tf.reshape(read, tf.concat([tf.shape(ids), [self.output_dim]], 0))
            rows.set_shape(ids.shape.concatenate([self.output_dim]))
        if ids.shape.rank == 1 or self.combiner is None:
            return rows
        axis = ids.shape.rank - 1  # the ids of one output row: [batch, n] or, per unit row, [batch, k, n]
        if self.combiner == "sum":
            return tf.reduce_sum(rows, axis=axis)
        if self.combiner == "mean":
            return tf.reduce_mean(rows, axis=axis)
        n = tf.cast(tf.shape(ids)[axis], rows.dtype)
        return tf.reduce_sum(rows, axis=axis) * tf.math.rsqrt(n)

    def _pool_ragged_units(self, ids: tf.RaggedTensor, read):
        """`[batch, k, dim]` pooled rows of ragged ids `[batch, k, None]`; a row with no ids pools to zeros."""
        self._require_combiner("ragged ids")
        rows = ids.values  # [batch * k, None]
        if read is None:
            with self._own_read():
                vectors = tf.gather(self.embeddings, rows.flat_values)
        else:
            vectors = read
        segments = rows.value_rowids()
        lengths = tf.cast(rows.row_lengths(), vectors.dtype)
        weights = tf.gather(self._combiner_weights(lengths), segments)  # mean: 1 / max(length, 1)
        pooled = tf.math.unsorted_segment_sum(vectors * weights[:, None], segments, rows.nrows())
        k = tf.cast(ids.uniform_row_length, tf.int32)
        pooled = tf.reshape(pooled, tf.stack([-1, k, self.output_dim]))
        pooled.set_shape([None, tf.get_static_value(ids.uniform_row_length), self.output_dim])
        return pooled


def _is_ragged_units(ids) -> bool:
    """Ragged ids `[batch, k, None]` with a uniform k: the rows of user units (`poisson_user_batches`)."""
    return (
        isinstance(ids, tf.RaggedTensor)
        and ids.ragged_rank == 2
        and ids.uniform_row_length is not None
        and isinstance(ids.values, tf.RaggedTensor)
    )


@contextlib.contextmanager
def read_hooks_removed(tables):
    """No read hook (LazyDP's catch-up) runs inside the block: the code there reads, never updates."""
    hooks = [table.read_hook for table in tables]
    try:
        for table in tables:
            table.set_read_hook(None)
        yield
    finally:
        for table, hook in zip(tables, hooks):
            table.set_read_hook(hook)


__all__ = ["EmbeddingLookup", "EmbeddingOccurrences", "read_hooks_removed"]
