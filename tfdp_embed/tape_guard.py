"""Gradients through a `DPModel` outside its DP step are refused (a tape would train with no clipping or noise).

`DPModel`'s own steps (`train_step`, `test_step`, `predict_step`, the
contract checks) call the wrapped model, `dp_model.inner`, directly. Only
a caller's own code runs `dp_model(x)`: a `tf.GradientTape` loop, or a
Keras model holding the `DPModel` as a layer and trained with its plain
`fit`. Under a private mechanism `DPModel.call` passes its outputs through
an identity whose gradient raises, so such a loop fails at
`tape.gradient` instead of training non-privately in silence:

    y = dp_model(x)                       # the forward pass works as before
    tape.gradient(loss(y), variables)     # PrivacyContractError

The named opt-out is the wrapped model itself: differentiating
`dp_model.inner` trains non-privately, by the caller's explicit choice.
A `NonPrivate` mechanism (no per-example clipping, no privacy claim)
leaves the outputs as they are.

References: Abadi et al. 2016 §3.1 (every update is clipped and noised).
"""

from __future__ import annotations

import tensorflow as tf

from tfdp_embed.errors import PrivacyContractError

MESSAGE = (
    "Gradients through a DPModel outside its DP step would train without clipping or noise "
    "(a `tf.GradientTape` over `dp_model(x)`, or a Keras model holding the DPModel as a layer). "
    "Train with `dp_model.fit` (or `dp_model.train_step`), or differentiate `dp_model.inner` "
    "explicitly to train non-privately."
)


@tf.custom_gradient
def _refusing_identity(x):
    def grad(upstream):
        del upstream
        raise PrivacyContractError(MESSAGE)

    return tf.identity(x), grad


def _guard(value):
    if isinstance(value, tf.Tensor) and value.dtype.is_floating:
        return _refusing_identity(value)
    return value


def refuse_gradients(outputs):
    """`outputs` (any nest, composite tensors included) with each float tensor's gradient refused.

    Args:
      outputs: what the wrapped model returned.

    Returns:
      The same values; asking a tape for a gradient through any of them
      raises `PrivacyContractError` (in eager mode at `tape.gradient`,
      inside a `tf.function` while it is traced).
    """
    return tf.nest.map_structure(_guard, outputs, expand_composites=True)


__all__ = ["MESSAGE", "refuse_gradients"]
