"""Checks, on one batch before training, that a model keeps the per-example contract (both front ends).

DP-SGD's guarantee rests on three properties that no class list can
establish, so `DPModel.prepare` checks them by behaviour:

* no layer changes non-trainable state in a training-mode forward pass
  (`check_no_state_updates`; the state would be computed from raw examples);
* each example's loss depends on that example alone
  (`check_independence`; otherwise clipping does not bound its influence);
* the clipping rules account for every use of every weight
  (`check_rules_cover_gradients`; otherwise per-example norms are wrong).

Each runs eagerly, once, and leaves every variable as it found it. The
checks are Keras-free: they patch layers' `call` per instance and read
weights as `tf.Variable`s, for tf-keras and Keras 3 layers alike.
"""

from tfdp_embed.contract.exact_rules import check_rules_cover_gradients
from tfdp_embed.contract.examples import batch_size_of, select_examples
from tfdp_embed.contract.independence import check_independence
from tfdp_embed.contract.layer_calls import deterministic
from tfdp_embed.contract.model_check import check_model
from tfdp_embed.contract.state import check_no_state_updates

__all__ = [
    "batch_size_of",
    "check_independence",
    "check_model",
    "check_no_state_updates",
    "check_rules_cover_gradients",
    "deterministic",
    "select_examples",
]
