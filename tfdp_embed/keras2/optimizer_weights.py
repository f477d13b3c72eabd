"""Creating an optimizer's variables before the train step is traced, so that Keras traces it once.

`tf.function` traces a function a second time when its first trace created
variables. An optimizer creates its step counter, hyperparameters and slots
(momentum, ...) in its first `apply_gradients`, i.e. inside the first trace
of the train step, and the step of a model with many tables is slow to
trace. `DPModel.prepare` calls `create_optimizer_weights` first, with public
optimizer API only: new-style optimizers `build(var_list)`; legacy ones
create the counter and hyperparameters through their public attributes,
and `keras.optimizers.legacy.SGD` its momentum slots with `add_slot`. Other
legacy optimizers keep creating their slots in the first trace (correct, one
trace slower).
"""

from __future__ import annotations

from tfdp_embed.keras2._keras import keras, tf


def create_optimizer_weights(optimizer, variables, *, strategy: tf.distribute.Strategy) -> None:
    """Creates `optimizer`'s step counter, hyperparameters and slots for `variables`, eagerly.

    Only without a distribution strategy (the model's is the default one):
    under any other the optimizer creates them where the strategy wants
    them, in the first step, as before.

    Args:
      optimizer: the compiled model's optimizer (None: nothing to do).
      variables: the variables it will update.
      strategy: the model's `distribute_strategy`.
    """
    default = strategy is tf.distribute.get_strategy() and not tf.distribute.has_strategy()
    if optimizer is None or not default or not tf.executing_eagerly():
        return
    if isinstance(optimizer, keras.optimizers.legacy.Optimizer):
        optimizer.iterations  # noqa: B018 - public accessors that create the variables
        optimizer.learning_rate  # noqa: B018 - the first hyperparameter read creates them all
        if isinstance(optimizer, keras.optimizers.legacy.SGD) and optimizer.get_config().get("momentum", 0) > 0:
            for variable in variables:
                optimizer.add_slot(variable, "momentum")
    elif isinstance(optimizer, keras.optimizers.Optimizer):
        optimizer.build(list(variables))


__all__ = ["create_optimizer_weights"]
