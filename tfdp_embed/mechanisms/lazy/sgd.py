"""The optimizers LazyDP can defer exactly, and the learning rate of the coming step.

An idle row's state after k noisy steps has a Gaussian closed form only
under SGD (`tfdp_embed.mechanisms.lazy.closed_form`): a learning rate or schedule,
inverse-time decay, constant momentum in [0, 1), Nesterov or not. LazyDP
talks to the optimizer only through `SgdOptimizer`; each Keras front end
registers an adapter for its SGD (`register_adapter`; tf-keras `legacy.SGD`
in `tfdp_embed.keras2.sgd_adapter`) that refuses everything else with the reason.

References: LazyDP (Lim et al., ASPLOS 2024) §5.2.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, runtime_checkable

import tensorflow as tf


class SgdSettings(NamedTuple):
    """What the closed forms need of the optimizer.

    Attributes:
      beta: momentum, exactly the float32 value Keras applies (0: plain SGD).
      nesterov: Nesterov momentum.
      decay: Keras's legacy inverse-time `decay` (0: none).
    """

    beta: float
    nesterov: bool
    decay: float


@runtime_checkable
class SgdOptimizer(Protocol):
    """The optimizer-slot protocol LazyDP needs of an SGD optimizer."""

    @property
    def iterations(self) -> tf.Variable:
        """The optimizer's applied-step counter (int64 variable)."""

    def settings(self) -> SgdSettings:
        """Momentum, Nesterov and decay; raises ValueError for settings without a lazy form."""

    def learning_rate(self) -> tf.Tensor:
        """eta of the coming apply (float32), schedules and decay applied as the optimizer does."""

    def momentum_slot(self, variable: tf.Variable, *, create: bool = False) -> tf.Variable:
        """The momentum slot of `variable` (created when `create`)."""


_ADAPTERS: list[Callable[[Any], SgdOptimizer | None]] = []


def register_adapter(adapt: Callable[[Any], SgdOptimizer | None]) -> None:
    """Registers `adapt(optimizer)`: an `SgdOptimizer` for optimizers it knows, None for others.

    A front end registers one for its Keras; an adapter may raise ValueError to
    refuse an optimizer it knows has no lazy form (with the reason).
    """
    if adapt not in _ADAPTERS:
        _ADAPTERS.append(adapt)


def adapt(optimizer) -> SgdOptimizer:
    """`optimizer` as an `SgdOptimizer`; refuses what no registered adapter accepts."""
    if optimizer is None:
        raise ValueError(
            "LazyDP.init needs the `optimizer` (an SGD: tf-keras' keras.optimizers.legacy.SGD, Keras 3's "
            "keras.optimizers.SGD): the deferred "
            "noise and momentum drift depend on its learning rate and momentum."
        )
    if isinstance(optimizer, SgdOptimizer):
        return optimizer
    for adapter in _ADAPTERS:
        adapted = adapter(optimizer)
        if adapted is not None:
            return adapted
    raise unsupported(optimizer, sgd=_EITHER_SGD)


# An optimizer no front end's adapter knows: both SGDs (a front end names its own, `unsupported`).
_EITHER_SGD = "tf-keras' keras.optimizers.legacy.SGD or Keras 3's keras.optimizers.SGD"


def unsupported(optimizer, *, sgd: str) -> ValueError:
    """The error refusing `optimizer`, naming `sgd`: the SGD of the optimizer's front end."""
    kind = type(optimizer).__name__
    return ValueError(
        f"LazyDP supports only SGD ({sgd}, with or without momentum and "
        f"a learning-rate schedule); received optimizer {kind}. An idle row's state under "
        f"{kind} after k noisy steps is not a Gaussian with a closed form (its statistics "
        "depend non-linearly on the noisy gradients), so its noise cannot be deferred "
        "exactly. Use mechanism 'adafest' (DP-AdaFEST), which only noises the rows it "
        "selects and needs no deferral, or 'dense'."
    )


__all__ = ["SgdOptimizer", "SgdSettings", "adapt", "register_adapter", "unsupported"]
