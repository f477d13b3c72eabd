"""Checks, on one batch before training, that a model keeps the per-example contract.

DP-SGD's guarantee rests on three properties that no class list can
establish, so `DPModel.prepare` checks them by behaviour:

* no layer changes non-trainable state in a training-mode forward pass
  (`check_no_state_updates`; the state would be computed from raw examples);
* each example's loss depends on that example alone
  (`check_independence`; otherwise clipping does not bound its influence);
* the clipping rules account for every use of every weight
  (`check_rules_cover_gradients`; otherwise per-example norms are wrong).

Each runs eagerly, once, and leaves every variable as it found it.
"""

from tfdp_embed.keras2.contract.exact_rules import check_rules_cover_gradients
from tfdp_embed.keras2.contract.examples import batch_size_of, select_examples
from tfdp_embed.keras2.contract.independence import check_independence
from tfdp_embed.keras2.contract.layer_calls import deterministic
from tfdp_embed.keras2.contract.model_check import check_model, one_batch_of_arrays
from tfdp_embed.keras2.contract.state import check_no_state_updates
from tfdp_embed.keras2.layers.embedding import read_hooks_removed

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
