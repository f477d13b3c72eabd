"""tfdp_embed: differentially private training of large embedding models, fast.

The package has a Keras-free core and a Keras front end beside it:

    from tfdp_embed import mechanisms, accounting, planning, data  # core: TensorFlow only, no Keras
    from tfdp_embed import clipping, layers  # the clipping engine and lookup math both front ends use
    from tfdp_embed import plan_run, Release, RunPlan, select_privately
    from tfdp_embed import DPEmbedding, DPModel, keras, tf     # the tf-keras (Keras 2) front end
    from tfdp_embed.keras2 import clipping, retrieval, export  # the rest of the front end

Importing `tfdp_embed` or any core module touches no Keras and sets no
environment variable. The front end (`tfdp_embed.keras2`) loads on first use
of one of its names; it selects Keras 2 (`TF_USE_LEGACY_KERAS=1`) and fails
with a clear message if `tf.keras` is already Keras 3 in the process.
"""

from __future__ import annotations

import importlib

from tfdp_embed._version import __version__ as __version__

# name -> module that defines it; loaded on first access (PEP 562), so the front end loads only when used.
_CORE = {
    "accounting": "tfdp_embed.accounting",
    "checkpointing": "tfdp_embed.checkpointing",
    "clipping": "tfdp_embed.clipping",
    "layers": "tfdp_embed.layers",
    "audit": "tfdp_embed.audit",
    "data": "tfdp_embed.data",
    "mechanisms": "tfdp_embed.mechanisms",
    "planning": "tfdp_embed.planning",
    "MECHANISMS": "tfdp_embed.mechanisms",
    "NoiseMechanism": "tfdp_embed.mechanisms",
    "PrivacyBudgetExceededError": "tfdp_embed.errors",
    "PrivacyContractError": "tfdp_embed.errors",
    "ReleasedContributionBound": "tfdp_embed.accounting.contribution_bound",
    "ReleasedDatasetSize": "tfdp_embed.accounting.dataset_size",
    "release_contribution_bound": "tfdp_embed.accounting.contribution_bound",
    "release_dataset_size": "tfdp_embed.accounting.dataset_size",
    "Release": "tfdp_embed.planning",
    "RunPlan": "tfdp_embed.planning",
    "plan_run": "tfdp_embed.planning",
    "select_privately": "tfdp_embed.planning",
}
_FRONT_END = {
    "keras2": "tfdp_embed.keras2",
    "keras": "tfdp_embed.keras2",
    "tf": "tfdp_embed.keras2",
    "DPEmbedding": "tfdp_embed.keras2",
    "DPModel": "tfdp_embed.keras2",
    "SharedEmbedding": "tfdp_embed.keras2",
    "export_saved_model": "tfdp_embed.keras2",
    # Kept for code written before the core/front-end split (the modules now live in tfdp_embed.keras2).
    "attention": "tfdp_embed.keras2.attention",
    "distribute": "tfdp_embed.keras2.distribute",
    "retrieval": "tfdp_embed.keras2.retrieval",
}


def __getattr__(name: str):
    module = _CORE.get(name) or _FRONT_END.get(name)
    if module is None:
        raise AttributeError(f"module 'tfdp_embed' has no attribute {name!r}")
    loaded = importlib.import_module(module)
    value = loaded if module.endswith(f".{name}") else getattr(loaded, name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted([*globals(), *_CORE, *_FRONT_END])


__all__ = sorted([*_CORE, *_FRONT_END])  # resolved lazily by __getattr__
