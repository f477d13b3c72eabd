"""Read guards: an eager read of a guarded variable first runs its guard (LazyDP: flush).

LazyDP defers the noise of rows nobody reads, so between steps a table
holds rows without their DP-SGD noise. Every public way to look at the
table outside the training step reads the variable eagerly: `numpy()`,
`value()`, `read_value()`, `tf.convert_to_tensor`, Keras `get_weights`,
every weights file and checkpoint (`_serialize_to_tensors` reads with
`read_value_no_copy`), `tf.gather` / `sparse_read` / `gather_nd`. All of
them go through three methods of TensorFlow's resource variable:
`_read_variable_op` (every full read), `sparse_read` and `gather_nd`.
`install` overrides these on one variable instance so that, when executing
eagerly, `before_read()` runs first (LazyDP adds all the noise it owes).

Untouched: reads while tracing or running a `tf.function` (the training
step and its read hooks, which catch up every row they read), writes, and
reads inside `unguarded()`. `unguarded()` is for code that must see the
raw training state: the training step run eagerly, the mechanism's own
bookkeeping, `TrainingCheckpoint` (which saves the table WITH the state
that says what noise each row still owes), and white-box tests.

Example:
    >>> install(table, flush_if_owed)  # e.g. LazyDP flushes when it owes noise
    >>> table.numpy()            # flushed first
    >>> with unguarded():
    ...     raw = table.numpy()  # training-internal: may lack owed noise

References: LazyDP (Lim et al., ASPLOS 2024) §3 (threat model: only the
final, flushed model is released).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

import tensorflow as tf

_GUARDED_METHODS = ("_read_variable_op", "sparse_read", "gather_nd")
_GUARD_ATTRIBUTE = "_tfdp_before_read"
_local = threading.local()


def _depth() -> int:
    return getattr(_local, "depth", 0)


@contextlib.contextmanager
def unguarded():
    """Reads inside this block (this thread) skip every guard: they may see un-flushed values."""
    _local.depth = _depth() + 1
    try:
        yield
    finally:
        _local.depth -= 1


def active() -> bool:
    """True when a read here runs guards: executing eagerly, outside `unguarded()`."""
    return _depth() == 0 and tf.executing_eagerly()


def _resource_variables(variable) -> list:
    """The resource variables holding `variable`'s value (one; PS strategies wrap it)."""
    inner = getattr(variable, "_v", None)  # tf.distribute's AggregatingVariable delegates to `_v`
    if isinstance(inner, tf.Variable):
        return _resource_variables(inner)
    if all(hasattr(variable, name) for name in (*_GUARDED_METHODS, "handle")):
        return [variable]
    raise TypeError(
        f"Cannot guard reads of variable {getattr(variable, 'name', variable)!r} of type "
        f"{type(variable).__name__}: expected a resource variable."
    )


def _guarded(method, variable):
    def read(*args, **kwargs):
        before_read = variable.__dict__.get(_GUARD_ATTRIBUTE)
        if before_read is not None and active():
            with unguarded():  # the guard's own reads (and a flush's) are not guarded again
                before_read()
        return method(variable, *args, **kwargs)

    return read


def install(variable: tf.Variable, before_read: Callable[[], None]) -> None:
    """Makes every eager read of `variable` (outside `unguarded()`) call `before_read()` first."""
    for resource in _resource_variables(variable):
        setattr(resource, _GUARD_ATTRIBUTE, before_read)
        for name in _GUARDED_METHODS:
            setattr(resource, name, _guarded(getattr(type(resource), name), resource))


def remove(variable: tf.Variable) -> None:
    """Removes `install`'s guard from `variable` (no-op if none)."""
    for resource in _resource_variables(variable):
        if resource.__dict__.pop(_GUARD_ATTRIBUTE, None) is None:
            continue
        for name in _GUARDED_METHODS:
            resource.__dict__.pop(name, None)


def is_guarded(variable: tf.Variable) -> bool:
    """True when `install` guards `variable`."""
    return all(_GUARD_ATTRIBUTE in resource.__dict__ for resource in _resource_variables(variable))


__all__ = ["active", "install", "is_guarded", "remove", "unguarded"]
