"""Running the three contract checks on one batch, as `DPModel` does before training.

`check_model` runs the state check always, and the independence and
coverage checks unless turned off; it reports whether the independence
check could run (it needs two examples). `one_batch_of_arrays` turns the
arrays given to `fit` into a one-batch dataset the check can read.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import tensorflow as tf

from tfdp_embed.contract import exact_rules, independence
from tfdp_embed.contract.exact_rules import check_rules_cover_gradients, record_forward
from tfdp_embed.contract.examples import batch_size_of
from tfdp_embed.contract.independence import check_independence
from tfdp_embed.contract.layer_calls import all_layers, deterministic, frozen_randomness, is_stochastic
from tfdp_embed.contract.state import check_no_state_updates


def check_model(
    model,
    batch: tuple,
    *,
    forward: Callable,
    tapped_layers: list,
    registry,
    fallback,
    loss_name: str,
    check_per_example: bool,
    loss_scale: float = 1.0,
) -> bool:
    """Checks `model` on `batch` = (x, y, sample_weight); True when the independence check ran.

    Args:
      model: the wrapped model.
      batch: one batch.
      forward: `(training, x, y, sample_weight) -> [n]` per-example losses.
      tapped_layers: the layers owning trainable weights.
      registry, fallback: what DPModel clips with.
      loss_name: the loss as error messages name it.
      check_per_example: False runs the state check only (and warns).
      loss_scale: DPModel's fixed loss scale (float16 compute), for the rules check.

    Raises:
      PrivacyContractError: the model breaks the per-example contract.
    """
    layers = all_layers(model)  # once for every check (walking a large model's layers takes a while)
    recorded = _state_check(model, layers, lambda: forward(True, *batch), tapped_layers, registry, check_per_example)
    if not check_per_example:
        warnings.warn(
            "DPModel(check_per_example=False): nothing checks that each example's loss depends "
            "on that example alone or that the clipping rules cover the whole gradient; the "
            "privacy guarantee assumes both.",
            RuntimeWarning,
            stacklevel=4,
        )
        return True
    size = batch_size_of(batch)
    ran = size is not None and size >= 2
    mode = "training"
    independence_rtol, rules_rtol = tolerances(model, layers)
    if ran:
        mode = check_independence(
            model, forward_as_loss(forward), batch, loss_name=loss_name, rtol=independence_rtol, layers=layers
        )
    with deterministic(model, layers):
        check_rules_cover_gradients(
            model,
            tapped_layers,
            registry=registry,
            fallback=fallback,
            forward=lambda: forward(mode == "training", *batch),
            rtol=rules_rtol,
            loss_scale=loss_scale,
            recorded_pass=recorded if mode == "training" else None,
        )
    return ran


def _state_check(model, layers: list, training_forward: Callable, tapped_layers: list, registry, record: bool):
    """The state check's training-mode pass; returns it recorded for the coverage check, or None.

    Without stochastic layers (and when the coverage check runs: `record`)
    the coverage check's training-mode pass is this one, so it is recorded
    (`exact_rules.record_forward`) instead of run again.
    """
    recorded = []

    def forward():
        if not record or any(is_stochastic(layer) for layer in layers):
            return training_forward()
        recorded.append(record_forward(tapped_layers, registry, training_forward))
        return recorded[0].loss

    with frozen_randomness(model, layers):  # the check's pass is not a training step
        check_no_state_updates(model, forward)
    return recorded[0] if recorded else None


# Unit round-off of the reduced compute dtypes, and how many of them the checks allow.
_UNIT_ROUNDOFF = {tf.float16: 2.0**-11, tf.bfloat16: 2.0**-8}
_ROUNDOFFS = 64


def tolerances(model, layers: list | None = None) -> tuple:
    """(independence rtol, rules rtol): float32's, or 64 unit round-offs of a float16/bfloat16 compute dtype.

    A float32 model keeps the float32 tolerances. Under reduced precision
    the losses and the true gradient are rounded to the compute dtype (and
    summed in it), so they can differ from a float32 computation of the
    same math by many of its round-offs; a missed use of a weight still
    shows at float32's tolerance (see `exact_rules`). `layers`: `all_layers(model)`, when the caller has it.
    """
    roundoff = _UNIT_ROUNDOFF.get(_compute_dtype(all_layers(model) if layers is None else layers))
    if roundoff is None:
        return independence.RTOL, exact_rules.RTOL
    return max(independence.RTOL, _ROUNDOFFS * roundoff), max(exact_rules.RTOL, _ROUNDOFFS * roundoff)


def _compute_dtype(layers: list) -> tf.DType:
    """The least precise compute dtype of a model's `layers` (any Keras): float16, bfloat16 or float32."""
    dtypes = {tf.as_dtype(layer.compute_dtype) for layer in layers if layer.compute_dtype is not None}
    return next((d for d in (tf.float16, tf.bfloat16) if d in dtypes), tf.float32)


def forward_as_loss(forward: Callable) -> Callable:
    """`(x, y, sample_weight, training) -> losses` from `(training, x, y, sample_weight)`."""
    return lambda x, y, sample_weight, training: forward(training, x, y, sample_weight)


__all__ = ["check_model", "forward_as_loss", "tolerances"]
