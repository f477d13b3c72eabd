"""How LazyDP sees every read of a table coming: read hooks, read guards and lookahead rows.

The read hook (`DPEmbedding.set_read_hook`) runs on every lookup, in the
training step or not: it catches up the ids the lookup reads (its `gather`
catches them up and returns their rows in one op, on the fused path). The
read guard (`tfdp_embed.read_guard`) of the table and of its momentum slot
flushes the mechanism before any eager read of the whole variable outside
the step. The lookahead names the next batch's ids, caught up after a step.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from tfdp_embed import read_guard
from tfdp_embed.mechanisms.tables import EmbeddingTable


def check_table(layer) -> None:
    """Refuses a layer LazyDP cannot hook: not a `DPEmbedding`, or not built.

    Raises:
      TypeError: no `set_read_hook`.
      ValueError: the layer is not built.
    """
    if not callable(getattr(layer, "set_read_hook", None)):
        raise TypeError(f"`tables` must hold embedding layers (DPEmbedding); received {type(layer).__name__}.")
    if not getattr(layer, "built", True) or not isinstance(layer, EmbeddingTable):
        raise ValueError(f"Table {layer.name!r} is not built; build the model before LazyDP.init.")


def attach(layer, momentum: tf.Variable | None, *, guard: Callable, catch_up: Callable, gather: Callable) -> None:
    """Installs `guard` on the table and its momentum slot (if any), and the read hook.

    Args:
      layer: the `DPEmbedding`.
      momentum: the table's momentum slot, None without momentum.
      guard: called before an eager read of either variable (flushes).
      catch_up: the read hook, `catch_up(ids)`: catches up the rows among `ids`.
      gather: `gather(ids)`: catches up and returns the rows of `ids`, or None
        (the layer then calls `catch_up` and gathers itself).
    """
    read_guard.install(layer.embeddings, guard)
    if momentum is not None:
        read_guard.install(momentum, guard)
    catch_up.gather = gather  # type: ignore[attr-defined]  # DPEmbedding.set_read_hook
    layer.set_read_hook(catch_up)


def detach(layer, momentum: tf.Variable | None) -> None:
    """Removes what `attach` installed; rows read afterwards are not caught up."""
    layer.set_read_hook(None)
    read_guard.remove(layer.embeddings)
    if momentum is not None:
        read_guard.remove(momentum)


def lookahead_rows(layer, ids, *, check_range: bool) -> tf.Tensor:
    """The rows of `layer` for the lookahead's `ids` as fed to the layer, flat (repeats kept).

    Ids are bucketed as the layer buckets them (`bucket_ids`: hashing, and
    a range check unless `check_range` is False, for a caller whose op
    checks the range itself).
    """
    rows = layer.bucket_ids(ids, check_range=check_range)
    if isinstance(rows, tf.RaggedTensor):
        return rows.flat_values
    if isinstance(rows, tf.SparseTensor):
        return rows.values
    return rows


__all__ = ["attach", "check_table", "detach", "lookahead_rows"]
