"""`DPModel`: the staged differentially private train step around any Keras model.

    forward + per-example loss -> per-example norms -> clip ->
    mechanism.update -> optimizer.apply -> mechanism.after_apply(lookahead)

It wraps a functional, sequential, subclassed or `tfrs.Model` and trains it
with `fit`. The DP argument clips each example's gradient, so the loss must be
one value per example and depend on that example alone: `prepare` checks this
on the first batch (`tfdp_embed.keras2.contract`) and refuses the model otherwise.
Per-example norms come from the clipping registry (ghost norms); a dense
`[batch, vocab, dim]` tensor is never built.

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

from tfdp_embed import fit_callbacks, front_end, nonfinite, plan_wiring, read_guard, sparse_sgd, tape_guard
from tfdp_embed.absent_examples import present_examples, without_absent_examples
from tfdp_embed.clipping.assemble import assemble, check_every_variable_noised
from tfdp_embed.clipping.per_example import clipped_step
from tfdp_embed.clipping.taps import layers_owning_weights, record_taps
from tfdp_embed.contract.arrays import one_batch_of_arrays
from tfdp_embed.contract.probe import probe_batch, warn_no_data, warn_no_pair
from tfdp_embed.contract.unit_axis import check_unit_batches
from tfdp_embed.data.provenance import fed_batching
from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.keras2 import callbacks as front_callbacks
from tfdp_embed.keras2 import contract, distribute, mixed_precision, optimizer_check
from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.contract.components import reject_non_per_example
from tfdp_embed.keras2.contract.preprocessing import check_preprocessing
from tfdp_embed.keras2.layers.embedding import DPEmbedding
from tfdp_embed.keras2.optimizer_weights import create_optimizer_weights
from tfdp_embed.keras2.training_exits import ReleaseExits
from tfdp_embed.keras2.training_losses import LossesAndMetrics, loss_name
from tfdp_embed.mechanisms.base import NoiseMechanism, check_declared_use
from tfdp_embed.ops import sparse_rows
from tfdp_embed.traced_as_written import as_written, user_code


class _TrainingOnly:
    """State `DPModel` keeps out of Keras/TF tracking, so no weights file, checkpoint or SavedModel of it holds it."""

    __slots__ = ("mechanism", "loss_tracker", "fed_batching", "loss", "plan")

    def __init__(self, mechanism, loss_tracker, plan=None):
        self.mechanism, self.plan = mechanism, plan  # the `RunPlan` whose q and N `fit` checks the batches against
        self.loss_tracker = loss_tracker
        self.fed_batching = None
        self.loss = None  # the compiled `PerExampleLoss` (None: the model's `compute_loss`)


def _check_arguments(model, mechanism, expected_batch_size, lookahead: bool) -> None:
    """`DPModel`'s argument checks; undeclared capabilities fail here, not in a traced step."""
    if not isinstance(model, keras.Model):
        raise TypeError(
            f"tfdp_embed.keras2.DPModel wraps a tf-keras `keras.Model`; received {type(model).__module__}."
            f"{type(model).__name__}. For a Keras 3 model use tfdp_embed.keras3.DPModel."
        )
    front_end.refuse_mixed_model(model, "keras2")  # a Keras 3 layer inside: one line, the front end to use
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
    reject_non_per_example(model)
    # Undeclared capabilities (strategy, lookahead, deferred noise) fail here, not in a traced step.
    distribute.check_supported(mechanism)
    check_declared_use(mechanism, lookahead=lookahead)
    mixed_precision.check_mechanism(mechanism, model)
    distribute.check_tables(model)


def _check_built(model, mechanism, registry) -> list:
    """The built model's checks (again: components created while building); returns the layers owning weights."""
    reject_non_per_example(model)  # again: components created while building
    check_preprocessing(model)  # vocabularies / means from data: DP-released or declared public
    tapped_layers = layers_owning_weights(model)
    for layer in tapped_layers:
        registry.lookup(layer)  # refuses subclasses the clipping rules cannot describe
    mixed_precision.check_variable_dtypes(model)
    mixed_precision.check_mechanism(mechanism, model)  # again: layers created while building
    return tapped_layers


@as_written
def _noise_and_apply(mechanism, optimizer, clipped, trainable_variables, lookahead) -> None:
    """mechanism.update -> optimizer.apply -> mechanism.after_apply, with the checks between."""
    # One device: mechanism.update(clipped). Mirrored strategies: all-reduce, noise once.
    pairs = distribute.noised_gradients(mechanism, clipped)
    check_every_variable_noised(pairs, trainable_variables, mechanism.name)
    # Unscaled and finite: a LossScaleOptimizer's inner optimizer applies them.
    optimizer = mixed_precision.inner_optimizer(optimizer)
    optimizer_check.warn_dense_table_rewrite(optimizer, pairs)
    sgd = sparse_sgd.fused_sgd(optimizer)  # SGD: tables stepped by one fused op each, sums for the check
    rest, row_sums = sparse_sgd.apply_tables(sgd, pairs)
    sparse_rows.prefetch_written_rows(rest)
    if rest or sgd is None:
        distribute.apply_gradients(optimizer, rest)
    else:  # every variable was a table stepped above
        sparse_sgd.count_step(sgd)
    user_code(mechanism.after_apply)(lookahead)
    nonfinite.check_weights(rest, row_sums=row_sums)  # a diverged model stops here; one example cannot stop it


def _init_mechanism(mechanism, model, tables, optimizer, strategy) -> None:
    """Inits `mechanism` on the model's tables and dense variables, and creates the optimizer's slots."""
    table_vars = {layer.embeddings.ref() for layer in tables}
    dense = [v for v in model.trainable_variables if v.ref() not in table_vars]
    distribute.check_supported(mechanism, strategy)
    distribute.check_tables(model)
    # Workers share worker 0's noise stream before init draws anything (DP-FEST selects there).
    distribute.synchronize_generator(mechanism, strategy)
    with distribute.mechanism_state_scope(strategy, tables):
        mechanism.init(tables=tables, dense_variables=dense, optimizer=mixed_precision.inner_optimizer(optimizer))
    distribute.check_identical_state(mechanism, strategy)
    # Before the first trace: variables it created would make Keras trace the step twice.
    create_optimizer_weights(mixed_precision.inner_optimizer(optimizer), model.trainable_variables, strategy=strategy)


class DPModel(ReleaseExits, LossesAndMetrics, keras.Model):
    """Trains `model` with a noise mechanism; `fit`, callbacks and `tf.function` work.

    Args:
      model: the Keras model to train (functional, sequential, subclassed, or `tfrs.Model`). Its `DPEmbedding`
        tables are sparse variables; every other trainable variable is dense.
      mechanism: a `NoiseMechanism` (keyword-only).
      plan: instead, a `plan_run` RunPlan: its mechanism and q * N; `fit` refuses batches sampled with another q or N.
      expected_batch_size: divisor of the noised gradient sum: q * N under Poisson sampling, else the batch size.
      registry: a `LayerRegistry` of per-example norm functions; defaults to
        `tfdp_embed.keras2.clipping.default_registry()`.
      lookahead: the dataset yields `(features, labels, lookahead)` where `lookahead` maps a `DPEmbedding` layer
        name to the next batch's unique ids (`tfdp_embed.data.with_lookahead`); only mechanisms declaring
        `capabilities.lookahead` (LazyDP) accept it.
      check_per_example: on the first batch, check that each example's loss depends on that example alone and
        that the clipping rules cover the whole gradient (a few eager forward passes, once). Turn it off only to
        save that time on a model known to pass (a warning says it is off); the check that training leaves
        non-trainable state alone always runs.

    What leaves training is the wrapped model's weights alone, flushed first
    (`tfdp_embed.keras2.training_exits`); training state that must resume exactly
    is saved with `tfdp_embed.keras2.checkpointing.TrainingCheckpoint`.

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
        mechanism: NoiseMechanism | None = None,
        plan=None,
        expected_batch_size: float | None = None,
        registry=None,
        lookahead: bool = False,
        check_per_example: bool = True,
        name: str | None = None,
    ):
        super().__init__(name=name or f"dp_{model.name}")
        mechanism, expected_batch_size = plan_wiring.from_plan(plan, mechanism, expected_batch_size)
        _check_arguments(model, mechanism, expected_batch_size, lookahead)
        from tfdp_embed.keras2 import clipping  # registry functions live in the clipping package

        self.inner = model
        self.expected_batch_size = None if expected_batch_size is None else float(expected_batch_size)
        self.registry = registry if registry is not None else clipping.default_registry()
        self._fallback = clipping.vectorized_layer_gradients
        self.lookahead = bool(lookahead)
        self.check_per_example = bool(check_per_example)
        self._prepared = False
        self._loss_scale = 1.0  # the fixed float16 loss scale (`tfdp_embed.keras2.mixed_precision`), set by prepare
        self._contract_pending = True
        self._trace_error = None
        self._training_only = _TrainingOnly(mechanism, keras.metrics.Mean(name="loss"), plan)

    @property
    def mechanism(self) -> NoiseMechanism:
        """The noise mechanism (training-only state: not among the model's weights)."""
        return self._training_only.mechanism

    @property
    def loss_tracker(self) -> keras.metrics.Mean:
        """The mean per-example loss metric (training-only state)."""
        return self._training_only.loss_tracker

    def call(self, inputs, training=None):
        outputs = self.inner(inputs, training=training)
        # Only a caller's own code calls the wrapper (the DP steps call `inner`): no gradient through it.
        return tape_guard.refuse_gradients(outputs) if self.mechanism.clips_per_example else outputs

    @property
    def batching(self):
        """The `FedBatching` of the data the last `fit` was fed (None before any `fit`)."""
        return self._training_only.fed_batching

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
        (`tfdp_embed.fit_callbacks`); a `PrivacyBudget`'s epsilon is in the
        epoch logs before any callback reads them.
        """
        self._training_only.fed_batching = fed_batching(x, declared=batching)
        plan_wiring.check_fed(self._training_only.plan, self._training_only.fed_batching)  # before any step
        data = x if isinstance(x, tf.data.Dataset) else one_batch_of_arrays(keras.Model.fit, x, args, kwargs)
        self.prepare(data)
        if self._contract_pending:
            self._check_contract(data)
        self._trace_error = None
        # Callbacks acting on un-noised training statistics are refused; epsilon reaches the logs first.
        args, kwargs = fit_callbacks.with_callbacks(
            args,
            kwargs,
            private=self.mechanism.clips_per_example,
            logged_names=[m.name for m in self.metrics],
            extra=[front_callbacks.MechanismWarnings(self.mechanism)],
            front=front_callbacks,
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
        contract (`tfdp_embed.keras2.contract`) is checked on it (on one of its first
        batches with >= 2 examples); without one, the model must be built and
        `fit` checks the contract on its own data. Reading those batches does
        not use up a dataset that can be read once (the Beam job's shards):
        `fit` on the same dataset still trains on every step.

        Raises:
          PrivacyContractError: the model breaks the per-example contract.
        """
        if self._prepared:
            return
        batch = None
        if isinstance(data, tf.data.Dataset):
            batch = probe_batch(data, self._unpack)
            # One eager forward pass builds the model and checks the loss is per example,
            # so a wrong loss fails here with a plain error, not inside the traced step.
            # In the model's strategy scope, as Keras builds it: variables created here are mirrored.
            x, y, sample_weight, _ = self._unpack(batch)
            with self.distribute_strategy.scope():
                self._per_example_loss(x, y, sample_weight, training=False)
        elif not self.inner.built or not self.inner.trainable_variables:
            raise ValueError(
                f"Model {self.inner.name!r} is not built; build it (call it once) or pass a "
                "tf.data.Dataset to `fit` so it can be built from the first batch."
            )
        self._tapped_layers = _check_built(self.inner, self.mechanism, self.registry)
        check_unit_batches(  # user-level batches: exact per-user rules and mechanisms only
            self._training_only.fed_batching,
            mechanism=self.mechanism,
            tapped_layers=self._tapped_layers,
            registry=self.registry,
            distributed=distribute.strategy_kind(self.distribute_strategy) != distribute.DEFAULT,
        )
        self._loss_scale = mixed_precision.loss_scale(self.inner, self.optimizer)
        self._tables = [layer for layer in self._tapped_layers if isinstance(layer, DPEmbedding)]
        if batch is not None:
            # Before mechanism.init: no read hook (LazyDP) runs on the check's forward passes.
            self._check_contract(batch=batch)
        _init_mechanism(self.mechanism, self.inner, self._tables, self.optimizer, self.distribute_strategy)
        self._prepared = True

    def _check_contract(self, data=None, *, batch=None) -> None:
        """Checks the per-example contract on `batch` (or a batch of `data`); see `tfdp_embed.keras2.contract`.

        The independence check needs >= 2 examples: on a smaller batch in
        `prepare` it waits for `fit`'s data, and warns if that has none either.
        """
        if not self.mechanism.clips_per_example:
            self._contract_pending = False
            return
        if batch is None and isinstance(data, tf.data.Dataset):
            batch = probe_batch(data, self._unpack)
        if batch is None:
            self._contract_pending = False
            warn_no_data(stacklevel=3)
            return
        with contract.read_hooks_removed(self._tables):
            ran = contract.check_model(
                self.inner,
                self._unpack(batch)[:3],
                forward=lambda training, x, y, w: self._per_example_loss(x, y, w, training=training).per_example,
                tapped_layers=self._tapped_layers,
                registry=self.registry,
                fallback=self._fallback,
                loss_name=loss_name(self.inner, self._loss_fn),
                check_per_example=self.check_per_example,
                loss_scale=self._loss_scale,
            )
        self._contract_pending = not ran and not self._prepared
        if not ran and self._prepared:  # fit's data: there is no later chance
            warn_no_pair(stacklevel=3)

    def synchronize_noise(self) -> None:
        """After a re-key (a restored checkpoint): every worker takes worker 0's noise state."""
        distribute.synchronize_generator(self.mechanism, self.distribute_strategy)

    # -- the step -------------------------------------------------------------
    @as_written
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
        clipped = assemble(
            step,
            taps,
            tf.shape(per_example_loss)[0],
            tables=self._tables,
            trainable_variables=self.inner.trainable_variables,
            expected_batch_size=self.expected_batch_size,
        )
        # Keras runs the step function once more when the dataset is exhausted; state
        # updates that do not depend on the batch (step counters, RNG draws) would run
        # in that phantom step unless they wait for the batch's loss.
        with tf.control_dependencies([per_example_loss]):
            _noise_and_apply(self.mechanism, self.optimizer, clipped, self.inner.trainable_variables, lookahead)
        return self._update_metrics(losses, y, sample_weight, private=True)

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
        user_code(self.optimizer.apply_gradients)([(g, v) for g, v in zip(grads, variables) if g is not None])
        return self._update_metrics(losses, y, sample_weight)


__all__ = ["DPModel"]
