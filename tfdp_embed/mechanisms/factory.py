"""The one mechanism factory: `create(name, ...)` builds `MECHANISMS[name]` from keyword options.

`MECHANISMS` maps each name to its class, nothing else, and is read-only:
a user's mechanism joins it through `register_mechanism(name, cls)`; whether a name is
DP, what it supports and which options it takes come from the class
(`is_dp`, `capabilities`, its constructor's keywords). Options are checked
against the constructor: an unknown one, or a required one left out, is an
error naming what is allowed.

A class whose constructor takes no `counts` but that offers `from_counts`
(DP-AdaFEST+, which selects its rows from bucket counts) is built with
`from_counts` when `counts` is given; the selection it makes then supplies
`selected_rows` and `selection_event`.

Example:
    >>> create("dense", l2_norm_clip=1.0, noise_multiplier=1.1)  # no seed: OS entropy (ints are for tests)
    >>> create("fest", l2_norm_clip=1.0, noise_multiplier=0.9, selection_epsilon=0.3,
    ...        top_fraction=0.1, counts=counts)
    >>> create("none")                    # no clip norm, no noise
    >>> register_mechanism("my_dense", MyDense)  # class MyDense(DenseDPSGD): name = "my_dense"
    >>> create("my_dense", l2_norm_clip=1.0, noise_multiplier=1.1)
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Mapping

from tfdp_embed.mechanisms.adafest import DPAdaFEST
from tfdp_embed.mechanisms.adafest_plus import DPAdaFESTPlus
from tfdp_embed.mechanisms.base import NoiseMechanism
from tfdp_embed.mechanisms.capabilities import capabilities_of, declaring_class
from tfdp_embed.mechanisms.dense import DenseDPSGD
from tfdp_embed.mechanisms.eana import EANA
from tfdp_embed.mechanisms.fest import DPFEST
from tfdp_embed.mechanisms.lazy import LazyDP
from tfdp_embed.mechanisms.none import NonPrivate

_REGISTRY: dict[str, type[NoiseMechanism]] = {
    "none": NonPrivate,
    "dense": DenseDPSGD,
    "adafest": DPAdaFEST,
    "adafest+": DPAdaFESTPlus,
    "eana": EANA,
    "fest": DPFEST,
    "lazy": LazyDP,
}
MECHANISMS: Mapping[str, type[NoiseMechanism]] = types.MappingProxyType(_REGISTRY)  # read-only view

# What `from_counts` fills in itself from the selection it makes.
_MADE_BY_FROM_COUNTS = frozenset({"selected_rows", "selection_event"})


def register_mechanism(name: str, cls: type[NoiseMechanism], *, replace: bool = False) -> type[NoiseMechanism]:
    """Makes `create(name, ...)` (and the pipelines' `--mechanism name`) build `cls`, a user's mechanism.

    Args:
      name: the name to register; must equal `cls.name` (reports and
        checkpoints record the class's `name`).
      cls: a concrete `NoiseMechanism` subclass that declares its
        `capabilities` (its own or a parent's, never the base's default).
      replace: allow replacing the class already registered as `name`.

    Returns:
      `cls`.

    Raises:
      TypeError: `cls` is not a concrete `NoiseMechanism` subclass, or does
        not declare `MechanismCapabilities`.
      ValueError: `name` is not `cls.name`, or is taken and `replace` is False.
    """
    if not (isinstance(cls, type) and issubclass(cls, NoiseMechanism)) or inspect.isabstract(cls):
        raise TypeError(f"`cls` must be a concrete subclass of tfdp_embed.mechanisms.NoiseMechanism; received {cls!r}.")
    capabilities_of(cls)  # a TypeError if `capabilities` is not a MechanismCapabilities
    if declaring_class(cls) is NoiseMechanism:
        raise TypeError(
            f"Mechanism class {cls.__name__} does not declare `capabilities`; set "
            "`capabilities = MechanismCapabilities(...)` on it (tfdp_embed.mechanisms.MechanismCapabilities)."
        )
    if not isinstance(name, str) or name != cls.name:
        raise ValueError(f"`name` must be the class's `name` ({cls.name!r}); received {name!r}.")
    if name in _REGISTRY and _REGISTRY[name] is not cls and not replace:
        raise ValueError(
            f"Mechanism name {name!r} is taken by {_REGISTRY[name].__name__}; pass `replace=True` to replace it, "
            f"or choose a name not in {sorted(_REGISTRY)}."
        )
    _REGISTRY[name] = cls
    return cls


def mechanism_class(name: str) -> type[NoiseMechanism]:
    """`MECHANISMS[name]`, or a ValueError naming the registered names."""
    if not isinstance(name, str) or name not in MECHANISMS:
        raise ValueError(f"`mechanism` must be one of {sorted(MECHANISMS)}; received {name!r}.")
    return MECHANISMS[name]


def options(name: str, *, counts: bool = False) -> frozenset:
    """Every keyword `create(name, ...)` accepts (`counts=True`: when `counts` is given)."""
    _, allowed, _ = _builder(mechanism_class(name), with_counts=counts)
    return allowed


def create(
    name: str, *, l2_norm_clip: float | None = None, noise_multiplier: float | None = None, seed=None, **kwargs
) -> NoiseMechanism:
    """Builds the mechanism registered as `name`.

    Args:
      name: a key of `MECHANISMS`.
      l2_norm_clip: per-example clip norm C (every mechanism but "none").
      noise_multiplier: sigma of the training steps (every mechanism but "none").
      seed: int for reproducible noise (tests), None for OS entropy.
      **kwargs: the class's other constructor keywords (`options(name)`).

    Returns:
      The `NoiseMechanism`.

    Raises:
      ValueError: an unknown `name`, an option the class does not take, or
        a required one missing (each error lists what is allowed).
    """
    cls = mechanism_class(name)
    given = dict(kwargs, seed=seed)
    for key, value in (("l2_norm_clip", l2_norm_clip), ("noise_multiplier", noise_multiplier)):
        if value is not None:
            given[key] = value
    build, allowed, required = _builder(cls, with_counts="counts" in given)
    unknown = sorted(set(given) - allowed)
    if unknown:
        raise ValueError(
            f"Mechanism {name!r} ({cls.__name__}) takes no option(s) {unknown}; allowed: {sorted(allowed)}."
        )
    missing = sorted(required - set(given))
    if missing:
        raise ValueError(f"Mechanism {name!r} ({cls.__name__}) needs {missing}; allowed: {sorted(allowed)}.")
    return build(**given)


def _builder(cls, *, with_counts: bool):
    """(callable, allowed keywords, required keywords) for `cls`."""
    init = _keywords(cls.__init__)
    if with_counts and "counts" not in init and hasattr(cls, "from_counts"):
        from_counts = _keywords(cls.from_counts)
        allowed = (set(init) | set(from_counts)) - _MADE_BY_FROM_COUNTS
        required = {k for k, p in {**init, **from_counts}.items() if p.default is inspect.Parameter.empty}
        return cls.from_counts, frozenset(allowed), frozenset(required - _MADE_BY_FROM_COUNTS)
    required = {k for k, p in init.items() if p.default is inspect.Parameter.empty}
    return cls, frozenset(init), frozenset(required)


def _keywords(function) -> dict:
    """The named parameters of `function` that a keyword can set (no self/cls, no *args/**kwargs)."""
    kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    params = inspect.signature(function).parameters
    return {k: p for k, p in params.items() if p.kind in kinds and k not in ("self", "cls")}


__all__ = ["MECHANISMS", "create", "mechanism_class", "options", "register_mechanism"]
