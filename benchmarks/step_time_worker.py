"""Measures train steps inside one process (spawned by `benchmarks.step_time`).

Run as `python -m benchmarks.step_time_worker SPEC.json OUT.json`. The spec
names one vocabulary size and the mechanisms to time in turn; the results are
rewritten to OUT.json after each mechanism, so a later crash or OOM kill
loses only the mechanism that was running.

The workload is BENCHMARKS.md's reference: one `vocab x dim` float32 table,
4 ids per example mean-pooled, Dense(64, relu) -> Dense(1), logistic loss.

For every mechanism other than `none`, the same process also times the
plain non-private step on *the same Keras model* (tape.gradient, the table
gradient stays `IndexedSlices`, legacy SGD), alternating one mechanism step
and one plain step, so each ratio compares steps taken in the same process
under the same load.

The spec's `front_end` ("keras2", the default, or "keras3") picks the Keras
the model, optimizer and `DPModel` come from (`benchmarks.step_time_front_ends`):
under keras3 every step above is Keras 3's, with `keras.optimizers.SGD`.
"""

from __future__ import annotations

import gc
import json
import math
import os
import resource
import sys
import time
import traceback

import numpy as np

from benchmarks import machine
from benchmarks.step_time_front_ends import FrontEnd, front_end
from tfdp_embed.keras2._keras import keras, tf

TABLE_NAME = "table"
IDS_PER_EXAMPLE = 4
LEARNING_RATE = 0.1
HIDDEN = 64
_INIT_CHUNK_ROWS = 1 << 18
# Mechanisms whose step this script wires itself (the rest come from MECHANISMS).
PLAIN = "none"
DPMODEL_NONE = "dpmodel_none"
TFP_KERAS_SGD = "tfp_keras_sgd"
# LazyDP with the one-batch lookahead (`DPModel(lookahead=True)`: the next
# batch's rows are caught up after each step); plain `lazy` catches rows up
# in the embedding's read hook, just before they are read.
LAZY_LOOKAHEAD = "lazy_lookahead"


def registry_name(name: str) -> str:
    """The MECHANISMS entry a benchmark name runs (`lazy_lookahead` is LazyDP)."""
    return "lazy" if name == LAZY_LOOKAHEAD else name


# -- workload ---------------------------------------------------------------
def make_batches(*, vocab: int, batch: int, count: int, zipf: float | None, seed: int) -> list:
    """`count` (ids [batch, 4] int64, labels [batch, 1] float32) numpy pairs.

    Uniform ids by default; with `zipf=a`, row r (rank r+1) has probability
    proportional to (r+1)^-a, and ranks are scattered over the table by the
    bijection r -> r * 2654435761 mod vocab (the multiplier is prime, and
    coprime to the powers of ten used here; checked below).
    """
    rng = np.random.default_rng(seed)
    n = batch * IDS_PER_EXAMPLE * count
    if zipf is None:
        ids = rng.integers(0, vocab, size=n, dtype=np.int64)
    else:
        multiplier = 2654435761
        if math.gcd(multiplier, vocab) != 1:
            raise ValueError(f"--zipf needs a vocabulary coprime to {multiplier}; received {vocab}.")
        cdf = np.cumsum(np.arange(1, vocab + 1, dtype=np.float64) ** -float(zipf))
        cdf /= cdf[-1]
        ranks = np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), vocab - 1)
        ids = (ranks.astype(np.int64) * multiplier) % vocab
        del cdf
    ids = ids.reshape(count, batch, IDS_PER_EXAMPLE)
    labels = rng.integers(0, 2, size=(count, batch, 1)).astype(np.float32)
    return [(ids[i], labels[i]) for i in range(count)]


def build_model(*, vocab: int, dim: int, dp_embedding: bool, seed: int, fe: FrontEnd | None = None):
    """The reference model (under `fe`, tf-keras by default); `dp_embedding`: DPEmbedding (ours) or keras Embedding.

    The table holds keras's default "uniform" values (U(-0.05, 0.05)), written
    in chunks of `_INIT_CHUNK_ROWS` rows into a zero-initialised variable: the
    one-shot initializer materialises ~3 table-sized temporaries, and TF's CPU
    allocator keeps them resident (8.4 GB RSS for a 2.56 GB table at 10^7 x
    64), which would hide every mechanism's own memory behind table creation.
    """
    fe = fe if fe is not None else front_end("keras2")
    keras = fe.keras
    keras.utils.set_random_seed(seed)
    ids = keras.Input((IDS_PER_EXAMPLE,), dtype="int64", name="ids")
    if dp_embedding:
        layer = fe.DPEmbedding(vocab, dim, combiner="mean", embeddings_initializer="zeros", name=TABLE_NAME)
        pooled = layer(ids)
    else:
        layer = keras.layers.Embedding(vocab, dim, embeddings_initializer="zeros", name=TABLE_NAME)
        pooled = keras.layers.GlobalAveragePooling1D()(layer(ids))
    hidden = keras.layers.Dense(HIDDEN, activation="relu")(pooled)
    logits = keras.layers.Dense(1)(hidden)
    generator = tf.random.Generator.from_seed(seed)
    for start in range(0, vocab, _INIT_CHUNK_ROWS):
        stop = min(vocab, start + _INIT_CHUNK_ROWS)
        values = generator.uniform([stop - start, dim], -0.05, 0.05)  # scatter_update: in place
        fe.table(layer).scatter_update(tf.IndexedSlices(values, tf.range(start, stop)))
    return keras.Model(ids, logits, name="reference")


# -- steps --------------------------------------------------------------------
def plain_step(model, fe: FrontEnd | None = None):
    """The fast non-private step: mean logistic loss, IndexedSlices table gradient, SGD (`fe`'s; legacy by default)."""
    fe = fe if fe is not None else front_end("keras2")
    optimizer = fe.built_sgd(LEARNING_RATE, model)
    loss_fn = fe.keras.losses.BinaryCrossentropy(from_logits=True)

    @tf.function
    def step(ids, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(ids, training=True))
        variables = model.trainable_variables
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))
        return loss

    step.table_gradient_type = None
    return step


def table_gradient_type(model) -> str:
    """Type of the table's gradient on the plain path (must be IndexedSlices to be the fast path)."""
    ids = tf.zeros([2, IDS_PER_EXAMPLE], tf.int64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(model(ids, training=True))
    table = FrontEnd.table(model.get_layer(TABLE_NAME))
    return type(tape.gradient(loss, table)).__name__


def tfp_step(model: keras.Model, *, l2_norm_clip: float, noise_multiplier: float, microbatches: int):
    """tensorflow-privacy's DPKerasSGDOptimizer on the plain model (per-example losses, minimize)."""
    sys.skip_tf_privacy_import = True
    from tensorflow_privacy.privacy.optimizers.dp_optimizer_keras import DPKerasSGDOptimizer

    optimizer = DPKerasSGDOptimizer(
        l2_norm_clip=l2_norm_clip,
        noise_multiplier=noise_multiplier,
        num_microbatches=microbatches,
        learning_rate=LEARNING_RATE,
    )
    loss_fn = keras.losses.BinaryCrossentropy(from_logits=True, reduction=keras.losses.Reduction.NONE)

    @tf.function
    def step(ids, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(ids, training=True))  # [batch]
        optimizer.minimize(loss, model.trainable_variables, tape=tape)
        return tf.reduce_mean(loss)

    return step


def make_mechanism(name: str, spec: dict, counts: np.ndarray | None):
    """One of our MECHANISMS (`mechanisms.create`) with the benchmark's hyperparameters (recorded in the results)."""
    from tfdp_embed import mechanisms

    if name == "none":
        return mechanisms.create("none", seed=spec["seed"])
    common = dict(l2_norm_clip=spec["l2_norm_clip"], noise_multiplier=spec["noise_multiplier"], seed=spec["seed"])
    if name == "fest":
        k = min(spec["fest_top_k"], spec["vocab"])
        common.update(selection_epsilon=spec["fest_selection_epsilon"], top_k=k, counts={TABLE_NAME: counts})
    elif name == "adafest":
        from tfdp_embed.mechanisms.adafest import split_noise_multiplier

        sigma1, sigma2 = split_noise_multiplier(spec["noise_multiplier"], ratio=spec["adafest_ratio"])
        common.update(
            noise_multiplier=sigma2,
            contribution_noise_multiplier=sigma1,
            contribution_clip=spec["adafest_contribution_clip"],
            threshold=spec["adafest_threshold"],
        )
    return mechanisms.create(name, **common)


def hyperparameters(name: str, spec: dict) -> str:
    if name in (PLAIN, DPMODEL_NONE):
        return "no clipping, no noise"
    base = f"C={spec['l2_norm_clip']:g}, sigma={spec['noise_multiplier']:g}"
    if name == "fest":
        return base + f", top_k={min(spec['fest_top_k'], spec['vocab'])}, eps1={spec['fest_selection_epsilon']:g}"
    if name == "adafest":
        from tfdp_embed.mechanisms.adafest import noise_survival_probability, split_noise_multiplier

        sigma1, sigma2 = split_noise_multiplier(spec["noise_multiplier"], ratio=spec["adafest_ratio"])
        p = noise_survival_probability(
            threshold=spec["adafest_threshold"],
            contribution_clip=spec["adafest_contribution_clip"],
            contribution_noise_multiplier=sigma1,
        )
        return (
            f"C2={spec['l2_norm_clip']:g}, sigma1={sigma1:.3g}, sigma2={sigma2:.3g} (effective "
            f"sigma={spec['noise_multiplier']:g}), C1={spec['adafest_contribution_clip']:g}, "
            f"tau={spec['adafest_threshold']:g}, untouched-row survival p={p:.2g}"
        )
    return base


_IGNORED_VOCAB_OPS = {"ReadVariableOp", "VarHandleOp", "Placeholder", "Identity"}


def vocab_sized_ops(concrete, vocab: int) -> dict:
    """Op types in a traced step (nested cond/while bodies included) whose output has `vocab` rows.

    A sparse step should have none besides reading the table variable; any
    other op with a `[vocab, ...]` output (Fill, AddV2, UnsortedSegmentSum,
    random sampling, ...) touches every row each step.
    """
    found: dict = {}
    seen: set = set()

    def walk(graph):
        if id(graph) in seen:
            return
        seen.add(id(graph))
        for op in graph.get_operations():
            for out in op.outputs:
                shape = out.shape
                if shape.rank and shape[0] == vocab and op.type not in _IGNORED_VOCAB_OPS:
                    found[op.type] = found.get(op.type, 0) + 1
                    break
            for attr in ("then_branch", "else_branch", "body", "cond", "f", "branches"):
                try:
                    value = op.get_attr(attr)
                except (ValueError, TypeError):
                    continue
                for func in value if isinstance(value, list) else [value]:
                    name = getattr(func, "name", None)
                    sub = graph._get_function(name) if name else None  # noqa: SLF001 - diagnostics only
                    if sub is not None and hasattr(sub, "graph"):
                        walk(sub.graph)

    walk(concrete.graph)
    return found


class Setup:
    """One mechanism wired for timing: `step(i)` runs step i; `baseline(i)` the plain step, same model."""

    def __init__(self, name: str, spec: dict, batches: list, fe: FrontEnd | None = None):
        self.name = name
        self.fe = fe if fe is not None else front_end(spec.get("front_end", "keras2"))
        self.notes: list[str] = []
        self.extra: dict = {}
        self._batches = batches
        self.baseline = None
        if name == PLAIN:
            model = self._model(spec, dp_embedding=False)
            self.extra["table_gradient"] = table_gradient_type(model)
            self._plain_fn(plain_step(model, self.fe))
        elif name == TFP_KERAS_SGD:
            self._tfp(spec)
        else:
            self._dp(name, spec, batches)

    def _model(self, spec: dict, *, dp_embedding: bool):
        return build_model(
            vocab=spec["vocab"], dim=spec["dim"], dp_embedding=dp_embedding, seed=spec["seed"], fe=self.fe
        )

    def _plain_fn(self, fn) -> None:
        """Steps `fn(ids, labels)` on the mechanism's batches."""
        self.step = lambda i: fn(*self._batch(i))
        self.concrete = lambda: fn.get_concrete_function(*self._batch(0))

    def _tfp(self, spec: dict) -> None:
        model = self._model(spec, dp_embedding=False)
        m = int(spec["tfp_microbatches"])
        self.extra["num_microbatches"] = m
        self.notes.append(f"num_microbatches={m}")
        fn = tfp_step(
            model, l2_norm_clip=spec["l2_norm_clip"], noise_multiplier=spec["noise_multiplier"], microbatches=m
        )
        self._plain_fn(fn)
        self._with_baseline(model)

    def _dp(self, name: str, spec: dict, batches: list) -> None:
        """Our `DPModel.train_step` under `tf.function`, with the mechanism `name` (`dpmodel_none`: NonPrivate)."""
        vocab = spec["vocab"]
        model = self._model(spec, dp_embedding=True)
        counts = None
        if name == "fest":  # the selection's counts: from the benchmark's own batches
            counts = np.zeros(vocab, np.int64)
            for ids, _ in batches:
                counts += np.bincount(np.asarray(ids).ravel(), minlength=vocab)
        mechanism = make_mechanism("none" if name == DPMODEL_NONE else registry_name(name), spec, counts)
        lookahead = name == LAZY_LOOKAHEAD
        dp = self.fe.dp_model(model, mechanism, batch=spec["batch"], lookahead=lookahead)
        dp.compile(optimizer=self.fe.sgd(LEARNING_RATE), loss=self.fe.keras.losses.BinaryCrossentropy(from_logits=True))
        dp.prepare()
        self.dp, self.mechanism = dp, mechanism
        fn = tf.function(dp.train_step)
        if lookahead:
            self.step = lambda i: fn(self._batch(i) + ({TABLE_NAME: self._batch(i + 1)[0]},))
            self.concrete = lambda: fn.get_concrete_function(self._batch(0) + ({TABLE_NAME: self._batch(1)[0]},))
        else:
            self.step = lambda i: fn(self._batch(i))
            self.concrete = lambda: fn.get_concrete_function(self._batch(0))
        if registry_name(name) == "lazy":
            self._record_history(mechanism, vocab)
        self._with_baseline(model)

    def _batch(self, i: int) -> tuple:
        """Step i's batch from the first half of the batches (the mechanism's stream)."""
        half = max(1, len(self._batches) // 2)
        return self._batches[i % half]

    def _baseline_batch(self, i: int) -> tuple:
        """Step i's batch for the in-process plain step: the second half, never the batch the
        mechanism just used (its rows would still be in cache and flatter the plain step)."""
        half = max(1, len(self._batches) // 2)
        return self._batches[half + i % max(1, len(self._batches) - half)]

    def _with_baseline(self, model) -> None:
        """The plain step on the same model, traced with every read hook removed (LazyDP's)."""
        fn = plain_step(model, self.fe)
        layers = [layer for layer in model.layers if hasattr(layer, "set_read_hook")]
        hooks = [layer.read_hook for layer in layers]
        for layer in layers:
            layer.set_read_hook(None)
        try:
            fn(*self._baseline_batch(0))  # traces without hooks; later calls reuse this trace
        finally:
            for layer, hook in zip(layers, hooks):
                layer.set_read_hook(hook)
        # The first call traces twice when it creates the optimizer's variables.
        self._baseline_traces = fn.experimental_get_tracing_count()
        self._baseline_fn = fn
        self.baseline = lambda i: fn(*self._baseline_batch(i))

    def baseline_retraced(self) -> bool:
        """True when the plain step was traced again after its first call (hooks could be back)."""
        return bool(self.baseline) and self._baseline_fn.experimental_get_tracing_count() != self._baseline_traces

    def _record_history(self, mechanism, vocab: int) -> None:
        histories = [v for v in mechanism.variables if "history" in v.name]
        if histories:
            h = histories[0]
            per_row = h.dtype.size * int(np.prod(h.shape[1:]))
            self.extra["lazy_history_bytes_per_row"] = per_row
            self.extra["lazy_history_dtype"] = h.dtype.name
            self.extra["lazy_history_mb"] = round(per_row * vocab / 2**20, 1)
            self.notes.append(f"history {h.dtype.name}, {per_row} B/row ({per_row * vocab / 2**20:.1f} MB)")
        else:
            self.notes.append("no history variable found on the mechanism")


def _finish(result) -> None:
    """Forces a step's outputs (a tensor or a dict of metrics) to the host."""
    if isinstance(result, dict):
        for value in result.values():
            np.asarray(value)
    else:
        np.asarray(result)


def _timed(fn, i: int, cpu: list | None = None) -> float:
    """Wall seconds of step i; appends the process CPU seconds (all threads) to `cpu`."""
    start, cpu_start = time.perf_counter(), time.process_time()
    _finish(fn(i))
    if cpu is not None:
        cpu.append(time.process_time() - cpu_start)
    return time.perf_counter() - start


def _peak_rss_mb() -> float:
    with open("/proc/self/status", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _stats(times: list) -> dict:
    if not times:
        return {"median_step_s": None, "p10_step_s": None, "p90_step_s": None, "steps_timed": 0}
    t = np.asarray(times)
    return {
        "median_step_s": float(np.median(t)),
        "p10_step_s": float(np.percentile(t, 10)),
        "p90_step_s": float(np.percentile(t, 90)),
        "steps_timed": int(t.size),
    }


def measure(name: str, spec: dict, batches: list) -> dict:
    """Builds `name`, runs warm-up steps, then alternates timed mechanism and plain steps."""
    build_start = time.perf_counter()
    setup = Setup(name, spec, batches)
    build_s = time.perf_counter() - build_start
    rss_after_build = machine.status_kb("VmRSS") / 1024
    warmup_start = time.perf_counter()
    i = 0
    for _ in range(spec["warmup"]):
        _finish(setup.step(i))
        if setup.baseline:
            _finish(setup.baseline(i))
        i += 1
    warmup_s = time.perf_counter() - warmup_start
    try:
        census = vocab_sized_ops(setup.concrete(), spec["vocab"])
    except Exception as error:  # noqa: BLE001 - diagnostics only
        census = {"census failed": f"{type(error).__name__}: {error}"[:200]}
    times, base_times, cpu, base_cpu = [], [], [], []
    budget, start = spec["max_seconds_per_mechanism"], time.perf_counter()
    capped = False
    while len(times) < spec["steps"]:
        if times and time.perf_counter() - start > budget:
            capped = True
            break
        times.append(_timed(setup.step, i, cpu))
        if setup.baseline:
            base_times.append(_timed(setup.baseline, i, base_cpu))
        i += 1
    while setup.baseline and len(base_times) < spec["steps"]:
        base_times.append(_timed(setup.baseline, i, base_cpu))
        i += 1
    result = {"mechanism": name, **_stats(times)}
    # Process CPU time per step (all threads): steadier than wall time on a shared machine.
    result["cpu_median_step_s"] = float(np.median(cpu)) if cpu else None
    result["none_in_process_cpu_median_s"] = float(np.median(base_cpu)) if base_cpu else None
    notes = list(setup.notes)
    if capped:
        notes.append(f"capped by --max-seconds-per-mechanism={budget:g}: {len(times)} of {spec['steps']} steps timed")
    base = _stats(base_times)
    result["none_in_process_median_s"] = base["median_step_s"] if setup.baseline else None
    result["none_in_process_steps"] = base["steps_timed"]
    if setup.baseline_retraced():
        notes.append("the in-process plain step was retraced after its first call")
    if name == "adafest" and hasattr(setup, "mechanism"):
        try:
            result["adafest_rows_noised_per_step"] = float(setup.mechanism.rows_noised.numpy()[0]) / max(
                1, int(setup.mechanism.steps.numpy())
            )
            # An operator diagnostic of the un-noised touches (NOT DP): fine for a synthetic
            # benchmark, never written beside a model.
            diagnostics = setup.mechanism.diagnostics()["tables"][0]
            result["adafest_dropped_touched_fraction"] = diagnostics["dropped_touched_fraction"]
            notes.append(
                f"{result['adafest_rows_noised_per_step']:.0f} rows noised/step, "
                f"{100 * result['adafest_dropped_touched_fraction']:.0f}% of touched rows below tau "
                "(operator diagnostic, not DP)"
            )
        except Exception:  # noqa: BLE001 - statistics are a bonus
            pass
    result.update(setup.extra)
    result["vocab_sized_ops"] = census
    if census:
        ops = ", ".join(k if v == 1 else f"{k}×{v}" for k, v in sorted(census.items()))
        notes.append(f"ops with [vocab, …] outputs: {ops}")
    result["hyperparameters"] = hyperparameters(name, spec)
    result["rss_after_build_mb"] = round(rss_after_build, 1)
    result["build_s"] = round(build_s, 2)
    result["warmup_s"] = round(warmup_s, 2)
    result["notes"] = "; ".join(notes)
    del setup
    return result


def _pair_build(name: str, spec: dict, batches: list, fe_name: str) -> tuple:
    """One front end's setup for `measure_pair`, warmed up; (setup, peak RSS MB, RSS MB before building it)."""
    machine.reset_peak_rss()
    before = machine.status_kb("VmRSS") / 1024
    setup = Setup(name, {**spec, "front_end": fe_name}, batches)
    for i in range(spec["warmup"]):
        _finish(setup.step(i))
        if setup.baseline:
            _finish(setup.baseline(i))
    return setup, _peak_rss_mb(), before


def measure_pair(name: str, spec: dict, batches: list) -> list:
    """`name` under both front ends in this process, their steps alternated: Keras 3 ÷ tf-keras, same process.

    Builds and warms up the front ends in `spec["pair_order"]` (VmHWM reset before each: a front end's
    peak RSS is that of building and stepping it, with the one built before it resident), then times
    step i of every front end's DP step and its plain step (same model), the order rotating each step.
    """
    order = list(spec["pair_order"])
    built = {fe: _pair_build(name, spec, batches, fe) for fe in order}
    times = {fe: ([], [], [], []) for fe in order}  # DP wall, plain wall, DP CPU, plain CPU
    budget, start, i = spec["max_seconds_per_mechanism"], time.perf_counter(), spec["warmup"]
    while len(times[order[0]][0]) < spec["steps"]:
        if times[order[0]][0] and time.perf_counter() - start > budget:
            break
        for fe in order[i % 2 :] + order[: i % 2]:
            setup, (wall, base, cpu, base_cpu) = built[fe][0], times[fe]
            wall.append(_timed(setup.step, i, cpu))
            if setup.baseline:
                base.append(_timed(setup.baseline, i, base_cpu))
        i += 1
    rows = []
    for fe in order:
        setup, peak, before = built[fe]
        wall, base, cpu, base_cpu = times[fe]
        row = {"mechanism": name, "front_end": fe, **_stats(wall), "cpu_median_step_s": float(np.median(cpu))}
        row.update(none_in_process_median_s=_stats(base)["median_step_s"], none_in_process_steps=len(base))
        row.update(none_in_process_cpu_median_s=float(np.median(base_cpu)) if base_cpu else None)
        row["peak_rss_mb"] = round(peak, 1)
        row.update(setup.extra, rss_before_mb=round(before, 1), hyperparameters=hyperparameters(name, spec))
        row["peak_rss_scope"] = f"front end, built {order.index(fe) + 1} of 2 (VmHWM reset before building it)"
        row["notes"] = "; ".join([*setup.notes, f"same process as {' and '.join(order)}, steps alternated"])
        rows.append(row)
    return rows


def _run_pair(name: str, spec: dict, batches: list, registered) -> list:
    """Both front ends' rows for `name` (`measure_pair`; a front end that cannot run it: measured alone)."""
    fes = [front_end(fe) for fe in spec["pair_order"]]
    unregistered = name not in (PLAIN, DPMODEL_NONE, TFP_KERAS_SGD) and registry_name(name) not in registered
    if unregistered or any(fe.unsupported(name) for fe in fes):
        rows = []
        for fe in fes:  # one after the other, as single-front-end processes do
            machine.reset_peak_rss()
            row = _measure_or_why(name, {**spec, "front_end": fe.name}, batches, fe, registered)
            row.update(front_end=fe.name, peak_rss_mb=None if row.get("skipped") else round(_peak_rss_mb(), 1))
            rows.append(row)
        return rows
    try:
        return measure_pair(name, spec, batches)
    except Exception as error:  # noqa: BLE001 - recorded, never estimated
        traceback.print_exc()
        first = (str(error).strip().splitlines() or [""])[0][:300]
        return [{**_not_measured(name, f"{type(error).__name__}: {first}"), "front_end": fe.name} for fe in fes]


def _not_measured(name: str, reason: str) -> dict:
    return {"mechanism": name, **_stats([]), "not_measured": reason, "notes": f"not measured: {reason}"}


def _unregistered(name: str, registered) -> dict:
    result = _not_measured(
        name, f"'{name}' is not in tfdp_embed.mechanisms.MECHANISMS ({', '.join(sorted(registered))})"
    )
    result["skipped"] = True
    return result


def _measure_or_why(name: str, spec: dict, batches: list, fe: FrontEnd, registered) -> dict:
    """`measure(name)`, or a "not measured" row with the reason (unregistered, unsupported, failed)."""
    if name not in (PLAIN, DPMODEL_NONE, TFP_KERAS_SGD) and registry_name(name) not in registered:
        return _unregistered(name, registered)
    if fe.unsupported(name):
        result = _not_measured(name, f"{fe.label}: {fe.unsupported(name)}")
        result["skipped"] = True
        return result
    try:
        return measure(name, spec, batches)
    except tf.errors.ResourceExhaustedError as error:
        return _not_measured(name, f"out of memory: {str(error).splitlines()[0][:200]}")
    except Exception as error:  # noqa: BLE001 - recorded, never estimated
        traceback.print_exc()
        first = (str(error).strip().splitlines() or [""])[0][:300]
        return _not_measured(name, f"{type(error).__name__}: {first}")


def run(spec: dict, out_path: str) -> None:
    tf.random.set_seed(spec["seed"])
    count = spec["num_batches"] or 2 * (spec["warmup"] + spec["steps"] + 2)  # 0: no batch is ever reused
    batches = make_batches(vocab=spec["vocab"], batch=spec["batch"], count=count, zipf=spec["zipf"], seed=spec["seed"])
    batches = [(tf.constant(ids), tf.constant(labels)) for ids, labels in batches]
    from tfdp_embed.mechanisms import MECHANISMS

    if spec.get("front_end") == "both":
        return _run_pairs(spec, out_path, batches)
    fe = front_end(spec.get("front_end", "keras2"))
    report = _report_header(spec, fe.name)
    for name in spec["mechanisms"]:
        per_mechanism_peak = machine.reset_peak_rss()
        rss_before = machine.status_kb("VmRSS") / 1024
        report["running"] = name
        _write(out_path, report)
        result = _measure_or_why(name, spec, batches, fe, MECHANISMS)
        result["front_end"] = fe.name
        result["peak_rss_mb"] = None if result.get("skipped") else round(_peak_rss_mb(), 1)
        result["rss_before_mb"] = round(rss_before, 1)
        result["peak_rss_scope"] = "mechanism (VmHWM reset)" if per_mechanism_peak else "process"
        report["results"].append(result)
        report.pop("running", None)
        _write(out_path, report)
        gc.collect()
        fe.keras.backend.clear_session()
        gc.collect()
    report["ru_maxrss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    _write(out_path, report)


def _report_header(spec: dict, front_end_name: str) -> dict:
    """The worker's report before any result: table size, front end, process, fused ops, devices."""
    from tfdp_embed.mechanisms import MECHANISMS
    from tfdp_embed.ops import fast_normal

    return {
        "vocab": spec["vocab"],
        "front_end": front_end_name,
        "pid": os.getpid(),
        "fused_ops": "available" if fast_normal.available() else f"unavailable: {fast_normal.unavailable_reason()}",
        "tf_devices": [d.name for d in tf.config.list_physical_devices()],
        "registered_mechanisms": sorted(MECHANISMS),
        "results": [],
    }


def _run_pairs(spec: dict, out_path: str, batches: list) -> None:
    """`run` with `spec["front_end"] == "both"`: every mechanism's rows from `_run_pair`."""
    from tfdp_embed.mechanisms import MECHANISMS

    report = _report_header(spec, "both")
    for name in spec["mechanisms"]:
        report["running"] = name
        _write(out_path, report)
        report["results"] += _run_pair(name, spec, batches, MECHANISMS)
        report.pop("running", None)
        _write(out_path, report)
        for fe in spec["pair_order"]:
            gc.collect()
            front_end(fe).keras.backend.clear_session()
        gc.collect()
    report["ru_maxrss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    _write(out_path, report)


def _write(path: str, report: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=1)
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m benchmarks.step_time_worker SPEC.json OUT.json", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as handle:
        spec = json.load(handle)
    run(spec, argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
