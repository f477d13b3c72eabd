"""The library's one factory of `tf.random.Generator`s (noise and sampling).

No default randomness: `seed=None` draws the state from OS entropy, an int
seed makes the stream reproducible (tests). Where the int goes in the
Philox state is explicit, because the two layouts give different streams
and seeded results (tests, checkpoints) pin each caller's layout.
"""

from __future__ import annotations

import tensorflow as tf

_SEED_AS = ("key", "counter")


def make_generator(seed: int | None, *, seed_as: str) -> tf.random.Generator:
    """A Philox generator: OS entropy unless an explicit int seed is given.

    Args:
      seed: int for a reproducible stream (tests), None for OS entropy.
      seed_as: where an int seed goes in the Philox state.
        "key": the seed is the Philox key, counter 0, so neighbouring seeds
        give independent streams (the mechanisms' noise).
        "counter": `tf.random.Generator.from_seed`'s layout, key 0 and
        counter `seed`, so seed s + 1 is the stream of seed s shifted by one
        Philox block (the Poisson samplers, whose seeded batches tests and
        sampler positions in checkpoints pin).

    Returns:
      A new `tf.random.Generator` (its state is a `tf.Variable`).

    Raises:
      TypeError: `seed` is neither an int nor None.
      ValueError: `seed_as` is not "key" or "counter".
    """
    if seed_as not in _SEED_AS:
        raise ValueError(f"`seed_as` must be one of {_SEED_AS}; received {seed_as!r}.")
    if seed is None:
        return tf.random.Generator.from_non_deterministic_state()
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"`seed` must be an int or None (OS entropy); received {seed!r}.")
    if seed_as == "key":
        return tf.random.Generator.from_key_counter(key=seed, counter=[0, 0], alg="philox")
    return tf.random.Generator.from_seed(seed)
