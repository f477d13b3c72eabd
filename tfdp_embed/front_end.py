"""Where the core reaches the Keras front end: one place, loaded only when a caller asks for a callback.

The core builds Keras-free trackers (`BudgetTracker`, `PeriodTracker`); a
caller that wants them as Keras callbacks (`RunPlan.budget()`,
`tfdp_embed.accounting.PrivacyBudget`) gets the front end's classes from
here: the Keras 3 front end's (`tfdp_embed.keras3.callbacks`) when the process
loaded it and not the tf-keras one, else tf-keras' (`tfdp_embed.keras2.callbacks`,
the default). A Keras 3 process that built its model with `tfdp_embed.keras3`
therefore gets Keras 3 callbacks, and its `tf.keras` is never switched.

It also tells the two Keras apart without importing either (`keras_of`, by
the package a class comes from), so a model mixing them is refused in one
line naming the front end to use: a `DPEmbedding` called on the other
Keras's symbolic input (`refuse_foreign_input`, functional models) and, when
`DPModel` wraps a model, a layer of the other Keras held by any of its
layers (`refuse_mixed_model`, subclassed models, whose foreign layers
neither Keras tracks: their weights would go untrained or break the step).
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

import tensorflow as tf

_FRONT_ENDS = {"keras2": "tfdp_embed.keras2", "keras3": "tfdp_embed.keras3"}
_KERAS_PACKAGES = {"tf_keras": "keras2", "keras": "keras3"}  # top-level package -> the front end serving it
_KERAS_NAMES = {"keras2": "tf-keras", "keras3": "Keras 3"}
_MAX_SPREAD = 10_000  # longer list or dict attributes (data, not layers) are not searched for layers


def loaded() -> str:
    """ "keras3" when the process loaded `tfdp_embed.keras3` and not `tfdp_embed.keras2`; else "keras2"."""
    if _FRONT_ENDS["keras3"] in sys.modules and _FRONT_ENDS["keras2"] not in sys.modules:
        return "keras3"
    return "keras2"


def callbacks() -> ModuleType:
    """The front end's callback module: `PrivacyBudget`, `PeriodBudget`, `epsilon_first`."""
    return importlib.import_module(_FRONT_ENDS[loaded()] + ".callbacks")


def keras_of(obj) -> str | None:
    """ "keras2" for a tf-keras object (layer, model, symbolic tensor), "keras3" for a Keras 3 one; else None."""
    for cls in type(obj).__mro__:
        front = _KERAS_PACKAGES.get(cls.__module__.partition(".")[0])
        if front is not None:
            return front
    return None


def refuse_foreign_input(layer, args: tuple, kwargs: dict) -> None:
    """Raises TypeError when `layer` (a tfdp_embed layer) is called on the other Keras's symbolic input."""
    own = keras_of(layer)
    for value in tf.nest.flatten((args, kwargs)):
        host = keras_of(value)
        if host is not None and own is not None and host != own:
            raise TypeError(mixed_message(layer, host))


def refuse_mixed_model(model, front: str) -> None:
    """Raises TypeError when a layer of `model` (a `front` model) holds a layer of the other Keras."""
    from tfdp_embed.clipping.layer_kinds import layer_classes

    layers = layer_classes("Layer")  # every imported Keras's
    stack, seen = [model], {id(model)}
    while stack:
        for value in _attribute_values(stack.pop()):
            if not isinstance(value, layers) or id(value) in seen:
                continue
            seen.add(id(value))
            if keras_of(value) != front:
                raise TypeError(mixed_message(value, front))
            stack.append(value)


def _attribute_values(obj) -> list:
    """`obj`'s attribute values, the items of its list, tuple and dict attributes spread out (two levels)."""
    values, found = list(vars(obj).values()), []
    for _ in range(3):
        nested = []
        for value in values:
            if isinstance(value, dict) and len(value) <= _MAX_SPREAD:
                nested += list(value.values())
            elif isinstance(value, (list, tuple)) and len(value) <= _MAX_SPREAD:
                nested += list(value)
            else:
                found.append(value)
        values = nested
    return found


def mixed_message(layer, host: str) -> str:
    """One line: `layer` (of the other Keras) inside a `host` model, and what to use instead."""
    guest = "keras2" if host == "keras3" else "keras3"
    where = f"({_KERAS_NAMES[guest]}) inside a {_KERAS_NAMES[host]} model: use"
    ours = next((c for c in type(layer).__mro__ if c.__module__.startswith(_FRONT_ENDS[guest] + ".")), None)
    if ours is None:
        return (
            f"{type(layer).__name__} layer {getattr(layer, 'name', '')!r} {where} {_KERAS_NAMES[host]} layers "
            f"throughout, with `{_FRONT_ENDS[host]}`."
        )
    what = f"`{_FRONT_ENDS[guest]}.{ours.__name__}`"
    if type(layer) is not ours:
        what = f"{type(layer).__name__} (a subclass of {what})"
    if hasattr(sys.modules.get(_FRONT_ENDS[host]), ours.__name__):
        return f"{what} {where} `{_FRONT_ENDS[host]}.{ours.__name__}`."
    return f"{what} {where} the layers of `{_FRONT_ENDS[host]}` throughout."


__all__ = ["callbacks", "keras_of", "loaded", "mixed_message", "refuse_foreign_input", "refuse_mixed_model"]
