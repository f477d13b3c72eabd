"""`TpuDPStep`: one DP training step with the embedding tables on the TPU embedding engine (SparseCore).

The engine is an argument of `TPUEmbeddingV2`'s interface; the step is
CPU-tested with a CPU engine of that interface
(tests/distributed/test_tpu_step.py) and was never run on a TPU.

References: EANA (RecSys 2022) §3, Alg. 2; DP-FEST / DP-AdaFEST (NeurIPS
2023) §3; docs/tpu_sparsecore.md.
"""

from __future__ import annotations

from tfdp_embed import nonfinite
from tfdp_embed._sorted_sets import is_member
from tfdp_embed.absent_examples import (
    present_examples,
    present_occurrences,
    read_rows,
    without_absent_examples,
)
from tfdp_embed.keras2._keras import tf
from tfdp_embed.keras2.clipping.per_example import start_gradients
from tfdp_embed.keras2.distribute.collectives import (
    _decode_grad,
    _encode_grad,
    _flatten,
    all_reduce_clipped,
)
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
from tfdp_embed.keras2.distribute.tpu_plan import TPU_PLANS, tpu_embedding_plan
from tfdp_embed.keras2.layers.embedding import DPEmbedding
from tfdp_embed.mechanisms.adafest import DPAdaFEST
from tfdp_embed.mechanisms.base import ClippedGradients, NoiseMechanism, TableGradient
from tfdp_embed.mechanisms.capabilities import capabilities_of, how_to_declare
from tfdp_embed.mechanisms.fest import DPFEST


class TpuDPStep:
    """One DP training step with the embedding tables on the TPU embedding engine (SparseCore).

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

    Why a dry run: the noise feature is enqueued with the batch, before any
    gradient exists, but DP-AdaFEST draws its survivors inside `update`.
    Every TPU-possible mechanism decides its rows from the ids and its
    generator only, never from gradient values, so `update` is run once on
    zero gradients with the batch's touched rows, its rows are kept, and all
    mechanism state (generator included) is put back; the real `update` draws
    the same numbers and must return the same rows (checked). Cost: a second
    `update` (O(rows x dim)) and a copy of the mechanism's variables per step
    (DP-FEST: its [vocabulary] int32 position map).

    On a TPU, shapes are static: `tf.unique` / boolean masks inside the
    clipping rules and mechanisms would need padding to static maxima for XLA
    (the noise feature already is padded to `max_noise_rows`). See
    docs/tpu_sparsecore.md.

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
        from tfdp_embed.keras2.clipping.taps import layers_owning_weights

        if not isinstance(mechanism, NoiseMechanism):
            raise TypeError(f"`mechanism` must be a tfdp_embed NoiseMechanism; received {type(mechanism).__name__}.")
        _check_tpu_capable(mechanism)
        for method in ("enqueue", "dequeue", "apply_gradients"):
            if not callable(getattr(engine, method, None)):
                raise TypeError(f"`engine` must have TPUEmbeddingV2's {method}(); {type(engine).__name__} has none.")
        table_sizes = _check_table_sizes(table_sizes)
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
        if not model.built or not model.trainable_variables:
            raise ValueError(f"The TensorCore model {model.name!r} must be built (call it once on activations).")
        dense_layers = layers_owning_weights(model)
        inner_tables = [layer.name for layer in dense_layers if isinstance(layer, DPEmbedding)]
        if inner_tables:
            raise ValueError(
                f"The TensorCore model holds DPEmbedding tables {inner_tables}; with TpuDPStep every table "
                "lives on the engine (declare it in the engine's table config and as a TpuFeature)."
            )
        if expected_batch_size is None or not float(expected_batch_size) > 0:
            raise ValueError(f"`expected_batch_size` must be > 0; received {expected_batch_size!r}.")
        tables_used = sorted(combiners)
        limits = max_noise_rows if isinstance(max_noise_rows, dict) else {t: max_noise_rows for t in tables_used}
        for table in tables_used:
            limit = limits.get(table)
            if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
                raise ValueError(
                    f"`max_noise_rows` for table {table!r} must be an int > 0 (noise-feature ids per replica); "
                    f"received {limit!r}."
                )
        self.engine = engine
        self.model = model
        self.features = features
        self.mechanism = mechanism
        self.optimizer = optimizer
        self.expected_batch_size = float(expected_batch_size)
        self.max_noise_rows = {t: limits[t] for t in tables_used}
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
        ctx = tf.distribute.get_replica_context()
        occurrences = {t.name: [t.occurrences(ids[f.name]) for f in self._features_of(t)] for t in self.tables}
        batch_size = tf.shape(next(iter(ids.values())))[0]
        present = present_examples(sample_weight, batch_size)  # None: every example counts

        # 1. The rows the mechanism changes this step, before the lookup (a dry run).
        planned = self._planned_rows(occurrences, batch_size, ctx, present)
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

        # 2. Lookup of the batch and the noise features.
        weights = {**{name: None for name in ids}, **noise_weights}
        partitioned = self.engine.enqueue({**ids, **noise_ids}, weights)
        activations, preserved = self.engine.dequeue(partitioned)

        # 3. TensorCore forward / backward, ghost norms, clip factors.
        from tfdp_embed.keras2.clipping.per_example import clipped_step
        from tfdp_embed.keras2.clipping.taps import LayerCall, LayerTaps, record_taps

        acts = {name: activations[name] for name in ids}
        with record_taps(self._dense_layers, self.registry) as taps, tf.GradientTape(persistent=True) as tape:
            for value in acts.values():
                tape.watch(value)
            per_example_loss = self._per_example_loss(
                labels, self.model(acts, training=True), sample_weight, check_finite=False
            )
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
        clipped = self._clipped(step, batch_size)

        # 4. The mechanism, once for the global batch.
        pairs, total = self._run_mechanism(clipped, ctx, dry=False)
        by_variable = {id(v): g for g, v in pairs}
        B = self.expected_batch_size
        gradients, checks = {}, []
        for table, rows, global_sum in zip(self.tables, planned, total.tables):
            update = by_variable[id(table.embeddings)]
            update_rows = tf.sort(tf.cast(update.indices, tf.int64))
            checks.append(
                tf.debugging.assert_equal(
                    update_rows,
                    rows,
                    message=f"TpuDPStep: mechanism {self.mechanism.name!r} changed different rows of table "
                    f"{table.name!r} than its dry run on the same ids and generator state",
                )
            )
            key = noise_feature_name(table.name)
            owned = noise_ids[key]
            sent = _values_at(update, owned) - _values_at(global_sum.gradient, owned) / B
            # The engine checks each gradient against its feature's static output shape.
            shape = [self.max_noise_rows[table.name], table.output_dim]
            gradients[key] = tf.ensure_shape(sent * noise_weights[key][:, None], shape)
            for f in self._features_of(table):
                grad = clipped_activation_gradients(act_grads[f.name], step.clip_factors, expected_batch_size=B)
                if f.combiner is None:  # sequence feature: occurrences of rows outside M get nothing
                    keep = is_member(tf.cast(ids[f.name], tf.int64), rows)
                    grad = grad * tf.cast(keep, grad.dtype)[..., None]
                gradients[f.name] = tf.ensure_shape(grad, acts[f.name].shape)
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
            per_example_loss = self._per_example_loss(labels, self.model(acts, training=True), sample_weight)
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

    def _per_example_loss(self, labels, predictions, sample_weight=None, check_finite: bool = True):
        from tfdp_embed.errors import PrivacyContractError
        from tfdp_embed.keras2._keras import keras

        fn = self._loss
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

    def _clipped(self, step, batch_size) -> ClippedGradients:
        grads, occurrences = {}, {}
        for tap, info in step.layers:
            for variable, grad in zip(info.variables, info.clipped_sum(step.clip_factors)):
                grads[id(variable)] = grad
            if info.occurrences is not None:
                occurrences[id(tap.layer)] = info.occurrences
        tables = [
            TableGradient(
                layer=t,
                variable=t.embeddings,
                gradient=grads[id(t.embeddings)],
                occurrences=occurrences[id(t)],
                clip_factors=step.clip_factors,
            )
            for t in self.tables
        ]
        dense = [(v, grads[id(v)] if id(v) in grads else tf.zeros_like(v)) for v in self.model.trainable_variables]
        return ClippedGradients(
            tables=tables, dense=dense, expected_batch_size=self.expected_batch_size, batch_size=batch_size
        )

    def _planned_rows(self, occurrences, batch_size, ctx, present=None) -> list:
        """Sorted int64 rows per table that `mechanism.update` will change for this batch.

        With `present`, absent examples' lookups are dropped as `without_absent_examples` drops them.
        """
        tables = []
        for t in self.tables:
            occ = occurrences[t.name]
            touched, _ = tf.unique(tf.concat([tf.cast(o.ids, tf.int64) for o in occ], 0))  # the registry's order
            if present is not None:  # the registry's rows, then those only absent examples read dropped
                occ = [present_occurrences(o, present) for o in occ]
                touched = tf.boolean_mask(touched, is_member(touched, read_rows(occ)))
            zeros = tf.zeros([tf.size(touched), t.output_dim], t.embeddings.dtype)
            tables.append(
                TableGradient(
                    layer=t,
                    variable=t.embeddings,
                    gradient=tf.IndexedSlices(zeros, touched, t.dense_shape),
                    occurrences=occ,
                    clip_factors=tf.ones([batch_size], tf.float32),
                )
            )
        dense = [(v, tf.zeros_like(v)) for v in self.model.trainable_variables]
        dry = ClippedGradients(
            tables=tables, dense=dense, expected_batch_size=self.expected_batch_size, batch_size=batch_size
        )
        pairs, _ = self._run_mechanism(dry, ctx, dry=True)
        by_variable = {id(v): g for g, v in pairs}
        return [tf.sort(tf.cast(by_variable[id(t.embeddings)].indices, tf.int64)) for t in self.tables]

    def _run_mechanism(self, clipped: ClippedGradients, ctx, *, dry: bool):
        """`mechanism.update` once for the global batch; (pairs, global clipped sums).

        `dry`: the mechanism's state (generator included) is restored afterwards.
        """
        mechanism = self.mechanism

        def update(sums):
            if not dry:
                return mechanism.update(sums)
            state = _mechanism_state(mechanism)
            saved = [tf.identity(v.read_value()) for v in state]
            with tf.control_dependencies(saved):
                pairs = mechanism.update(sums)
            done = [g.values if isinstance(g, tf.IndexedSlices) else g for g, _ in pairs]
            with tf.control_dependencies(done):
                for variable, value in zip(state, saved):
                    variable.assign(value)
            return pairs

        if ctx is None or ctx.num_replicas_in_sync == 1:
            return update(clipped), clipped
        total = all_reduce_clipped(clipped, ctx, with_lookups=True)
        variables = [t.variable for t in total.tables] + [v for v, _ in total.dense]
        order = {id(v): i for i, v in enumerate(variables)}
        flat, rebuild = _flatten(total)

        def merged(strategy, *per_replica):
            local = [strategy.experimental_local_results(x)[0] for x in per_replica]
            grads = [None] * len(variables)
            for grad, var in update(rebuild(local)):
                grads[order[id(var)]] = grad
            return [_encode_grad(g) for g in grads]

        encoded = ctx.merge_call(merged, args=tuple(flat))
        pairs = [(_decode_grad(g), v) for g, v in zip(encoded, variables) if g is not None]
        return pairs, total


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


def _mechanism_state(mechanism: NoiseMechanism) -> list:
    """Every variable `update` may write: the mechanism's variables and its generator's state."""
    seen, out = set(), []
    for variable in [*mechanism.variables, mechanism.generator.state]:
        if id(variable) not in seen:
            seen.add(id(variable))
            out.append(variable)
    return out


__all__ = ["TpuDPStep"]
