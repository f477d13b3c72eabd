"""Ready-made models built only from tfdp_embed's public layers.

`ctr` is the pCTR model of DP-FEST App. D.1 (with a DCN-v2 option);
`ctr_serving` wraps a trained one in a SavedModel module that takes raw
Criteo fields. `two_tower` is the MovieLens retrieval two-tower (full
softmax over all items, exact per-example norms); `two_tower_serving`
exports its query tower with a top-k retrieval signature. `sasrec` is the
next-item Transformer (vanilla or DPFormer) with a shared input/output table.
"""

from tfdp_embed.keras2.models.ctr import (
    ARCHITECTURES,
    CTRModelConfig,
    build_ctr_model,
    ctr_embedding_dims,
    feature_table,
    table_counts,
    table_ids_fn,
    table_layout,
    table_names,
)
from tfdp_embed.keras2.models.ctr_serving import (
    RAW_FIELDS,
    CTRServingModule,
    check_request,
    serving_input_signature,
)
from tfdp_embed.keras2.models.sasrec import SASRec, SASRecConfig, SASRecServing
from tfdp_embed.keras2.models.two_tower import HistoryEmbedding, ItemEmbedding, TwoTowerModel, two_tower_registry
from tfdp_embed.keras2.models.two_tower_serving import RetrievalServingModule, check_history

__all__ = [
    "ARCHITECTURES",
    "CTRModelConfig",
    "CTRServingModule",
    "HistoryEmbedding",
    "ItemEmbedding",
    "RAW_FIELDS",
    "RetrievalServingModule",
    "SASRec",
    "SASRecConfig",
    "SASRecServing",
    "TwoTowerModel",
    "build_ctr_model",
    "check_history",
    "check_request",
    "ctr_embedding_dims",
    "feature_table",
    "serving_input_signature",
    "table_counts",
    "table_ids_fn",
    "table_layout",
    "table_names",
    "two_tower_registry",
]
