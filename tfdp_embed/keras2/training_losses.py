"""`DPModel`'s forward passes: the per-example loss (a compiled loss or `compute_loss`) and its metrics.

DP clips each example's gradient, so the loss must be one value per example
(`[batch]`); a reduced loss is refused here, before anything trains. The
metrics of a DP step leave out examples whose loss is not finite
(`tfdp_embed.nonfinite`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from tfdp_embed import nonfinite, read_guard
from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.per_example_loss import PerExampleLoss
from tfdp_embed.traced_as_written import as_written, user_code


class Losses(NamedTuple):
    """One forward pass's losses: `[B]` float32 per example, predictions, each output's `[B]` loss."""

    per_example: tf.Tensor
    y_pred: object
    per_output: list


@tf.autograph.experimental.do_not_convert
def unpack(data, *, lookahead: bool):
    """`(x, y, sample_weight, lookahead)` of a dataset element (`lookahead` None unless enabled)."""
    ids = None
    if lookahead:
        if not isinstance(data, tuple) or not isinstance(data[-1], dict):
            raise ValueError(
                "DPModel(lookahead=True) expects (features, labels, lookahead) elements; "
                "use tfdp_embed.data.with_lookahead."
            )
        data, ids = data[:-1], data[-1]
        if len(data) == 1:
            data = data[0]
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    return x, y, sample_weight, ids


@as_written
def per_example_losses(model, loss_fn, x, y, sample_weight, training) -> Losses:
    """The `[B]` float32 per-example loss (sample weights applied), predictions, output losses.

    Args:
      model: the wrapped Keras model.
      loss_fn: the compiled `PerExampleLoss`, or None to use `model.compute_loss`.
    """
    if loss_fn is None:
        return Losses(_compute_loss(model, x, y, sample_weight, training), None, [])
    if y is None:
        raise ValueError(
            f"The compiled loss ({loss_name(model, loss_fn)}) needs labels: the data must yield "
            "(features, labels) or (features, labels, sample_weight)."
        )
    y_pred = model(x, training=training)
    loss, per_output = loss_fn(y, y_pred, sample_weight)
    check_per_example(loss)
    return Losses(loss, y_pred, per_output)


def _compute_loss(model, x, y, sample_weight, training):
    """The wrapped model's `compute_loss`, which must return one loss per example."""
    loss = user_code(model.compute_loss)(x if y is None else (x, y), training=training)  # converted, as before
    loss = tf.cast(tf.convert_to_tensor(loss), tf.float32)
    check_per_example(loss)
    if sample_weight is not None:
        loss = loss * tf.cast(tf.reshape(sample_weight, [-1]), loss.dtype)
    return loss


def check_per_example(loss) -> None:
    """Raises PrivacyContractError unless `loss` has shape `[batch]`."""
    if loss.shape.rank != 1:
        raise PrivacyContractError(
            f"The loss must be one value per example (shape [batch]); it has shape {loss.shape}. "
            "DP clips each example's gradient: use a loss with reduction NONE and return it "
            "unreduced from `compute_loss`."
        )


def loss_name(model, loss_fn) -> str:
    """How errors name the loss: the compiled loss's name, or the model's `compute_loss`."""
    if loss_fn is None:
        return f"`{type(model).__name__}.compute_loss`"
    return loss_fn.name


class LossesAndMetrics:
    """`DPModel`'s compiled loss, metrics, and evaluation steps (a mixin placed before `keras.Model`)."""

    inner: Any  # the wrapped Keras model
    lookahead: bool  # dataset elements end with the next batch's ids
    _training_only: Any  # holds the compiled loss (training-only state)
    loss_tracker: Any  # the mean per-example loss metric
    compiled_metrics: Any  # Keras' compiled metrics

    def compile(self, optimizer="sgd", loss=None, metrics=None, loss_weights=None, **kwargs):
        """Like `keras.Model.compile`; `loss` and `loss_weights` give one loss per example.

        They are matched to the outputs as Keras matches them (dict, list or
        one loss for all outputs; see `tfdp_embed.keras2.per_example_loss`): example
        i's loss is sum_o w_o loss_o(y_o, p_o)[i] times its sample weight. A
        loss's `reduction` is not used.
        """
        if loss is None and not hasattr(self.inner, "compute_loss"):
            raise ValueError(
                "`loss` is required unless the wrapped model defines `compute_loss` returning one loss per example."
            )
        if loss is None and loss_weights is not None:
            raise ValueError(
                "`loss_weights` weighs the losses given in `loss`; without `loss` the wrapped "
                "model's `compute_loss` gives the loss, so weigh its terms there."
            )
        self._training_only.loss = (
            None
            if loss is None
            else PerExampleLoss(loss, loss_weights, output_names=getattr(self.inner, "output_names", None))
        )
        super().compile(optimizer=optimizer, metrics=metrics, **kwargs)  # type: ignore[misc]

    @property
    def _loss_fn(self) -> PerExampleLoss | None:
        return self._training_only.loss

    @property
    def metrics(self):
        per_output = self._loss_fn.output_metrics if self._loss_fn is not None else []
        return [self.loss_tracker, *per_output, *super().metrics]

    def _unpack(self, data):
        return unpack(data, lookahead=self.lookahead)

    def _per_example_loss(self, x, y, sample_weight, training=True) -> Losses:
        """The `[B]` float32 per-example loss (sample weights applied), predictions, output losses."""
        return per_example_losses(self.inner, self._loss_fn, x, y, sample_weight, training)

    @as_written
    def _update_metrics(self, losses: Losses, y, sample_weight, private: bool = False):
        """Updates the loss and compiled metrics; NaN shows as NaN, except a DP step's non-finite examples.

        In a DP step (`private`) an example with a non-finite loss contributed zero: the losses
        are averaged over the finite examples and its prediction and label read as 0, so neither
        a NaN nor a count of such examples reaches the logs (`tfdp_embed.nonfinite`).
        """
        finite = nonfinite.finite_examples(losses.per_example) if private else None
        for metric, values in [(self.loss_tracker, losses.per_example), *self._output_losses(losses)]:
            if finite is None:
                metric.update_state(tf.reduce_mean(values))
            else:
                metric.update_state(*nonfinite.finite_mean(values, finite))
        if losses.y_pred is not None and y is not None:
            y_true, y_pred = (y, losses.y_pred) if finite is None else nonfinite.finite_values((y, losses.y_pred))
            self.compiled_metrics.update_state(y_true, y_pred, sample_weight)
        return {m.name: m.result() for m in self.metrics}

    @tf.autograph.experimental.do_not_convert
    def _output_losses(self, losses: Losses) -> list:
        """(metric, `[B]` loss) of each output of the compiled loss; none for `compute_loss` models."""
        return [] if self._loss_fn is None else list(zip(self._loss_fn.output_metrics, losses.per_output))

    def test_step(self, data):
        x, y, sample_weight, _ = self._unpack(data)
        with read_guard.unguarded():  # as in train_step
            losses = self._per_example_loss(x, y, sample_weight, training=False)
        return self._update_metrics(losses, y, sample_weight)

    def predict_step(self, data):
        x = self._unpack(data)[0]
        with read_guard.unguarded():  # as in train_step
            return self.inner(x, training=False)


__all__ = ["Losses", "LossesAndMetrics", "check_per_example", "loss_name", "per_example_losses", "unpack"]
