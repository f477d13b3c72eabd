"""The one place that decides which Keras `tf.keras` is.

TFRS and tensorflow-privacy need Keras 2, which TensorFlow >= 2.16 ships as
the separate `tf-keras` package and selects when `TF_USE_LEGACY_KERAS=1` is set
before `tf.keras` is first touched. Every module of the front end imports
`keras` and `tf` from here.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf
import tf_keras as keras


def _check_legacy_keras() -> None:
    if os.environ.get("TF_USE_LEGACY_KERAS") not in ("1", "true", "True"):
        raise ImportError(
            "tfdp_embed's tf-keras front end (DPModel, DPEmbedding, tfdp_embed.keras2) needs Keras 2 "
            f"(`tf-keras`), but TF_USE_LEGACY_KERAS is set to {os.environ.get('TF_USE_LEGACY_KERAS')!r}. "
            "Unset it or set it to '1' before importing TensorFlow. (The core, e.g. tfdp_embed.mechanisms "
            "and tfdp_embed.accounting, works under either Keras.)"
        )
    if tf.keras.layers.Layer is not keras.layers.Layer:
        raise ImportError(
            "tfdp_embed needs Keras 2 (`tf-keras`) as `tf.keras`, but `tf.keras` is already "
            "Keras 3 in this process (TensorFlow was imported and `tf.keras` used before "
            "tfdp_embed could set TF_USE_LEGACY_KERAS=1). Import the front end first "
            "(`from tfdp_embed import DPModel` or `import tfdp_embed.keras2`), or set "
            "TF_USE_LEGACY_KERAS=1 in the environment."
        )


_check_legacy_keras()

__all__ = ["keras", "tf"]
