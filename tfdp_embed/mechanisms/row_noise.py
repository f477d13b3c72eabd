"""Per-row noise keyed by (seed, step, row): the exactness test mode.

Dense DP-SGD draws a step's table noise as one `[vocab, dim]` block;
LazyDP draws a row's noise whenever it catches the row up. With
`row_noise="stateless"` both draw row r's noise of step t as

    z[t, r] = tf.random.stateless_normal([dim], seed=(seed, t * 2^32 + r))

so LazyDP with `aggregate=False` (each missed step's own noise) adds the
very numbers dense DP-SGD adds, and the two trained models agree to float
rounding. It is a test mode: one op per row is slow, and an explicit seed
is required. Production noise comes from a `tf.random.Generator`
(`row_noise="generator"`, OS entropy unless a seed is given).

Example:
    >>> z = stateless_row_normals(seed=0, steps=3, rows=tf.constant([5, 9]), shape=[4])
    >>> z.shape  # [2, 4]; z[0] depends only on (0, 3, 5)

References: LazyDP §5.2 (Alg. 1 with ANS disabled reproduces DP-SGD's draws).
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

ROW_NOISE_MODES = ("generator", "stateless")
_ROW_BITS = 32


def check_row_noise(row_noise: str, seed: int | None) -> str:
    """Validates `row_noise`; the stateless mode needs an explicit int seed."""
    if row_noise not in ROW_NOISE_MODES:
        raise ValueError(f"`row_noise` must be one of {ROW_NOISE_MODES}; received {row_noise!r}.")
    if row_noise == "stateless" and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise ValueError(
            "`row_noise='stateless'` keys each row's noise by (seed, step, row) to reproduce "
            f"dense DP-SGD's draws exactly, and needs an explicit int `seed`; received {seed!r}. "
            "It is a test mode: production noise uses row_noise='generator' with seed=None."
        )
    return row_noise


def stateless_row_normals(*, seed: int, steps, rows, shape: Sequence[int]) -> tf.Tensor:
    """Standard normals of shape `[n, *shape]`; slice i keyed by (seed, steps[i], rows[i]).

    Args:
      seed: the mechanism's int seed.
      steps: int scalar or `[n]` step numbers (negative values form a
        separate key space, used for LazyDP's aggregated stateless draws).
      rows: int `[n]` table rows, each in [0, 2^32).
      shape: per-row shape, e.g. `[dim]`.

    Returns:
      float32 `[n, *shape]`.
    """
    rows = tf.reshape(tf.cast(rows, tf.int64), [-1])
    steps = tf.broadcast_to(tf.cast(steps, tf.int64), tf.shape(rows))
    keys = tf.stack(
        [tf.fill(tf.shape(rows), tf.constant(seed, tf.int64)), steps * (1 << _ROW_BITS) + rows],
        axis=1,
    )
    shape = list(shape)

    @tf.autograph.experimental.do_not_convert
    def draw(key):
        return tf.random.stateless_normal(shape, seed=key, dtype=tf.float32)

    return tf.map_fn(draw, keys, fn_output_signature=tf.TensorSpec(shape, tf.float32))


__all__ = ["ROW_NOISE_MODES", "check_row_noise", "stateless_row_normals"]
