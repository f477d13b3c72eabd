"""The step's clipped gradients for every trainable variable, in the form mechanisms take.

`assemble` turns the clipping stage's per-layer clipped sums into one
`ClippedGradients`: a `TableGradient` per `DPEmbedding` table and a dense
gradient per other variable, zeros for layers the step did not call (so the
mechanism still noises them). `check_every_variable_noised` checks, when the
step is traced, that the mechanism returned a noised gradient for each.
"""

from __future__ import annotations

import functools

import tensorflow as tf

from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.mechanisms.base import ClippedGradients, TableGradient
from tfdp_embed.traced_as_written import as_written, user_code


@as_written
def assemble(step, taps, batch_size, *, tables, trainable_variables, expected_batch_size: float) -> ClippedGradients:
    """Collects every variable's clipped sum; zeros for layers not called this step.

    Args:
      step: the clipping stage's result (`clipped_step`): per-layer clipped sums and clip factors.
      taps: the step's recorded layer calls (`record_taps`).
      batch_size: the batch's number of examples (a scalar tensor).
      tables: the model's `DPEmbedding` layers, in the mechanism's order.
      trainable_variables: every trainable variable of the model.
      expected_batch_size: the divisor of the noised sum (set whenever examples are clipped).
    """
    # The rules' clipped sums run here (`user_code`: autograph converts a user rule's, as before).
    sums = _clipped_sums(step, tables, expected_batch_size)
    return _assembled(sums, step.clip_factors, batch_size, tables, trainable_variables, expected_batch_size)


@tf.autograph.experimental.do_not_convert
def _assembled(sums, clip_factors, batch_size, tables, trainable_variables, expected_batch_size) -> ClippedGradients:
    """`assemble`'s result from `_clipped_sums`' dicts: a `TableGradient` per table (zeros where not called)."""
    grads, averaged, occurrences, shared_rows = sums
    table_gradients = []
    for layer in tables:
        var = layer.embeddings
        grad = grads.get(var.ref())
        if grad is None:
            grad = tf.IndexedSlices(
                tf.zeros([0, layer.output_dim], var.dtype),
                tf.zeros([0], tf.int64),
                tf.shape(var, out_type=tf.int64),
            )
        table_gradients.append(
            TableGradient(
                layer=layer,
                variable=var,
                gradient=grad,
                occurrences=occurrences.get(id(layer), []),
                clip_factors=clip_factors,
                averaged=averaged.get(var.ref()),
                shared_rows=shared_rows.get(id(layer)),
            )
        )
    table_vars = {layer.embeddings.ref() for layer in tables}
    dense = []
    for variable in trainable_variables:
        if variable.ref() in table_vars:
            continue
        grad = grads.get(variable.ref())
        dense.append((variable, tf.zeros_like(variable) if grad is None else grad))
    return ClippedGradients(
        tables=table_gradients,
        dense=dense,
        expected_batch_size=expected_batch_size,
        batch_size=batch_size,
    )


def _clipped_sums(step, tables, expected_batch_size):
    """Each variable's clipped sum, the tables' averaged sums, and each layer's occurrences and shared rows."""
    grads, averaged, occurrences, shared_rows = {}, {}, {}, {}
    table_vars = {layer.embeddings.ref() for layer in tables}
    for tap, info in step.layers:
        for i, (variable, grad) in enumerate(zip(info.variables, user_code(info.clipped_sum)(step.clip_factors))):
            grads[variable.ref()] = grad
            if variable.ref() in table_vars:
                averaged[variable.ref()] = functools.partial(
                    _averaged_sum, info.clipped_sum, step.clip_factors, expected_batch_size, i
                )
        if info.occurrences is not None:
            occurrences[id(tap.layer)] = info.occurrences
        if info.shared_rows is not None:
            shared_rows[id(tap.layer)] = info.shared_rows
    return grads, averaged, occurrences, shared_rows


def _averaged_sum(clipped_sum, clip_factors, expected_batch_size: float, index: int) -> tf.IndexedSlices:
    """Variable `index`'s clipped sum divided by the expected batch size, via c_i / B."""
    return clipped_sum(clip_factors / expected_batch_size)[index]


@tf.autograph.experimental.do_not_convert
def check_every_variable_noised(pairs, trainable_variables, mechanism_name: str) -> None:
    """Trace-time check: the mechanism returned a noised gradient for every variable.

    Raises:
      PrivacyContractError: a trainable variable has no (gradient, variable) pair in `pairs`.
    """
    returned = {variable.ref() for _, variable in pairs}
    for variable in trainable_variables:
        if variable.ref() not in returned:
            raise PrivacyContractError(
                f"Trainable variable {variable.name!r} is not handled by mechanism "
                f"{mechanism_name!r}: it would train without noise (or not at all, "
                "silently). Every trainable variable must be noised; freeze it with "
                "`trainable=False` if it should not train."
            )


__all__ = ["assemble", "check_every_variable_noised"]
