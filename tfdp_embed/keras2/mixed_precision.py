"""DP training under Keras mixed precision: float16/bfloat16 compute, float32 everything DP.

`keras.mixed_precision.set_global_policy("mixed_float16")` or
`"mixed_bfloat16"` makes layers compute in float16 or bfloat16 and keeps
their variables in float32. Under DP:

* the per-example loss is float32 (`tfdp_embed.keras2.per_example_loss` casts the
  predictions), every clipping rule casts what it reads to the variable's
  dtype, so norms, clip factors and clipped sums are float32; the
  mechanisms noise float32 gradients and the optimizer updates the float32
  variables. `DPEmbedding` tables are read in float32 (as
  `keras.layers.Embedding`'s).
* bfloat16 has float32's exponent range: the backward pass needs no loss
  scaling (Keras uses none either).
* float16 underflows below about 6e-8, so the backward pass is scaled by a
  fixed loss scale S and the rules unscale (`clipping.per_example`). S is
  `FLOAT16_LOSS_SCALE`, or the `initial_scale` of a
  `keras.mixed_precision.LossScaleOptimizer(..., dynamic=False)` the user
  compiles with. Keras' dynamic loss scaling is never used: it skips the
  step and lowers S when any example's gradient overflows, so every
  example's update (and every later step's S) would depend on that one
  example, outside what the clipping bounds. An entry that overflows under
  S is dropped from its example's gradient (set to 0) before the norm: that
  example is still clipped to C, and the others do not see it. An example
  whose loss itself is NaN or Inf (an input of 65504 or more is Inf in
  float16) contributes 0 and training goes on (`tfdp_embed.nonfinite`).
* Keras wraps the optimizer in a `LossScaleOptimizer` under
  `mixed_float16`; the noised gradient (already unscaled and finite) is
  applied by its inner optimizer, which the mechanism also sees (LazyDP's
  `keras.optimizers.legacy.SGD`).

Only mechanisms whose class declares `capabilities.mixed_precision` (every
library mechanism does) train a model computing in float16 or bfloat16;
`DPModel` refuses any other at construction (`check_mechanism`).

Policies that keep variables in float16 or bfloat16 (`"float16"`,
`"bfloat16"`) are refused: the clipped sums and noise would be rounded to
the variable's precision inside the mechanisms' state.

Example:
    >>> keras.mixed_precision.set_global_policy("mixed_bfloat16")
    >>> model = build_model()           # its last layer with dtype="float32" is advised, as in Keras
    >>> dp = DPModel(model, mechanism=DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.1),
    ...              expected_batch_size=256)

References: Micikevicius et al. 2018 (mixed precision training, loss
scaling); Abadi et al. 2016 (per-example clipping).
"""

from __future__ import annotations

from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.mechanisms.capabilities import capabilities_of

FLOAT16_LOSS_SCALE = (
    2.0**8
)  # DP backpropagates the sum of per-example losses, not their mean: a smaller scale than Keras' 2**15

_REDUCED = (tf.float16, tf.bfloat16)


@tf.autograph.experimental.do_not_convert
def inner_optimizer(optimizer):
    """The optimizer that applies updates: a `LossScaleOptimizer`'s inner one, else `optimizer`."""
    if isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer):
        return optimizer.inner_optimizer
    return optimizer


def compute_dtype(model) -> tf.DType:
    """The least precise compute dtype of `model`'s layers: float16, bfloat16 or float32."""
    dtypes = {
        tf.as_dtype(layer.compute_dtype)
        for layer in [model, *model.submodules]
        if isinstance(layer, keras.layers.Layer) and layer.compute_dtype is not None
    }
    for reduced in _REDUCED:
        if reduced in dtypes:
            return reduced
    return tf.float32


def loss_scale(model, optimizer) -> float:
    """The fixed loss scale of the DP backward pass: 1 unless `model` computes in float16.

    Raises:
      ValueError: a non-dynamic `LossScaleOptimizer` whose scale is not > 0.
    """
    if compute_dtype(model) != tf.float16:
        return 1.0
    if isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer) and not optimizer.dynamic:
        scale = float(optimizer.initial_scale)
        if not scale > 0:
            raise ValueError(f"The LossScaleOptimizer's `initial_scale` must be > 0; received {scale!r}.")
        return scale
    return FLOAT16_LOSS_SCALE


def check_variable_dtypes(model) -> None:
    """Refuses trainable variables kept in float16 or bfloat16 (policies "float16", "bfloat16").

    Raises:
      ValueError: naming the first such variable and the mixed policy to use.
    """
    for variable in model.trainable_variables:
        dtype = tf.as_dtype(variable.dtype).base_dtype
        if dtype in _REDUCED:
            raise ValueError(
                f"DPModel clips and noises in float32 and needs float32 variables, but "
                f"{variable.name!r} is {dtype.name} (dtype policy {dtype.name!r}): use "
                f"keras.mixed_precision.set_global_policy('mixed_{dtype.name}'), which computes in "
                f"{dtype.name} and keeps float32 variables."
            )


def check_mechanism(mechanism, model) -> None:
    """Refuses a mechanism whose class does not declare `mixed_precision` for a model computing in 16 bits.

    Raises:
      ValueError: naming the mechanism class, the model's compute dtype and
        the two ways out.
    """
    dtype = compute_dtype(model)
    if dtype == tf.float32 or capabilities_of(mechanism).mixed_precision:
        return
    cls = type(mechanism)
    raise ValueError(
        f"Mechanism class {cls.__name__} (name {getattr(cls, 'name', '?')!r}) does not declare "
        f"`mixed_precision` in its `capabilities`, so it cannot train model {model.name!r}, which computes "
        f"in {dtype.name} (policy 'mixed_{dtype.name}'): train under "
        "keras.mixed_precision.set_global_policy('float32'), or declare "
        "`capabilities = MechanismCapabilities(..., mixed_precision=True)` on the class once it keeps its "
        "state, noise and updates in the variables' dtype."
    )


__all__ = [
    "FLOAT16_LOSS_SCALE",
    "check_mechanism",
    "check_variable_dtypes",
    "compute_dtype",
    "inner_optimizer",
    "loss_scale",
]
