"""What each mechanism needs from the TPU SparseCore embedding engine (`TPU_PLANS`), and whether it is possible.

docs/tpu_sparsecore.md explains each plan; `TpuDPStep` refuses the
mechanisms whose plan is not possible (dense DP-SGD, LazyDP).

Example:
    >>> tpu_embedding_plan("eana").possible
    True

References: EANA (RecSys 2022) §3; DP-FEST / DP-AdaFEST (NeurIPS 2023) §3;
LazyDP (ASPLOS 2024) (deferred noise added by a read hook); TensorFlow
`tpu_embedding_v3.TPUEmbeddingV2`.
"""

from __future__ import annotations

import dataclasses

from tfdp_embed.mechanisms.base import NoiseMechanism


@dataclasses.dataclass(frozen=True)
class TpuEmbeddingPlan:
    """What one mechanism needs from the TPU embedding engine (docs/tpu_sparsecore.md).

    Attributes:
      mechanism: mechanism name.
      possible: True when the mechanism can run with tables on SparseCore today.
      path: how (the gradient-path recipe), or why not.
      needs: engine features the recipe relies on.
    """

    mechanism: str
    possible: bool
    path: str
    needs: tuple


_CLIP = "per-example clip factors c_i scale the activation gradients before apply_gradients"
_NOISE_FEATURE = (
    "a 'noise feature' on the same table whose ids are the global union of touched rows, each row "
    "owned by one replica (noise_feature_rows) and whose activation gradients are the noise "
    "(noise_feature_gradients): the engine sums all features' gradients per row, so each row gets "
    "exactly one draw"
)

TPU_PLANS = {
    "none": TpuEmbeddingPlan("none", True, "plain TPUEmbedding training (no clipping, no noise)", ()),
    "eana": TpuEmbeddingPlan(
        "eana",
        True,
        f"{_CLIP}; {_NOISE_FEATURE}.",
        (
            "TPUEmbeddingV2.apply_gradients with explicit activation gradients",
            "extra FeatureConfig on the table",
            "ids of the batch on the TensorCore (ghost norms, union of rows)",
        ),
    ),
    "fest": TpuEmbeddingPlan(
        "fest",
        True,
        f"{_CLIP}; unselected rows must get no gradient: ids as sequence features "
        "(max_sequence_length > 0, pooling on the TensorCore) so each occurrence's gradient can be "
        "masked; noise feature over the k selected rows every step.",
        ("sequence features (per-id activations)", "extra FeatureConfig with k ids per step"),
    ),
    "adafest": TpuEmbeddingPlan(
        "adafest",
        True,
        f"{_CLIP}; contribution map and thresholding on the TensorCore from the ids; touched rows "
        "below tau masked per occurrence (sequence features); noise feature over the survivors "
        "(touched survivors plus noise-only rows, a variable count padded to a static maximum).",
        ("sequence features (per-id activations)", "static maximum of survivors per step"),
    ),
    "adafest+": TpuEmbeddingPlan(
        "adafest+",
        True,
        "as adafest, restricted to the DP-FEST selection.",
        ("sequence features (per-id activations)", "static maximum of survivors per step"),
    ),
    "dense": TpuEmbeddingPlan(
        "dense",
        False,
        "dense DP-SGD adds noise to every row every step; SparseCore updates only rows that appear in "
        "the step's features, so it would need all vocabulary ids as a feature each step (a "
        "table-sized activation gradient): not feasible beyond small tables.",
        (),
    ),
    "lazy": TpuEmbeddingPlan(
        "lazy",
        False,
        "LazyDP must add a row's owed noise before the row is read; TPUEmbedding reads rows inside "
        "the engine with no read hook. Plain SGD could be served by the lookahead (owed noise of the "
        "next batch's rows sent through the noise feature as gradient -owed/lr, history table on the "
        "TensorCore host), but momentum's deferred drift m <- beta^k m has no gradient-path form and "
        "the SparseCore optimizers apply to rows in the batch only; not implemented.",
        ("read hook or lookahead feature", "history table", "SGD without momentum"),
    ),
}


def tpu_embedding_plan(mechanism: NoiseMechanism | type | str) -> TpuEmbeddingPlan:
    """The TPU SparseCore plan of `mechanism` (a mechanism, its class, or a library mechanism's name).

    A mechanism's plan is that of the nearest library class it derives from
    (`tfdp_embed.mechanisms.MECHANISMS`), found through its class, never
    through its `name`: a subclass of `EANA` has EANA's plan, a new class
    that copies the name "eana" has none.

    Raises:
      KeyError: for a mechanism with no plan (a new mechanism must add one).
    """
    name = mechanism if isinstance(mechanism, str) else _library_name(mechanism)
    if name not in TPU_PLANS:
        shown = name if isinstance(mechanism, str) else _class_name(mechanism)
        raise KeyError(f"No TPU SparseCore plan for mechanism {shown!r}; plans exist for {sorted(TPU_PLANS)}.")
    return TPU_PLANS[name]


def _class_name(mechanism) -> str:
    return (mechanism if isinstance(mechanism, type) else type(mechanism)).__name__


def _library_name(mechanism) -> str | None:
    """The `MECHANISMS` name of the nearest library class in `mechanism`'s MRO, or None."""
    from tfdp_embed.mechanisms import MECHANISMS

    names = {cls: name for name, cls in MECHANISMS.items()}
    cls = mechanism if isinstance(mechanism, type) else type(mechanism)
    for klass in cls.__mro__:
        if klass in names:
            return names[klass]
    return None


__all__ = ["TPU_PLANS", "TpuEmbeddingPlan", "tpu_embedding_plan"]
