"""The Keras-free part of the embedding layers: lookup math both front ends' layers mix in.

`tfdp_embed.keras2.DPEmbedding` and `tfdp_embed.keras3.DPEmbedding` are
`EmbeddingLookup` on their own Keras's `Layer`; the clipping rules
(`tfdp_embed.clipping`) match either through these classes.
"""

from tfdp_embed.layers.lookup import EmbeddingLookup, EmbeddingOccurrences, read_hooks_removed
from tfdp_embed.layers.shared_lookup import MODES, SharedLookup, check_shared_arguments
from tfdp_embed.layers.stacked_lookup import StackedLookup, width_groups

__all__ = [
    "MODES",
    "EmbeddingLookup",
    "EmbeddingOccurrences",
    "SharedLookup",
    "StackedLookup",
    "check_shared_arguments",
    "read_hooks_removed",
    "width_groups",
]
