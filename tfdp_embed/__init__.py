"""tfdp_embed: differentially private training of large embedding models, fast.

Public API (everything else is internal):

    from tfdp_embed import keras, tf                 # Keras 2 (tf-keras), selected here
    from tfdp_embed import DPEmbedding, DPModel      # layer to subclass, staged DP train step
    from tfdp_embed import mechanisms                # DenseDPSGD, LazyDP, ...; mechanisms.create(name, ...)
    from tfdp_embed import plan_run, Release, RunPlan  # target (eps, delta) -> calibrated mechanism, budget, report
    from tfdp_embed import select_privately            # private hyperparameter search (Papernot & Steinke 2022)
    from tfdp_embed import accounting, data, clipping, planning
    from tfdp_embed import retrieval                  # Retrieval task (drop-in for tfrs.tasks.Retrieval)
    from tfdp_embed.export import export_saved_model

Importing this package sets TF_USE_LEGACY_KERAS=1 before TensorFlow is
imported and fails with a clear message if `tf.keras` is already Keras 3.
"""

from tfdp_embed._keras import keras, tf  # noqa: I001  (must come first)
from tfdp_embed import accounting, attention, audit, checkpointing, clipping, data, distribute, mechanisms, planning
from tfdp_embed import retrieval
from tfdp_embed._version import __version__ as __version__
from tfdp_embed.accounting.dataset_size import ReleasedDatasetSize, release_dataset_size
from tfdp_embed.errors import PrivacyBudgetExceededError, PrivacyContractError
from tfdp_embed.export import export_saved_model
from tfdp_embed.layers.embedding import DPEmbedding
from tfdp_embed.layers.shared_embedding import SharedEmbedding
from tfdp_embed.mechanisms import MECHANISMS, NoiseMechanism
from tfdp_embed.planning import Release, RunPlan, plan_run, select_privately
from tfdp_embed.training import DPModel

__all__ = [
    "DPEmbedding",
    "DPModel",
    "MECHANISMS",
    "NoiseMechanism",
    "PrivacyBudgetExceededError",
    "PrivacyContractError",
    "Release",
    "ReleasedDatasetSize",
    "RunPlan",
    "SharedEmbedding",
    "accounting",
    "attention",
    "audit",
    "checkpointing",
    "clipping",
    "data",
    "distribute",
    "export_saved_model",
    "keras",
    "mechanisms",
    "plan_run",
    "planning",
    "release_dataset_size",
    "retrieval",
    "select_privately",
    "tf",
]
