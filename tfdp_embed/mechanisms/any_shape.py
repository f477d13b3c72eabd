"""`AnyShapeFunction`: a `tf.function` traced once for variables and tensors of any shape.

A mechanism's per-table work (LazyDP's catch-up, its flush) is the same ops
for every table; only the shapes differ. A `tf.function` closing over each
table is traced once per table (26 traces for the Criteo model), and
`tf.function` called with the tables as arguments traces again for each new
shape. This wrapper traces one concrete function per dtype, rank and
Python argument, with every dimension unknown, and calls it with the
variables as arguments: one trace serves every table.

Under a distribution strategy, or with arguments that are not plain
resource variables, tensors or Python values, the call runs inline instead.

Example:
    >>> scale = AnyShapeFunction(lambda table, rows: table.scatter_mul(tf.IndexedSlices(...)))
    >>> for table in tables:
    ...     scale(table, rows)        # one trace for all tables
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import tensorflow as tf

try:  # the spec of a variable a traced function takes as an argument (no public name)
    from tensorflow.python.ops.resource_variable_ops import VariableSpec as _VariableSpec
except ImportError:  # pragma: no cover

    class _VariableSpec:  # type: ignore[no-redef]  # nothing matches: every call runs inline
        pass


class AnyShapeFunction:
    """Calls `python_function` through concrete functions traced for any shape.

    Args:
      python_function: a function of variables, tensors and Python values
        (None, ints, strings: part of the trace key).
      noinline: keep the traced function out of line where it is called
        from another trace (one function body for the optimiser and the
        runtime to prepare, instead of a copy per call site).

    Attributes:
      traced: the underlying `tf.function` (its tracing count is the number
        of concrete functions made).
    """

    def __init__(self, python_function: Callable, *, noinline: bool = False):
        attributes = {"_noinline": True} if noinline else None
        self.python_function = python_function
        self._arguments: list = []  # the traces' variable arguments: the functions hold them weakly only
        keeping = functools.partial(_keeping_variables, python_function, self._arguments)
        self.traced = tf.function(keeping, autograph=False, experimental_attributes=attributes)
        self._concrete: dict = {}

    def __call__(self, *args):
        if tf.distribute.has_strategy() or not all(_traceable(arg) for arg in args):  # under a strategy: inline
            return self.python_function(*args)
        key = tuple(_key(arg) for arg in args)
        if key not in self._concrete:
            self._concrete[key] = self.traced.get_concrete_function(*(_spec(arg) for arg in args))
        return self._concrete[key](*args)


def _keeping_variables(python_function: Callable, kept: list, *args):
    """Calls `python_function`, keeping the variables a trace passes it.

    A traced function's graph references its variable arguments weakly:
    unkept, they die after the trace and every call fails.
    """
    kept.extend(arg for arg in args if isinstance(arg, tf.Variable))
    return python_function(*args)


def _traceable(arg) -> bool:
    """A plain resource variable, a tensor or a Python value (anything else is called inline)."""
    if isinstance(arg, tf.Variable):
        if isinstance(arg, tf.distribute.DistributedValues):
            return False
        try:
            return isinstance(tf.type_spec_from_value(arg), _VariableSpec)
        except (TypeError, ValueError):
            return False
    return isinstance(arg, tf.Tensor) or arg is None or isinstance(arg, (bool, int, float, str))


def _key(arg) -> tuple:
    if isinstance(arg, tf.Variable):
        return ("variable", arg.dtype, arg.shape.rank)
    if isinstance(arg, tf.Tensor):
        return ("tensor", arg.dtype, arg.shape.rank)
    return ("python", arg)


def _spec(arg):
    """A spec with every dimension unknown for a variable or tensor; Python values as they are."""
    if isinstance(arg, (tf.Variable, tf.Tensor)):
        spec = tf.type_spec_from_value(arg)
        rank = arg.shape.rank
        return type(spec)(shape=None if rank is None else [None] * rank, dtype=arg.dtype)
    return arg


__all__ = ["AnyShapeFunction"]
