"""User-level batches train only through clipping rules and mechanisms that are exact per user.

`tfdp_embed.data.poisson_user_batches` packs each sampled user's <= k rows
along a second axis (`[users, k, ...]`), so that one user is one example of
the per-example machinery. That is exact only where every per-example
quantity is computed over everything after the batch axis:

* a clipping rule must take the unit axis as it takes a sequence axis: a
  user's gradient is the sum over their rows, and its norm is the norm of
  that sum (Dense and LayerNormalization's Gram forms, `DPEmbedding`'s
  grouping by (example, row); each such rule is marked `handles_unit_axis`).
  The per-example fallback re-runs each example alone, so it is exact too;
* a mechanism must compute its per-example quantities (clip factors,
  DP-AdaFEST's distinct (example, row) contributions, the rows LazyDP and
  EANA see) from the batch's examples, which are users: it declares
  `capabilities.user_level`; a DP selection (DP-FEST) must come from counts
  per user (`selection_unit`).

Anything else is refused before the first step, in one line.

Example:
    >>> check_unit_batches(dp.batching, mechanism=mechanism, tapped_layers=layers, registry=registry)

References: Chua et al., "Mind the Privacy Unit!", COLM 2024 (user-wise DP-SGD).
"""

from __future__ import annotations

from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.mechanisms.capabilities import capabilities_of


def unit_of(fed) -> str:
    """The privacy unit of the fed batches (`FedBatching` or None): "user" for user-level samplers, else "example"."""
    info = getattr(fed, "info", None)
    return getattr(info, "privacy_unit", "example") if info is not None else "example"


def check_unit_batches(fed, *, mechanism, tapped_layers, registry, distributed: bool = False) -> None:
    """Refuses user-level batches for a mechanism or a layer rule not exact per user; nothing for example batches.

    Raises:
      PrivacyContractError: `distributed` (a strategy with replicas or workers), the mechanism does not declare `user_level`, or a
        layer's clipping rule is not marked `handles_unit_axis`.
    """
    unit = unit_of(fed)
    if unit == "example":
        return
    if distributed:  # the front end's answer: a strategy other than the default or one device
        raise PrivacyContractError(
            f"privacy_unit={unit!r} batches under a tf.distribute strategy are not supported yet (per-user "
            "clipping across replicas is untested): train user-level runs on one device."
        )
    if not capabilities_of(mechanism).user_level:
        raise PrivacyContractError(
            f"Mechanism {mechanism.name!r} does not support privacy_unit={unit!r} batches (its per-example "
            "quantities are not per user; `capabilities.user_level` is False): train it at example level."
        )
    if mechanism.selection_unit not in (None, unit):
        raise PrivacyContractError(
            f"Mechanism {mechanism.name!r} selected rows from counts per {mechanism.selection_unit}, but the batches' "
            f"privacy unit is {unit!r}: count each {unit}'s distinct ids once (bucket_counts over user-level "
            f"batches) and pass counts_unit={unit!r}."
        )
    for layer in tapped_layers:
        rule = registry.lookup(layer)
        if rule is not None and not getattr(rule, "handles_unit_axis", False):
            raise PrivacyContractError(
                f"Layer {layer.name!r} ({type(layer).__name__}): its clipping rule {rule.__name__} is not verified "
                f"exact over the unit axis of privacy_unit={unit!r} batches [users, k, ...]; per-user norms "
                "could be wrong, so it is refused."
            )


__all__ = ["check_unit_batches", "unit_of"]
