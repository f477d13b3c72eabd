"""`DPModel` for Keras 3 (TensorFlow backend): the staged DP train step around any Keras 3 model.

    forward + per-example loss -> per-example norms -> clip ->
    mechanism.update -> optimizer.apply -> mechanism.after_apply

The same engine as the tf-keras front end: taps and ghost norms
(`tfdp_embed.clipping`), the clipped sums assembled for the mechanism
(`assemble`), absent (weight-0) examples dropped, non-finite examples given
clip factor 0, and every mechanism of `tfdp_embed.mechanisms` unchanged. The
mechanism and the optimizer see the `tf.Variable`s inside Keras 3's
`keras.Variable`s; embedding gradients stay `tf.IndexedSlices` to the
optimizer.

Example:
    >>> inputs = keras.Input((4,), dtype="int32")
    >>> x = DPEmbedding(1000, 8, combiner="mean")(inputs)
    >>> model = keras.Model(inputs, keras.layers.Dense(1)(x))
    >>> dp = DPModel(model, mechanism=DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.1), expected_batch_size=256)
    >>> dp.compile(optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    >>> dp.fit(dataset, epochs=1)

On the first batch, `prepare` runs the core's per-example contract checks
(`tfdp_embed.contract`: no state updates, each loss depends on its example
alone, the rules cover every use of every weight), as the tf-keras front end does.

Not yet in this front end (tf-keras has them): distribution strategies,
mixed precision, lookahead, `TrainingCheckpoint`. The first two are refused
with a one-line error (`reject_unsupported`), the others are not offered.
"""

from __future__ import annotations

import contextlib

from tfdp_embed import fit_callbacks, front_end, nonfinite, plan_wiring, read_guard, sparse_sgd, tape_guard
from tfdp_embed.absent_examples import present_examples, without_absent_examples
from tfdp_embed.clipping import clipped_step, vectorized_layer_gradients
from tfdp_embed.clipping.assemble import assemble, check_every_variable_noised
from tfdp_embed.clipping.layer_kinds import tf_variable
from tfdp_embed.clipping.taps import layers_owning_weights, record_taps
from tfdp_embed.contract import check_model
from tfdp_embed.contract.arrays import one_batch_of_arrays
from tfdp_embed.contract.preprocessing import check_preprocessing
from tfdp_embed.contract.probe import probe_batch, warn_no_data, warn_no_pair
from tfdp_embed.contract.unit_axis import check_unit_batches
from tfdp_embed.data.provenance import fed_batching
from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.keras3 import callbacks as front_callbacks
from tfdp_embed.keras3 import clipping, sgd_adapter
from tfdp_embed.keras3._keras import keras, tf
from tfdp_embed.keras3.per_example_loss import per_example_loss_fn, reject_unsupported
from tfdp_embed.layers.lookup import EmbeddingLookup, read_hooks_removed
from tfdp_embed.mechanisms.base import NoiseMechanism, check_declared_use
from tfdp_embed.ops import sparse_rows
from tfdp_embed.release import release_ready


class _TrainingOnly:
    """State kept out of Keras/TF tracking: no weights file, `.keras` archive or SavedModel holds it."""

    __slots__ = ("mechanism", "plan", "fed_batching", "loss_fn", "tables", "variables", "keras_variables", "sparse_sgd")

    def __init__(self, mechanism, plan):
        self.mechanism, self.plan = mechanism, plan
        self.fed_batching = self.loss_fn = None
        self.tables: list = []
        self.variables: list = []  # tf.Variables of the wrapped model's trainable weights
        self.keras_variables: dict = {}  # tf.Variable ref -> the keras.Variable the optimizer knows
        self.sparse_sgd = None  # LazyDP with momentum: applies the tables' gradients (sgd_adapter.lazy_momentum)


def _probe(data):
    """(x, y, sample_weight) of one of `data`'s first batches (`probe_batch`), or None without a dataset."""
    if not isinstance(data, tf.data.Dataset):
        return None
    return keras.utils.unpack_x_y_sample_weight(probe_batch(data, keras.utils.unpack_x_y_sample_weight))


@contextlib.contextmanager
def _seed_states_kept(model):
    """Puts every Keras 3 `SeedGenerator` state of `model`'s layers back afterwards (Dropout's, for one).

    The contract check's training-mode passes would otherwise advance them: the check would change the
    model's variables, and training would draw other masks than without the check.
    """
    states = [v for v in model.variables if v.name == "seed_generator_state"]  # each SeedGenerator's `state`
    saved = [state.numpy() for state in states]
    try:
        yield
    finally:
        for state, value in zip(states, saved):
            state.assign(value)


def _check_arguments(model, mechanism, expected_batch_size) -> None:
    if not isinstance(model, keras.Model):
        raise TypeError(
            f"tfdp_embed.keras3.DPModel wraps a Keras 3 `keras.Model`; received {type(model).__module__}."
            f"{type(model).__name__}. For a tf-keras model use tfdp_embed.keras2.DPModel."
        )
    front_end.refuse_mixed_model(model, "keras3")  # a tf-keras layer inside: one line, the front end to use
    if not isinstance(mechanism, NoiseMechanism):
        raise TypeError(f"`mechanism` must be a tfdp_embed NoiseMechanism; received {type(mechanism).__name__}.")
    if mechanism.clips_per_example and expected_batch_size is None:
        raise ValueError("`expected_batch_size` is required for private training: the noised sum is divided by it.")
    if expected_batch_size is not None and not float(expected_batch_size) > 0:
        raise ValueError(f"`expected_batch_size` must be > 0; received {expected_batch_size!r}.")
    check_declared_use(mechanism, lookahead=False)


class DPModel(keras.Model):
    """Trains a Keras 3 `model` with a noise mechanism; `fit`, callbacks and `evaluate` work.

    Args:
      model: the Keras 3 model to train; its `tfdp_embed.keras3.DPEmbedding` tables are sparse variables.
      mechanism: a `NoiseMechanism` (keyword-only), or `plan=` a `plan_run` RunPlan.
      expected_batch_size: divisor of the noised gradient sum (q * N under Poisson sampling).
      registry: per-example norm rules; `tfdp_embed.keras3.clipping.default_registry()` when None.

    What leaves training is the wrapped model alone, flushed first (LazyDP's owed noise).
    """

    def __init__(self, model, *, mechanism=None, plan=None, expected_batch_size=None, registry=None, name=None):
        super().__init__(name=name or f"dp_{model.name}")
        mechanism, expected_batch_size = plan_wiring.from_plan(plan, mechanism, expected_batch_size)
        _check_arguments(model, mechanism, expected_batch_size)
        self.inner = model
        self.expected_batch_size = None if expected_batch_size is None else float(expected_batch_size)
        self.registry = registry if registry is not None else clipping.default_registry()
        self._training_only = _TrainingOnly(mechanism, plan)
        self._prepared = False
        self._contract_pending = True  # until a batch of >= 2 examples is checked (prepare's data or fit's)
        self._tapped: list = []

    @property
    def mechanism(self) -> NoiseMechanism:
        """The noise mechanism (training-only state: not among the model's weights)."""
        return self._training_only.mechanism

    @property
    def batching(self):
        """The `FedBatching` of the data the last `fit` was fed (None before any `fit`)."""
        return self._training_only.fed_batching

    def call(self, inputs, training=None):
        """The wrapped model's outputs; a gradient through them (a tape loop outside the DP step) is refused."""
        outputs = self.inner(inputs, training=training)
        return tape_guard.refuse_gradients(outputs) if self.mechanism.clips_per_example else outputs

    def compile(self, *args, jit_compile=False, **kwargs):
        """`keras.Model.compile`; `jit_compile` defaults to False (the sparse DP step is not XLA-compiled)."""
        if jit_compile not in (False, None):
            raise ValueError("tfdp_embed.keras3.DPModel trains without XLA (`jit_compile=False`).")
        super().compile(*args, jit_compile=False, **kwargs)

    def fit(self, x=None, *args, **kwargs):
        """Like `keras.Model.fit`; refuses callbacks acting on un-noised training statistics (as tf-keras)."""
        self._training_only.fed_batching = fed_batching(x, declared=None)
        plan_wiring.check_fed(self._training_only.plan, self._training_only.fed_batching)
        data = x if isinstance(x, tf.data.Dataset) else one_batch_of_arrays(keras.Model.fit, x, args, kwargs)
        self.prepare(data)
        if self._contract_pending and self.mechanism.clips_per_example:  # `prepare()` had no data: fit's is the last
            with read_hooks_removed(self._training_only.tables):
                self._check_contract(_probe(data), last_chance=True)
        args, kwargs = fit_callbacks.with_callbacks(
            args,
            kwargs,
            private=self.mechanism.clips_per_example,
            logged_names=self._logged_names(),
            extra=[front_callbacks.MechanismWarnings(self.mechanism)],
            front=front_callbacks,
        )
        return super().fit(x, *args, **kwargs)

    def _logged_names(self) -> list:
        """What the step logs: the loss and each compiled metric (Keras 3 nests those in `compile_metrics`)."""
        names = []
        for metric in self.metrics:
            nested = getattr(metric, "metrics", None)  # CompileMetrics, once built by the first step
            names += [m.name for m in nested] if nested else [metric.name]
        return names

    # -- setup ----------------------------------------------------------------
    def prepare(self, data=None) -> None:
        """Builds the wrapped model (from `data`'s first batch), checks its layers, inits the mechanism."""
        if self._prepared:
            return
        if self.optimizer is None or getattr(self, "loss", None) is None:
            raise ValueError("Call `compile(optimizer=..., loss=...)` before `fit`.")
        self._training_only.loss_fn = per_example_loss_fn(self.loss)
        batch = _probe(data)
        if batch is not None:
            self.inner(batch[0], training=False)
        if not self.inner.built or not self.inner.trainable_weights:
            raise ValueError(f"Model {self.inner.name!r} is not built; call it once or pass a tf.data.Dataset to fit.")
        check_preprocessing(self.inner)  # vocabularies / means from data: DP-released or declared public (N7)
        reject_unsupported(self.inner)
        # Untracked: Keras 3 refuses new tracked layers once `dp(x)` has built the wrapper.
        object.__setattr__(self, "_tapped", layers_owning_weights(self.inner))
        for layer in self._tapped:
            self.registry.lookup(layer)  # refuses subclasses the rules cannot describe
        check_unit_batches(  # user-level batches: exact per-user rules and mechanisms only
            self._training_only.fed_batching,
            mechanism=self.mechanism,
            tapped_layers=self._tapped,
            registry=self.registry,
        )
        if self.mechanism.clips_per_example:
            self._check_contract(batch)
        state = self._training_only
        state.tables = [layer for layer in self._tapped if isinstance(layer, EmbeddingLookup)]
        state.keras_variables = {tf_variable(v).ref(): v for v in self.inner.trainable_weights}
        state.variables = [tf_variable(v) for v in self.inner.trainable_weights]
        tables = {t.embeddings.ref() for t in state.tables}
        dense = [v for v in state.variables if v.ref() not in tables]
        self.optimizer.build(self.inner.trainable_weights)  # before the first trace, and LazyDP's momentum slots
        self.mechanism.init(tables=state.tables, dense_variables=dense, optimizer=self.optimizer)
        state.sparse_sgd = sgd_adapter.lazy_momentum(self.mechanism, self.optimizer)
        self._prepared = True

    def _check_contract(self, batch, *, last_chance: bool = False) -> None:
        """The core's behavioural checks on one batch (`tfdp_embed.contract`), with no read hook active.

        Without a batch of >= 2 examples the check stays pending for `fit`'s data (as on tf-keras); on
        `fit`'s data (`last_chance`) it warns instead.
        """
        if batch is None:
            if last_chance:
                self._contract_pending = False
                warn_no_data(stacklevel=4)
            return
        with _seed_states_kept(self.inner):
            ran = check_model(
                self.inner,
                tuple(batch),
                forward=lambda training, x, y, w: self._per_example_loss(x, y, w, training=training)[0],
                tapped_layers=self._tapped,
                registry=self.registry,
                fallback=vectorized_layer_gradients,
                loss_name=f"the compiled loss {getattr(self.loss, 'name', self.loss)!r}",
                check_per_example=True,
            )
        self._contract_pending = not ran and not last_chance
        if not ran and last_chance:  # none of the probed batches has two examples
            warn_no_pair(stacklevel=4)

    def create_optimizer_variables(self) -> None:
        """The optimizer's slots and step counter, before a checkpoint restore fills them (`prepare` builds them)."""
        self.optimizer.build(self.inner.trainable_weights)

    # -- the step -------------------------------------------------------------
    def train_step(self, data):
        with read_guard.unguarded():  # run eagerly, the step reads tables as its traced form does
            return self._train_step(data)

    def _per_example_loss(self, x, y, sample_weight, training=True):
        y_pred = self.inner(x, training=training)
        return self._training_only.loss_fn(y, y_pred, sample_weight), y_pred

    def _train_step(self, data):
        if not self._prepared:
            raise RuntimeError("Call `DPModel.prepare(dataset)` (fit does it) before stepping.")
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        if not self.mechanism.clips_per_example:
            return self._non_private_step(x, y, sample_weight)
        with record_taps(self._tapped, self.registry) as taps, tf.GradientTape() as tape:
            losses, y_pred = self._per_example_loss(x, y, sample_weight)
        step = clipped_step(
            taps,
            losses,
            tape,
            registry=self.registry,
            fallback=vectorized_layer_gradients,
            l2_norm_clip=self.mechanism.l2_norm_clip,
        )
        batch = tf.shape(losses)[0]
        step = without_absent_examples(step, present_examples(sample_weight, batch))
        state = self._training_only
        clipped = assemble(
            step,
            taps,
            batch,
            tables=state.tables,
            trainable_variables=state.variables,
            expected_batch_size=self.expected_batch_size,
        )
        with tf.control_dependencies([losses]):
            self._noise_and_apply(clipped)
        return self._metrics_result(losses, x, y, y_pred, sample_weight, private=True)

    def _noise_and_apply(self, clipped) -> None:
        state = self._training_only
        pairs = self.mechanism.update(clipped)
        check_every_variable_noised(pairs, state.variables, self.mechanism.name)
        sgd = sparse_sgd.fused_sgd(self.optimizer)  # SGD: tables stepped by one fused op each
        constrained = {ref for ref, v in state.keras_variables.items() if v.constraint is not None}
        pairs, row_sums = sparse_sgd.apply_tables(sgd, pairs, constrained=constrained)
        sparse_rows.prefetch_written_rows(pairs)
        if state.sparse_sgd is not None:  # LazyDP with momentum: tables as legacy SGD moves them (sgd_adapter)
            tables = {t.embeddings.ref() for t in state.tables}
            learning_rate = state.sparse_sgd.learning_rate()  # this step's, before Keras counts the step
            for gradient, variable in pairs:
                if variable.ref() in tables:
                    row_sums.append(state.sparse_sgd.apply_sparse(gradient, variable, learning_rate))
            pairs = [(g, v) for g, v in pairs if v.ref() not in tables]
        counter = sgd or state.sparse_sgd
        if pairs or counter is None:
            self.optimizer.apply_gradients([(g, state.keras_variables[v.ref()]) for g, v in pairs])
        else:  # every variable was a table stepped above
            sparse_sgd.count_step(counter)
        self.mechanism.after_apply(None)
        nonfinite.check_weights(pairs, row_sums=row_sums)  # every written weight, the tables' by their sums

    def _non_private_step(self, x, y, sample_weight):
        with tf.GradientTape() as tape:
            losses, y_pred = self._per_example_loss(x, y, sample_weight)
            loss = tf.reduce_mean(losses)
        weights = self.inner.trainable_weights
        grads = tape.gradient(loss, [tf_variable(v) for v in weights])
        self.optimizer.apply_gradients([(g, v) for g, v in zip(grads, weights) if g is not None])
        return self._metrics_result(losses, x, y, y_pred, sample_weight)

    def _metrics_result(self, losses, x, y, y_pred, sample_weight, private: bool = False):
        """Loss and compiled metrics; in a DP step a non-finite example's loss, label and prediction read as 0."""
        if not private:
            self._loss_tracker.update_state(tf.reduce_mean(losses))
            return self.compute_metrics(x, y, y_pred, sample_weight)
        finite = nonfinite.finite_examples(losses)
        self._loss_tracker.update_state(*nonfinite.finite_mean(losses, finite))
        y, y_pred = nonfinite.finite_values((y, y_pred))
        return self.compute_metrics(x, y, y_pred, sample_weight)

    # -- exits ----------------------------------------------------------------
    def flush(self) -> None:
        """Adds all noise the mechanism still owes (LazyDP); a no-op for the others."""
        if self._prepared:
            release_ready(self)

    def get_weights(self):
        """The wrapped model's weights, flushed."""
        self.flush()
        return self.inner.get_weights()

    def set_weights(self, weights):
        """Sets the wrapped model's weights; flushes first, so no noise owed before lands on what is written."""
        self.flush()
        return self.inner.set_weights(weights)

    def save_weights(self, filepath, *args, **kwargs):
        """Saves the wrapped model's weights, flushed (no mechanism or optimizer state)."""
        self.flush()
        return self.inner.save_weights(filepath, *args, **kwargs)

    def load_weights(self, filepath, *args, **kwargs):
        """Loads a weights file of the wrapped model (as `save_weights` writes); flushes first (LazyDP's history)."""
        self.flush()
        return self.inner.load_weights(filepath, *args, **kwargs)

    def save(self, filepath, *args, **kwargs):
        """Saves the wrapped model (`.keras`), flushed: its layers and weights only, no mechanism state."""
        self.flush()
        return self.inner.save(filepath, *args, **kwargs)

    def export(self, filepath, *args, **kwargs):
        """`keras.Model.export` of the wrapped model, flushed and traced without read hooks."""
        from tfdp_embed.release import _without_read_hooks

        self.flush()
        nonfinite.check_released_weights(self.inner)
        with _without_read_hooks(self.inner):
            return self.inner.export(filepath, *args, **kwargs)

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        """TF's object graph of a `DPModel` is its wrapped model alone (no optimizer, mechanism or metrics).

        `tf.train.Checkpoint(m=dp)` then writes the released weights only;
        training state is checkpointed by `DPCheckpoint`, which names it.
        """
        if save_type == "savedmodel":
            raise PrivacyContractError(
                "tf.saved_model.save of a DPModel would export the training wrapper (its optimizer and traced "
                "training step). Export the released model with dp.export(path) or "
                "tfdp_embed.release.export_saved_model(dp, path) (flushes and writes the privacy report)."
            )
        return {"inner": self.inner}

    def get_config(self):
        raise PrivacyContractError(
            "A DPModel is not serialized: save or export the wrapped model (`dp.save(...)`, `dp.export(...)` "
            "or `dp.inner`), which holds no mechanism or optimizer state."
        )


__all__ = ["DPModel"]
