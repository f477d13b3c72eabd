"""LazyDP: dense DP-SGD in distribution, at a per-step cost independent of vocabulary size.

Dense DP-SGD moves every embedding row every step (noise, and with
momentum the drift m <- beta m). LazyDP defers both for every row nobody
reads. Each table keeps a `HistoryTable` (one int32 per row): the last step
through which the row's noise was applied, with one flag bit saying that its
deterministic state (gradient, momentum) is one step further on (a row the
current batch touched: the optimizer applied its gradient, its own step
noise is deferred too). Before a row is read again, it receives in ONE
draw the exact sum of everything it missed (aggregated noise sampling):

    plain SGD:  theta += N(0, sum_{r in (h, t]} (eta_r sigma C / B)^2)
    momentum:   (m, theta) <- (beta^k m, theta + gain_k m) + (M, Theta),
                (M, Theta) ~ N(0, Sigma_2x2(h, t)) per coordinate

(closed forms, with learning-rate schedules, Keras `decay` and Nesterov, in
`tfdp_embed.mechanisms.lazy_math`). Rows are caught up for the next batch's
unique ids after each step (`after_apply(lookahead)`, ids as fed to the
layer, e.g. from `tfdp_embed.data.with_lookahead`) and, as a safety net,
by a read hook on every `DPEmbedding` lookup (first batch, epoch starts,
evaluation, a missing lookahead). Draws per step are then the floor:
(distinct rows of the next batch) x dim, plus dim more per row with
momentum unless the row owes a single step (its 2x2 covariance is rank
one). Catching a row up early is always exact, so wrong lookahead ids
only cost draws. Non-table variables get ordinary dense DP-SGD noise.

Lookahead or not: without it the read hook does every catch-up, in one
fused op that also returns the caught-up rows to the lookup (no second
gather; `DPEmbedding.set_read_hook`, `hook.gather`). On
the 2-core CPU of benchmarks/RESULTS.md that is the faster of the two
(step_time over 150 steps, x the non-private step at 10^5 / 10^6 / 10^7 /
5 10^7 rows: 1.36 / 1.32 / 1.30 / 1.35 on read against 1.43 / 1.48 / 1.56 /
1.63 with the lookahead, section 16:03:24Z): with both cores busy, catching
up the next batch's cold rows at the end of a step overlaps nothing. The lookahead is for
pipelines where that catch-up can run beside other work.

Plain SGD with aggregated generator noise (the common case) runs its
bookkeeping in custom ops (`tfdp_embed.ops.sparse_rows`): a read-hook or
flush catch-up is one `lazy_catch_up` (`lazy_catch_up_gather` for a
lookup) that reads the step counter, step
sums and history itself and draws its noise from the step's catch-up stream
(one generator key per step, shared with the dense noise: streams 0..n-1
dense, n, n+1, ... catch-ups); the lookahead catch-up is the same split in
two (`lazy_catch_up_split`: the draws run while the optimizer writes the
table, then the rows are added); `lazy_record_step` records the step's
eta^2 sigma^2 C^2 / B^2, the key and the counter. Without
momentum the one-step-ahead flag changes nothing, so touched rows need no
history write. Without the op library the same ops run as TensorFlow
(bit-identical given the op's normals). Momentum, per-step draws and
stateless noise use the TensorFlow path below.
`flush()` brings every row up to date; the model is then distributed
exactly as dense DP-SGD's. `owes_noise()` (O(1)), `owes_noise_tensor()`
and `assert_flushed()` let export and checkpoint code refuse an
un-flushed model. All state (histories, per-step sums, RNG) is in
variables: checkpoints resume un-flushed training exactly.

No un-flushed row leaves training: `init` installs a read guard
(`tfdp_embed.read_guard`) on each table and momentum slot, so every eager
read outside the training step (`numpy()`, `get_weights()`, weights files,
`.keras`, SavedModels, `tf.train.Checkpoint`, callbacks) flushes first,
and a checkpoint that holds this mechanism is written after one flush
(`_trackable_children`). Reads inside `read_guard.unguarded()` see the raw
training state: the training step, this class's own bookkeeping, and
`TrainingCheckpoint`, whose table is saved with the history of the noise it
still owes. `detach()` removes hooks and guards.

Example:
    >>> mechanism = LazyDP(l2_norm_clip=1.0, noise_multiplier=1.1)
    >>> dp_model = DPModel(model, mechanism=mechanism, expected_batch_size=256,
    ...                    lookahead=True)
    >>> dp_model.compile(optimizer=keras.optimizers.legacy.SGD(0.1, momentum=0.9),
    ...                  loss=loss)
    >>> dp_model.fit(with_lookahead(dataset, tables=...))
    >>> mechanism.flush()  # export does this, and refuses if noise is owed

References: Lim et al., "LazyDP: Co-Designing Algorithm-Software for
Scalable Training of Differentially Private Recommendation Models",
ASPLOS 2024, §5.2, Alg. 1 (lazy noise update, HistoryTable, aggregated
noise sampling); §3 (threat model: the final model is released).
"""

from __future__ import annotations

import functools
import weakref

import dp_accounting
import numpy as np

from tfdp_embed import read_guard
from tfdp_embed._keras import keras, tf
from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.layers.embedding import DPEmbedding
from tfdp_embed.mechanisms import lazy_math
from tfdp_embed.mechanisms.base import ClippedGradients, NoiseMechanism
from tfdp_embed.mechanisms.capabilities import (
    MIRRORED,
    MULTI_WORKER_MIRRORED,
    ONE_DEVICE,
    PARAMETER_SERVER,
    MechanismCapabilities,
)
from tfdp_embed.mechanisms.row_noise import check_row_noise, stateless_row_normals
from tfdp_embed.ops import sparse_rows

# History entries are (step << 1) | flag in an int32.
_MAX_STEPS = (1 << 30) - 1
_FLUSH_CHUNK_FLOATS = 1 << 21
# Rows owing at most this many steps get their momentum moments summed directly.
_DIRECT_WINDOW = 32


# Why LazyDP does not declare the synchronous strategies (quoted in their refusals).
_LAZY_SYNC_REASON = (
    "LazyDP adds each row's owed noise in its read hook, inside every replica's forward pass, "
    "for the ids that replica reads: the replicas of a synchronous strategy would add different "
    "noise to their copies of the mirrored table (and a row read on two replicas would get its "
    "owed noise twice). Use ParameterServerStrategy with one worker, one device, or a mechanism "
    "without deferred noise (DenseDPSGD, DPFEST, DPAdaFEST, DPAdaFESTPlus)."
)

# Per-mechanism traced flush functions; kept out of the mechanism so checkpoints and
# SavedModels never see them.
_FLUSH_FUNCTIONS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

# Everything here is straight-line TF with explicit tf.cond: autograph would only slow tracing.
_plain_python = tf.autograph.experimental.do_not_convert


def _raw_reads(method):
    """The mechanism's own bookkeeping reads the raw table: it knows what each row owes."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        with read_guard.unguarded():
            return method(*args, **kwargs)

    return wrapper


def _sgd_settings(optimizer) -> tuple:
    """(beta, nesterov, decay) of a tf-keras legacy SGD; refuses anything without a lazy form."""
    if optimizer is None:
        raise ValueError(
            "LazyDP.init needs the `optimizer` (a keras.optimizers.legacy.SGD): the deferred "
            "noise and momentum drift depend on its learning rate and momentum."
        )
    if not isinstance(optimizer, keras.optimizers.legacy.SGD):
        kind = type(optimizer).__name__
        if isinstance(optimizer, keras.optimizers.SGD):
            raise ValueError(
                "LazyDP needs `keras.optimizers.legacy.SGD`; received the new-style "
                f"keras.optimizers.{kind}, whose sparse momentum update decays the momentum of "
                "every row every step (a dense update) and has no per-row lazy counterpart here."
            )
        raise ValueError(
            f"LazyDP supports only SGD (keras.optimizers.legacy.SGD, with or without momentum and "
            f"a learning-rate schedule); received optimizer {kind}. An idle row's state under "
            f"{kind} after k noisy steps is not a Gaussian with a closed form (its statistics "
            "depend non-linearly on the noisy gradients), so its noise cannot be deferred "
            "exactly. Use mechanism 'adafest' (DP-AdaFEST), which only noises the rows it "
            "selects and needs no deferral, or 'dense'."
        )
    config = optimizer.get_config()
    for key in ("clipnorm", "clipvalue", "global_clipnorm"):
        if config.get(key) is not None:
            raise ValueError(
                f"LazyDP cannot use an optimizer with `{key}`={config[key]!r}: it would clip the "
                "noiseless sparse gradient instead of dense DP-SGD's noisy one, so the model "
                "would differ from DP-SGD. Per-example clipping already bounds the gradient."
            )
    momentum = getattr(optimizer, "momentum")
    if callable(momentum) and not isinstance(momentum, tf.Variable):
        raise ValueError(
            "LazyDP needs a constant `momentum` (the deferred-noise closed form depends on it); "
            f"received a callable {momentum!r}."
        )
    # Keras applies momentum as float32: use exactly that value in the closed form.
    beta = float(np.float32(momentum.numpy() if hasattr(momentum, "numpy") else momentum))
    if not 0.0 <= beta < 1.0:
        raise ValueError(
            f"LazyDP needs optimizer `momentum` in [0, 1); received {beta!r} (beta = 1 never "
            "forgets noise and the closed form divides by 1 - beta)."
        )
    return beta, bool(config.get("nesterov", False)), float(config.get("decay", 0.0) or 0.0)


class _StepSums(tf.Module):
    """Per-step running sums of the noise weights (float64, grows by doubling)."""

    def __init__(self, capacity: int = 1024):
        super().__init__(name="lazy_step_sums")
        self.sums = lazy_math.RunningSums(
            *[
                tf.Variable(
                    tf.zeros([capacity], tf.float64),
                    shape=tf.TensorShape([None]),
                    trainable=False,
                    name=name,
                )
                for name in lazy_math.RunningSums._fields
            ]
        )

    def record(self, step, weight, *, beta: float) -> None:
        """Writes the sums through `step` (>= 1) from those through `step - 1`."""
        capacity = tf.shape(self.sums.p_hi)[0]

        def grow():
            extra = tf.maximum(capacity, step + 1 - capacity)
            for var in self.sums:
                var.assign(tf.concat([var, tf.zeros([extra], tf.float64)], 0))
            return tf.constant(0)

        tf.cond(step >= capacity, grow, lambda: tf.constant(0))
        if beta == 0:
            # Plain SGD reads only P (S1, S2 feed the momentum moments): A and Q stay 0.
            zero = tf.zeros([], tf.float64)
            previous = lazy_math.RunningSums(
                tf.gather(self.sums.p_hi, step - 1), tf.gather(self.sums.p_lo, step - 1), zero, zero
            )
            new = lazy_math.advance_running_sums(previous, weight, beta=0.0)
            updated = zip(self.sums[:2], new[:2])
        else:
            updated = zip(self.sums, lazy_math.advance_running_sums(self.at(step - 1), weight, beta=beta))
        for var, value in updated:
            var.scatter_update(tf.IndexedSlices(value[None], step[None]))

    def at(self, steps) -> lazy_math.RunningSums:
        return lazy_math.RunningSums(*[tf.gather(var, steps) for var in self.sums])

    def weights(self, steps) -> tf.Tensor:
        """w_r for each step r >= 1 in `steps`."""
        now, before = self.at(steps), self.at(steps - 1)
        return (now.p_hi - before.p_hi) + (now.p_lo - before.p_lo)

    def recent_weights(self, now, size: int) -> tf.Tensor:
        """w at lags 0..size-1 from step `now` (0 before step 1)."""
        steps = now - tf.range(size)
        return tf.where(steps >= 1, self.weights(tf.maximum(steps, 1)), tf.zeros([], tf.float64))


class LazyDP(NoiseMechanism):
    """DP-SGD with deferred, aggregated noise on embedding rows (LazyDP).

    Args (keyword-only):
      l2_norm_clip: per-example clip norm C (> 0).
      noise_multiplier: sigma (>= 0); a dense DP-SGD step would add
        N(0, sigma^2 C^2) to every coordinate of the gradient sum.
      seed: int for reproducible noise (tests), None for OS entropy.
      aggregate: True (default) draws a row's owed noise in one draw
        (aggregated noise sampling); False draws each missed step's noise
        separately (LazyDP Alg. 1 with ANS disabled; for tests).
      row_noise: "generator" (default) or "stateless" (test mode, needs
        `seed`): with `aggregate=False` it adds exactly the numbers
        `DenseDPSGD(row_noise="stateless")` adds.
      flush_chunk_rows: rows caught up per chunk in `flush()`; default keeps
        each chunk's noise around 8 MB.

    The optimizer must be `keras.optimizers.legacy.SGD` (learning rate or
    schedule, `decay`, momentum in [0, 1), Nesterov or not); anything else
    is refused in `init` because no exact lazy form exists.

    Raises:
      ValueError, TypeError: on bad arguments (the message names them).

    References: LazyDP (Lim et al., ASPLOS 2024) §5.2, Alg. 1.
    """

    name = "lazy"
    capabilities = MechanismCapabilities(
        strategies=(ONE_DEVICE, PARAMETER_SERVER),
        parameter_server_workers=1,
        lookahead=True,
        defers_noise=True,
        needs_lookups=False,
        why_not=((MIRRORED, _LAZY_SYNC_REASON), (MULTI_WORKER_MIRRORED, _LAZY_SYNC_REASON)),
    )

    def __init__(
        self,
        *,
        l2_norm_clip: float,
        noise_multiplier: float,
        seed: int | None = None,
        aggregate: bool = True,
        row_noise: str = "generator",
        flush_chunk_rows: int | None = None,
    ):
        super().__init__(l2_norm_clip=l2_norm_clip, noise_multiplier=noise_multiplier, seed=seed)
        if not isinstance(aggregate, bool):
            raise TypeError(f"`aggregate` must be a bool; received {aggregate!r}.")
        if flush_chunk_rows is not None and (
            not isinstance(flush_chunk_rows, int) or isinstance(flush_chunk_rows, bool) or flush_chunk_rows <= 0
        ):
            raise ValueError(f"`flush_chunk_rows` must be a positive int or None; received {flush_chunk_rows!r}.")
        self.aggregate = aggregate
        self.row_noise = check_row_noise(row_noise, seed)
        self.flush_chunk_rows = flush_chunk_rows
        self.flushed_at = tf.Variable(0, dtype=tf.int64, trainable=False, name="flushed_at")
        self._histories: list = []
        self._step_sums = None
        self._stream = None
        self._beta, self._nesterov, self._decay = 0.0, False, 0.0
        self._initialized = False

    # -- state --------------------------------------------------------------
    def init(self, *, tables, dense_variables, optimizer) -> None:
        """Creates one HistoryTable per table, the step sums and momentum slots; installs read hooks.

        Raises:
          ValueError: for an optimizer without an exact lazy form or an unbuilt table.
        """
        if self._initialized:
            raise RuntimeError("LazyDP.init was already called; use one LazyDP per model.")
        self._beta, self._nesterov, self._decay = _sgd_settings(optimizer)
        super().init(tables=tables, dense_variables=dense_variables, optimizer=optimizer)
        optimizer.iterations  # noqa: B018 - created eagerly, read in update()
        # Appended to the list made in __init__ (not a new list): a checkpoint restored before
        # init fills each history as it is created.
        for index, layer in enumerate(self._tables):
            if not isinstance(layer, DPEmbedding):
                raise TypeError(f"`tables` must hold DPEmbedding layers; received {type(layer).__name__}.")
            if not layer.built:
                raise ValueError(f"Table {layer.name!r} is not built; build the model before LazyDP.init.")
            self._histories.append(
                tf.Variable(  # every row current (a checkpoint restored before or after overrides)
                    tf.fill([layer.vocabulary_size], 2 * self._now()),
                    trainable=False,
                    name=f"history_{layer.name}",
                )
            )
            read_guard.install(layer.embeddings, self._flush_before_read)
            if self._beta > 0:
                read_guard.install(optimizer.add_slot(layer.embeddings, "momentum"), self._flush_before_read)
            hook = functools.partial(self._bring_current, index)
            hook.gather = functools.partial(self._read_rows, index)  # see DPEmbedding.set_read_hook
            layer.set_read_hook(hook)
        self._by_name = {layer.name: i for i, layer in enumerate(self._tables)}
        self._step_sums = _StepSums() if self.noise_multiplier > 0 else None
        if self._step_sums is not None and self._beta == 0 and self.aggregate and self.row_noise == "generator":
            # (k0, k1, calls): plain-SGD catch-ups draw the stream (k0, k1 + calls); every step
            # resets it from the step's key. The initial key (used only if a restored history
            # owes noise before the first step) comes from `seed`, else OS entropy: not from
            # the generator, whose sequence feeds the dense noise.
            initial = np.random.SeedSequence(self.seed).generate_state(2, np.uint64).view(np.int64)
            self._stream = tf.Variable(
                np.concatenate([initial, np.zeros([1], np.int64)]), trainable=False, name="catch_up_stream"
            )
        self._initialized = True

    def rekey_from_entropy(self) -> bool:
        """Re-keys the generator and the catch-up stream from OS entropy (unless `seed` was given).

        The stream `(k0, k1, calls)` keys the catch-ups that run before the
        next step draws a fresh key (rows read by the first forward pass
        after a restore, or a flush): restored as saved, two restores would
        add the same owed noise.
        """
        if not super().rekey_from_entropy():
            return False
        if self._stream is not None:
            key = tf.raw_ops.NonDeterministicInts(shape=[2], dtype=tf.int64)
            self._stream.assign(tf.concat([key, tf.zeros([1], tf.int64)], 0))
        return True

    def _unseeded_rng_state(self) -> tuple:
        return (*super()._unseeded_rng_state(), "_stream")

    def detach(self) -> None:
        """Removes the read hooks and read guards; rows read afterwards are not caught up."""
        for layer in self._tables:
            layer.set_read_hook(None)
            read_guard.remove(layer.embeddings)
            if self._beta > 0:
                read_guard.remove(self._optimizer.get_slot(layer.embeddings, "momentum"))

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        """A checkpoint holding this mechanism is written flushed, unless written in `read_guard.unguarded()`.

        Listing the children comes before any value is serialized, so the
        table, momentum, history and RNG states it saves are all taken after
        the flush (a flush at the table's read alone could follow the save of
        the history or RNG state). `TrainingCheckpoint` writes inside
        `unguarded()`: training state, un-flushed.
        """
        if save_type == "checkpoint" and read_guard.active():
            with read_guard.unguarded():
                self._flush_before_read()
        return super()._trackable_children(save_type, **kwargs)

    def _flush_before_read(self) -> None:
        """The read guard of every table (and momentum slot): an eager read sees a flushed table.

        Installed by `init` with `tfdp_embed.read_guard`: `numpy()`,
        `get_weights()`, weights files, checkpoints and SavedModels of the
        table read it eagerly outside the training step, and get every row
        with its owed noise (catching rows up early is exact). Reads in the
        traced training step are not guarded: its read hooks catch up what
        it reads.
        """
        if self.owes_noise():
            self.flush()

    # -- the step -----------------------------------------------------------
    @_plain_python
    @_raw_reads
    def update(self, clipped: ClippedGradients) -> list:
        """Dense noise on non-table variables; tables get their noiseless sparse gradient.

        Touched rows are first brought up to date (normally the read hook or
        the lookahead already did), then flagged: the optimizer applies their
        gradient at step t, their step-t noise is owed.
        """
        self._require_init()
        # State changes wait for the batch: at the end of a dataset Keras runs the step
        # function once more and only its data-dependent ops fail, so without this the
        # step counter and the step sums would advance for a step that never happened.
        # (Table indices, not values: the values unused here are pruned, see TableGradient.averaged.)
        batch = [clipped.batch_size, *(t.gradient.indices for t in clipped.tables), *(g for _, g in clipped.dense)]
        with tf.control_dependencies(batch):
            if self._fused_step():
                return self._fused_update(clipped)
            now = self._now()
            tf.debugging.assert_less(now, _MAX_STEPS, message="LazyDP's int32 history holds 2^30 steps.")
            if self._step_sums is not None:
                lr = tf.cast(self._learning_rate(), tf.float64)
                std = lr * self._noise_scale(clipped)
                self._step_sums.record(now + 1, tf.square(std), beta=self._beta)
            out = self._dense_noised(clipped, self.noise_multiplier)
            for table in clipped.tables:
                index = self._table_index(table)
                grad = table.gradient
                rows = tf.cast(grad.indices, tf.int64)
                self._bring_current(index, rows, unique=True, stamp=2 * now + 1)
                out.append((table.averaged_gradient(clipped.expected_batch_size), table.variable))
            self.steps.assign_add(1)
        return out

    def _fused_update(self, clipped: ClippedGradients) -> list:
        """`update` for plain SGD with aggregated generator noise: a handful of ops per step.

        One key per step: the dense variables' noise uses its streams
        0..n-1; the catch-ups that follow (this step's lookahead, the next
        step's read hooks) use streams n, n+1, ... (`sparse_rows.lazy_record_step`
        stores the key, records the step's noise weight and advances the step).

        Touched rows need no history write here: without momentum a row's
        deterministic state never drifts, so the one-step-ahead flag changes
        nothing (its owed noise starts after step `now` either way), and the
        read hook made every row the forward pass read current. A row the
        optimizer steps without reading it is not a read: its noise, owed
        from its history on, is added before its next read, as usual.
        """
        key = self.generator.uniform_full_int([2], dtype=tf.int64)
        dense = [grad for _, grad in clipped.dense]
        noised = sparse_rows.noised_values_many(
            self.generator,
            dense,
            stddev=self.noise_multiplier * self.l2_norm_clip,
            divisor=clipped.expected_batch_size,
            key=key,
        )
        out = [(grad, variable) for grad, (variable, _) in zip(noised, clipped.dense)]
        now = None
        for table in clipped.tables:
            index = self._table_index(table)
            grad = table.gradient
            if not self._fused(index):  # a table the op cannot update (float64, not a resource variable)
                now = self._now() if now is None else now
                self._bring_current(index, tf.cast(grad.indices, tf.int64), unique=True, stamp=2 * now + 1)
            out.append((table.averaged_gradient(clipped.expected_batch_size), table.variable))
        sums = self._step_sums.sums
        sparse_rows.lazy_record_step(
            sums.p_hi, sums.p_lo, self.steps, self._stream,
            self._learning_rate(), self._noise_scale(clipped), key, first_stream=len(dense),
        )
        return out

    def _noise_scale(self, clipped: ClippedGradients) -> float:
        """sigma C / B: a step's noise std on a weight is eta times this."""
        return self.noise_multiplier * self.l2_norm_clip / float(clipped.expected_batch_size)

    @_plain_python
    @_raw_reads
    def after_apply(self, lookahead: dict | None) -> None:
        """Catches up the next batch's rows: `lookahead` maps table name -> ids as fed to the layer.

        Ids are bucketed with the layer's `bucket_ids` (hashing, range check)
        and deduplicated. Wrong or missing ids never break exactness (the read
        hook catches every row before it is read); they only cost draws.
        """
        self._require_init()
        if not lookahead:
            return
        for name, ids in lookahead.items():
            if name not in self._by_name:
                raise KeyError(
                    f"`lookahead` names table {name!r}; LazyDP's tables are {sorted(self._by_name)}."
                )
            index = self._by_name[name]
            # The fused op checks the range itself (one op instead of min, max and an assert).
            rows = self._tables[index].bucket_ids(ids, check_range=not self._fused(index))
            if isinstance(rows, tf.RaggedTensor):
                rows = rows.flat_values
            elif isinstance(rows, tf.SparseTensor):
                rows = rows.values
            if self._fused(index):  # the op deduplicates (same rows, same order)
                # Two ops: the draws need not wait for the optimizer's table write.
                sums = self._step_sums.sums
                sparse_rows.lazy_catch_up_split(
                    self._tables[index].embeddings, self._histories[index], rows,
                    sums.p_hi, sums.p_lo, self.steps, self._stream,
                )
            else:
                rows = tf.reshape(tf.cast(rows, tf.int64), [-1])
                self._bring_current(index, tf.unique(rows).y, unique=True)

    # -- leaving training -----------------------------------------------------
    @_raw_reads
    def flush(self) -> None:
        """Brings every row of every table up to date, `flush_chunk_rows` rows at a time."""
        self._require_init()
        for index, layer in enumerate(self._tables):
            chunk = self.flush_chunk_rows or max(
                1, _FLUSH_CHUNK_FLOATS // (layer.output_dim * (2 if self._beta > 0 else 1))
            )
            catch_up = self._flush_function(index)
            for start in range(0, layer.vocabulary_size, chunk):
                catch_up(tf.constant(start, tf.int64), tf.constant(min(start + chunk, layer.vocabulary_size), tf.int64))
        self.flushed_at.assign(self.steps)

    def owes_noise(self) -> bool:
        """True when some row may be behind (a step ran since the last flush); O(1)."""
        if not self._initialized:
            return False
        return bool(self.owes_noise_tensor().numpy())

    def owes_noise_tensor(self) -> tf.Tensor:
        """TF-side `owes_noise` (a scalar bool), for use inside `tf.function`s."""
        return self.steps > self.flushed_at

    def assert_flushed(self, what: str = "export") -> tf.Operation | None:
        """Refuses an un-flushed model: raises PrivacyContractError eagerly, returns an assert op in graphs."""
        message = (
            f"LazyDP refuses to {what} a model that still owes noise: rows not read since their "
            "last update lack their deferred DP-SGD noise (and momentum drift), so the weights "
            "are not a DP-SGD model. Call flush() first."
        )
        if tf.executing_eagerly():
            if self.owes_noise():
                raise PrivacyContractError(message)
            return None
        return tf.debugging.Assert(tf.logical_not(self.owes_noise_tensor()), [message])

    # -- accounting ---------------------------------------------------------
    def step_event(self, sampling_probability: float) -> dp_accounting.DpEvent:
        return dp_accounting.PoissonSampledDpEvent(
            sampling_probability, dp_accounting.GaussianDpEvent(self.noise_multiplier)
        )

    def report(self) -> dict:
        report = super().report()
        report.update(
            noise="lazy (deferred per row, aggregated sampling)" if self.aggregate else "lazy (deferred per row)",
            momentum=self._beta,
            nesterov=self._nesterov,
        )
        report["caveats"].append(
            "LazyDP defers the noise (and momentum drift) of embedding rows a step does not "
            "read and adds the exact owed Gaussian in one draw before the row is read again; "
            "every released model is flushed first, so it has the distribution of a dense "
            "DP-SGD model and the same (epsilon, delta). Un-flushed intermediate checkpoints "
            "are not DP-SGD iterates and must not be released (LazyDP §3 threat model)."
        )
        return report

    # -- internals ------------------------------------------------------------
    def _require_init(self) -> None:
        if not self._initialized:
            raise RuntimeError("Call LazyDP.init(tables=..., dense_variables=..., optimizer=...) first.")

    def _flush_function(self, index: int):
        """A traced catch-up of rows [start, stop) of table `index`, cached outside tracking."""
        cache = _FLUSH_FUNCTIONS.setdefault(self, {})
        if index not in cache:
            mechanism = weakref.ref(self)  # the cache must not keep its key alive
            cache[index] = tf.function(
                lambda start, stop: mechanism()._bring_current(index, tf.range(start, stop), unique=True),
                input_signature=[tf.TensorSpec([], tf.int64)] * 2,
                autograph=False,
            )
        return cache[index]

    def _table_index(self, table) -> int:
        for index, layer in enumerate(self._tables):
            if layer.embeddings is table.variable:
                return index
        raise ValueError(f"Table {table.layer.name!r} was not given to LazyDP.init.")

    def _now(self) -> tf.Tensor:
        return tf.cast(self.steps, tf.int32)

    def _learning_rate(self) -> tf.Tensor:
        """eta of the coming apply, computed as Keras's legacy `_decayed_lr` does (float32)."""
        optimizer = self._optimizer
        lr = optimizer.learning_rate
        if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule):
            lr = lr(tf.cast(optimizer.iterations, tf.float32))
        elif callable(lr) and not isinstance(lr, tf.Variable):
            lr = lr()
        lr = tf.cast(lr, tf.float32)
        if self._decay > 0:
            lr = lr / (1.0 + tf.cast(self._decay, tf.float32) * tf.cast(optimizer.iterations, tf.float32))
        return lr

    def _fused_step(self) -> bool:
        """True when a step's bookkeeping is `sparse_rows.lazy_record_step` (plain SGD, aggregated, generator noise)."""
        return (
            self._beta == 0
            and self.aggregate
            and self.row_noise == "generator"
            and self._step_sums is not None
            and self._stream is not None
            and not tf.distribute.has_strategy()
        )

    def _fused(self, index: int) -> bool:
        """True when table `index` is caught up by `sparse_rows.lazy_catch_up` (one op; TF ops without the library)."""
        var = self._tables[index].embeddings
        return self._fused_step() and var.dtype.base_dtype == tf.float32 and hasattr(var, "handle")

    @_plain_python
    @_raw_reads
    def _read_rows(self, index: int, ids):
        """The lookup's read: catches up `ids` and returns their rows in one op, or None.

        None (the layer then runs the read hook and its own gather) unless
        table `index` is caught up by the fused op (`_fused`).
        """
        if not self._fused(index):
            return None
        sums = self._step_sums.sums
        return sparse_rows.lazy_catch_up_gather(
            self._tables[index].embeddings, self._histories[index], ids, sums.p_hi, sums.p_lo, self.steps, self._stream
        )

    @_plain_python
    @_raw_reads
    def _bring_current(self, index: int, ids, *, unique: bool = False, stamp=None) -> tf.Tensor:
        """Catches up the rows among `ids` that are behind the current step; returns whether any were.

        `stamp` (default: current) is then written to the history of every row
        among `ids` (update() flags the rows the optimizer steps with 2 now + 1).
        Plain SGD with aggregated generator noise runs as one fused op
        (`tfdp_embed.ops.sparse_rows.lazy_catch_up`: the catch-up below, its
        key from the step's stream instead of a generator draw), which marks
        rows current; a `stamp` (touched rows of a table the op cannot
        update) takes the TensorFlow path.
        """
        history = self._histories[index]
        if self._fused(index) and stamp is None:
            sums = self._step_sums.sums
            caught_up = sparse_rows.lazy_catch_up(
                self._tables[index].embeddings, history, ids, sums.p_hi, sums.p_lo, self.steps, self._stream
            )
            return caught_up > 0
        rows = tf.reshape(tf.cast(ids, tf.int64), [-1])
        now = self._now()
        behind = tf.not_equal(tf.gather(history, rows), 2 * now)

        def catch_up():
            stale = tf.boolean_mask(rows, behind)
            if not unique:
                stale = tf.unique(stale).y
            self._catch_up(index, stale, now)
            return tf.constant(True)

        result = tf.cond(tf.reduce_any(behind), catch_up, lambda: tf.constant(False))
        if stamp is not None:
            with tf.control_dependencies([result]):
                history.scatter_update(tf.IndexedSlices(tf.fill(tf.shape(rows), stamp), rows))
        return result

    def _catch_up(self, index: int, rows: tf.Tensor, now: tf.Tensor) -> None:
        """Adds owed drift and noise to unique `rows` and marks them current at `now`."""
        layer = self._tables[index]
        var, history = layer.embeddings, self._histories[index]
        packed = tf.gather(history, rows)
        noise_from = tf.bitwise.right_shift(packed, 1)
        state_from = noise_from + tf.bitwise.bitwise_and(packed, 1)
        theta_delta, m_new, slot = None, None, None
        if self._beta > 0:
            slot = self._optimizer.get_slot(var, "momentum")
            m = tf.gather(slot, rows)
            decay, gain = lazy_math.momentum_drift(now - state_from, beta=self._beta, nesterov=self._nesterov)
            m_new = tf.cast(decay, var.dtype)[:, None] * m
            theta_delta = tf.cast(gain, var.dtype)[:, None] * m
        if self._step_sums is not None:
            noise_m, noise_theta = self._owed_noise(rows, noise_from, now, layer.output_dim)
            noise_theta = tf.cast(noise_theta, var.dtype)
            theta_delta = noise_theta if theta_delta is None else theta_delta + noise_theta
            if m_new is not None:
                m_new = m_new + tf.cast(noise_m, var.dtype)
        if m_new is not None:
            slot.scatter_update(tf.IndexedSlices(m_new, rows))
        if theta_delta is not None:
            var.scatter_add(tf.IndexedSlices(theta_delta, rows))
        history.scatter_update(tf.IndexedSlices(tf.fill(tf.shape(rows), 2 * now), rows))

    def _normals(self, rows, steps, shape) -> tf.Tensor:
        if self.row_noise == "stateless":
            return stateless_row_normals(seed=self.seed, steps=steps, rows=rows, shape=shape)
        return self._noise_like(tf.concat([tf.shape(rows), shape], 0), 1.0)

    def _owed_noise(self, rows, noise_from, now, dim) -> tuple:
        """(M, Theta) `[n, dim]` float32 owed by `rows` for steps (noise_from, now]; M None without momentum."""
        if not self.aggregate:
            return self._owed_noise_per_step(rows, noise_from, now, dim)
        sums = self._step_sums
        if self._beta == 0:
            s0, _, _ = lazy_math.range_sums(sums.at(noise_from), sums.at(now), now - noise_from, beta=0.0)
            z = self._normals(rows, -now, [dim])  # negative steps: a key space apart from per-step draws
            return None, tf.cast(tf.sqrt(s0), tf.float32)[:, None] * z
        var_m, cov, var_theta = lazy_math.owed_noise_moments(
            sums.at(noise_from),
            sums.at(now),
            now - noise_from,
            sums.recent_weights(now, _DIRECT_WINDOW),
            beta=self._beta,
            nesterov=self._nesterov,
        )
        l11, l21, l22 = (tf.cast(x, tf.float32)[:, None] for x in lazy_math.cholesky_2x2(var_m, cov, var_theta))
        if self.row_noise == "stateless":
            z = self._normals(rows, -now, [2, dim])
            x, y = z[:, 0], z[:, 1]
        else:
            # A row owing one step (touched last step, read again now: the hot rows) has a
            # rank-one covariance, M = Theta / (1 + nesterov beta): it needs dim draws, not 2 dim.
            x = self._normals(rows, -now, [dim])
            two = tf.where(now - noise_from > 1)
            y = tf.scatter_nd(two, self._normals(tf.gather_nd(rows, two), -now, [dim]), tf.shape(x, tf.int64))
        return l11 * x, l21 * x + l22 * y

    def _owed_noise_per_step(self, rows, noise_from, now, dim) -> tuple:
        """Alg. 1 with ANS disabled: each missed step r draws its own u_r = -eta_r z_r / B."""
        n = tf.shape(rows)[0]
        steps = tf.ragged.range(noise_from + 1, now + 1)
        pair_steps = steps.flat_values
        owner = tf.cast(steps.value_rowids(), tf.int32)
        scale = -tf.sqrt(tf.maximum(self._step_sums.weights(pair_steps), 0.0))
        z = self._normals(tf.gather(rows, owner), pair_steps, [dim])
        u = tf.cast(scale, tf.float32)[:, None] * z
        coef_m, coef_theta = lazy_math.propagation_coefficients(
            now - pair_steps, beta=self._beta, nesterov=self._nesterov
        )
        theta = tf.math.unsorted_segment_sum(tf.cast(coef_theta, tf.float32)[:, None] * u, owner, n)
        if self._beta == 0:
            return None, theta
        return tf.math.unsorted_segment_sum(tf.cast(coef_m, tf.float32)[:, None] * u, owner, n), theta
