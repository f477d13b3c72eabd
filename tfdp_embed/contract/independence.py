"""The independence check: each example's loss must depend on that example alone.

Per-example clipping bounds one example's influence on the update only if
loss_i is a function of example i (and the weights): then removing example
j changes the clipped sum by c_j g_j alone, of norm <= C. Batch statistics
(batch normalisation, centring with the batch mean), in-batch negatives
(`tfrs.tasks.Retrieval`, contrastive losses) and any other mixing break
this, whatever class implements them. So on one batch, before training,
the per-example losses of the batch are compared with those of the batch
less one example (twice) and less half its examples: the losses of the
remaining examples must not change (up to float round-off). When they do,
the culprit is named: the first layer, in the order calls finish, whose
output rows for the remaining examples change (or whose inputs change,
when code between layers mixes), else the loss itself.

Training mode is checked with the known stochastic layers (dropout,
Gaussian noise) passing their input through; if the loss is still random,
inference mode is checked instead, with a warning.

References: Abadi et al. 2016 §3.1 (the per-example sensitivity argument).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from tfdp_embed.contract.examples import batch_size_of, select_examples
from tfdp_embed.contract.layer_calls import deterministic, recorded_calls
from tfdp_embed.errors import PrivacyContractError

RTOL = 1e-5  # of the largest magnitude compared: float32 round-off passes, mixing does not
MAX_EXAMPLES = 32  # the check runs on the first examples of the batch


def check_independence(
    model,
    per_example_loss: Callable,
    batch: tuple,
    *,
    loss_name: str,
    rtol: float = RTOL,
    layers: list | None = None,
) -> str:
    """Refuses a model whose per-example losses depend on other examples.

    Args:
      model: the model (its layers are recorded to name a culprit).
      per_example_loss: `(x, y, sample_weight, training) -> [n]` losses.
      batch: `(x, y, sample_weight)` of one batch with at least 2 examples.
      loss_name: how to name the loss in the error (e.g. "`Model.compute_loss`").
      rtol: the largest difference taken for round-off, relative to the
        largest magnitude compared (larger for float16/bfloat16 compute).
      layers: `layer_calls.all_layers(model)`, when the caller has it.

    Returns:
      "training" or "inference": the mode checked; "unchecked" if the losses
      were random in both (a warning says so).

    Raises:
      PrivacyContractError: naming what mixes examples.
      ValueError: a batch of fewer than 2 examples.
    """
    n = batch_size_of(batch)
    if n is None or n < 2:
        raise ValueError(f"The independence check needs a batch of >= 2 examples; received {n}.")
    m = min(n, MAX_EXAMPLES)
    probe = select_examples(batch, range(m), n)
    with deterministic(model, layers):
        try:
            mode, full = _reproducible_mode(lambda training: per_example_loss(*probe, training), m, rtol)
            if mode == "unchecked":
                return mode
            training = mode == "training"
            for keep in _subsets(m):
                part = select_examples(probe, keep, m)
                if not _close(full[keep], np.asarray(per_example_loss(*part, training)), rtol):
                    raise PrivacyContractError(
                        _blame(model, per_example_loss, probe, part, keep, m, training, loss_name, rtol)
                    )
        except (tf.errors.InvalidArgumentError, ValueError) as error:
            _warn_unchecked(f"the model does not run on part of the batch ({type(error).__name__}: {error})")
            return "unchecked"
    return mode


def _subsets(m: int) -> list:
    """The batch less its first example, less its last, and its first half."""
    everyone = np.arange(m)
    subsets = [np.delete(everyone, 0), np.delete(everyone, m - 1)]
    if m >= 4:
        subsets.append(everyone[: m // 2])
    return subsets


def _reproducible_mode(losses: Callable, m: int, rtol: float) -> tuple:
    """(the first mode whose losses two runs reproduce, or "unchecked"; those losses, the later run's).

    The later run's losses are the full probe's that the subsets are
    compared with: a third run would compute them again.
    """
    for training in (True, False):
        first = np.asarray(losses(training))
        if first.shape != (m,):
            raise ValueError(f"the losses of {m} examples have shape {first.shape}")
        again = np.asarray(losses(training))
        if _close(first, again, rtol):
            if not training:
                warnings.warn(
                    "DPModel could not check in training mode that each example's loss depends "
                    "on that example alone: the training-mode loss is random even with dropout "
                    "and Gaussian-noise layers passing their input through (a layer draws "
                    "randomness in `call`). It checked inference mode instead.",
                    RuntimeWarning,
                    stacklevel=5,
                )
            return ("training" if training else "inference"), again
    _warn_unchecked("the loss is random in training and in inference mode")
    return "unchecked", None


def _warn_unchecked(why: str) -> None:
    warnings.warn(
        f"DPModel could not check that each example's loss depends on that example alone: {why}. "
        "Per-example clipping is a privacy guarantee only if it does.",
        RuntimeWarning,
        stacklevel=5,
    )


def _close(a, b, rtol: float) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    if a.size == 0:
        return True
    if not np.issubdtype(a.dtype, np.floating):
        return bool(np.array_equal(a, b))
    a, b = a.astype(np.float64), b.astype(np.float64)
    same_nan = np.isnan(a) & np.isnan(b)
    difference = np.where(same_nan, 0.0, np.abs(a - b))
    if np.isnan(difference).any():
        return False
    scale = max(np.nanmax(np.abs(a), initial=0.0), np.nanmax(np.abs(b), initial=0.0))
    return bool(difference.max() <= rtol * scale)


def _rows_differ(whole: list, part: list, keep: np.ndarray, m: int, rtol: float) -> bool:
    """Whether some batched dense tensor of `whole` differs from `part` on the kept rows."""
    dense = (tf.Tensor, np.ndarray)  # ragged, sparse and variables are not compared
    for a, b in zip(whole, part):
        if not isinstance(a, dense) or not isinstance(b, dense):
            continue
        shape_a, shape_b = a.shape, b.shape
        if len(shape_a) == 0 or shape_a[0] != m or len(shape_b) == 0 or shape_b[0] != len(keep):
            continue
        if not _close(np.asarray(a)[keep], np.asarray(b), rtol):
            return True
    return False


def _blame(model, per_example_loss, probe, part, keep, m, training, loss_name, rtol) -> str:
    with recorded_calls(model) as whole_calls:
        per_example_loss(*probe, training)
    with recorded_calls(model) as part_calls:
        per_example_loss(*part, training)
    index: dict[int, list] = {}
    for call in part_calls:
        index.setdefault(id(call.layer), []).append(call)
    seen: dict = {}
    for call in whole_calls:
        k = seen.get(id(call.layer), 0)
        seen[id(call.layer)] = k + 1
        matches = index.get(id(call.layer), [])
        if k >= len(matches):
            continue
        other = matches[k]
        if _rows_differ(call.inputs, other.inputs, keep, m, rtol):
            return _between_layers_message(call)
        if _rows_differ(call.outputs, other.outputs, keep, m, rtol):
            return _layer_message(call.layer)
    return _loss_message(loss_name)


_WHY = (
    "Per-example clipping bounds one example's influence only when each example's loss "
    "depends on that example alone; DPModel checked on the first batch that the other "
    "examples' losses stay the same when one example is removed, and they did not."
)


def _layer_message(layer) -> str:
    return (
        f"Layer {layer.name!r} ({type(layer).__name__}) mixes examples: its output for one "
        "example changes when another example is removed from the batch (batch statistics, "
        "centring with the batch mean, attention or scoring across the batch, in-batch "
        f"negatives). {_WHY} Compute the layer per example (e.g. LayerNormalization instead of "
        "batch statistics; for retrieval, score against the full item table instead of the "
        "batch's items), or remove it."
    )


def _between_layers_message(call) -> str:
    where = (
        f"in the `call` of {call.parent.name!r} ({type(call.parent).__name__})"
        if call.parent is not None
        else "before the model's first layer"
    )
    return (
        f"The inputs of layer {call.layer.name!r} ({type(call.layer).__name__}) mix examples "
        f"although no layer before it does: code outside any layer, {where}, combines "
        f"examples (e.g. a mean or a sum over the batch axis). {_WHY} Compute it per example."
    )


def _loss_message(loss_name: str) -> str:
    return (
        f"The per-example loss ({loss_name}) mixes examples: one example's loss changes when "
        "another example is removed from the batch, though no layer's output for it does. "
        f"{_WHY} In-batch negatives (e.g. `tfrs.tasks.Retrieval`, which scores each query "
        "against the other examples' items) and losses that compare or normalise across "
        "examples break it: score against the full item table (a softmax over all items, e.g. "
        "`tfdp_embed.keras2.models.two_tower.ItemEmbedding`) or use `tfdp_embed.keras2.retrieval.Retrieval` "
        "(full softmax, or sampled softmax with negatives drawn independently of the data), and "
        "return one loss per example that depends on that example alone."
    )


__all__ = ["MAX_EXAMPLES", "RTOL", "check_independence"]
