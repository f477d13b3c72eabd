"""LazyDP's tables at run time: each table's rows caught up on the path `init` chose for it.

`TableRows` holds what `LazyDP.init` built for its tables (histories,
momentum slots, the op state) and the paths it chose once
(`lazy_fused.choose`): a table on the fused path is caught up by the ops
chosen for it (the custom ops or their references), any other by the
TensorFlow ops of `lazy_catch_up`. Its methods are LazyDP's read hooks
(`bring_current`, `read`; `attach` installs them), the per-table part of
its step (`stepped`) and of its lookahead (`next_batch`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import tensorflow as tf

from tfdp_embed import read_guard
from tfdp_embed.mechanisms.lazy import catch_up as lazy_catch_up
from tfdp_embed.mechanisms.lazy import fused as lazy_fused
from tfdp_embed.mechanisms.lazy import history as lazy_history
from tfdp_embed.mechanisms.lazy import hooks as lazy_hooks
from tfdp_embed.ops import sparse_rows

# Everything here is straight-line TF with explicit tf.cond: autograph would only slow tracing.
plain_python = tf.autograph.experimental.do_not_convert


def raw_reads(method):
    """The mechanism's own bookkeeping reads the raw table: it knows what each row owes."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        with read_guard.unguarded():
            return method(*args, **kwargs)

    return wrapper


class TableRows:
    """Catches up the rows of LazyDP's tables, each on the path chosen for it at `init`.

    Args:
      layers: the `DPEmbedding` tables.
      histories: their histories (`lazy_history.new_history`).
      momenta: their momentum slots (None each without momentum).
      paths: what runs the step and each table's catch-ups (`lazy_fused.choose`).
      state: the fused ops' `lazy_fused.OpState`; None off the fused path.
      now: `now()`, the current step (int32 scalar).
      owed: `owed()`, what rows owe on the TensorFlow path (`lazy_catch_up.OwedNoise`).
      traced: `traced()`, the shared traced TensorFlow-path catch-up (`lazy_traced.function`).
    """

    def __init__(
        self,
        layers: Sequence,
        histories: Sequence[tf.Variable],
        momenta: Sequence[tf.Variable | None],
        paths: lazy_fused.Paths,
        state: lazy_fused.OpState | None,
        *,
        now: Callable[[], tf.Tensor],
        owed: Callable[[], lazy_catch_up.OwedNoise],
        traced: Callable[[], Callable],
    ):
        self.layers, self.histories, self.momenta = tuple(layers), tuple(histories), tuple(momenta)
        self.paths, self.state = paths, state
        self._now, self._owed, self._traced = now, owed, traced

    def attach(self, *, guard: Callable) -> None:
        """Installs each table's read hook (`bring_current`, `read`), and `guard` on its table and momentum slot."""
        for index, (layer, momentum) in enumerate(zip(self.layers, self.momenta)):
            catch_up, gather = functools.partial(self.bring_current, index), functools.partial(self.read, index)
            lazy_hooks.attach(layer, momentum, guard=guard, catch_up=catch_up, gather=gather)

    def detach(self) -> None:
        """Removes what `attach` installed; rows read afterwards are not caught up."""
        for layer, momentum in zip(self.layers, self.momenta):
            lazy_hooks.detach(layer, momentum)

    def fused_step(self) -> bool:
        """True when a step runs on the fused path; under a distribution strategy the TensorFlow path runs."""
        return self.paths.step is not None and not tf.distribute.has_strategy()

    def table_ops(self, index: int) -> sparse_rows.LazyOps | None:
        """The ops that catch up table `index` (custom or reference); None: the TensorFlow path."""
        return self.paths.tables[index] if self.fused_step() else None

    def index_of(self, table) -> int:
        """The index of the table of `table` (a `TableGradient`)."""
        for index, layer in enumerate(self.layers):
            if layer.embeddings is table.variable:
                return index
        raise ValueError(f"Table {table.layer.name!r} was not given to LazyDP.init.")

    @plain_python
    @raw_reads
    def read(self, index: int, ids):
        """The lookup's read: catches up `ids` and returns their rows in one op, or None.

        None (the layer then runs the read hook and its own gather) unless
        table `index` is on the fused path.
        """
        ops = self.table_ops(index)
        if ops is None:
            return None
        assert self.state is not None  # the fused path has its op state
        return lazy_fused.catch_up_and_gather(
            ops, self.layers[index].embeddings, self.histories[index], ids, self.state
        )

    @plain_python
    @raw_reads
    def bring_current(self, index: int, ids, *, unique: bool = False, stamp=None) -> tf.Tensor:
        """Catches up the rows among `ids` that are behind the current step; returns whether any were.

        `stamp` (default: current) is then written to the history of every
        row among `ids`; a stamp (stepped rows of a table the fused ops
        cannot update) takes the TensorFlow path.
        """
        ops = self.table_ops(index)
        if ops is not None and stamp is None:
            assert self.state is not None  # the fused path has its op state
            return lazy_fused.catch_up(ops, self.layers[index].embeddings, self.histories[index], ids, self.state)
        if tf.executing_eagerly():
            return lazy_catch_up.bring_current(
                self.table_state(index), ids, self._now(), self._owed(), unique=unique, stamp=stamp
            )
        # Traced (a step, a flush, an evaluation): one traced function for every table and call site,
        # called the same way everywhere, so it is traced once: a read stamps its rows current (what
        # catching up writes anyway), and rows known to be unique go through `tf.unique` too.
        now = self._now()
        stamp = lazy_history.current(now) if stamp is None else stamp
        return self._traced()(self.table_state(index), ids, now, unique=False, stamp=stamp)

    def stepped(self, clipped, now=None) -> list:
        """Each table's `(noiseless averaged gradient, variable)` of the step `clipped`.

        The rows the optimizer is about to step on the tables off the fused
        path are first caught up and flagged one step ahead, all those
        tables together (`_stamp_stepped`; `now`: the current step, read
        when first needed if not given): the optimizer applies their
        gradient at step t, their step-t noise is owed.
        """
        out, indices, rows = [], [], []
        for table in clipped.tables:
            index = self.index_of(table)
            if self.table_ops(index) is None:  # the TensorFlow path (float64, not a resource variable, momentum)
                indices.append(index)
                rows.append(tf.cast(table.gradient.indices, tf.int64))
            out.append((table.averaged_gradient(clipped.expected_batch_size), table.variable))
        if indices:
            self._stamp_stepped(indices, rows, self._now() if now is None else now)
        return out

    @plain_python
    @raw_reads
    def _stamp_stepped(self, indices: Sequence[int], rows: Sequence, now) -> None:
        """Flags the unique `rows[i]` of TensorFlow-path table `indices[i]` one step ahead, caught up first.

        The rows a forward pass read are current already: one check for all
        the tables, and the catch-up (the shared traced one, table by table,
        as a read runs it) only when some row is behind, i.e. the optimizer
        steps a row the step did not read.
        """
        current = lazy_history.current(now)
        behind = [tf.reduce_any(tf.not_equal(tf.gather(self.histories[i], r), current)) for i, r in zip(indices, rows)]

        def catch_up():
            for index, table_rows in zip(indices, rows):
                self.bring_current(index, table_rows)
            return tf.constant(True)

        caught_up = tf.cond(tf.reduce_any(tf.stack(behind)), catch_up, lambda: tf.constant(False))
        with tf.control_dependencies([caught_up]):
            stamp = lazy_history.state_ahead(now)
            for index, table_rows in zip(indices, rows):
                self.histories[index].scatter_update(tf.IndexedSlices(tf.fill(tf.shape(table_rows), stamp), table_rows))

    def next_batch(self, index: int, ids) -> None:
        """Catches up table `index`'s rows for the lookahead's `ids` (as fed to the layer), deduplicated."""
        ops, layer = self.table_ops(index), self.layers[index]
        # The fused op checks the range itself (one op instead of min, max and an assert).
        rows = lazy_hooks.lookahead_rows(layer, ids, check_range=ops is None)
        if ops is not None:  # the op deduplicates (same rows, same order)
            assert self.state is not None  # the fused path has its op state
            lazy_fused.catch_up_next_batch(ops, layer.embeddings, self.histories[index], rows, self.state)
        else:
            rows = tf.reshape(tf.cast(rows, tf.int64), [-1])
            self.bring_current(index, sparse_rows.unique(rows)[0], unique=True)

    def table_state(self, index: int) -> lazy_catch_up.TableState:
        """Table `index`'s variables, as the TensorFlow path takes them."""
        layer = self.layers[index]
        return lazy_catch_up.TableState(layer.embeddings, self.histories[index], self.momenta[index], layer.output_dim)


__all__ = ["TableRows", "plain_python", "raw_reads"]
