"""`DPModel`: the staged differentially private train step around any Keras model.

    forward + per-example loss -> per-example norms -> clip ->
    mechanism.update -> optimizer.apply -> mechanism.after_apply(lookahead)

`DPModel` wraps a functional, sequential or subclassed Keras model, or a
`tfrs.Model` (whose `compute_loss` must return one loss per example), and
trains it with `fit` like any Keras model. Per-example gradient norms come
from the clipping registry (ghost norms over each layer's inputs and
output gradients); a dense `[batch, vocab, dim]` tensor is never built.

Per-example losses are required: the DP argument clips each example's
gradient, which is only meaningful when loss_i depends on example i alone.
Losses that mix examples (in-batch negatives, e.g. `tfrs.tasks.Retrieval`,
batch normalisation in training mode) break it. `prepare` checks this by
behaviour on the first batch, before anything trains
(`tfdp_embed.contract`): a training-mode forward pass must leave every
non-trainable variable unchanged, the other examples' losses must not
change when one example is removed, and the clipping rules must account
for the whole gradient. It refuses the model otherwise, naming the layer
(or the loss) at fault.

Example:
    >>> inputs = keras.Input((4,), dtype="int32")
    >>> x = DPEmbedding(1000, 8, combiner="mean")(inputs)
    >>> model = keras.Model(inputs, keras.layers.Dense(1)(x))
    >>> dp = DPModel(model, mechanism=DenseDPSGD(l2_norm_clip=1.0,
    ...              noise_multiplier=1.1), expected_batch_size=256)
    >>> dp.compile(optimizer=keras.optimizers.legacy.SGD(0.1),
    ...            loss=keras.losses.BinaryCrossentropy(from_logits=True))
    >>> dp.fit(dataset, epochs=1)

References: Abadi et al. 2016 (DP-SGD); Li et al. 2022 and Bu et al. 2022
(ghost clipping, book-keeping); TFRS `models/base.py` (staged step).
"""

from __future__ import annotations

import functools
import warnings
from typing import NamedTuple

from tfdp_embed import (
    callbacks_check,
    contract,
    distribute,
    mixed_precision,
    nonfinite,
    optimizer_check,
    read_guard,
    tape_guard,
)
from tfdp_embed._keras import keras, tf
from tfdp_embed.clipping.absent_examples import present_examples, without_absent_examples
from tfdp_embed.clipping.per_example import clipped_step
from tfdp_embed.clipping.taps import layers_owning_weights, record_taps
from tfdp_embed.contract.preprocessing import check_preprocessing
from tfdp_embed.data.provenance import fed_batching
from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.export import _without_read_hooks, release_ready
from tfdp_embed.layers.embedding import DPEmbedding
from tfdp_embed.mechanisms.base import ClippedGradients, NoiseMechanism, TableGradient
from tfdp_embed.mechanisms.capabilities import check_declared_use
from tfdp_embed.optimizer_weights import create_optimizer_weights
from tfdp_embed.per_example_loss import PerExampleLoss

_NON_PER_EXAMPLE_LAYERS = (keras.layers.BatchNormalization,)


def _reject_non_per_example(model) -> None:
    """Raises PrivacyContractError for components whose loss mixes examples."""
    try:
        import tensorflow_recommenders as tfrs

        retrieval: tuple[type, ...] = (tfrs.tasks.Retrieval,)
    except ImportError:  # pragma: no cover
        retrieval = ()
    for module in [model, *model.submodules]:
        if retrieval and isinstance(module, retrieval):
            raise PrivacyContractError(
                f"{type(module).__name__} {getattr(module, 'name', '')!r} scores each query against "
                "the other examples of the batch (in-batch negatives), so one example's loss depends "
                "on other examples and per-example clipping no longer bounds its influence. Use "
                "`tfdp_embed.retrieval.Retrieval` instead, the DP-safe drop-in: a full softmax over "
                "the catalogue, or a sampled softmax whose negatives are drawn independently of the "
                "data (a shared sample per step from a fixed proposal, with log-Q correction)."
            )
        if isinstance(module, _NON_PER_EXAMPLE_LAYERS) and module.trainable:
            raise PrivacyContractError(
                f"Layer {module.name!r} ({type(module).__name__}) normalises with batch statistics "
                "in training, which mixes examples and breaks per-example clipping. Use "
                "LayerNormalization or freeze it (trainable=False)."
            )


_PROBE_BATCHES = 4  # batches of a dataset searched for one with >= 2 examples


def _averaged_sum(clipped_sum, clip_factors, expected_batch_size: float, index: int) -> tf.IndexedSlices:
    """Variable `index`'s clipped sum divided by the expected batch size, via c_i / B."""
    return clipped_sum(clip_factors / expected_batch_size)[index]


class _MechanismWarnings(keras.callbacks.Callback):
    """Emits the mechanism's `epoch_warnings` at each epoch end (operator-only diagnostics)."""

    def __init__(self, mechanism):
        super().__init__()
        self._mechanism = mechanism

    def on_epoch_end(self, epoch, logs=None):
        for message in self._mechanism.epoch_warnings():
            warnings.warn(message, RuntimeWarning, stacklevel=2)


class _Losses(NamedTuple):
    """One forward pass's losses: `[B]` float32 per example, predictions, each output's `[B]` loss."""

    per_example: tf.Tensor
    y_pred: object
    per_output: list


class _TrainingOnly:
    """State `DPModel` keeps out of Keras/TF tracking, so no weights file, checkpoint or SavedModel of it holds it."""

    __slots__ = ("mechanism", "loss_tracker", "fed_batching", "loss")

    def __init__(self, mechanism, loss_tracker):
        self.mechanism = mechanism
        self.loss_tracker = loss_tracker
        self.fed_batching = None
        self.loss = None  # the compiled `PerExampleLoss` (None: the model's `compute_loss`)


class DPModel(keras.Model):
    """Trains `model` with a noise mechanism; `fit`, callbacks and `tf.function` work.

    Args:
      model: the Keras model to train (functional, sequential, subclassed, or
        `tfrs.Model`). Its `DPEmbedding` tables are sparse variables; every
        other trainable variable is dense.
      mechanism: a `NoiseMechanism` (keyword-only).
      expected_batch_size: divisor of the noised gradient sum: q * N under
        Poisson sampling, the batch size under fixed-size batching.
      registry: a `LayerRegistry` of per-example norm functions; defaults to
        `tfdp_embed.clipping.default_registry()`.
      lookahead: the dataset yields `(features, labels, lookahead)` where
        `lookahead` maps a `DPEmbedding` layer name to the next batch's unique
        ids (`tfdp_embed.data.with_lookahead`); only mechanisms declaring
        `capabilities.lookahead` (LazyDP) accept it.
      check_per_example: on the first batch, check that each example's loss
        depends on that example alone and that the clipping rules cover the
        whole gradient (a few eager forward passes, once). Turn it off only to
        save that time on a model known to pass; a warning says it is off.
        The check that training leaves non-trainable state alone always runs.

    What leaves training: `DPModel`'s own Keras/TF state is exactly the
    wrapped model's weights. The mechanism (noise RNG, LazyDP's histories),
    the optimizer and the loss tracker are training-only: `weights`,
    `get_weights`, `save_weights`, `save` and `tf.train.Checkpoint(m=dp)`
    hold the wrapped model alone, flushed first (LazyDP's owed noise is
    added); `tf.saved_model.save(dp, ...)` is refused. Training state that
    must resume exactly is saved with
    `tfdp_embed.checkpointing.TrainingCheckpoint`.

    Raises:
      PrivacyContractError: when the model has components whose loss is not
        per-example, or trainable variables no layer owns (at `prepare`/`fit`:
        layers that update state or mix examples in training, subclasses the
        clipping rules cannot describe).
      DistributionNotSupportedError, ValueError: a strategy or `lookahead`
        the mechanism's class does not declare in its `capabilities`.
    """

    def __init__(
        self,
        model: keras.Model,
        *,
        mechanism: NoiseMechanism,
        expected_batch_size: float | None = None,
        registry=None,
        lookahead: bool = False,
        check_per_example: bool = True,
        name: str | None = None,
    ):
        super().__init__(name=name or f"dp_{model.name}")
        if not isinstance(mechanism, NoiseMechanism):
            raise TypeError(f"`mechanism` must be a tfdp_embed NoiseMechanism; received {type(mechanism).__name__}.")
        if mechanism.clips_per_example:
            if expected_batch_size is None:
                raise ValueError(
                    "`expected_batch_size` is required for private training: the noised sum is "
                    "divided by it (q * N under Poisson sampling)."
                )
        if expected_batch_size is not None and not float(expected_batch_size) > 0:
            raise ValueError(f"`expected_batch_size` must be > 0; received {expected_batch_size!r}.")
        _reject_non_per_example(model)
        # Undeclared capabilities (strategy, lookahead, deferred noise) fail here, not in a traced step.
        distribute.check_supported(mechanism)
        check_declared_use(mechanism, lookahead=lookahead)
        mixed_precision.check_mechanism(mechanism, model)
        distribute.check_tables(model)
        from tfdp_embed import clipping  # registry functions live in the clipping package

        self.inner = model
        self.expected_batch_size = None if expected_batch_size is None else float(expected_batch_size)
        self.registry = registry if registry is not None else clipping.default_registry()
        self._fallback = clipping.vectorized_layer_gradients
        self.lookahead = bool(lookahead)
        self.check_per_example = bool(check_per_example)
        self._prepared = False
        self._loss_scale = 1.0  # the fixed float16 loss scale (`tfdp_embed.mixed_precision`), set by prepare
        self._contract_pending = True
        self._trace_error = None
        self._training_only = _TrainingOnly(mechanism, keras.metrics.Mean(name="loss"))

    @property
    def mechanism(self) -> NoiseMechanism:
        """The noise mechanism (training-only state: not among the model's weights)."""
        return self._training_only.mechanism

    @property
    def loss_tracker(self) -> keras.metrics.Mean:
        """The mean per-example loss metric (training-only state)."""
        return self._training_only.loss_tracker

    # -- Keras plumbing -----------------------------------------------------
    def call(self, inputs, training=None):
        outputs = self.inner(inputs, training=training)
        # Only a caller's own code calls the wrapper (the DP steps call `inner`): no gradient through it.
        return tape_guard.refuse_gradients(outputs) if self.mechanism.clips_per_example else outputs

    def compile(self, optimizer="sgd", loss=None, metrics=None, loss_weights=None, **kwargs):
        """Like `keras.Model.compile`; `loss` and `loss_weights` give one loss per example.

        They are matched to the outputs as Keras matches them (dict, list or
        one loss for all outputs; see `tfdp_embed.per_example_loss`): example
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
        super().compile(optimizer=optimizer, metrics=metrics, **kwargs)

    @property
    def _loss_fn(self) -> PerExampleLoss | None:
        return self._training_only.loss

    @property
    def batching(self):
        """The `FedBatching` of the data the last `fit` was fed (None before any `fit`)."""
        return self._training_only.fed_batching

    @property
    def metrics(self):
        per_output = self._loss_fn.output_metrics if self._loss_fn is not None else []
        return [self.loss_tracker, *per_output, *super().metrics]

    def fit(self, x=None, *args, batching=None, **kwargs):
        """Like `keras.Model.fit`; records how the batches were drawn in `self.batching`.

        Args:
          batching: only for sources that cannot be inspected (e.g. a
            `DatasetCreator` under ParameterServerStrategy): the
            `BatchingInfo` of the sampler inside; reported as declared by
            the caller, not verified. Datasets from `tfdp_embed.data` carry
            their batching; anything else is reported as not verified Poisson.

        Under a private mechanism, callbacks that act on un-noised training
        statistics (`EarlyStopping`, `ReduceLROnPlateau`,
        `ModelCheckpoint(save_best_only=True)` monitoring a training metric,
        `TerminateOnNaN`) and Keras' `BackupAndRestore` are refused
        (`tfdp_embed.callbacks_check`); a `PrivacyBudget`'s epsilon is in the
        epoch logs before any callback reads them.
        """
        self._training_only.fed_batching = fed_batching(x, declared=batching)
        data = x if isinstance(x, tf.data.Dataset) else contract.one_batch_of_arrays(x, args, kwargs)
        self.prepare(data)
        if self._contract_pending:
            self._check_contract(data)
        self._trace_error = None
        # Callbacks acting on un-noised training statistics are refused; epsilon reaches the logs first.
        args, kwargs = callbacks_check.with_callbacks(
            args,
            kwargs,
            private=self.mechanism.clips_per_example,
            logged_names=[m.name for m in self.metrics],
            extra=[_MechanismWarnings(self.mechanism)],
        )
        try:
            return super().fit(x, *args, **kwargs)
        except Exception:
            if self._trace_error is not None:
                raise self._trace_error from None
            raise

    # -- setup ----------------------------------------------------------------
    def prepare(self, data=None) -> None:
        """Builds the wrapped model, checks the per-example contract, and inits the mechanism.

        With a `tf.data.Dataset`, the model is built from its first batch and the
        contract (`tfdp_embed.contract`) is checked on it (on one of its first
        batches with >= 2 examples); without one, the model must be built and
        `fit` checks the contract on its own data.

        Raises:
          PrivacyContractError: the model breaks the per-example contract.
        """
        if self._prepared:
            return
        batch = None
        if isinstance(data, tf.data.Dataset):
            batch = self._probe_batch(data)
            # One eager forward pass builds the model and checks the loss is per example,
            # so a wrong loss fails here with a plain error, not inside the traced step.
            x, y, sample_weight, _ = self._unpack(batch)
            self._per_example_loss(x, y, sample_weight, training=False)
        elif not self.inner.built or not self.inner.trainable_variables:
            raise ValueError(
                f"Model {self.inner.name!r} is not built; build it (call it once) or pass a "
                "tf.data.Dataset to `fit` so it can be built from the first batch."
            )
        _reject_non_per_example(self.inner)  # again: components created while building
        check_preprocessing(self.inner)  # vocabularies / means from data: DP-released or declared public
        self._tapped_layers = layers_owning_weights(self.inner)
        for layer in self._tapped_layers:
            self.registry.lookup(layer)  # refuses subclasses the clipping rules cannot describe
        mixed_precision.check_variable_dtypes(self.inner)
        mixed_precision.check_mechanism(self.mechanism, self.inner)  # again: layers created while building
        self._loss_scale = mixed_precision.loss_scale(self.inner, self.optimizer)
        self._tables = [layer for layer in self._tapped_layers if isinstance(layer, DPEmbedding)]
        if batch is not None:
            # Before mechanism.init: no read hook (LazyDP) runs on the check's forward passes.
            self._check_contract(batch=batch)
        table_vars = {layer.embeddings.ref() for layer in self._tables}
        dense = [v for v in self.inner.trainable_variables if v.ref() not in table_vars]
        strategy = self.distribute_strategy
        distribute.check_supported(self.mechanism, strategy)
        distribute.check_tables(self.inner)
        # Workers share worker 0's noise stream before init draws anything (DP-FEST selects there).
        distribute.synchronize_generator(self.mechanism, strategy)
        with distribute.mechanism_state_scope(strategy, self._tables):
            self.mechanism.init(
                tables=self._tables, dense_variables=dense, optimizer=mixed_precision.inner_optimizer(self.optimizer)
            )
        distribute.check_identical_state(self.mechanism, strategy)
        # Before the first trace: variables it created would make Keras trace the step twice.
        create_optimizer_weights(
            mixed_precision.inner_optimizer(self.optimizer), self.inner.trainable_variables, strategy=strategy
        )
        self._prepared = True

    def _probe_batch(self, data: tf.data.Dataset):
        """The first batch of `data` with >= 2 examples among its first few, else its first."""
        first = None
        for element in data.take(_PROBE_BATCHES):
            if first is None:
                first = element
            size = contract.batch_size_of(self._unpack(element)[:3])
            if size is not None and size >= 2:
                return element
        if first is None:
            raise ValueError("The training dataset is empty: it yielded no batch.")
        return first

    def _check_contract(self, data=None, *, batch=None) -> None:
        """Checks the per-example contract on `batch` (or a batch of `data`); see `tfdp_embed.contract`.

        The independence check needs >= 2 examples: on a smaller batch in
        `prepare` it waits for `fit`'s data, and warns if that has none either.
        """
        if not self.mechanism.clips_per_example:
            self._contract_pending = False
            return
        if batch is None and isinstance(data, tf.data.Dataset):
            batch = self._probe_batch(data)
        if batch is None:
            self._contract_pending = False
            warnings.warn(
                "DPModel could not check the per-example contract (no layer updates state in "
                "training, each example's loss depends on it alone): it needs a tf.data.Dataset "
                "or arrays to read one batch from. Pass one to `prepare` or `fit`.",
                RuntimeWarning,
                stacklevel=3,
            )
            return
        with contract.read_hooks_removed(self._tables):
            ran = contract.check_model(
                self.inner,
                self._unpack(batch)[:3],
                forward=lambda training, x, y, w: self._per_example_loss(x, y, w, training=training).per_example,
                tapped_layers=self._tapped_layers,
                registry=self.registry,
                fallback=self._fallback,
                loss_name=self._loss_name(),
                check_per_example=self.check_per_example,
                loss_scale=self._loss_scale,
            )
        self._contract_pending = not ran and not self._prepared
        if not ran and self._prepared:  # fit's data: there is no later chance
            warnings.warn(
                "DPModel could not check that each example's loss depends on that example alone: "
                f"none of the first {_PROBE_BATCHES} batches has two examples.",
                RuntimeWarning,
                stacklevel=3,
            )

    def _loss_name(self) -> str:
        if self._loss_fn is None:
            return f"`{type(self.inner).__name__}.compute_loss`"
        return self._loss_fn.name

    # -- the step -------------------------------------------------------------
    def _unpack(self, data):
        lookahead = None
        if self.lookahead:
            if not isinstance(data, tuple) or not isinstance(data[-1], dict):
                raise ValueError(
                    "DPModel(lookahead=True) expects (features, labels, lookahead) elements; "
                    "use tfdp_embed.data.with_lookahead."
                )
            data, lookahead = data[:-1], data[-1]
            if len(data) == 1:
                data = data[0]
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        return x, y, sample_weight, lookahead

    def _per_example_loss(self, x, y, sample_weight, training=True) -> _Losses:
        """The `[B]` float32 per-example loss (sample weights applied), predictions, output losses."""
        if self._loss_fn is None:
            return _Losses(self._compute_loss(x, y, sample_weight, training), None, [])
        if y is None:
            raise ValueError(
                f"The compiled loss ({self._loss_name()}) needs labels: the data must yield "
                "(features, labels) or (features, labels, sample_weight)."
            )
        y_pred = self.inner(x, training=training)
        loss, per_output = self._loss_fn(y, y_pred, sample_weight)
        self._check_per_example(loss)
        return _Losses(loss, y_pred, per_output)

    def _compute_loss(self, x, y, sample_weight, training):
        """The wrapped model's `compute_loss`, which must return one loss per example."""
        loss = self.inner.compute_loss(x if y is None else (x, y), training=training)
        loss = tf.cast(tf.convert_to_tensor(loss), tf.float32)
        self._check_per_example(loss)
        if sample_weight is not None:
            loss = loss * tf.cast(tf.reshape(sample_weight, [-1]), loss.dtype)
        return loss

    @staticmethod
    def _check_per_example(loss) -> None:
        if loss.shape.rank != 1:
            raise PrivacyContractError(
                f"The loss must be one value per example (shape [batch]); it has shape {loss.shape}. "
                "DP clips each example's gradient: use a loss with reduction NONE and return it "
                "unreduced from `compute_loss`."
            )

    def train_step(self, data):
        try:
            # Run eagerly (`run_eagerly=True`), the step reads tables as its traced form does:
            # unguarded, through read hooks that catch up what they read.
            with read_guard.unguarded():
                return self._train_step(data)
        except PrivacyContractError as error:
            # Errors raised while Keras traces the step reach `fit` re-wrapped by
            # AutoGraph as a StagingError; keep the original to re-raise it there.
            self._trace_error = error
            raise

    def _train_step(self, data):
        if not self._prepared:
            raise RuntimeError("Call `DPModel.prepare(dataset)` (fit does it) before stepping.")
        x, y, sample_weight, lookahead = self._unpack(data)
        if not self.mechanism.clips_per_example:
            return self._non_private_step(x, y, sample_weight)
        with record_taps(self._tapped_layers, self.registry) as taps:
            with tf.GradientTape() as tape:
                losses = self._per_example_loss(x, y, sample_weight)
        # A NaN or Inf loss does not stop training: that example gets clip factor 0 (tfdp_embed.nonfinite).
        per_example_loss = losses.per_example
        step = clipped_step(
            taps,
            per_example_loss,
            tape,
            registry=self.registry,
            fallback=self._fallback,
            l2_norm_clip=self.mechanism.l2_norm_clip,
            loss_scale=self._loss_scale,
        )
        # Weight-0 examples (fixed-shape padding) are absent: no clip factor, lookup or row (N1).
        step = without_absent_examples(step, present_examples(sample_weight, tf.shape(per_example_loss)[0]))
        clipped = self._assemble(step, taps, tf.shape(per_example_loss)[0])
        # Keras runs the step function once more when the dataset is exhausted; state
        # updates that do not depend on the batch (step counters, RNG draws) would run
        # in that phantom step unless they wait for the batch's loss.
        with tf.control_dependencies([per_example_loss]):
            # One device: mechanism.update(clipped). Mirrored strategies: all-reduce, noise once.
            pairs = distribute.noised_gradients(self.mechanism, clipped)
            self._check_every_variable_noised(pairs)
            # Unscaled and finite: a LossScaleOptimizer's inner optimizer applies them.
            optimizer = mixed_precision.inner_optimizer(self.optimizer)
            optimizer_check.warn_dense_table_rewrite(optimizer, pairs)
            distribute.apply_gradients(optimizer, pairs)
            self.mechanism.after_apply(lookahead)
            nonfinite.check_weights(pairs)  # a diverged model stops here; one example cannot stop it
        return self._update_metrics(losses, y, sample_weight, private=True)

    def _check_every_variable_noised(self, pairs) -> None:
        """Trace-time check: the mechanism returned a noised gradient for every variable."""
        returned = {variable.ref() for _, variable in pairs}
        for variable in self.inner.trainable_variables:
            if variable.ref() not in returned:
                raise PrivacyContractError(
                    f"Trainable variable {variable.name!r} is not handled by mechanism "
                    f"{self.mechanism.name!r}: it would train without noise (or not at all, "
                    "silently). Every trainable variable must be noised; freeze it with "
                    "`trainable=False` if it should not train."
                )

    def _non_private_step(self, x, y, sample_weight):
        """Plain training (`NonPrivate`); Keras' own (dynamic) loss scaling under mixed_float16."""
        scaled = isinstance(self.optimizer, keras.mixed_precision.LossScaleOptimizer)
        with tf.GradientTape() as tape:
            losses = self._per_example_loss(x, y, sample_weight)
            loss = distribute.mean_loss(losses.per_example)  # the global-batch mean under replicas
            if scaled:
                loss = self.optimizer.get_scaled_loss(loss)
        variables = self.inner.trainable_variables
        grads = tape.gradient(loss, variables)
        if scaled:
            grads = self.optimizer.get_unscaled_gradients(grads)
        self.optimizer.apply_gradients([(g, v) for g, v in zip(grads, variables) if g is not None])
        return self._update_metrics(losses, y, sample_weight)

    def _assemble(self, step, taps, batch_size) -> ClippedGradients:
        """Collects every variable's clipped sum; zeros for layers not called this step."""
        grads = {}
        averaged = {}
        occurrences, shared_rows = {}, {}
        table_vars = {layer.embeddings.ref() for layer in self._tables}
        for tap, info in step.layers:
            for i, (variable, grad) in enumerate(zip(info.variables, info.clipped_sum(step.clip_factors))):
                grads[variable.ref()] = grad
                if variable.ref() in table_vars:
                    averaged[variable.ref()] = functools.partial(
                        _averaged_sum, info.clipped_sum, step.clip_factors, self.expected_batch_size, i
                    )
            if info.occurrences is not None:
                occurrences[id(tap.layer)] = info.occurrences
            if info.shared_rows is not None:
                shared_rows[id(tap.layer)] = info.shared_rows
        tables = []
        for layer in self._tables:
            var = layer.embeddings
            grad = grads.get(var.ref())
            if grad is None:
                grad = tf.IndexedSlices(
                    tf.zeros([0, layer.output_dim], var.dtype),
                    tf.zeros([0], tf.int64),
                    tf.shape(var, out_type=tf.int64),
                )
            tables.append(
                TableGradient(
                    layer=layer,
                    variable=var,
                    gradient=grad,
                    occurrences=occurrences.get(id(layer), []),
                    clip_factors=step.clip_factors,
                    averaged=averaged.get(var.ref()),
                    shared_rows=shared_rows.get(id(layer)),
                )
            )
        dense = []
        for variable in self.inner.trainable_variables:
            if variable.ref() in table_vars:
                continue
            grad = grads.get(variable.ref())
            dense.append((variable, tf.zeros_like(variable) if grad is None else grad))
        return ClippedGradients(
            tables=tables,
            dense=dense,
            expected_batch_size=self.expected_batch_size,
            batch_size=batch_size,
        )

    def _update_metrics(self, losses: _Losses, y, sample_weight, private: bool = False):
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

    def _output_losses(self, losses: _Losses) -> list:
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

    # -- leaving training ---------------------------------------------------------
    def flush(self) -> None:
        """Adds all noise the mechanism still owes (LazyDP); a no-op for others.

        Raises:
          PrivacyContractError: the mechanism still owes noise afterwards.
        """
        release_ready(self)

    def _flush_if_prepared(self) -> None:
        """`flush` once the mechanism is initialised (before, nothing can be owed)."""
        if self._prepared:
            self.flush()

    def get_weights(self):
        """The wrapped model's weights, flushed (mechanism, optimizer and metrics are not weights)."""
        self._flush_if_prepared()
        return super().get_weights()

    def set_weights(self, weights):
        """Sets the wrapped model's weights; flushes first so LazyDP's history matches what is written."""
        self._flush_if_prepared()
        return super().set_weights(weights)

    def save_weights(self, filepath, *args, **kwargs):
        """Flushes, then writes the wrapped model's weights file (`self.inner.save_weights`).

        The file holds model weights only; it loads into the bare wrapped
        model (`inner.load_weights`) as well as into this `DPModel`.
        """
        self._flush_if_prepared()
        return self.inner.save_weights(filepath, *args, **kwargs)

    def load_weights(self, filepath, *args, **kwargs):
        """Loads a weights file of the wrapped model; flushes first (LazyDP's history stays consistent)."""
        self._flush_if_prepared()
        return self.inner.load_weights(filepath, *args, **kwargs)

    def save(self, filepath, *args, **kwargs):
        """Flushes, then saves the wrapped model (`self.inner.save`): the released model only.

        No mechanism state, optimizer or read hook is saved. Use
        `tfdp_embed.export.export_saved_model` to also write the privacy
        report beside it.
        """
        self._flush_if_prepared()
        with _without_read_hooks(self.inner):
            return self.inner.save(filepath, *args, **kwargs)

    def get_config(self):
        """Refused: a `DPModel` is the training wrapper, never a model to serialize.

        Keras serializes a model's config before its state
        (`keras.models.save_model(dp, "x.keras")`, `to_json`); refusing here
        keeps the loss tracker's and compiled metrics' training statistics
        out of any file. `dp.save(path)` saves the wrapped model.
        """
        raise PrivacyContractError(
            "A DPModel is the training wrapper: serializing it would write its training metrics "
            "(non-DP statistics of the training data). Save the released model with "
            "dp_model.save(path) or tfdp_embed.export.export_saved_model(dp_model, path)."
        )

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        """TF's object graph of a `DPModel` is its wrapped model alone (no mechanism, optimizer, metrics)."""
        if save_type == "savedmodel":
            raise PrivacyContractError(
                "tf.saved_model.save of a DPModel would export the training wrapper (its traced "
                "training machinery and optimizer). Export the released model with "
                "tfdp_embed.export.export_saved_model(dp_model, path) (flushes and writes the "
                "privacy report) or dp_model.save(path)."
            )
        return {"inner": self.inner}
