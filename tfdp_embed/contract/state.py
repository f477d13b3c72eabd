"""The state check: a training-mode forward pass must not change any non-trainable variable.

A layer that updates state in training (batch normalisation's moving
statistics, a running count, a layer that stores inputs) computes that
state from raw training examples, with no clipping and no noise, and the
state is released with the model. Such a layer is refused by what it does,
not by its class: one training-mode forward pass of one batch runs with
every non-trainable variable saved first and restored afterwards, so the
check leaves the model exactly as it was.
"""

from __future__ import annotations

from collections.abc import Callable

from tfdp_embed.clipping import layer_kinds
from tfdp_embed.clipping.taps import submodules
from tfdp_embed.errors import PrivacyContractError


def check_no_state_updates(model, forward: Callable[[], object]) -> None:
    """Runs `forward()` once; refuses the model if it changed a non-trainable variable.

    Args:
      model: the model whose non-trainable variables are watched.
      forward: runs one training-mode forward pass (and loss) of one batch.

    Raises:
      PrivacyContractError: naming each layer whose state changed; every
        variable is restored before it is raised.
    """
    variables = _unique(layer_kinds.tf_variable(v) for v in model.non_trainable_weights)
    saved = [v.numpy().copy() for v in variables]
    try:
        forward()
    finally:
        changed = [(v, old) for v, old in zip(variables, saved) if v.numpy().tobytes() != old.tobytes()]
        for variable, old in changed:
            variable.assign(old)
    if changed:
        owners = _owners(model, [v for v, _ in changed])
        described = "; ".join(f"layer {layer.name!r} ({type(layer).__name__}): {names}" for layer, names in owners)
        raise PrivacyContractError(
            f"A training-mode forward pass changes non-trainable state ({described}). That "
            "state is computed from raw training examples with no clipping and no noise and is "
            "released with the model (e.g. batch normalisation's moving statistics); a layer "
            "normalising with batch statistics also mixes examples. DPModel restored the "
            "variables and refuses the model: use LayerNormalization, freeze the layer "
            "(trainable=False, which also runs batch normalisation in inference mode), or keep "
            "such state out of the model."
        )


def _unique(variables) -> list:
    seen, out = set(), []
    for v in variables:
        if v.ref() not in seen:
            seen.add(v.ref())
            out.append(v)
    return out


def _owners(model, variables) -> list:
    """[(deepest layer holding the variables, [their names])] in the model's layer order."""
    layers = [model] + [m for m in submodules(model) if layer_kinds.is_layer(m)]
    owners: dict = {}
    for v in variables:
        holding = [layer for layer in layers if v.ref() in {layer_kinds.tf_variable(w).ref() for w in layer.weights}]
        owner = min(holding, key=lambda layer: len(layer.weights)) if holding else model
        owners.setdefault(id(owner), (owner, []))[1].append(v.name)
    return list(owners.values())


__all__ = ["check_no_state_updates"]
