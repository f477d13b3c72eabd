"""The per-example loss of a compiled Keras 3 model, and the layers whose training output mixes examples.

DP clips each example's gradient, so the loss must be one value per example:
a Keras 3 `Loss`'s `call` (or a loss function, or its name) gives one value
per example before reduction; extra axes (per position, per output unit) are
averaged, as Keras' reduction does. A dict or list of losses (several
outputs) is refused with a one-line error, as are layers that mix the
examples of a batch in training (BatchNormalization, whose batch statistics
make each example's output depend on the others).
"""

from __future__ import annotations

from collections.abc import Callable

from tfdp_embed.clipping.taps import submodules
from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.keras3._keras import keras, tf

_MIXING = ("BatchNormalization",)
_REDUCED = ("float16", "bfloat16")


def per_example_loss_fn(loss) -> Callable:
    """`(y_true, y_pred) -> [batch]` for the loss given to `compile`."""
    if isinstance(loss, (dict, list, tuple)):
        raise PrivacyContractError(
            "tfdp_embed.keras3.DPModel takes one loss (one output); received a "
            f"{type(loss).__name__} of losses. Combine the outputs' losses in one `keras.losses.Loss`."
        )
    if isinstance(loss, str):
        loss = keras.losses.get(loss)
    fn = loss.call if isinstance(loss, keras.losses.Loss) else loss
    if not callable(fn):
        raise TypeError(f"`loss` must be a Keras 3 loss, a loss function or its name; received {loss!r}.")

    def per_example(y_true, y_pred, sample_weight=None):
        values = tf.convert_to_tensor(fn(y_true, y_pred))
        if values.shape.rank == 0:
            raise PrivacyContractError(
                f"The loss {getattr(loss, 'name', loss)!r} returned one value for the whole batch; DP needs one "
                "per example. Return the unreduced loss (shape [batch] or [batch, ...])."
            )
        if sample_weight is not None:
            values = values * _weights_like(sample_weight, values)
        if values.shape.rank > 1:
            values = tf.reduce_mean(tf.reshape(values, [tf.shape(values)[0], -1]), axis=1)
        return tf.cast(values, tf.float32)

    return per_example


def _weights_like(sample_weight, values):
    """Sample weights broadcast against the unreduced loss: one per example (`[B]`, `[B, 1]`) or per position.

    Per-position weights (`[B, k]`, e.g. the mask of user-level batches) weight each position before
    the mean over the non-batch axes; one weight per example scales the example's loss.
    """
    weights = tf.cast(sample_weight, values.dtype)
    if weights.shape.rank is not None and weights.shape.rank >= 2 and weights.shape[-1] != 1:
        if weights.shape.rank > values.shape.rank:
            raise ValueError(
                f"Sample weights of shape {weights.shape} (one per position) need a loss with a value per position; "
                f"the loss returned shape {values.shape}."
            )
        while weights.shape.rank < values.shape.rank:
            weights = tf.expand_dims(weights, -1)
        return weights
    return tf.reshape(weights, tf.concat([[-1], tf.ones([values.shape.rank - 1], tf.int32)], 0))


def reject_unsupported(model) -> None:
    """Refuses batch-mixing layers, a distribution strategy and reduced precision (not yet in this front end)."""
    if tf.distribute.has_strategy():
        raise ValueError(
            "tfdp_embed.keras3.DPModel trains on one device for now; under a tf.distribute strategy use the "
            "tf-keras front end (tfdp_embed.keras2), which supports Mirrored, MultiWorker, ParameterServer and TPU."
        )
    reduced = sorted({layer.compute_dtype for layer in submodules(model) if layer.compute_dtype in _REDUCED})
    if reduced:
        raise ValueError(
            f"tfdp_embed.keras3.DPModel computes in float32 for now; layers of this model compute in {reduced}. "
            "Use keras.config.set_dtype_policy('float32'), or the tf-keras front end for mixed precision."
        )
    for layer in [model, *submodules(model)]:
        if type(layer).__name__ in _MIXING and isinstance(layer, keras.layers.Layer):
            raise PrivacyContractError(
                f"Layer {layer.name!r} ({type(layer).__name__}) mixes the examples of a batch in training, so one "
                "example's loss depends on the others and clipping it bounds nothing. Use LayerNormalization."
            )


__all__ = ["per_example_loss_fn", "reject_unsupported"]
