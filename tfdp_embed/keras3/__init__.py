"""The Keras 3 front end (TensorFlow backend): layers, per-example clipping, `DPModel`, callbacks and export.

    from tfdp_embed.keras3 import DPEmbedding, DPModel, keras
    from tfdp_embed import mechanisms

Importing it keeps the process's Keras as it is: it uses the user's
`keras` (3.x) and refuses another backend with one line. The engine under
it is the core's (`tfdp_embed.clipping`, `tfdp_embed.mechanisms`,
`tfdp_embed.accounting`), the same as the tf-keras front end's
(`tfdp_embed.keras2`).
"""

from tfdp_embed.keras3._keras import keras, tf  # noqa: I001  (first: checks Keras 3 on TensorFlow)
from tfdp_embed.keras3 import sgd_adapter as sgd_adapter  # registers Keras 3 SGD for LazyDP
from tfdp_embed.keras3.callbacks import PeriodBudget, PrivacyBudget
from tfdp_embed.keras3.layers import DPEmbedding, SharedEmbedding, StackedEmbedding, stacked_tables
from tfdp_embed.keras3.training import DPModel
from tfdp_embed.release import export_saved_model

__all__ = [
    "DPEmbedding",
    "DPModel",
    "PeriodBudget",
    "PrivacyBudget",
    "SharedEmbedding",
    "StackedEmbedding",
    "export_saved_model",
    "keras",
    "stacked_tables",
    "tf",
]
