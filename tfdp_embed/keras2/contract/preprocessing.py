"""Where preprocessing layers' state comes from: `tfdp_embed.contract.preprocessing` (both front ends)."""

from tfdp_embed.contract.preprocessing import (
    check_preprocessing,
    declare_public,
    mark_state_source,
    preprocessing_sources,
    state_source,
)

__all__ = ["check_preprocessing", "declare_public", "mark_state_source", "preprocessing_sources", "state_source"]
