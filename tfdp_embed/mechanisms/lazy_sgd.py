"""The optimizers LazyDP can defer exactly, and the learning rate of the coming step.

An idle row's state after k noisy steps has a Gaussian closed form only
under SGD (`tfdp_embed.mechanisms.lazy_math`): tf-keras `legacy.SGD` with
a learning rate or schedule, `decay`, constant momentum in [0, 1), Nesterov
or not. Everything else is refused with the reason.

References: LazyDP (Lim et al., ASPLOS 2024) §5.2.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tfdp_embed._keras import keras, tf


class SgdSettings(NamedTuple):
    """What the closed forms need of the optimizer.

    Attributes:
      beta: momentum, exactly the float32 value Keras applies (0: plain SGD).
      nesterov: Nesterov momentum.
      decay: Keras's legacy inverse-time `decay` (0: none).
    """

    beta: float
    nesterov: bool
    decay: float


def sgd_settings(optimizer) -> SgdSettings:
    """The settings of a tf-keras legacy SGD; refuses anything without a lazy form.

    Raises:
      ValueError: no optimizer, another optimizer, gradient clipping in the
        optimizer, or a momentum that is callable or outside [0, 1).
    """
    _check_is_legacy_sgd(optimizer)
    config = optimizer.get_config()
    for key in ("clipnorm", "clipvalue", "global_clipnorm"):
        if config.get(key) is not None:
            raise ValueError(
                f"LazyDP cannot use an optimizer with `{key}`={config[key]!r}: it would clip the "
                "noiseless sparse gradient instead of dense DP-SGD's noisy one, so the model "
                "would differ from DP-SGD. Per-example clipping already bounds the gradient."
            )
    momentum = optimizer.momentum
    if callable(momentum) and not isinstance(momentum, tf.Variable):
        raise ValueError(
            "LazyDP needs a constant `momentum` (the deferred-noise closed form depends on it); "
            f"received a callable {momentum!r}."
        )
    # Keras applies momentum as float32: use exactly that value in the closed form.
    beta = float(np.float32(momentum.numpy() if hasattr(momentum, "numpy") else momentum))
    if not 0.0 <= beta < 1.0:
        raise ValueError(
            f"LazyDP needs optimizer `momentum` in [0, 1); received {beta!r} (beta = 1 never "
            "forgets noise and the closed form divides by 1 - beta)."
        )
    return SgdSettings(beta, bool(config.get("nesterov", False)), float(config.get("decay", 0.0) or 0.0))


def _check_is_legacy_sgd(optimizer) -> None:
    if optimizer is None:
        raise ValueError(
            "LazyDP.init needs the `optimizer` (a keras.optimizers.legacy.SGD): the deferred "
            "noise and momentum drift depend on its learning rate and momentum."
        )
    if isinstance(optimizer, keras.optimizers.legacy.SGD):
        return
    kind = type(optimizer).__name__
    if isinstance(optimizer, keras.optimizers.SGD):
        raise ValueError(
            "LazyDP needs `keras.optimizers.legacy.SGD`; received the new-style "
            f"keras.optimizers.{kind}, whose sparse momentum update decays the momentum of "
            "every row every step (a dense update) and has no per-row lazy counterpart here."
        )
    raise ValueError(
        f"LazyDP supports only SGD (keras.optimizers.legacy.SGD, with or without momentum and "
        f"a learning-rate schedule); received optimizer {kind}. An idle row's state under "
        f"{kind} after k noisy steps is not a Gaussian with a closed form (its statistics "
        "depend non-linearly on the noisy gradients), so its noise cannot be deferred "
        "exactly. Use mechanism 'adafest' (DP-AdaFEST), which only noises the rows it "
        "selects and needs no deferral, or 'dense'."
    )


def learning_rate(optimizer, *, decay: float) -> tf.Tensor:
    """eta of the coming apply, computed as Keras's legacy `_decayed_lr` does (float32)."""
    lr = optimizer.learning_rate
    if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule):
        lr = lr(tf.cast(optimizer.iterations, tf.float32))
    elif callable(lr) and not isinstance(lr, tf.Variable):
        lr = lr()
    lr = tf.cast(lr, tf.float32)
    if decay > 0:
        lr = lr / (1.0 + tf.cast(decay, tf.float32) * tf.cast(optimizer.iterations, tf.float32))
    return lr
