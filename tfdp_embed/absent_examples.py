"""Weight-0 examples (static-shape padding) are absent: no clip factor, no lookup, no row of the step.

`fixed_shape_batches` pads every Poisson batch up to its cap with examples
of sample weight 0, and a TPU step needs the same static shape. A padding
example's loss is 0, so its gradient is 0, but it still *reads* rows:
every padding example looks up the ids of all-zero features. Counted as
lookups, those reads move whatever a mechanism derives from the batch's
lookups: DP-AdaFEST's contribution map (adding the target removes one
padding example, so the map moves by the target's vector *and* a padding
vector: sensitivity sqrt(2) C1, not C1), EANA's and LazyDP's touched rows,
the rows TpuDPStep plans. This module is the one place that makes such an
example absent, after the norms are taken and before any clipped sum or
mechanism sees the step:

    present_i = (some sample weight of example i != 0)
    c_i = 0 and ||g_i|| = 0 for absent i;  lookups of absent i dropped;
    table gradient rows: those a present example looks up, plus shared rows

so a step on a padded batch is the step on the batch without its padding:
the same clipped sums, occurrences, touched rows and clip factors (the
batch axis keeps its static size). Rows are dropped only for rules whose
gradient rows are exactly their lookups plus `shared_rows`
(`LayerGradients.rows_from_lookups`); a rule whose every example touches
every row (Phantom Clipping's logits) keeps its rows, which no example
decides.

Example:
    >>> present = present_examples(sample_weight, tf.shape(loss)[0])
    >>> step = without_absent_examples(clipped_step(taps, loss, tape, ...), present)

References: DP-AdaFEST (Zhang et al. 2023) Alg. 1 line 6 (the map's
sensitivity C1 assumes one example adds one clipped vector); Chua et al.,
NeurIPS 2024 (truncated Poisson batches padded to a fixed size).
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from tfdp_embed._sorted_sets import is_member


@tf.autograph.experimental.do_not_convert
def present_examples(sample_weight, batch_size) -> tf.Tensor | None:
    """bool `[batch]`: the examples with a non-zero sample weight; None when every example is present.

    An example is absent when every weight it has (one per output, or per
    position for temporal weights) is exactly 0. None (no weights, or an
    output without weights, through which every example counts) means no
    example is absent.

    Args:
      sample_weight: None, a tensor `[batch, ...]` (or a scalar), or a nest
        of them (one per output), as `keras.utils.unpack_x_y_sample_weight` gives.
      batch_size: scalar int, the number of examples (rows of the batch).
    """
    if sample_weight is None:
        return None
    leaves = tf.nest.flatten(sample_weight)
    if not leaves or any(leaf is None for leaf in leaves):
        return None
    present = None
    for leaf in leaves:
        weights = tf.convert_to_tensor(leaf)
        if weights.shape.rank == 0:
            nonzero = tf.fill([batch_size], tf.not_equal(weights, 0))
        else:
            flat = tf.reshape(weights, [tf.shape(weights)[0], -1])
            nonzero = tf.reduce_any(tf.not_equal(flat, tf.zeros([], flat.dtype)), axis=1)
        present = nonzero if present is None else tf.logical_or(present, nonzero)
    return present


@tf.autograph.experimental.do_not_convert
def without_absent_examples(step, present):
    """`step` (a `ClippedStep`) with the examples not in `present` made absent; `step` itself if None.

    Clip factors and norms of absent examples become 0, their lookups leave
    every layer's `occurrences`, and for rules with
    `rows_from_lookups` the clipped sums' `IndexedSlices` keep only rows a
    present example looks up or `shared_rows` (data-independent reads).
    """
    if present is None:
        return step
    present = tf.cast(present, tf.bool)
    factors = tf.where(present, step.clip_factors, tf.zeros_like(step.clip_factors))
    norms = tf.where(present, step.norms, tf.zeros_like(step.norms))
    layers = [(tap, _present_layer(info, present)) for tap, info in step.layers]
    return dataclasses.replace(step, norms=norms, clip_factors=factors, layers=layers)


def present_occurrences(occurrences, present: tf.Tensor):
    """`EmbeddingOccurrences` without the lookups of absent examples (segments and batch axis unchanged)."""
    examples = tf.gather(tf.cast(occurrences.segment_examples, tf.int32), tf.cast(occurrences.segments, tf.int32))
    keep = tf.gather(present, examples)
    return dataclasses.replace(
        occurrences,
        ids=tf.boolean_mask(occurrences.ids, keep),
        segments=tf.boolean_mask(occurrences.segments, keep),
        weights=tf.boolean_mask(occurrences.weights, keep),
    )


def read_rows(occurrences, shared_rows=None) -> tf.Tensor:
    """Sorted int64 rows (repeats kept) that `occurrences` look up, plus `shared_rows`."""
    rows = [tf.cast(tf.reshape(o.ids, [-1]), tf.int64) for o in occurrences]
    if shared_rows is not None:
        rows.append(tf.cast(shared_rows, tf.int64))
    if not rows:
        return tf.zeros([0], tf.int64)
    return tf.sort(tf.concat(rows, 0))


def keep_rows(slices: tf.IndexedSlices, sorted_rows: tf.Tensor) -> tf.IndexedSlices:
    """The rows of `slices` that occur in `sorted_rows`, in their order."""
    keep = is_member(tf.cast(slices.indices, tf.int64), sorted_rows)
    return tf.IndexedSlices(
        tf.boolean_mask(slices.values, keep), tf.boolean_mask(slices.indices, keep), slices.dense_shape
    )


def _present_layer(info, present: tf.Tensor):
    """One layer's `LayerGradients` with absent examples' lookups (and the rows only they read) gone."""
    if info.occurrences is None:
        return info
    lookups = [present_occurrences(o, present) for o in info.occurrences]
    if not getattr(info, "rows_from_lookups", False):
        return dataclasses.replace(info, occurrences=lookups)
    rows = read_rows(lookups, info.shared_rows)
    inner = info.clipped_sum

    def clipped_sum(clip_factors):
        return [keep_rows(g, rows) if isinstance(g, tf.IndexedSlices) else g for g in inner(clip_factors)]

    return dataclasses.replace(info, occurrences=lookups, clipped_sum=clipped_sum)


__all__ = ["keep_rows", "present_examples", "present_occurrences", "read_rows", "without_absent_examples"]
