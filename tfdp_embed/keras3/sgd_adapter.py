"""LazyDP's optimizer protocol (`tfdp_embed.mechanisms.lazy.sgd.SgdOptimizer`) for Keras 3's `SGD`.

Keras 3's SGD applies a `tf.IndexedSlices` gradient as a scatter (sparse,
measured: 0.5 ms at 10^6 x 16), with a constant or scheduled learning rate;
LazyDP's closed form holds for it without momentum. With momentum, Keras 3
updates every row's momentum every step (`m <- beta m - eta g` on the whole
slot, 29 ms at 10^6 x 16), which leaves no row idle. LazyDP's closed form
assumes what tf-keras' legacy SGD does for a sparse gradient: only the rows
the gradient names move (`m[r] <- beta m[r] - eta g[r]`, then `theta[r] +=
m[r]`, or `beta m[r] - eta g[r]` with Nesterov), and LazyDP catches idle rows
up (their momentum drift and owed noise) before anybody reads them. So under
LazyDP the tables' gradients are applied that way here
(`Keras3Sgd.apply_sparse`, on Keras 3's own momentum slots), the dense
variables by Keras 3's SGD; the step counter and the schedule are Keras 3's.
"""

from __future__ import annotations

from tfdp_embed.clipping.layer_kinds import tf_variable
from tfdp_embed.keras3._keras import keras, tf
from tfdp_embed.mechanisms.lazy import sgd as lazy_sgd
from tfdp_embed.ops import sparse_rows

_REFUSED_SETTINGS = ("clipnorm", "clipvalue", "global_clipnorm", "weight_decay", "loss_scale_factor")


class Keras3Sgd:
    """A Keras 3 `keras.optimizers.SGD` (momentum 0) seen through `lazy_sgd.SgdOptimizer`."""

    def __init__(self, optimizer):
        self._optimizer = optimizer
        # How it applies a sparse gradient, for `sparse_sgd` to do the same in one op: "sgd" (a scatter of
        # -lr * values) for the class itself without momentum; else None (Keras 3's momentum is dense).
        self.sparse_step = "sgd" if type(optimizer) is keras.optimizers.SGD and not optimizer.momentum else None

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
        beta = float(config.get("momentum") or 0.0)
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"LazyDP needs optimizer `momentum` in [0, 1); received {beta!r}.")
        return lazy_sgd.SgdSettings(beta, bool(config.get("nesterov", False)), 0.0)

    def learning_rate(self) -> tf.Tensor:
        """eta of the coming apply: Keras 3 evaluates a schedule at `iterations` before it increments it."""
        return tf.cast(self._optimizer.learning_rate, tf.float32)

    def momentum_slot(self, variable: tf.Variable, *, create: bool = False) -> tf.Variable:
        """Keras 3's momentum slot of `variable` (built with the optimizer, before the mechanism's init)."""
        optimizer = self._optimizer
        if not optimizer.built or not optimizer.momentums:
            raise ValueError("Build the Keras 3 SGD (with momentum) on the model's variables before LazyDP.init.")
        index = optimizer._get_variable_index(variable)  # noqa: SLF001 - Keras 3 has no public slot accessor
        return tf_variable(optimizer.momentums[index])

    def apply_sparse(self, gradient: tf.IndexedSlices, variable: tf.Variable, learning_rate: tf.Tensor) -> tf.Tensor:
        """Legacy SGD's sparse momentum step on the rows `gradient` names (unique rows); other rows stay idle.

        One op (`sparse_rows.momentum_sum`); returns the float64 sum of the written rows (the check's).
        """
        rows, values = gradient.indices, tf.cast(gradient.values, variable.dtype)
        return sparse_rows.momentum_sum(
            variable,
            self.momentum_slot(variable),
            rows,
            values,
            learning_rate,
            float(self._optimizer.momentum),
            nesterov=bool(self._optimizer.nesterov),
        )


def lazy_momentum(mechanism, optimizer) -> Keras3Sgd | None:
    """A `Keras3Sgd` whose `apply_sparse` takes the tables' gradients: LazyDP with a Keras 3 SGD with momentum."""
    from tfdp_embed.mechanisms import LazyDP

    if isinstance(mechanism, LazyDP) and isinstance(optimizer, keras.optimizers.SGD) and optimizer.momentum:
        return Keras3Sgd(optimizer)
    return None


def adapt(optimizer) -> Keras3Sgd | None:
    """A `Keras3Sgd` for a Keras 3 SGD; refuses another Keras 3 optimizer naming Keras 3's SGD; else None."""
    if isinstance(optimizer, keras.optimizers.SGD):
        return Keras3Sgd(optimizer)
    if isinstance(optimizer, keras.optimizers.Optimizer):
        raise lazy_sgd.unsupported(optimizer, sgd="keras.optimizers.SGD")
    return None


lazy_sgd.register_adapter(adapt)

__all__ = ["Keras3Sgd", "adapt", "lazy_momentum"]
