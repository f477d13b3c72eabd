"""The per-example contract checks for tf-keras models: the core's behavioural checks plus tf-keras' class rules.

The behavioural checks (`tfdp_embed.contract`: no state updates, independence,
rules covering the gradient) serve both front ends; here are what only the
tf-keras front end needs: the components refused by class (`components`),
and the DP preprocessing sources (`preprocessing`). `fit`'s arrays become a
batch in the core (`tfdp_embed.contract.arrays`).
"""

from tfdp_embed.contract import (
    batch_size_of,
    check_independence,
    check_model,
    check_no_state_updates,
    check_rules_cover_gradients,
    deterministic,
    select_examples,
)
from tfdp_embed.layers.lookup import read_hooks_removed

__all__ = [
    "batch_size_of",
    "check_independence",
    "check_model",
    "check_no_state_updates",
    "check_rules_cover_gradients",
    "deterministic",
    "read_hooks_removed",
    "select_examples",
]
