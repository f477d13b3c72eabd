"""Refuses, by class, the components known to mix examples in their loss.

The behavioural checks (`check_model`) catch any such component on a batch;
these two are refused at once, with the DP-safe alternative named.
"""

from __future__ import annotations

from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.keras2._keras import keras

NON_PER_EXAMPLE_LAYERS = (keras.layers.BatchNormalization,)


def reject_non_per_example(model) -> None:
    """Raises PrivacyContractError for components whose loss mixes examples."""
    try:
        import tensorflow_recommenders as tfrs

        retrieval: tuple[type, ...] = (tfrs.tasks.Retrieval,)
    except ImportError:  # pragma: no cover
        retrieval = ()
    for module in [model, *model.submodules]:
        if retrieval and isinstance(module, retrieval):
            raise PrivacyContractError(
                f"{type(module).__name__} {getattr(module, 'name', '')!r} scores each query against "
                "the other examples of the batch (in-batch negatives), so one example's loss depends "
                "on other examples and per-example clipping no longer bounds its influence. Use "
                "`tfdp_embed.keras2.retrieval.Retrieval` instead, the DP-safe drop-in: a full softmax over "
                "the catalogue, or a sampled softmax whose negatives are drawn independently of the "
                "data (a shared sample per step from a fixed proposal, with log-Q correction)."
            )
        if isinstance(module, NON_PER_EXAMPLE_LAYERS) and module.trainable:
            raise PrivacyContractError(
                f"Layer {module.name!r} ({type(module).__name__}) normalises with batch statistics "
                "in training, which mixes examples and breaks per-example clipping. Use "
                "LayerNormalization or freeze it (trainable=False)."
            )


__all__ = ["NON_PER_EXAMPLE_LAYERS", "reject_non_per_example"]
