"""Per-example gradients for layers without a registry entry (slow but exact).

For a layer with no ghost-norm rule, the layer's original `call` is re-run
on each example alone inside `tf.vectorized_map`, and that example's output
gradient is back-propagated to the layer's *own* trainable variables:

    grad_i = sum_k d/dv <call_k(x_{k,i}), g_{k,i}>  over the layer's calls k,

which materialises `[batch, *v.shape]` for every own variable v. This is
fine for small layers (a convolution, a custom scale) and a warning, once
per layer, says which layer took this path so that a rule can be
registered. The re-run must reproduce the recorded forward pass: layers
that draw randomness in `call` (dropout inside the layer) are not exact.

Example:
    >>> info = vectorized_layer_gradients(layer, taps, output_grads)

References: Goodfellow 2015 (per-example gradients); Agarwal et al. 2019
(vectorized per-example gradients via pfor); Bu et al. 2022 book-keeping.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Sequence

from tfdp_embed._keras import keras, tf
from tfdp_embed.clipping.registry import LayerGradients
from tfdp_embed.clipping.taps import LayerTaps, own_trainable_variables

_WARNED: weakref.WeakSet = weakref.WeakSet()


def vectorized_layer_gradients(
    layer: keras.layers.Layer, taps: LayerTaps, output_grads: Sequence[tf.Tensor]
) -> LayerGradients:
    """Per-example gradients of a layer's own variables by `tf.vectorized_map`.

    grad_i = d/dv sum_k <call_k(x_{k,i}), g_{k,i}>, one example at a time (vectorised).

    Every tensor argument of rank >= 1 of a recorded call is treated as batched
    (sliced per example); other arguments (Python values, scalars) are passed as
    they were.

    Args:
      layer: any layer; only the variables it owns itself (not its sub-layers') count.
      taps: the layer's recorded calls; `taps.call_fn` is re-run per example.
      output_grads: d(sum_i loss_i)/d(output) for each call.

    Returns:
      `LayerGradients` over the layer's own trainable variables.

    Raises:
      TypeError: if a call received a ragged or sparse tensor (it cannot be sliced).

    References: Agarwal et al. 2019 (pfor per-example gradients); Bu et al. 2022 book-keeping.
    """
    _warn_once(layer)
    variables = own_trainable_variables(layer)
    batch_size = tf.shape(output_grads[0])[0]
    if not variables:
        return LayerGradients([], tf.zeros([batch_size], tf.float32), lambda c: [])

    plans, elems = [], []
    for call, grad in zip(taps.calls, output_grads):
        structure = (call.args, call.kwargs)
        flat = tf.nest.flatten(structure)
        batched = []
        for leaf in flat:
            if isinstance(leaf, (tf.RaggedTensor, tf.SparseTensor)):
                raise TypeError(
                    f"The per-example fallback cannot slice the {type(leaf).__name__} input "
                    f"of layer {layer.name!r} ({type(layer).__name__}); register a rule for "
                    "this layer in the LayerRegistry."
                )
            is_batched = isinstance(leaf, tf.Tensor) and leaf.shape.rank != 0
            batched.append(is_batched)
            if is_batched:
                elems.append(leaf)
        elems.append(grad)
        plans.append((structure, flat, batched))

    def one_example(example_elems):
        it = iter(example_elems)
        with tf.GradientTape() as tape:
            tape.watch(variables)
            terms = []
            for structure, flat, batched in plans:
                leaves = [next(it)[None] if b else leaf for leaf, b in zip(flat, batched)]
                args, kwargs = tf.nest.pack_sequence_as(structure, leaves)
                outputs = taps.call_fn(*args, **kwargs)
                grad = tf.stop_gradient(tf.cast(next(it)[None], outputs.dtype))
                terms.append(tf.reduce_sum(outputs * grad))
        return tape.gradient(terms, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO)

    per_example = tf.vectorized_map(one_example, elems)  # [B, *v.shape] per variable
    squared = 0.0
    for grads in per_example:
        flat_grads = tf.reshape(grads, [batch_size, -1])
        squared += tf.cast(tf.reduce_sum(tf.square(flat_grads), axis=1), tf.float32)

    def clipped_sum(clip_factors: tf.Tensor) -> list:
        return [
            tf.tensordot(tf.cast(clip_factors, grads.dtype), grads, axes=1) for grads in per_example
        ]

    return LayerGradients(variables=variables, squared_norms=squared, clipped_sum=clipped_sum)


def _warn_once(layer: keras.layers.Layer) -> None:
    if layer in _WARNED:
        return
    _WARNED.add(layer)
    warnings.warn(
        f"No per-example clipping rule for layer {layer.name!r} ({type(layer).__name__}); "
        "computing its per-example gradients with tf.vectorized_map, which is slower and "
        "holds [batch, *weight.shape] per weight. Register a rule in the LayerRegistry "
        "to make it fast.",
        RuntimeWarning,
        stacklevel=3,
    )
