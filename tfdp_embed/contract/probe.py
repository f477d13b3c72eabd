"""Which batch `DPModel` checks the contract on, and the warnings when it cannot check.

The independence check needs >= 2 examples, so a dataset's first few
batches are searched for one; when none has two (or there is no data to
read), training goes on with a warning rather than unchecked in silence.
Looking at them is not the training pass: a dataset of Beam shards, which
can be read once, still gives `fit` every step from the first
(`tfdp_embed.data.beam_shards.uncounted_reads`).
"""

from __future__ import annotations

import warnings

import tensorflow as tf

from tfdp_embed.contract.examples import batch_size_of
from tfdp_embed.data.beam_shards import uncounted_reads

PROBE_BATCHES = 4  # batches of a dataset searched for one with >= 2 examples


def probe_batch(data: tf.data.Dataset, unpack):
    """The first batch of `data` with >= 2 examples among its first few, else its first.

    `unpack` maps a dataset element to `(x, y, sample_weight, ...)`. These
    reads do not count as the one pass over Beam shards (`uncounted_reads`).
    """
    with uncounted_reads(data):
        iterator = iter(data.take(PROBE_BATCHES))
        try:
            return _first_with_pair(iterator, unpack)
        finally:
            del iterator  # its prefetching stops before the pass is restored


def _first_with_pair(elements, unpack):
    """The first of `elements` with >= 2 examples, else the first; ValueError when there is none."""
    first = None
    for element in elements:
        if first is None:
            first = element
        size = batch_size_of(unpack(element)[:3])
        if size is not None and size >= 2:
            return element
    if first is None:
        raise ValueError("The training dataset is empty: it yielded no batch.")
    return first


def warn_no_data(stacklevel: int) -> None:
    """Warns that the contract went unchecked: no dataset or arrays to read a batch from."""
    warnings.warn(
        "DPModel could not check the per-example contract (no layer updates state in "
        "training, each example's loss depends on it alone): it needs a tf.data.Dataset "
        "or arrays to read one batch from. Pass one to `prepare` or `fit`.",
        RuntimeWarning,
        stacklevel=stacklevel + 1,
    )


def warn_no_pair(stacklevel: int) -> None:
    """Warns that independence went unchecked: none of the probed batches has two examples."""
    warnings.warn(
        "DPModel could not check that each example's loss depends on that example alone: "
        f"none of the first {PROBE_BATCHES} batches has two examples.",
        RuntimeWarning,
        stacklevel=stacklevel + 1,
    )


__all__ = ["PROBE_BATCHES", "probe_batch", "warn_no_data", "warn_no_pair"]
