"""tf.data options the library's input pipelines share."""

from __future__ import annotations

import tensorflow as tf


def without_autotuning(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """`dataset` with tf.data's autotuning off, for pipelines with nothing to tune.

    The library's pipelines fix their parallelism and buffers (sequential
    maps: the sampler's draws come in a fixed order). Autotuning's model
    thread still runs, and deleting an iterator waits for it to wake: in
    about half of the Criteo pipeline's runs that cost ~1-2 s at the end of
    a `fit` or of a file read (measured, TF 2.21). A pipeline built on the
    dataset that has something to tune turns it back on with `with_options`.
    """
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


__all__ = ["without_autotuning"]
