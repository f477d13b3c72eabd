"""The tf-keras (Keras 2) front end: layers, per-example clipping, `DPModel`, callbacks, save and export.

Importing it selects Keras 2 for the process (`TF_USE_LEGACY_KERAS=1`, see
`_keras`); the core (`tfdp_embed.mechanisms`, `accounting`, `planning`,
`data`, `ops`) never imports it. Submodules (`clipping`, `contract`,
`checkpointing`, `distribute`, `retrieval`, `attention`, `models`, ...) load
on `from tfdp_embed.keras2 import <name>`.
"""

from tfdp_embed.keras2._keras import keras, tf  # noqa: I001  (must come first: it selects Keras 2)
from tfdp_embed.keras2 import sgd_adapter as sgd_adapter  # registers legacy SGD for LazyDP
from tfdp_embed.keras2.export import export_saved_model
from tfdp_embed.keras2.layers.embedding import DPEmbedding
from tfdp_embed.keras2.layers.shared_embedding import SharedEmbedding
from tfdp_embed.keras2.training import DPModel

__all__ = ["DPEmbedding", "DPModel", "SharedEmbedding", "export_saved_model", "keras", "tf"]
