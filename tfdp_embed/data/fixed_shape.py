"""Poisson batches of one static shape: truncated at `max_batch_size`, padded up to it with weight-0 examples.

XLA and TPU SparseCore compile one program per batch shape; Poisson batch
sizes vary. A Poisson sampler with `max_batch_size = B` already cuts larger
batches to a uniform random subset of B; `fixed_shape_batches` pads every
smaller batch up to B:

    batch t = (x_t, y_t, w_t),  w_t = [1] * |S_t| + [0] * (B - |S_t|),  padding rows all zeros

A padding example is absent from the step, not merely weightless: its
loss is multiplied by its weight 0 (`DPModel` scales each example's loss
by its sample weight), and `tfdp_embed.absent_examples` gives
every weight-0 example clip factor 0 and drops its lookups and the rows
only it reads before any mechanism sees the step. Its lookups must not
count: padding examples read rows too (the ids of all-zero features), and
adding an example to a batch removes one padding example, so a count of
lookups (DP-AdaFEST's contribution map, EANA's and LazyDP's touched rows,
`bucket_counts`) would move by the example *and* a padding example:
sensitivity sqrt(2) C1 where the accounting assumes C1. The step on a
padded batch is therefore the unpadded batch's step (the same clipped sums,
touched rows and noise draws; tests/privacy/test_padding_sensitivity.py).
Padding changes shapes only, not what is released. `TpuDPStep` takes the
weights as `sample_weight`.

Accounting: the truncation is part of the mechanism. Account the steps with
`tfdp_embed.accounting.truncated_steps` (each step is dp-accounting's
`TruncatedSubsampledGaussianDpEvent(N, q, B, sigma)`, PLD), or keep the
plain Poisson events, for which the report adds the truncation's extra delta.

Example:
    >>> batches, info = poisson_batches(arrays, sampling_probability=q, max_batch_size=cap, seed=1)
    >>> fixed, info = fixed_shape_batches(batches, info)    # every batch has `cap` rows
    >>> mechanism = truncated_steps(mechanism, dataset_size=n, max_batch_size=cap)

References: Chua et al., "Scalable DP-SGD: Shuffling vs. Poisson
Subsampling", NeurIPS 2024 (truncated Poisson batches of a fixed size);
dp-accounting 0.6 `TruncatedSubsampledGaussianDpEvent` (arXiv:2508.15089).
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from tfdp_embed.data.poisson import BatchingInfo
from tfdp_embed.data.provenance import register, registered_info


def fixed_shape_batches(batches: tf.data.Dataset, info: BatchingInfo) -> tuple[tf.data.Dataset, BatchingInfo]:
    """Pads every batch of a capped Poisson sampler to `info.max_batch_size` rows of weight 0.

    Args:
      batches: the output of a `tfdp_embed.data` Poisson sampler (optionally
        through pass-through transformations) whose elements are
        `(features, labels)` or `(features, labels, sample_weight)` of dense tensors.
      info: that sampler's `BatchingInfo`; it must have a `max_batch_size`.

    Returns:
      `(fixed, fixed_info)`: batches `(features, labels, sample_weight)` with
      leading dimension `max_batch_size`, and the info with `fixed_shape=True`
      (same truncation counters).

    Raises:
      ValueError: `info` is not Poisson with a cap, `batches` is not that
        sampler's output, or the elements are not `(features, labels[, weights])` of dense tensors.
    """
    if not isinstance(info, BatchingInfo) or info.batching != "poisson" or info.max_batch_size is None:
        raise ValueError(
            "`fixed_shape_batches` pads Poisson batches truncated at a cap: pass the `BatchingInfo` of a "
            f"tfdp_embed.data Poisson sampler given `max_batch_size`; received {info!r}."
        )
    if registered_info(batches) is not info:
        raise ValueError("`batches` is not the output of the sampler that returned `info` (see tfdp_embed.data).")
    spec = batches.element_spec
    if (
        not isinstance(spec, tuple)
        or len(spec) not in (2, 3)
        or (len(spec) == 3 and not isinstance(spec[2], tf.TensorSpec))
    ):
        raise ValueError(
            "`batches` elements must be (features, labels[, sample_weight]) (pad before `with_lookahead`); "
            f"received {spec}."
        )
    for leaf in tf.nest.flatten(spec):
        if not isinstance(leaf, tf.TensorSpec):
            raise ValueError(f"`fixed_shape_batches` pads dense tensors only; received a component {leaf}.")
    cap = int(info.max_batch_size)

    def pad(*element):
        size = tf.shape(tf.nest.flatten(element[0])[0])[0]
        weights = element[2] if len(element) == 3 else tf.ones([size], tf.float32)
        padded = tf.nest.map_structure(lambda t: _pad_rows(t, cap), (element[0], element[1], weights))
        return padded

    fixed_info = dataclasses.replace(info, fixed_shape=True)
    return register(batches.map(pad), fixed_info), fixed_info


def _pad_rows(tensor: tf.Tensor, cap: int) -> tf.Tensor:
    """`tensor` with zero rows appended up to `cap` rows (it must have at most `cap`)."""
    size = tf.shape(tensor)[0]
    check = tf.debugging.assert_less_equal(size, cap, message="fixed_shape_batches: a batch exceeds max_batch_size")
    with tf.control_dependencies([check]):
        paddings = tf.concat([[[0, cap - size]], tf.zeros([tensor.shape.rank - 1, 2], tf.int32)], 0)
        padded = tf.pad(tensor, paddings)
    return tf.ensure_shape(padded, [cap, *tensor.shape[1:]])


__all__ = ["fixed_shape_batches"]
