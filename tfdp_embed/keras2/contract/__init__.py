"""The per-example contract checks for tf-keras models: the core's behavioural checks plus tf-keras' class rules.

The behavioural checks (`tfdp_embed.contract`: no state updates, independence,
rules covering the gradient) serve both front ends; here are what only the
tf-keras front end needs: the components refused by class (`components`),
the DP preprocessing sources (`preprocessing`), and `fit`'s arrays as a
batch (`arrays`).
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
from tfdp_embed.keras2.contract.arrays import one_batch_of_arrays
from tfdp_embed.layers.lookup import read_hooks_removed

__all__ = [
    "batch_size_of",
    "check_independence",
    "check_model",
    "check_no_state_updates",
    "check_rules_cover_gradients",
    "deterministic",
    "one_batch_of_arrays",
    "read_hooks_removed",
    "select_examples",
]
