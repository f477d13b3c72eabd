"""What the clipping engine asks of a Keras layer, without importing a Keras.

The engine serves both front ends: tf-keras (Keras 2, `tf_keras`) and Keras 3
(`keras` on the TensorFlow backend). It never imports either; it asks the
Keras packages the process has already imported (a front end imports its
own before any layer exists). Importing `tfdp_embed.clipping` therefore
never selects a Keras for the user.

Keras 3 wraps each TensorFlow variable in a `keras.Variable`; the engine and
the mechanisms work on the `tf.Variable` inside (`tf_variable`).
"""

from __future__ import annotations

import sys
from typing import Any

import tensorflow as tf

Layer = Any  # a tf-keras or Keras 3 layer (annotation only)

_KERAS_PACKAGES = ("tf_keras", "keras")


def _imported_kerases() -> list:
    """The Keras packages already imported in this process that have layers (tf-keras first)."""
    found = []
    for name in _KERAS_PACKAGES:
        module = sys.modules.get(name)
        layers = getattr(module, "layers", None) if module is not None else None
        if layers is not None and hasattr(layers, "Layer"):
            found.append(module)
    return found


def layer_classes(name: str) -> tuple:
    """`keras.layers.<name>` of every imported Keras (e.g. "Dense": tf-keras' and Keras 3's)."""
    return tuple(getattr(k.layers, name) for k in _imported_kerases() if hasattr(k.layers, name))


def is_layer(obj) -> bool:
    """`obj` is a layer (or model) of an imported Keras."""
    return isinstance(obj, layer_classes("Layer"))


def is_instance(obj, name: str) -> bool:
    """`obj` is an instance of `keras.layers.<name>` of an imported Keras."""
    classes = layer_classes(name)
    return bool(classes) and isinstance(obj, classes)


def is_keras_instance(obj, kind: str, name: str) -> bool:
    """`obj` is an instance of `keras.<kind>.<name>` (e.g. "callbacks", "EarlyStopping") of an imported Keras."""
    classes = tuple(
        getattr(getattr(k, kind), name) for k in _imported_kerases() if hasattr(getattr(k, kind, None), name)
    )
    return bool(classes) and isinstance(obj, classes)


def experimental_preprocessing_base():
    """tf-keras' `layers.experimental.preprocessing.PreprocessingLayer` when tf-keras is imported; else None."""
    for k in _imported_kerases():
        experimental = getattr(k.layers, "experimental", None)
        base = getattr(getattr(experimental, "preprocessing", None), "PreprocessingLayer", None)
        if base is not None:
            return base
    return None


_TF_ACTIVATIONS = {
    "relu": (tf.nn.relu,),
    "sigmoid": (tf.math.sigmoid, tf.nn.sigmoid),
    "tanh": (tf.math.tanh, tf.nn.tanh),
    "softmax": (tf.nn.softmax,),
}


def activation_name(activation) -> str | None:
    """ "linear", "relu", "sigmoid", "tanh" or "softmax" for those activations of any Keras or `tf.nn`; else None.

    None (no activation) is "linear". Matched by identity, never by name: a
    user's function called `relu` is not Keras's.
    """
    if activation is None:
        return "linear"
    for name in ("linear", "relu", "sigmoid", "tanh", "softmax"):
        known = [getattr(k.activations, name, None) for k in _imported_kerases()]
        if any(activation is f for f in (*known, *_TF_ACTIVATIONS.get(name, ()))):
            return name
    return None


def tf_variable(variable):
    """The `tf.Variable` of a tf-keras variable (itself) or of a Keras 3 `keras.Variable` (the one it wraps)."""
    if isinstance(variable, tf.Variable):
        return variable
    inner = getattr(variable, "value", None)
    if isinstance(inner, tf.Variable):
        return inner
    return variable


def trainable_tf_variables(layer) -> list:
    """`layer.trainable_weights` as `tf.Variable`s."""
    return [tf_variable(v) for v in layer.trainable_weights]


__all__ = [
    "Layer",
    "activation_name",
    "experimental_preprocessing_base",
    "is_instance",
    "is_keras_instance",
    "is_layer",
    "layer_classes",
    "tf_variable",
    "trainable_tf_variables",
]
