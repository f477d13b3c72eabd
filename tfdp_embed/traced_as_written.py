"""The DP step's own stages run as written under AutoGraph; the user's code in them is converted as before.

`tf.function` with AutoGraph (Keras' `fit`, `tf.function(dp.train_step)`)
converts every Python function the step calls, recursively. Converting the
library's clipping, assembling and noising stages was most of a DP step's
first call (3.7 of 4.7 s for one LazyDP table, measured with a load of
about 4 on 2 cores). They build their tensor-dependent branches with
`tf.cond` and `tf.while_loop` themselves, so `as_written` runs them
unconverted.

Unlike `tf.autograph.experimental.do_not_convert`, `as_written` keeps the
caller's AutoGraph status: a Keras layer, loss or metric called inside
still converts the user's `call` as Keras does (`tf_convert` with the
current status). A user's plain function called inside (a clipping rule,
its clipped sum, a mechanism's `update`, an optimizer's `apply_gradients`)
goes through `user_code`, which converts it exactly when the caller would
have: functions already marked unconverted (the built-in rules) run as
they are.

Example:
    >>> @as_written
    ... def clipped_step(taps, loss, tape, *, registry, ...):
    ...     info = user_code(rule)(layer, taps, output_grads)
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import tensorflow as tf


@tf.autograph.experimental.do_not_convert
def _call_in_status(status, func: Callable, args: tuple, kwargs: dict):
    """`func(*args, **kwargs)` unconverted, under the caller's AutoGraph `status` (re-entered)."""
    with status:
        return func(*args, **kwargs)


def as_written(func: Callable) -> Callable:
    """`func` runs unconverted by AutoGraph, under its caller's AutoGraph status (see the module docstring).

    The returned wrapper is converted once per process (one code object for
    every function wrapped here); `func`'s body never is.
    """

    @functools.wraps(func)
    def run(*args, **kwargs):
        return _call_in_status(tf.__internal__.autograph.control_status_ctx(), func, args, kwargs)

    return run


def user_code(fn: Callable) -> Callable:
    """`fn`, converted by AutoGraph exactly when the current status is on (the caller's, under `as_written`).

    On: in a step traced with AutoGraph, where the caller itself used to be
    converted. Off or unspecified (eager, `tf.function(autograph=False)`):
    `fn` runs unconverted, as it did. Functions marked unconverted
    (`do_not_convert`, `as_written`) come back as they are.
    """
    status = tf.__internal__.autograph.control_status_ctx()
    return tf.__internal__.autograph.tf_convert(fn, status, convert_by_default=False)


__all__ = ["as_written", "user_code"]
