"""Ready-made models built only from tfdp_embed's public layers.

`ctr` is the pCTR model of DP-FEST App. D.1 (with a DCN-v2 option);
`ctr_serving` wraps a trained one in a SavedModel module that takes raw
Criteo fields.
"""

from tfdp_embed.models.ctr import ARCHITECTURES, CTRModelConfig, build_ctr_model, ctr_embedding_dims, table_names
from tfdp_embed.models.ctr_serving import (
    RAW_FIELDS,
    CTRServingModule,
    check_request,
    serving_input_signature,
)

__all__ = [
    "ARCHITECTURES",
    "CTRModelConfig",
    "CTRServingModule",
    "RAW_FIELDS",
    "build_ctr_model",
    "check_request",
    "ctr_embedding_dims",
    "serving_input_signature",
    "table_names",
]
