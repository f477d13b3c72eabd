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

from tfdp_embed import contract, distribute, optimizer_check, read_guard
from tfdp_embed._keras import keras, tf
from tfdp_embed.clipping.per_example import clipped_step
from tfdp_embed.clipping.taps import layers_owning_weights, record_taps
from tfdp_embed.data.provenance import fed_batching
from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.export import _without_read_hooks, release_ready
from tfdp_embed.layers.embedding import DPEmbedding
from tfdp_embed.mechanisms.base import ClippedGradients, NoiseMechanism, TableGradient
from tfdp_embed.mechanisms.capabilities import check_declared_use
from tfdp_embed.optimizer_weights import create_optimizer_weights

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
                "on other examples and per-example clipping no longer bounds its influence. Score "
                "against the full item table (softmax over all items) instead."
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


class _TrainingOnly:
    """State `DPModel` keeps out of Keras/TF tracking, so no weights file, checkpoint or SavedModel of it holds it."""

    __slots__ = ("mechanism", "loss_tracker", "fed_batching")

    def __init__(self, mechanism, loss_tracker):
        self.mechanism = mechanism
        self.loss_tracker = loss_tracker
        self.fed_batching = None


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
        distribute.check_tables(model)
        from tfdp_embed import clipping  # registry functions live in the clipping package

        self.inner = model
        self.expected_batch_size = None if expected_batch_size is None else float(expected_batch_size)
        self.registry = registry if registry is not None else clipping.default_registry()
        self._fallback = clipping.vectorized_layer_gradients
        self.lookahead = bool(lookahead)
        self.check_per_example = bool(check_per_example)
        self._loss_fn = None
        self._prepared = False
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
        return self.inner(inputs, training=training)

    def compile(self, optimizer="sgd", loss=None, metrics=None, **kwargs):
        """Like `keras.Model.compile`; `loss` is applied per example (no reduction)."""
        if loss is None and not hasattr(self.inner, "compute_loss"):
            raise ValueError(
                "`loss` is required unless the wrapped model defines `compute_loss` returning one loss per example."
            )
        self._loss_fn = keras.losses.get(loss) if loss is not None else None
        super().compile(optimizer=optimizer, metrics=metrics, **kwargs)

    @property
    def batching(self):
        """The `FedBatching` of the data the last `fit` was fed (None before any `fit`)."""
        return self._training_only.fed_batching

    @property
    def metrics(self):
        return [self.loss_tracker, *super().metrics]

    def fit(self, x=None, *args, batching=None, **kwargs):
        """Like `keras.Model.fit`; records how the batches were drawn in `self.batching`.

        Args:
          batching: only for sources that cannot be inspected (e.g. a
            `DatasetCreator` under ParameterServerStrategy): the
            `BatchingInfo` of the sampler inside; reported as declared by
            the caller, not verified. Datasets from `tfdp_embed.data` carry
            their batching; anything else is reported as not verified Poisson.
        """
        self._training_only.fed_batching = fed_batching(x, declared=batching)
        data = x if isinstance(x, tf.data.Dataset) else contract.one_batch_of_arrays(x, args, kwargs)
        self.prepare(data)
        if self._contract_pending:
            self._check_contract(data)
        self._trace_error = None
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
        self._tapped_layers = layers_owning_weights(self.inner)
        for layer in self._tapped_layers:
            self.registry.lookup(layer)  # refuses subclasses the clipping rules cannot describe
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
            self.mechanism.init(tables=self._tables, dense_variables=dense, optimizer=self.optimizer)
        distribute.check_identical_state(self.mechanism, strategy)
        # Before the first trace: variables it created would make Keras trace the step twice.
        create_optimizer_weights(self.optimizer, self.inner.trainable_variables, strategy=strategy)
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
                forward=lambda training, x, y, w: self._per_example_loss(x, y, w, training=training)[0],
                tapped_layers=self._tapped_layers,
                registry=self.registry,
                fallback=self._fallback,
                loss_name=self._loss_name(),
                check_per_example=self.check_per_example,
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
        fn = self._loss_fn
        return getattr(fn, "name", None) or getattr(fn, "__name__", type(fn).__name__)

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

    def _per_example_loss(self, x, y, sample_weight, training=True):
        if self._loss_fn is None:
            loss = self.inner.compute_loss(x if y is None else (x, y), training=training)
            y_pred = None
        else:
            y_pred = self.inner(x, training=training)
            loss = (
                self._loss_fn.call(y, y_pred)
                if isinstance(self._loss_fn, keras.losses.Loss)
                else self._loss_fn(y, y_pred)
            )
            if loss.shape.rank is not None and loss.shape.rank > 1:
                loss = tf.reduce_mean(loss, axis=list(range(1, loss.shape.rank)))
        loss = tf.convert_to_tensor(loss)
        if loss.shape.rank != 1:
            raise PrivacyContractError(
                f"The loss must be one value per example (shape [batch]); it has shape {loss.shape}. "
                "DP clips each example's gradient: use a loss with reduction NONE and return it "
                "unreduced from `compute_loss`."
            )
        if sample_weight is not None:
            loss = loss * tf.cast(tf.reshape(sample_weight, [-1]), loss.dtype)
        return loss, y_pred

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
                per_example_loss, y_pred = self._per_example_loss(x, y, sample_weight)
                # Inside the tape: the checked tensor is what the backward pass starts from.
                per_example_loss = tf.debugging.assert_all_finite(
                    per_example_loss,
                    "The per-example loss is NaN or Inf: check the inputs and the learning "
                    "rate (training stopped rather than clip a non-finite gradient).",
                )
        step = clipped_step(
            taps,
            per_example_loss,
            tape,
            registry=self.registry,
            fallback=self._fallback,
            l2_norm_clip=self.mechanism.l2_norm_clip,
        )
        clipped = self._assemble(step, taps, tf.shape(per_example_loss)[0])
        # Keras runs the step function once more when the dataset is exhausted; state
        # updates that do not depend on the batch (step counters, RNG draws) would run
        # in that phantom step unless they wait for the batch's loss.
        with tf.control_dependencies([per_example_loss]):
            # One device: mechanism.update(clipped). Mirrored strategies: all-reduce, noise once.
            pairs = distribute.noised_gradients(self.mechanism, clipped)
            self._check_every_variable_noised(pairs)
            optimizer_check.warn_dense_table_rewrite(self.optimizer, pairs)
            distribute.apply_gradients(self.optimizer, pairs)
            self.mechanism.after_apply(lookahead)
        return self._update_metrics(per_example_loss, y, y_pred, sample_weight)

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
        with tf.GradientTape() as tape:
            per_example_loss, y_pred = self._per_example_loss(x, y, sample_weight)
            loss = distribute.mean_loss(per_example_loss)  # the global-batch mean under replicas
        variables = self.inner.trainable_variables
        grads = tape.gradient(loss, variables)
        self.optimizer.apply_gradients([(g, v) for g, v in zip(grads, variables) if g is not None])
        return self._update_metrics(per_example_loss, y, y_pred, sample_weight)

    def _assemble(self, step, taps, batch_size) -> ClippedGradients:
        """Collects every variable's clipped sum; zeros for layers not called this step."""
        grads = {}
        averaged = {}
        occurrences = {}
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

    def _update_metrics(self, per_example_loss, y, y_pred, sample_weight):
        self.loss_tracker.update_state(tf.reduce_mean(per_example_loss))
        if y_pred is not None and y is not None:
            self.compiled_metrics.update_state(y, y_pred, sample_weight)
        return {m.name: m.result() for m in self.metrics}

    def test_step(self, data):
        x, y, sample_weight, _ = self._unpack(data)
        with read_guard.unguarded():  # as in train_step
            per_example_loss, y_pred = self._per_example_loss(x, y, sample_weight, training=False)
        return self._update_metrics(per_example_loss, y, y_pred, sample_weight)

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
