"""LazyDP's traced functions: the flush and the TensorFlow-path catch-up, each one trace for every table.

`function(mechanism, name)` caches them per mechanism, outside it, so
checkpoints and SavedModels never see them; they hold the mechanism by a
weak reference (a cache entry must not keep its key alive). The flush
catches up every row of every table, a chunk of rows at a time.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Sequence

import tensorflow as tf

from tfdp_embed.mechanisms.lazy import catch_up as lazy_catch_up

# Floats of noise per flush chunk (8 MB) when `flush_chunk_rows` is not given.
FLUSH_CHUNK_FLOATS = 1 << 21

# Per-mechanism traced functions (flush, catch-up), each shared by all tables.
_TRACED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def chunk_rows(layers: Sequence, flush_chunk_rows: int | None, *, momentum: bool) -> tuple:
    """Rows per flush chunk for each table: `flush_chunk_rows`, else about 8 MB of noise (twice with momentum)."""
    floats_per_row = [layer.output_dim * (2 if momentum else 1) for layer in layers]
    return tuple(flush_chunk_rows or max(1, FLUSH_CHUNK_FLOATS // floats) for floats in floats_per_row)


def flush_tables(bring_current: Callable, layers: Sequence, chunks: tuple, sizes: tf.Tensor) -> None:
    """The traced flush: each table's rows in chunks of `chunks[i]`, one chunk after the other.

    `bring_current(index, rows)` catches up rows of table `index`. The
    sizes are an argument, not constants: with constant rows the graph
    optimiser would specialise the shared catch-up for each table. The
    chunks are caught up as the read hook catches up ids (rows in a range
    are unique already; `sparse_rows.unique` keeps their order): the catch-up's
    trace from the steps serves, none is made for the flush.
    """
    for index, (layer, chunk) in enumerate(zip(layers, chunks)):
        vocab = sizes[index]
        if layer.vocabulary_size <= chunk:
            bring_current(index, tf.range(vocab))
            continue

        def flush_chunk(start, index=index, chunk=chunk, vocab=vocab):
            rows = tf.range(start, tf.minimum(start + chunk, vocab))
            with tf.control_dependencies([bring_current(index, rows)]):
                return start + chunk

        tf.while_loop(lambda start, vocab=vocab: start < vocab, flush_chunk, [tf.constant(0, tf.int64)])


def function(mechanism, name: str) -> Callable:
    """`mechanism`'s traced function `name` (each serves every table), made on first use.

    "bring_current": `lazy_catch_up.bring_current_function`; "flush": the
    mechanism's `_flush_tables` of `(chunks, sizes)` (one trace for all
    tables; the catch-ups in it call "bring_current").
    """
    functions = _TRACED.setdefault(mechanism, {})
    if name not in functions:
        owner = weakref.ref(mechanism)
        makers = {
            "bring_current": lambda: lazy_catch_up.bring_current_function(functools.partial(_owed_noise, owner)),
            "flush": lambda: tf.function(functools.partial(_flush_tables, owner), autograph=False),
        }
        functions[name] = makers[name]()
    return functions[name]


def _flush_tables(mechanism: weakref.ref, chunks: tuple, sizes) -> None:
    owner = mechanism()
    assert owner is not None  # the op's owner outlives its graph
    owner._flush_tables(chunks, sizes)  # noqa: SLF001


def _owed_noise(mechanism: weakref.ref) -> lazy_catch_up.OwedNoise:
    owner = mechanism()
    assert owner is not None  # the op's owner outlives its graph
    return owner._owed_noise()  # noqa: SLF001


__all__ = ["FLUSH_CHUNK_FLOATS", "chunk_rows", "flush_tables", "function"]
