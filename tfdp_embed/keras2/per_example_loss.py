"""One loss per example from what `compile(loss=..., loss_weights=...)` accepts, mapped as Keras maps it.

Keras' compiled loss is a scalar: the sum over outputs o of w_o times the
batch mean of loss_o * sample_weight_o. DP clips each example's gradient,
so it needs one loss per example whose batch mean is that scalar:

    loss_i = sum_o w_o * mean over the non-batch axes of (loss_o(y_o, p_o) * sample_weight_o)[i]

Losses, loss weights, labels and sample weights are matched to the model's
outputs as `keras.Model.compile` matches them (tf-keras
`engine/compile_utils.py`, `LossesContainer`): by key for dict outputs, by
position for list outputs, by output name for a dict given to a model with
one or a list of outputs, and one loss (or weight, label, sample weight)
given for several outputs applies to each of them. An output whose loss is
None adds nothing. Label rank and dtype follow `compile_utils.
match_dtype_and_rank` (1-D labels against `[B, 1]` predictions are
expanded) and then the loss's own squeeze (`LossFunctionWrapper`).

Differences from Keras, each an error where Keras would silently do
something else: a key that names no output, a list of the wrong length, a
list against dict outputs (Keras would match it in sorted-key order), and
an output with a loss but no labels (Keras skips it). The `reduction` of a
`keras.losses.Loss` is not used: losses stay per example (DPModel averages
the clipped sum over the expected batch size). Predictions are cast to
float32 before the loss, so under a mixed-precision policy the loss, and
the backward pass's start, are float32.

Example:
    >>> loss = PerExampleLoss(
    ...     {"click": keras.losses.BinaryCrossentropy(from_logits=True), "conversion": "mse"},
    ...     loss_weights={"click": 1.0, "conversion": 0.5})
    >>> per_example, per_output = loss(labels, model(features), sample_weight)  # [B], [[B], [B]]

References: tf-keras `engine/compile_utils.py` (`LossesContainer`,
`map_to_output_names`, `match_dtype_and_rank`); Abadi et al. 2016 §3.1
(per-example losses).
"""

from __future__ import annotations

import numbers

from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.traced_as_written import user_code


class PerExampleLoss:
    """`compile`'s `loss` and `loss_weights` as a function returning one float32 loss per example.

    Args:
      loss: a loss (a `keras.losses.Loss`, a function `(y_true, y_pred)`, or a
        name `keras.losses.get` knows), or a dict / list of them per output.
      loss_weights: a float, or a dict / list of floats per output; None is 1.
      output_names: the model's output names (`model.output_names`), used to
        match dict keys to the outputs of a model returning one tensor or a
        list; None gives Keras' names for subclassed models (`output_1`, ...).

    Raises:
      ValueError: (at the first call, when the outputs are known) a key that
        names no output, a list whose length differs from the outputs', a
        list against dict outputs, a loss weight that is not a number, or no
        loss for any output.
    """

    def __init__(self, loss, loss_weights=None, *, output_names=None):
        self._user_loss = loss
        self._user_weights = loss_weights
        self._output_names = list(output_names) if output_names is not None else None
        self._losses = None  # per flattened output: a callable or None, after `build`
        self._weights = None
        self.output_names = None  # per flattened output
        self.output_metrics = []  # Mean of each output's loss, only with several outputs

    @property
    def name(self) -> str:
        """The loss as error messages name it."""
        if not tf.nest.is_nested(self._user_loss):
            return _name_of(self._user_loss)
        if isinstance(self._user_loss, dict):
            return ", ".join(f"{k}: {_name_of(v)}" for k, v in sorted(self._user_loss.items()))
        return ", ".join(_name_of(v) for v in tf.nest.flatten(self._user_loss))

    @tf.autograph.experimental.do_not_convert
    def build(self, y_pred) -> None:
        """Matches the losses and weights to the structure of `y_pred` (once)."""
        names = self._output_names or _pseudo_names(y_pred)
        losses = align(self._user_loss, y_pred, names, argument="loss")
        weights = align(self._user_weights, y_pred, names, argument="loss_weights")
        if all(loss is None for loss in losses):
            raise ValueError(f"`loss` gives no loss for any model output; received {self._user_loss!r}.")
        for weight in weights:
            if weight is not None and not isinstance(weight, numbers.Real):
                raise ValueError(
                    f"`loss_weights` must be numbers (one, or one per output); received {self._user_weights!r}."
                )
        self.output_names = _flat_names(y_pred, names)
        self._losses = [None if loss is None else _loss_callable(loss) for loss in losses]
        self._weights = [1.0 if w is None else float(w) for w in weights]
        if len(self._losses) > 1:
            self.output_metrics = [
                keras.metrics.Mean(name=f"{name}_loss")
                for name, loss in zip(self.output_names, self._losses)
                if loss is not None
            ]

    def __call__(self, y_true, y_pred, sample_weight=None):
        """Returns (`[B]` weighted sum over outputs, `[B]` loss of each output that has one).

        Raises:
          ValueError: labels or sample weights that do not match the outputs, or
            an output with a loss but no labels.
          PrivacyContractError: a loss that does not return a value per example.
        """
        if self._losses is None:
            self.build(y_pred)
        names = self._output_names or _pseudo_names(y_pred)
        labels = align(y_true, y_pred, names, argument="labels (`y`)")
        weights = align(sample_weight, y_pred, names, argument="sample_weight")
        total, per_output = None, []
        for name, loss, w, y_t, y_p, sw in zip(
            self.output_names, self._losses, self._weights, labels, tf.nest.flatten(y_pred), weights
        ):
            if loss is None:
                continue
            if y_t is None:
                raise ValueError(
                    f"Output {name!r} has a loss but the data has no labels for it; give labels for "
                    "every output with a loss, or set its loss to None."
                )
            value = _output_loss(loss, y_t, y_p, sw, name)
            per_output.append(value)
            total = w * value if total is None else total + w * value
        return total, per_output


@tf.autograph.experimental.do_not_convert
def align(struct, outputs, names, *, argument: str) -> list:
    """`struct` as a flat list with one entry per `tf.nest.flatten(outputs)` leaf (Keras' mapping).

    Args:
      struct: losses, weights, labels or sample weights: one object (applied to
        every output), or a dict / list / nested structure per output.
      outputs: the model's outputs (structure only).
      names: the output names of a model returning one tensor or a flat list.
      argument: how errors name `struct`.

    Raises:
      ValueError: a key naming no output, a list of the wrong length, or a list
        against dict outputs.
    """
    flat_list = isinstance(outputs, (list, tuple)) and not any(tf.nest.is_nested(o) for o in outputs)
    if isinstance(struct, dict) and (not tf.nest.is_nested(outputs) or flat_list):
        unknown = sorted(set(struct) - set(names), key=str)
        if unknown:
            raise ValueError(f"`{argument}` has keys {unknown} that name no model output; the outputs are {names}.")
        struct = [struct.get(name) for name in names]
        struct = struct[0] if len(struct) == 1 and not tf.nest.is_nested(outputs) else struct
    return _align(struct, outputs, argument)


def _align(struct, outputs, argument: str) -> list:
    if not tf.nest.is_nested(struct):
        return [struct] * len(tf.nest.flatten(outputs))
    if isinstance(outputs, dict):
        if not isinstance(struct, dict):
            raise ValueError(
                f"`{argument}` is a {type(struct).__name__} but the model returns a dict of outputs "
                f"{sorted(outputs)}: give a dict keyed by output name."
            )
        unknown = sorted(set(struct) - set(outputs), key=str)
        if unknown:
            raise ValueError(
                f"`{argument}` has keys {unknown} that name no model output; the outputs are {sorted(outputs)}."
            )
        return [entry for key in sorted(outputs) for entry in _align(struct.get(key), outputs[key], argument)]
    if isinstance(outputs, (list, tuple)):
        if not isinstance(struct, (list, tuple)) or len(struct) != len(outputs):
            raise ValueError(
                f"`{argument}` must give one entry per model output ({len(outputs)}, in order) or one "
                f"for all of them; received {_describe(struct)}."
            )
        return [entry for s, o in zip(struct, outputs) for entry in _align(s, o, argument)]
    if isinstance(struct, (list, tuple)) and len(struct) == 1:
        return _align(struct[0], outputs, argument)
    raise ValueError(f"`{argument}` must be one entry for the model's single output; received {_describe(struct)}.")


def _output_loss(loss, y_true, y_pred, sample_weight, name: str) -> tf.Tensor:
    """One output's `[B]` float32 per-example loss (Keras' rank and dtype matching first)."""
    y_true = tf.convert_to_tensor(y_true)
    y_pred = tf.convert_to_tensor(y_pred)
    if y_pred.dtype.is_floating:
        y_pred = tf.cast(y_pred, tf.float32)  # the loss in float32 under mixed precision
    # compile_utils.match_dtype_and_rank
    if y_true.shape.rank == 1 and y_pred.shape.rank == 2:
        y_true = tf.expand_dims(y_true, -1)
    if (y_true.dtype.is_floating and y_pred.dtype.is_floating) or (y_true.dtype.is_integer and y_pred.dtype.is_integer):
        y_true = tf.cast(y_true, y_pred.dtype)
    values = tf.cast(loss(y_true, y_pred), tf.float32)
    if sample_weight is not None:
        sample_weight = tf.cast(sample_weight, tf.float32)
        values = values * _match_rank(sample_weight, values)
    if values.shape.rank == 0:
        raise PrivacyContractError(
            f"The loss of output {name!r} ({_name_of(loss)}) returned one value for the whole batch "
            f"(labels {y_true.shape}, predictions {y_pred.shape}); DP clips each example's gradient "
            "and needs one value per example. A custom loss function must not average over the batch."
        )
    if values.shape.rank is not None and values.shape.rank > 1:
        values = tf.reduce_mean(values, axis=list(range(1, values.shape.rank)))
    return values


def _match_rank(sample_weight: tf.Tensor, losses: tf.Tensor) -> tf.Tensor:
    """`sample_weight` with its last axis squeezed or added to match `losses` (losses_utils)."""
    weights_rank, losses_rank = sample_weight.shape.rank, losses.shape.rank
    if weights_rank in (None, 0) or losses_rank is None:
        return sample_weight
    if weights_rank - losses_rank == 1:
        return tf.squeeze(sample_weight, [-1])
    if losses_rank - weights_rank == 1:
        return tf.expand_dims(sample_weight, -1)
    return sample_weight


def _loss_callable(loss):
    """`(y_true, y_pred) -> unreduced losses` for a Loss, a function or a loss name."""
    try:
        loss = keras.losses.get(loss)
    except (ValueError, TypeError) as error:
        raise ValueError(f"`loss` entry {loss!r} is not a Keras loss: {error}") from None
    if isinstance(loss, keras.losses.Loss):
        return _Unreduced(loss)
    if not callable(loss):
        raise ValueError(f"`loss` entries must be Keras losses or callables; received {loss!r}.")
    return _SqueezedFunction(loss)


class _Unreduced:
    """A `keras.losses.Loss` without its reduction: `Loss.call` (its own rank matching included)."""

    def __init__(self, loss):
        self.loss = loss
        self.name = loss.name

    def __call__(self, y_true, y_pred):
        return user_code(self.loss.call)(y_true, y_pred)  # a user's Loss subclass: converted, as before


class _SqueezedFunction:
    """A loss function with `LossFunctionWrapper`'s squeeze of a trailing size-1 axis."""

    def __init__(self, fn):
        self.fn = fn
        self.name = getattr(fn, "__name__", type(fn).__name__)

    def __call__(self, y_true, y_pred):
        y_true, y_pred = _squeeze_trailing(y_true, y_pred)
        return user_code(self.fn)(y_true, y_pred)


def _squeeze_trailing(y_true, y_pred):
    """losses_utils.squeeze_or_expand_dimensions for static ranks: drop a size-1 last axis."""
    true_rank, pred_rank = y_true.shape.rank, y_pred.shape.rank
    if true_rank is None or pred_rank is None:
        return y_true, y_pred
    if pred_rank - true_rank == 1 and y_pred.shape[-1] == 1:
        return y_true, tf.squeeze(y_pred, [-1])
    if true_rank - pred_rank == 1 and y_true.shape[-1] == 1:
        return tf.squeeze(y_true, [-1]), y_pred
    return y_true, y_pred


@tf.autograph.experimental.do_not_convert
def _pseudo_names(outputs) -> list:
    """Keras' names for the outputs of a subclassed model: output_1, output_2, ..."""
    if isinstance(outputs, dict):
        return sorted(outputs)
    return [f"output_{i + 1}" for i in range(len(tf.nest.flatten(outputs)))]


@tf.autograph.experimental.do_not_convert
def _flat_names(outputs, names) -> list:
    """A name per flattened output: `names` for one tensor or a flat list, else the key paths."""
    if not isinstance(outputs, dict) and len(names) == len(tf.nest.flatten(outputs)):
        return list(names)
    return _paths(outputs)


def _paths(outputs) -> list:
    """`tf.nest.flatten` order of `outputs`' leaves, each named by its keys / positions joined by "_"."""
    if isinstance(outputs, dict):
        items = [(str(key), outputs[key]) for key in sorted(outputs)]
    elif isinstance(outputs, (list, tuple)):
        items = [(str(i + 1), value) for i, value in enumerate(outputs)]
    else:
        return [""]
    return [f"{key}_{path}" if path else key for key, value in items for path in _paths(value)]


def _name_of(loss) -> str:
    if loss is None:
        return "None"
    if isinstance(loss, str):
        return loss
    return getattr(loss, "name", None) or getattr(loss, "__name__", None) or type(loss).__name__


def _describe(struct) -> str:
    if isinstance(struct, (list, tuple)):
        return f"a {type(struct).__name__} of {len(struct)}"
    return f"a {type(struct).__name__}"


__all__ = ["PerExampleLoss", "align"]
