"""`TpuDPStep`: one DP training step with the embedding tables on the TPU embedding engine (SparseCore).

The engine is an argument of `TPUEmbeddingV2`'s interface; the step is
CPU-tested with a CPU engine of that interface
(tests/distributed/test_tpu_step.py) and was never run on a TPU.

Per replica (inside `strategy.run`), for one global batch:

    rows_t = the rows mechanism.update will change in table t this step (a
             dry run on the batch's ids; the draws are then replayed)
    engine.enqueue(batch features + per table a noise feature listing the
                   rows of rows_t this replica owns)  ->  dequeue: activations
    TensorCore: model(activations) -> per-example losses; ghost norms (the
                clipping registry: DPEmbedding rule from ids + activation
                gradients, Dense/LayerNorm rules for the TensorCore layers)
                -> c_i = C / max(||g_i||, C)
    M = mechanism.update(global clipped sums)   (once; merge_call on > 1 replica)
    engine.apply_gradients(
        batch features: c_i / B x activation gradients (sequence features:
                        masked to rows_t, so frozen rows get exactly 0),
        noise features: M[r] - S[r] for owned rows r, S = clipped sum / B)
    optimizer.apply_gradients(M's dense DP-SGD gradients)   (noised once)

The engine sums every feature and replica per row, so row r of table t
receives S[r] + (M[r] - S[r]) = M[r], the mechanism's own gradient (EANA:
(clipped sum + N(0, sigma^2 C^2)) / B on the union of touched rows; DP-FEST:
noise on all k selected rows, unselected rows 0; DP-AdaFEST: survivors),
and every row of the cross-replica union once. Rows outside M get no
gradient at all. With an SGD engine optimizer the tables then move as
`DPModel`'s would (`tests/distributed/test_tpu_step.py` checks it against a
`DPModel` step to float rounding, with a CPU engine of the same interface).

Why a dry run, and what it costs: `tpu_mechanism_update`.

On a TPU, shapes are static: `tf.unique` / boolean masks inside the
clipping rules and mechanisms would need padding to static maxima for XLA
(the noise feature already is padded to `max_noise_rows`). See
docs/tpu_sparsecore.md.

References: EANA (RecSys 2022) §3, Alg. 2; DP-FEST / DP-AdaFEST (NeurIPS
2023) §3; docs/tpu_sparsecore.md.
"""

from __future__ import annotations

from tfdp_embed import nonfinite
from tfdp_embed._sorted_sets import is_member
from tfdp_embed.absent_examples import present_examples, without_absent_examples
from tfdp_embed.clipping.per_example import start_gradients
from tfdp_embed.keras2._keras import tf
from tfdp_embed.keras2.distribute.support import DistributionNotSupportedError
from tfdp_embed.keras2.distribute.tpu_engine_table import (
    EngineTable,
    TpuFeature,
    _check_table_sizes,
    engine_table_gradients,
)
from tfdp_embed.keras2.distribute.tpu_gradient_path import (
    NOISE_FEATURE_SUFFIX,
    _owned_rows,
    _values_at,
    clipped_activation_gradients,
    noise_feature_name,
)
from tfdp_embed.keras2.distribute.tpu_mechanism_update import planned_rows, run_once
from tfdp_embed.keras2.distribute.tpu_plan import TPU_PLANS, tpu_embedding_plan
from tfdp_embed.keras2.layers.embedding import DPEmbedding
from tfdp_embed.mechanisms.adafest import DPAdaFEST
from tfdp_embed.mechanisms.base import ClippedGradients, NoiseMechanism, TableGradient
from tfdp_embed.mechanisms.capabilities import capabilities_of, how_to_declare
from tfdp_embed.mechanisms.fest import DPFEST


class TpuDPStep:
    """One DP training step with the embedding tables on the TPU embedding engine (SparseCore).

    Per replica (inside `strategy.run`), for one global batch: the stages
    in the module docstring (rows planned by a dry run, lookup with the noise
    features, ghost norms and clipping, `mechanism.update` once, both updates).

    Args:
      engine: the embedding engine, with `TPUEmbeddingV2`'s interface:
        `enqueue(features, weights) -> partitioned`, `dequeue(partitioned) ->
        (activations, preserved)` and `apply_gradients(gradients, preserved)`.
        Its feature configuration must hold every feature of `features` and, for a
        clipping mechanism, per table the noise feature `noise_feature_name(table)`
        (one id per sample, `[max_noise_rows]` samples, combiner "sum"; ids
        arrive with weights 1, padding with 0). The engine's optimizer is the
        tables' optimizer (SGD gives DP-SGD's update).
      model: the TensorCore Keras model: {feature name: activations} ->
        predictions. Built, no `DPEmbedding` inside (tables go on the engine).
      features: the `TpuFeature`s of the batch.
      mechanism: a TPU-possible `NoiseMechanism` (`TPU_PLANS`), keyword-only.
      loss: per-example loss: a Keras `Loss` (applied unreduced) or a callable
        (labels, predictions) -> `[batch]`.
      optimizer: Keras optimizer of the TensorCore variables.
      expected_batch_size: B, the global expected batch size (q N).
      table_sizes: {table name: (vocabulary_size, dim)} of every table the
        features read (the engine's `TableConfig`s).
      max_noise_rows: static number of noise-feature ids per replica, an int
        or {table: int}; a step needing more fails with a clear error.
      registry: `LayerRegistry` of per-example norm rules (default:
        `tfdp_embed.keras2.clipping.default_registry()`).

    Raises:
      DistributionNotSupportedError: a mechanism that cannot run on the engine
        (dense DP-SGD, LazyDP: the reason from `TPU_PLANS`), or DP-FEST /
        DP-AdaFEST(+) with pooled features.
      ValueError: tables missing from `table_sizes` (or sizes that are not
        positive ints), repeated feature names, features of one
        table with different combiners, a non-positive `max_noise_rows` or
        `expected_batch_size`, an unbuilt model or a model holding tables.

    Example (one replica step; under TPUStrategy inside `strategy.run`):
        >>> step = TpuDPStep(engine, model=tower, features=[TpuFeature("movie", "movies")],
        ...                  table_sizes={"movies": (100_000, 32)},
        ...                  mechanism=EANA(l2_norm_clip=1.0, noise_multiplier=1.0),
        ...                  loss=keras.losses.BinaryCrossentropy(from_logits=True),
        ...                  optimizer=keras.optimizers.legacy.SGD(0.1),
        ...                  expected_batch_size=1024, max_noise_rows=4096)
        >>> logs = step({"movie": ids}, labels)

    References: EANA (RecSys 2022) §3, Alg. 2; DP-FEST / DP-AdaFEST
    (NeurIPS 2023) §3; Bu et al. 2022 (book-keeping); TensorFlow
    `tpu_embedding_v3.TPUEmbeddingV2` (enqueue / dequeue / apply_gradients).
    """

    def __init__(
        self,
        engine,
        *,
        model,
        features,
        mechanism: NoiseMechanism,
        loss,
        optimizer,
        expected_batch_size: float,
        table_sizes,
        max_noise_rows,
        registry=None,
    ):
        from tfdp_embed.keras2 import clipping

        if not isinstance(mechanism, NoiseMechanism):
            raise TypeError(f"`mechanism` must be a tfdp_embed NoiseMechanism; received {type(mechanism).__name__}.")
        _check_tpu_capable(mechanism)
        for method in ("enqueue", "dequeue", "apply_gradients"):
            if not callable(getattr(engine, method, None)):
                raise TypeError(f"`engine` must have TPUEmbeddingV2's {method}(); {type(engine).__name__} has none.")
        table_sizes = _check_table_sizes(table_sizes)
        features, combiners = _checked_features(features, table_sizes, mechanism)
        dense_layers = _tensorcore_layers(model)
        if expected_batch_size is None or not float(expected_batch_size) > 0:
            raise ValueError(f"`expected_batch_size` must be > 0; received {expected_batch_size!r}.")
        tables_used = sorted(combiners)
        self.engine = engine
        self.model = model
        self.features = features
        self.mechanism = mechanism
        self.optimizer = optimizer
        self.expected_batch_size = float(expected_batch_size)
        self.max_noise_rows = _noise_row_limits(max_noise_rows, tables_used)
        registry = registry if registry is not None else clipping.default_registry()
        self.registry = clipping.LayerRegistry([(EngineTable, engine_table_gradients), *registry])
        self._fallback = clipping.vectorized_layer_gradients
        self._loss = loss
        self._dense_layers = dense_layers
        self.tables = [EngineTable(t, table_sizes[t][0], table_sizes[t][1], combiners[t]) for t in tables_used]
        if mechanism.clips_per_example:
            mechanism.init(tables=self.tables, dense_variables=list(model.trainable_variables), optimizer=optimizer)

    # -- the step ---------------------------------------------------------------------
    def __call__(self, features: dict, labels, sample_weight=None) -> dict:
        """Runs one step on this replica's part of the batch.

        Args:
          features: {feature name: int ids} `[batch]` or `[batch, n]` (the
            engine's inputs; the TensorCore reads them for the ghost norms).
          labels: this replica's labels.
          sample_weight: optional `[batch]` weights multiplying the losses. An
            example of weight 0 (the padding of a static-shape batch,
            `tfdp_embed.data.fixed_shape_batches`) is absent: no clip factor,
            no lookup in the contribution map or the planned rows, no row
            (`tfdp_embed.absent_examples`).

        Returns:
          {"loss": mean per-example loss of this replica's examples,
           "noise_rows": {table: rows this replica noised (int32 count)}}.
        """
        missing = sorted({f.name for f in self.features} - set(features))
        if missing:
            raise ValueError(f"`features` lacks {missing}; the step reads {[f.name for f in self.features]}.")
        ids = {f.name: tf.convert_to_tensor(features[f.name]) for f in self.features}
        for name, value in ids.items():
            if not value.dtype.is_integer:
                raise TypeError(f"Feature {name!r} must hold integer ids; received dtype {value.dtype.name}.")
        if not self.mechanism.clips_per_example:
            return self._non_private_step(ids, labels, sample_weight)
        return self._private_step(ids, labels, sample_weight)

    def _private_step(self, ids, labels, sample_weight=None) -> dict:
        """Rows planned (dry run), lookup with the noise features, clipping, the mechanism, both updates."""
        ctx = tf.distribute.get_replica_context()
        occurrences = {t.name: [t.occurrences(ids[f.name]) for f in self._features_of(t)] for t in self.tables}
        batch_size = tf.shape(next(iter(ids.values())))[0]
        present = present_examples(sample_weight, batch_size)  # None: every example counts

        # 1. The rows the mechanism changes this step, before the lookup (a dry run).
        planned = self._planned_rows(occurrences, batch_size, ctx, present)
        noise_ids, noise_weights, counts = self._noise_features(planned, ctx)

        # 2. Lookup of the batch and the noise features.
        weights = {**{name: None for name in ids}, **noise_weights}
        partitioned = self.engine.enqueue({**ids, **noise_ids}, weights)
        activations, preserved = self.engine.dequeue(partitioned)

        # 3. TensorCore forward / backward, ghost norms, clip factors.
        acts = {name: activations[name] for name in ids}
        step, per_example_loss, act_grads = self._clipped_step(ids, acts, labels, sample_weight, present)
        clipped = _clipped_gradients(
            step, self.tables, self.model.trainable_variables, self.expected_batch_size, batch_size
        )

        # 4. The mechanism, once for the global batch.
        pairs, total = run_once(self.mechanism, clipped, ctx, dry=False)
        by_variable = {id(v): g for g, v in pairs}
        gradients, checks = {}, []
        for table, rows, global_sum in zip(self.tables, planned, total.tables):
            key = noise_feature_name(table.name)
            update = by_variable[id(table.embeddings)]
            checks.append(self._check_planned(table, update, rows))
            gradients[key] = self._noise_feature_gradient(table, update, global_sum, noise_ids[key], noise_weights[key])
            for f in self._features_of(table):
                gradients[f.name] = self._feature_gradient(f, act_grads, step.clip_factors, ids, acts, rows)
        with tf.control_dependencies(checks):
            self.engine.apply_gradients(gradients, preserved)
        table_ids = {id(t.embeddings) for t in self.tables}
        dense = [(g, v) for g, v in pairs if id(v) not in table_ids]
        if ctx is not None and ctx.num_replicas_in_sync > 1:  # already the global, noised gradient
            self.optimizer.apply_gradients(dense, experimental_aggregate_gradients=False)
        else:
            self.optimizer.apply_gradients(dense)
        mean_loss, _ = nonfinite.finite_mean(per_example_loss, nonfinite.finite_examples(per_example_loss))
        return {"loss": mean_loss, "noise_rows": counts}

    def _planned_rows(self, occurrences, batch_size, ctx, present) -> list:
        """Sorted int64 rows per table that `mechanism.update` will change for this batch (`planned_rows`)."""
        variables, B = self.model.trainable_variables, self.expected_batch_size
        return planned_rows(
            self.mechanism,
            self.tables,
            variables,
            expected_batch_size=B,
            occurrences=occurrences,
            batch_size=batch_size,
            ctx=ctx,
            present=present,
        )

    def _noise_features(self, planned: list, ctx) -> tuple:
        """Per table the noise feature's ids (the planned rows this replica owns) and weights; the counts."""
        noise_ids, noise_weights, counts = {}, {}, {}
        replicas, me = 1, 0
        if ctx is not None and ctx.num_replicas_in_sync > 1:
            replicas, me = ctx.num_replicas_in_sync, ctx.replica_id_in_sync_group
        for table, rows in zip(self.tables, planned):
            limit = self.max_noise_rows[table.name]
            owned, weights, count = _owned_rows(
                rows,
                limit,
                replicas,
                me,
                message=f"TpuDPStep: table {table.name!r} needs more noise-feature rows on this replica than "
                f"max_noise_rows={limit}; raise it (and the engine's noise feature size with it).",
            )
            key = noise_feature_name(table.name)
            noise_ids[key], noise_weights[key], counts[table.name] = owned, weights, count
        return noise_ids, noise_weights, counts

    def _clipped_step(self, ids, acts, labels, sample_weight, present) -> tuple:
        """(ghost norms and clip factors of the present examples, per-example losses, finite activation grads)."""
        from tfdp_embed.clipping.per_example import clipped_step
        from tfdp_embed.clipping.taps import LayerCall, LayerTaps, record_taps

        with record_taps(self._dense_layers, self.registry) as taps, tf.GradientTape(persistent=True) as tape:
            for value in acts.values():
                tape.watch(value)
            predictions = self.model(acts, training=True)
            per_example_loss = _per_example_loss(self._loss, labels, predictions, sample_weight, check_finite=False)
        table_taps = [
            LayerTaps(
                layer=t,
                call_fn=None,
                calls=[LayerCall(args=(ids[f.name],), kwargs={}, outputs=acts[f.name]) for f in self._features_of(t)],
            )
            for t in self.tables
        ]
        step = clipped_step(
            list(taps) + table_taps,
            per_example_loss,
            tape,
            registry=self.registry,
            fallback=self._fallback,
            l2_norm_clip=self.mechanism.l2_norm_clip,
        )
        step = without_absent_examples(step, present)
        # A NaN or Inf loss does not stop the step: that example starts from 0 and has c_i = 0 (N2).
        act_grads = tape.gradient(per_example_loss, acts, output_gradients=start_gradients(per_example_loss, 1.0))
        act_grads = nonfinite.finite_values(act_grads)
        del tape
        return step, per_example_loss, act_grads

    def _check_planned(self, table, update, rows):
        """Asserts that the real `update` changed the rows of its dry run."""
        update_rows = tf.sort(tf.cast(update.indices, tf.int64))
        return tf.debugging.assert_equal(
            update_rows,
            rows,
            message=f"TpuDPStep: mechanism {self.mechanism.name!r} changed different rows of table "
            f"{table.name!r} than its dry run on the same ids and generator state",
        )

    def _noise_feature_gradient(self, table, update, global_sum, owned, weights) -> tf.Tensor:
        """M[r] - S[r] on the rows r this replica owns (S = clipped sum / B), zero on the padding."""
        sent = _values_at(update, owned) - _values_at(global_sum.gradient, owned) / self.expected_batch_size
        # The engine checks each gradient against its feature's static output shape.
        shape = [self.max_noise_rows[table.name], table.output_dim]
        return tf.ensure_shape(sent * weights[:, None], shape)

    def _feature_gradient(self, feature, act_grads, clip_factors, ids, acts, rows) -> tf.Tensor:
        """c_i / B x the activation gradient; a sequence feature's ids outside the changed `rows` get 0."""
        grad = clipped_activation_gradients(
            act_grads[feature.name], clip_factors, expected_batch_size=self.expected_batch_size
        )
        if feature.combiner is None:  # sequence feature: occurrences of rows outside M get nothing
            keep = is_member(tf.cast(ids[feature.name], tf.int64), rows)
            grad = grad * tf.cast(keep, grad.dtype)[..., None]
        return tf.ensure_shape(grad, acts[feature.name].shape)

    def _non_private_step(self, ids, labels, sample_weight=None) -> dict:
        """`NonPrivate`: gradients of the global-batch mean loss, no clipping, no noise feature."""
        ctx = tf.distribute.get_replica_context()
        partitioned = self.engine.enqueue(ids, {name: None for name in ids})
        activations, preserved = self.engine.dequeue(partitioned)
        acts = {name: activations[name] for name in ids}
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            for value in acts.values():
                tape.watch(value)
            per_example_loss = _per_example_loss(self._loss, labels, self.model(acts, training=True), sample_weight)
            total = tf.cast(tf.shape(per_example_loss)[0], per_example_loss.dtype)
            if ctx is not None and ctx.num_replicas_in_sync > 1:
                total = ctx.all_reduce("sum", total)
            loss = tf.reduce_sum(per_example_loss) / tf.maximum(total, 1.0)
        grads = tape.gradient(loss, [acts, variables])
        self.engine.apply_gradients(grads[0], preserved)
        self.optimizer.apply_gradients([(g, v) for g, v in zip(grads[1], variables) if g is not None])
        return {"loss": tf.reduce_mean(per_example_loss), "noise_rows": {}}

    # -- helpers ------------------------------------------------------------------------
    def _features_of(self, table) -> list:
        return [f for f in self.features if f.table == table.name]


def _per_example_loss(loss_fn, labels, predictions, sample_weight=None, check_finite: bool = True):
    """`loss_fn`'s per-example loss `[batch]` (a Keras `Loss` applied unreduced), times `sample_weight`."""
    from tfdp_embed.errors import PrivacyContractError
    from tfdp_embed.keras2._keras import keras

    fn = loss_fn
    loss = fn.call(labels, predictions) if isinstance(fn, keras.losses.Loss) else fn(labels, predictions)
    loss = tf.convert_to_tensor(loss)
    if loss.shape.rank is not None and loss.shape.rank > 1:
        loss = tf.reduce_mean(loss, axis=list(range(1, loss.shape.rank)))
    if loss.shape.rank != 1:
        raise PrivacyContractError(
            f"The loss must be one value per example (shape [batch]); it has shape {loss.shape}."
        )
    if sample_weight is not None:
        loss = loss * tf.cast(tf.reshape(sample_weight, [-1]), loss.dtype)
    if not check_finite:  # the private step: a non-finite example gets c_i = 0 (`clipped_step`)
        return loss
    return tf.debugging.assert_all_finite(loss, "TpuDPStep: the per-example loss is NaN or Inf.")


def _clipped_gradients(step, tables: list, dense_variables: list, expected_batch_size: float, batch_size):
    """The clipped sums of `step` as the mechanism's `ClippedGradients` (zeros for unreached dense variables)."""
    grads, occurrences = {}, {}
    for tap, info in step.layers:
        for variable, grad in zip(info.variables, info.clipped_sum(step.clip_factors)):
            grads[id(variable)] = grad
        if info.occurrences is not None:
            occurrences[id(tap.layer)] = info.occurrences
    table_grads = [
        TableGradient(
            layer=t,
            variable=t.embeddings,
            gradient=grads[id(t.embeddings)],
            occurrences=occurrences[id(t)],
            clip_factors=step.clip_factors,
        )
        for t in tables
    ]
    dense = [(v, grads[id(v)] if id(v) in grads else tf.zeros_like(v)) for v in dense_variables]
    return ClippedGradients(
        tables=table_grads, dense=dense, expected_batch_size=expected_batch_size, batch_size=batch_size
    )


def _checked_features(features, table_sizes: dict, mechanism: NoiseMechanism) -> tuple:
    """(the features as a list, {table: combiner}), refusing what the engine path cannot run.

    Refused: repeated or reserved names, unknown tables, mixed combiners on one table,
    pooled features with a mechanism that leaves touched rows unchanged.
    """
    features = list(features)
    if not features or not all(isinstance(f, TpuFeature) for f in features):
        raise ValueError(f"`features` must be a non-empty sequence of TpuFeature; received {features!r}.")
    names = [f.name for f in features]
    if len(set(names)) != len(names):
        raise ValueError(f"Feature names repeat: {names}; each feature needs its own name.")
    combiners: dict[str, str | None] = {}
    for f in features:
        if f.table not in table_sizes:
            raise ValueError(
                f"Feature {f.name!r} reads table {f.table!r}, which `table_sizes` does not have; it has "
                f"{sorted(table_sizes)}."
            )
        if f.name.endswith(NOISE_FEATURE_SUFFIX):
            raise ValueError(
                f"Feature name {f.name!r} ends with {NOISE_FEATURE_SUFFIX!r}, reserved for noise features."
            )
        if combiners.setdefault(f.table, f.combiner) != f.combiner:
            raise ValueError(
                f"The features of table {f.table!r} use different combiners ({combiners[f.table]!r}, "
                f"{f.combiner!r}); one table, one combiner."
            )
    if isinstance(mechanism, (DPFEST, DPAdaFEST)):
        pooled = [f.name for f in features if f.combiner is not None]
        if pooled:
            raise DistributionNotSupportedError(
                f"Mechanism {mechanism.name!r} leaves some touched rows unchanged (unselected or below "
                f"the threshold), which needs a per-id activation gradient to mask: features {pooled} "
                "are pooled by the engine. Declare them as sequence features (combiner=None, engine "
                "max_sequence_length = ids per example) and pool on the TensorCore."
            )
    return features, combiners


def _tensorcore_layers(model) -> list:
    """The built TensorCore model's layers owning weights; refused if any is a `DPEmbedding` table."""
    from tfdp_embed.clipping.taps import layers_owning_weights

    if not model.built or not model.trainable_variables:
        raise ValueError(f"The TensorCore model {model.name!r} must be built (call it once on activations).")
    dense_layers = layers_owning_weights(model)
    inner_tables = [layer.name for layer in dense_layers if isinstance(layer, DPEmbedding)]
    if inner_tables:
        raise ValueError(
            f"The TensorCore model holds DPEmbedding tables {inner_tables}; with TpuDPStep every table "
            "lives on the engine (declare it in the engine's table config and as a TpuFeature)."
        )
    return dense_layers


def _noise_row_limits(max_noise_rows, tables: list) -> dict:
    """{table: noise-feature ids per replica} from an int or a dict; each must be an int > 0."""
    limits = max_noise_rows if isinstance(max_noise_rows, dict) else {t: max_noise_rows for t in tables}
    for table in tables:
        limit = limits.get(table)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
            raise ValueError(
                f"`max_noise_rows` for table {table!r} must be an int > 0 (noise-feature ids per replica); "
                f"received {limit!r}."
            )
    return {t: limits[t] for t in tables}


def _check_tpu_capable(mechanism: NoiseMechanism) -> None:
    """Refuses mechanisms whose class does not declare `tpu`, or whose library plan is not possible."""
    possible = sorted(n for n, p in TPU_PLANS.items() if p.possible)
    try:
        plan = tpu_embedding_plan(mechanism)
    except KeyError:
        plan = None
    if not capabilities_of(mechanism).tpu:
        why = f"{plan.path} " if plan is not None and not plan.possible else ""
        raise DistributionNotSupportedError(
            f"Mechanism {mechanism.name!r} cannot run with its tables on the TPU embedding engine "
            f"(class {type(mechanism).__name__}): {why}"
            + how_to_declare(mechanism, "TPU support (`tpu=True`)")
            + f" TPU-possible library mechanisms: {possible} (docs/tpu_sparsecore.md)."
        )
    if plan is None or not plan.possible:
        why = (
            plan.path
            if plan is not None
            else (
                f"no TPU plan exists for {type(mechanism).__name__} (it derives from no library mechanism in TPU_PLANS)"
            )
        )
        raise DistributionNotSupportedError(
            f"Mechanism {mechanism.name!r} cannot run with its tables on the TPU embedding engine "
            f"(class {type(mechanism).__name__}): {why} TPU-possible mechanisms: {possible} (docs/tpu_sparsecore.md)."
        )


__all__ = ["TpuDPStep"]
