"""Running the three contract checks on one batch, as `DPModel` does before training.

`check_model` runs the state check always, and the independence and
coverage checks unless turned off; it reports whether the independence
check could run (it needs two examples). `one_batch_of_arrays` turns the
arrays given to `fit` into a one-batch dataset the check can read.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable

import numpy as np

from tfdp_embed.keras2 import mixed_precision
from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.contract import exact_rules, independence
from tfdp_embed.keras2.contract.exact_rules import check_rules_cover_gradients
from tfdp_embed.keras2.contract.examples import batch_size_of
from tfdp_embed.keras2.contract.independence import check_independence
from tfdp_embed.keras2.contract.layer_calls import deterministic, frozen_randomness
from tfdp_embed.keras2.contract.state import check_no_state_updates


def check_model(
    model: keras.Model,
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
    with frozen_randomness(model):  # the check's pass is not a training step
        check_no_state_updates(model, lambda: forward(True, *batch))
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
    independence_rtol, rules_rtol = tolerances(model)
    if ran:
        mode = check_independence(model, forward_as_loss(forward), batch, loss_name=loss_name, rtol=independence_rtol)
    with deterministic(model):
        check_rules_cover_gradients(
            model,
            tapped_layers,
            registry=registry,
            fallback=fallback,
            forward=lambda: forward(mode == "training", *batch),
            rtol=rules_rtol,
            loss_scale=loss_scale,
        )
    return ran


# Unit round-off of the reduced compute dtypes, and how many of them the checks allow.
_UNIT_ROUNDOFF = {tf.float16: 2.0**-11, tf.bfloat16: 2.0**-8}
_ROUNDOFFS = 64


def tolerances(model) -> tuple:
    """(independence rtol, rules rtol): float32's, or 64 unit round-offs of a float16/bfloat16 compute dtype.

    A float32 model keeps the float32 tolerances. Under reduced precision
    the losses and the true gradient are rounded to the compute dtype (and
    summed in it), so they can differ from a float32 computation of the
    same math by many of its round-offs; a missed use of a weight still
    shows at float32's tolerance (see `exact_rules`).
    """
    roundoff = _UNIT_ROUNDOFF.get(mixed_precision.compute_dtype(model))
    if roundoff is None:
        return independence.RTOL, exact_rules.RTOL
    return max(independence.RTOL, _ROUNDOFFS * roundoff), max(exact_rules.RTOL, _ROUNDOFFS * roundoff)


def forward_as_loss(forward: Callable) -> Callable:
    """`(x, y, sample_weight, training) -> losses` from `(training, x, y, sample_weight)`."""
    return lambda x, y, sample_weight, training: forward(training, x, y, sample_weight)


def one_batch_of_arrays(x, args: tuple, kwargs: dict) -> tf.data.Dataset | None:
    """`fit`'s arrays (`x`, `y`, `sample_weight`, `batch_size`) as a dataset of their first batch.

    Returns None for anything else (generators, Sequences, DatasetCreators).
    """
    try:
        bound = inspect.signature(keras.Model.fit).bind(None, x, *args, **kwargs).arguments
    except TypeError:
        return None
    y, sample_weight = bound.get("y"), bound.get("sample_weight")
    leaves = tf.nest.flatten((x, y, sample_weight))
    if x is None or not all(isinstance(a, (np.ndarray, tf.Tensor)) or a is None for a in leaves):
        return None
    data = keras.utils.pack_x_y_sample_weight(x, y, sample_weight)
    try:
        return tf.data.Dataset.from_tensor_slices(data).batch(bound.get("batch_size") or 32).take(1)
    except (TypeError, ValueError):
        return None


__all__ = ["check_model", "forward_as_loss", "one_batch_of_arrays", "tolerances"]
