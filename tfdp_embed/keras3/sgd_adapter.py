"""LazyDP's optimizer protocol (`tfdp_embed.mechanisms.lazy.sgd.SgdOptimizer`) for Keras 3's `SGD`.

Keras 3's SGD applies a `tf.IndexedSlices` gradient as a scatter (sparse,
measured: 0.5 ms at 10^6 x 16), with a constant or scheduled learning rate;
LazyDP's closed form holds for it without momentum. With momentum, Keras 3
updates every row's momentum every step (`m <- beta m - eta g` on the whole
slot, 29 ms at 10^6 x 16): there is no per-row lazy form of that update, so
LazyDP refuses it with the reason (DenseDPSGD trains with it, dense).
"""

from __future__ import annotations

from tfdp_embed.clipping.layer_kinds import tf_variable
from tfdp_embed.keras3._keras import keras, tf
from tfdp_embed.mechanisms.lazy import sgd as lazy_sgd

_REFUSED_SETTINGS = ("clipnorm", "clipvalue", "global_clipnorm", "weight_decay", "loss_scale_factor")


class Keras3Sgd:
    """A Keras 3 `keras.optimizers.SGD` (momentum 0) seen through `lazy_sgd.SgdOptimizer`."""

    def __init__(self, optimizer):
        self._optimizer = optimizer

    @property
    def iterations(self) -> tf.Variable:
        return tf_variable(self._optimizer.iterations)

    def settings(self) -> lazy_sgd.SgdSettings:
        """Refuses clipping, weight decay, EMA, accumulation and momentum: none has a lazy form here."""
        config = self._optimizer.get_config()
        for key in _REFUSED_SETTINGS:
            if config.get(key):
                raise ValueError(
                    f"LazyDP cannot use a Keras 3 SGD with `{key}`={config[key]!r}: it would act on the noiseless "
                    "sparse gradient or on every row, not as dense DP-SGD's noisy step does."
                )
        if config.get("use_ema") or (config.get("gradient_accumulation_steps") or 1) > 1:
            raise ValueError("LazyDP cannot use a Keras 3 SGD with `use_ema` or `gradient_accumulation_steps`.")
        if float(config.get("momentum") or 0.0) != 0.0:
            raise ValueError(
                f"LazyDP with Keras 3 needs `keras.optimizers.SGD(momentum=0)`; received momentum="
                f"{config['momentum']!r}. Keras 3's SGD decays every row's momentum every step (a dense update "
                "with no per-row lazy form). Use DenseDPSGD for momentum under Keras 3, or the tf-keras front end "
                "(tfdp_embed.keras2) with keras.optimizers.legacy.SGD(momentum=...) for LazyDP with momentum."
            )
        return lazy_sgd.SgdSettings(0.0, False, 0.0)

    def learning_rate(self) -> tf.Tensor:
        """eta of the coming apply: Keras 3 evaluates a schedule at `iterations` before it increments it."""
        return tf.cast(self._optimizer.learning_rate, tf.float32)

    def momentum_slot(self, variable: tf.Variable, *, create: bool = False) -> tf.Variable:
        raise ValueError("LazyDP under Keras 3 runs without momentum: there is no momentum slot.")


def adapt(optimizer) -> Keras3Sgd | None:
    """A `Keras3Sgd` for a Keras 3 SGD; None for anything else (LazyDP then refuses it with the reason)."""
    if isinstance(optimizer, keras.optimizers.SGD):
        return Keras3Sgd(optimizer)
    return None


lazy_sgd.register_adapter(adapt)

__all__ = ["Keras3Sgd", "adapt"]
