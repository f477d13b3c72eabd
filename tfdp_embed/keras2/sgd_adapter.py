"""LazyDP's optimizer protocol (`tfdp_embed.mechanisms.lazy.sgd.SgdOptimizer`) for tf-keras `legacy.SGD`.

Only `legacy.SGD` has an exact lazy form here: the new-style `SGD`'s sparse
momentum update decays every row's momentum every step (a dense update), and
other optimizers' state is not Gaussian after noisy steps. Both are refused
with the reason.
"""

from __future__ import annotations

import numpy as np

from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.mechanisms.lazy import sgd as lazy_sgd


class LegacySgd:
    """A `keras.optimizers.legacy.SGD` seen through `lazy_sgd.SgdOptimizer`."""

    def __init__(self, optimizer: keras.optimizers.legacy.SGD):
        self._optimizer = optimizer
        # How it applies a sparse gradient, for `sparse_sgd` to do the same in one op: "sgd" (a scatter of
        # -lr * values) or "momentum" (dedup, then Keras' sparse momentum op); None for a subclass (it may
        # apply otherwise) or gradient transformers.
        exact = type(optimizer) is keras.optimizers.legacy.SGD and not optimizer.gradient_transformers
        momentum = optimizer._momentum  # noqa: SLF001 - the flag legacy SGD itself branches on
        self.sparse_step = ("momentum" if momentum else "sgd") if exact else None
        self._decay = float(optimizer.get_config().get("decay", 0.0) or 0.0)  # legacy inverse-time decay

    @property
    def iterations(self) -> tf.Variable:
        return self._optimizer.iterations

    def settings(self) -> lazy_sgd.SgdSettings:
        """The optimizer's settings; refuses clipping in the optimizer and a callable or out-of-range momentum."""
        config = self._optimizer.get_config()
        for key in ("clipnorm", "clipvalue", "global_clipnorm"):
            if config.get(key) is not None:
                raise ValueError(
                    f"LazyDP cannot use an optimizer with `{key}`={config[key]!r}: it would clip the "
                    "noiseless sparse gradient instead of dense DP-SGD's noisy one, so the model "
                    "would differ from DP-SGD. Per-example clipping already bounds the gradient."
                )
        momentum = self._optimizer.momentum
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
        return lazy_sgd.SgdSettings(beta, bool(config.get("nesterov", False)), self._decay)

    def learning_rate(self) -> tf.Tensor:
        """eta of the coming apply, computed as Keras's legacy `_decayed_lr` does (float32)."""
        lr = self._optimizer.learning_rate
        if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule):
            lr = lr(tf.cast(self._optimizer.iterations, tf.float32))
        elif callable(lr) and not isinstance(lr, tf.Variable):
            lr = lr()
        lr = tf.cast(lr, tf.float32)
        if self._decay > 0:
            lr = lr / (1.0 + tf.cast(self._decay, tf.float32) * tf.cast(self._optimizer.iterations, tf.float32))
        return lr

    def momentum(self) -> tf.Tensor:
        """The momentum the coming apply uses (float32; a hyperparameter variable is read when the step runs)."""
        return tf.identity(self._optimizer._get_hyper("momentum", tf.float32))  # noqa: SLF001 - as legacy SGD reads it

    @property
    def nesterov(self) -> bool:
        return bool(self._optimizer.nesterov)

    def momentum_slot(self, variable: tf.Variable, *, create: bool = False) -> tf.Variable:
        if create:
            return self._optimizer.add_slot(variable, "momentum")
        return self._optimizer.get_slot(variable, "momentum")


def adapt(optimizer) -> LegacySgd | None:
    """A `LegacySgd` for a tf-keras legacy SGD; refuses tf-keras' other optimizers naming it; None for the rest."""
    if isinstance(optimizer, keras.optimizers.legacy.SGD):
        return LegacySgd(optimizer)
    if isinstance(optimizer, keras.optimizers.SGD):
        raise ValueError(
            "LazyDP needs `keras.optimizers.legacy.SGD`; received the new-style "
            f"keras.optimizers.{type(optimizer).__name__}, whose sparse momentum update decays the momentum of "
            "every row every step (a dense update) and has no per-row lazy counterpart here."
        )
    if isinstance(optimizer, (keras.optimizers.Optimizer, keras.optimizers.legacy.Optimizer)):
        raise lazy_sgd.unsupported(optimizer, sgd="keras.optimizers.legacy.SGD")
    return None


lazy_sgd.register_adapter(adapt)


__all__ = ["LegacySgd", "adapt"]
