"""DP-safe retrieval: the drop-in for `tfrs.tasks.Retrieval`, item towers with features, top-k metrics.

    from tfdp_embed.keras2.retrieval import Retrieval, FullSoftmax, SampledSoftmax, RetrievalRecipe, export_top_k

`Retrieval` scores each query against the whole catalogue (`FullSoftmax`)
or against one shared sample of negatives per step drawn independently of
the data (`SampledSoftmax`, log-Q corrected), through a candidate tower of
the user's (a `DPEmbedding` subclass + Dense layers, say) run inside a
`tfdp_embed.clipping.shared_computation` for exact per-example norms.
Its recall@k / precision@k metrics are operator-only (not DP).
`export_top_k` saves any user's query model and candidates (a `Retrieval`
task or an embedding matrix) as a top-k SavedModel, after the DP flush.

`RetrievalRecipe` holds the loss, negatives, optimizer and schedule whose
non-private control matches a tuned plain TFRS model on ml-100k.

Modules: `task` (Retrieval), `negatives` (FullSoftmax, SampledSoftmax),
`catalogue` (item features and identifiers), `top_k` (metrics),
`serving` (TopKServing, export_top_k), `recipe` (RetrievalRecipe).
"""

from tfdp_embed.keras2.retrieval.catalogue import Catalogue
from tfdp_embed.keras2.retrieval.negatives import FullSoftmax, SampledSoftmax
from tfdp_embed.keras2.retrieval.recipe import RetrievalRecipe
from tfdp_embed.keras2.retrieval.serving import TopKServing, export_top_k
from tfdp_embed.keras2.retrieval.task import Retrieval
from tfdp_embed.keras2.retrieval.top_k import TopKMetrics

__all__ = [
    "Catalogue",
    "FullSoftmax",
    "Retrieval",
    "RetrievalRecipe",
    "SampledSoftmax",
    "TopKMetrics",
    "TopKServing",
    "export_top_k",
]
