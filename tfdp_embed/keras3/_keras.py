"""The one place the Keras 3 front end gets Keras: the user's `keras` (3.x) on the TensorFlow backend.

Nothing here selects a Keras: the process's `tf.keras` stays whatever it
was, and `TF_USE_LEGACY_KERAS` is neither read nor set. A Keras 3 on
another backend (JAX, PyTorch), or a Keras 2 as `keras`, gets a one-line
error naming what to use.
"""

from __future__ import annotations

import tensorflow as tf

try:
    import keras
except ImportError as error:  # pragma: no cover - Keras 3 ships with TensorFlow >= 2.16
    raise ImportError(
        "tfdp_embed.keras3 needs Keras 3 (`pip install keras`); for tf-keras use tfdp_embed.keras2."
    ) from error


def _check() -> None:
    version = getattr(keras, "__version__", "?")
    if not version.startswith("3."):
        raise ImportError(
            f"tfdp_embed.keras3 needs Keras 3; `import keras` gives {version}. For Keras 2 (tf-keras) use "
            "tfdp_embed.keras2 (`from tfdp_embed import DPModel`)."
        )
    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise ImportError(
            f"tfdp_embed.keras3 runs Keras 3 on the TensorFlow backend; this process uses {backend!r}. Set "
            "KERAS_BACKEND=tensorflow before importing keras."
        )


_check()

__all__ = ["keras", "tf"]
