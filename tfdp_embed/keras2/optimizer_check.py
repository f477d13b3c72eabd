"""A sparse table gradient under a non-legacy tf-keras optimizer: warn once, naming the legacy optimizer.

tf-keras' new-style optimizers (`keras.optimizers.SGD`, `Adam`, ...) apply a
`tf.IndexedSlices` gradient by rewriting the whole variable, so a sparse
mechanism's step costs as much as the table is large, not as the rows a
batch touches. `keras.optimizers.legacy.*` apply it sparsely. The check runs
when the train step is traced, the first point where the gradients' types
are known: a dense gradient (dense DP-SGD noises every row) costs the same
either way and is not warned about.
"""

from __future__ import annotations

import warnings
import weakref

from tfdp_embed.keras2._keras import keras, tf

_warned: weakref.WeakSet = weakref.WeakSet()


@tf.autograph.experimental.do_not_convert
def warn_dense_table_rewrite(optimizer, pairs) -> None:
    """Warns (once per optimizer) when a non-legacy optimizer gets `tf.IndexedSlices` gradients.

    Args:
      optimizer: the model's optimizer.
      pairs: the (gradient, variable) pairs about to be applied.
    """
    if optimizer in _warned or isinstance(optimizer, keras.optimizers.legacy.Optimizer):
        return
    sparse = [variable.name for gradient, variable in pairs if isinstance(gradient, tf.IndexedSlices)]
    if not sparse:
        return
    _warned.add(optimizer)
    name = type(optimizer).__name__
    legacy = (
        f"`keras.optimizers.legacy.{name}`"
        if hasattr(keras.optimizers.legacy, name)
        else "an optimizer from `keras.optimizers.legacy` (e.g. `keras.optimizers.legacy.SGD`)"
    )
    warnings.warn(
        f"The optimizer {name} ({type(optimizer).__module__}) is not a legacy tf-keras optimizer: it applies the "
        f"sparse gradients of {sparse} by rewriting each whole table every step, so the step costs as much as "
        f"the tables are large. Use {legacy} with the same arguments: it updates only the rows a batch touches.",
        UserWarning,
        stacklevel=2,
    )


__all__ = ["warn_dense_table_rewrite"]
