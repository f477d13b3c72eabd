"""LazyDP: dense DP-SGD's distribution at a per-step cost independent of the vocabulary.

Dense DP-SGD moves every embedding row every step (its noise, and with
momentum the drift m <- beta m). LazyDP defers both for rows nobody reads:
each table keeps a history of the step through which each row's noise was
applied (`lazy_history`), and before a row is read again it receives the
exact sum of everything it missed (`lazy_math` holds the closed forms).
Catching a row up early is always exact, so rows are caught up

* by a read hook on every `DPEmbedding` lookup, which covers every read
  (first batch, epoch starts, evaluation, no lookahead), and
* optionally after each step, for the next batch's ids (`after_apply`,
  ids from `tfdp_embed.data.with_lookahead`): this moves the catch-up out
  of the next lookup, which pays only where it overlaps other work (step
  times with and without it: benchmarks/RESULTS.md, section (a)). Wrong
  lookahead ids cost draws, never exactness.

Two paths implement the catch-up: `lazy_fused` (custom ops) for plain SGD
with aggregated generator noise, the common case, and `lazy_catch_up`
(TensorFlow ops) for momentum, per-step draws and stateless noise.
Non-table variables get ordinary dense DP-SGD noise.

No un-flushed row leaves training. `flush()` brings every row up to date
(the model is then distributed exactly as dense DP-SGD's); `init` installs
a read guard (`tfdp_embed.read_guard`) on each table and momentum slot, so
every eager read outside the training step (`numpy()`, `get_weights()`,
weights files, SavedModels, `tf.train.Checkpoint`, callbacks) flushes
first. `TrainingCheckpoint` saves the raw training state inside
`read_guard.unguarded()`, with the histories that say what each row owes:
all state is in variables, so training resumes un-flushed exactly.

Example:
    >>> mechanism = LazyDP(l2_norm_clip=1.0, noise_multiplier=1.1)
    >>> dp_model = DPModel(model, mechanism=mechanism, expected_batch_size=256,
    ...                    lookahead=True)
    >>> dp_model.compile(optimizer=keras.optimizers.legacy.SGD(0.1, momentum=0.9),
    ...                  loss=loss)
    >>> dp_model.fit(with_lookahead(dataset, lambda features: {"items": features}))
    >>> mechanism.flush()  # export does this, and refuses if noise is owed

References: Lim et al., "LazyDP: Co-Designing Algorithm-Software for
Scalable Training of Differentially Private Recommendation Models",
ASPLOS 2024, §5.2, Alg. 1 (lazy noise update, HistoryTable, aggregated
noise sampling); §3 (threat model: the final model is released).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable

import dp_accounting
import tensorflow as tf

from tfdp_embed import read_guard
from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.mechanisms.base import ClippedGradients, NoiseMechanism
from tfdp_embed.mechanisms.capabilities import (
    MIRRORED,
    MULTI_WORKER_MIRRORED,
    ONE_DEVICE,
    PARAMETER_SERVER,
    MechanismCapabilities,
)
from tfdp_embed.mechanisms.lazy import catch_up as lazy_catch_up
from tfdp_embed.mechanisms.lazy import fused as lazy_fused
from tfdp_embed.mechanisms.lazy import history as lazy_history
from tfdp_embed.mechanisms.lazy import sgd as lazy_sgd
from tfdp_embed.mechanisms.row_noise import check_row_noise
from tfdp_embed.mechanisms.tables import EmbeddingTable
from tfdp_embed.ops import sparse_rows

# Floats of noise per flush chunk (8 MB) when `flush_chunk_rows` is not given.
_FLUSH_CHUNK_FLOATS = 1 << 21

# Why LazyDP does not declare the synchronous strategies (quoted in their refusals).
_LAZY_SYNC_REASON = (
    "LazyDP adds each row's owed noise in its read hook, inside every replica's forward pass, "
    "for the ids that replica reads: the replicas of a synchronous strategy would add different "
    "noise to their copies of the mirrored table (and a row read on two replicas would get its "
    "owed noise twice). Use ParameterServerStrategy with one worker, one device, or a mechanism "
    "without deferred noise (DenseDPSGD, DPFEST, DPAdaFEST, DPAdaFESTPlus)."
)

# Per-mechanism traced functions (flush, catch-up), each shared by all tables; kept out
# of the mechanism so checkpoints and SavedModels never see them.
_TRACED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

# Everything here is straight-line TF with explicit tf.cond: autograph would only slow tracing.
_plain_python = tf.autograph.experimental.do_not_convert


def _raw_reads(method):
    """The mechanism's own bookkeeping reads the raw table: it knows what each row owes."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        with read_guard.unguarded():
            return method(*args, **kwargs)

    return wrapper


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
    is refused in `init` because no exact lazy form exists (`lazy_sgd`).

    State (checkpointed by these names): `_histories` (one `history_<table>`
    per table), `_step_sums` (`lazy_step_sums`), `_stream`
    (`catch_up_stream`, fused path only), `flushed_at`, `steps`, `generator`.

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
        mixed_precision=True,
        noised_rows="touched",
        read_hooks=True,
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
        self._step_sums: lazy_history.StepSums | None = None
        self._stream = None
        self._beta, self._nesterov, self._decay = 0.0, False, 0.0
        self._initialized = False

    # -- state --------------------------------------------------------------
    def init(self, *, tables, dense_variables, optimizer) -> None:
        """Creates one history per table, the step sums and momentum slots; installs hooks and guards.

        Raises:
          ValueError: for an optimizer without an exact lazy form or an unbuilt table.
        """
        if self._initialized:
            raise RuntimeError("LazyDP.init was already called; use one LazyDP per model.")
        optimizer = lazy_sgd.adapt(optimizer)
        self._beta, self._nesterov, self._decay = optimizer.settings()
        super().init(tables=tables, dense_variables=dense_variables, optimizer=optimizer)
        optimizer.iterations  # noqa: B018 - created eagerly, read in update()
        for index, layer in enumerate(self._tables):
            self._init_table(index, layer)
        self._by_name = {layer.name: i for i, layer in enumerate(self._tables)}
        self._step_sums = lazy_history.StepSums() if self.noise_multiplier > 0 else None
        if lazy_fused.applies(
            beta=self._beta, aggregate=self.aggregate, row_noise=self.row_noise, noise_multiplier=self.noise_multiplier
        ):
            self._stream = lazy_fused.new_catch_up_stream(self.seed)
        self._initialized = True

    def _init_table(self, index: int, layer) -> None:
        """The table's history (all rows current), read guards, and read hook."""
        if not callable(getattr(layer, "set_read_hook", None)):
            raise TypeError(f"`tables` must hold embedding layers (DPEmbedding); received {type(layer).__name__}.")
        if not getattr(layer, "built", True) or not isinstance(layer, EmbeddingTable):
            raise ValueError(f"Table {layer.name!r} is not built; build the model before LazyDP.init.")
        # Appended to the list made in __init__ (not a new list): a checkpoint restored before
        # init fills each history as it is created (and one restored after overrides it).
        self._histories.append(lazy_history.new_history(layer, self._now()))
        read_guard.install(layer.embeddings, self._flush_before_read)
        if self._beta > 0:
            read_guard.install(self._optimizer.momentum_slot(layer.embeddings, create=True), self._flush_before_read)
        hook = functools.partial(self._bring_current, index)
        hook.gather = functools.partial(self._read_rows, index)  # type: ignore[attr-defined]  # DPEmbedding.set_read_hook
        layer.set_read_hook(hook)

    def rekey_from_entropy(self) -> bool:
        """Re-keys the generator and the catch-up stream from OS entropy (unless `seed` was given).

        The stream keys the catch-ups that run before the next step draws a
        fresh key (rows read by the first forward pass after a restore, or a
        flush): restored as saved, two restores would add the same owed noise.
        """
        if not super().rekey_from_entropy():
            return False
        if self._stream is not None:
            lazy_fused.rekey(self._stream)
        return True

    def _unseeded_rng_state(self) -> tuple:
        return (*super()._unseeded_rng_state(), "_stream")

    def detach(self) -> None:
        """Removes the read hooks and read guards; rows read afterwards are not caught up."""
        for layer in self._tables:
            layer.set_read_hook(None)
            read_guard.remove(layer.embeddings)
            if self._beta > 0:
                read_guard.remove(self._optimizer.momentum_slot(layer.embeddings))

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
        """The read guard of every table and momentum slot: an eager read sees a flushed table.

        Reads in the traced training step are not guarded: its read hooks
        catch up what it reads.
        """
        if self.owes_noise():
            self.flush()

    # -- the step -----------------------------------------------------------
    @_plain_python
    @_raw_reads
    def update(self, clipped: ClippedGradients) -> list:
        """Dense noise on non-table variables; tables get their noiseless sparse gradient.

        The rows a table's gradient touches are first brought up to date
        (normally the read hook or the lookahead already did); on the
        TensorFlow path they are then flagged: the optimizer applies their
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
            return self._tf_update(clipped)

    def _fused_update(self, clipped: ClippedGradients) -> list:
        """`update` on the fused path (`lazy_fused`): a handful of ops per step."""
        key, out = lazy_fused.noised_dense(self.generator, clipped, stddev=self.noise_multiplier * self.l2_norm_clip)
        now = None
        for table in clipped.tables:
            index = self._table_index(table)
            if not self._fused(index):  # a table the ops cannot update (float64, not a resource variable)
                now = self._now() if now is None else now
                self._stamp_stepped_rows(index, table, now)
            out.append((table.averaged_gradient(clipped.expected_batch_size), table.variable))
        lazy_fused.record_step(
            self._op_state(), self._learning_rate(), self._noise_scale(clipped), key, first_stream=len(clipped.dense)
        )
        return out

    def _tf_update(self, clipped: ClippedGradients) -> list:
        """`update` on the TensorFlow path: step sums, dense noise, stepped rows flagged."""
        now = self._now()
        tf.debugging.assert_less(now, lazy_history.MAX_STEPS, message="LazyDP's int32 history holds 2^30 steps.")
        if self._step_sums is not None:
            lr = tf.cast(self._learning_rate(), tf.float64)
            std = lr * self._noise_scale(clipped)
            self._step_sums.record(now + 1, tf.square(std), beta=self._beta)
        out = self._dense_noised(clipped, self.noise_multiplier)
        for table in clipped.tables:
            self._stamp_stepped_rows(self._table_index(table), table, now)
            out.append((table.averaged_gradient(clipped.expected_batch_size), table.variable))
        self.steps.assign_add(1)
        return out

    def _stamp_stepped_rows(self, index: int, table, now) -> None:
        """Catches up the rows the optimizer is about to step and flags them one step ahead."""
        rows = tf.cast(table.gradient.indices, tf.int64)
        self._bring_current(index, rows, unique=True, stamp=lazy_history.state_ahead(now))

    def _noise_scale(self, clipped: ClippedGradients) -> float:
        """sigma C / B: a step's noise std on a weight is eta times this."""
        return self.noise_multiplier * self.l2_norm_clip / float(clipped.expected_batch_size)

    def _learning_rate(self) -> tf.Tensor:
        return self._optimizer.learning_rate()

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
                raise KeyError(f"`lookahead` names table {name!r}; LazyDP's tables are {sorted(self._by_name)}.")
            index = self._by_name[name]
            rows = self._lookahead_rows(index, ids)
            if self._fused(index):  # the op deduplicates (same rows, same order)
                lazy_fused.catch_up_next_batch(
                    self._tables[index].embeddings, self._histories[index], rows, self._op_state()
                )
            else:
                rows = tf.reshape(tf.cast(rows, tf.int64), [-1])
                self._bring_current(index, tf.unique(rows).y, unique=True)

    def _lookahead_rows(self, index: int, ids) -> tf.Tensor:
        """Table `index`'s rows for the lookahead's `ids`, flat (repeats kept)."""
        # The fused op checks the range itself (one op instead of min, max and an assert).
        rows = self._tables[index].bucket_ids(ids, check_range=not self._fused(index))
        if isinstance(rows, tf.RaggedTensor):
            return rows.flat_values
        if isinstance(rows, tf.SparseTensor):
            return rows.values
        return rows

    # -- leaving training -----------------------------------------------------
    @_raw_reads
    def flush(self) -> None:
        """Brings every row of every table up to date, `flush_chunk_rows` rows at a time."""
        self._require_init()
        chunks = tuple(
            self.flush_chunk_rows or max(1, _FLUSH_CHUNK_FLOATS // (layer.output_dim * (2 if self._beta > 0 else 1)))
            for layer in self._tables
        )
        sizes = tf.constant([layer.vocabulary_size for layer in self._tables], tf.int64)
        self._traced("flush")(chunks, sizes)
        self.flushed_at.assign(self.steps)

    def _flush_tables(self, chunks: tuple, sizes: tf.Tensor) -> None:
        """The traced flush: each table's rows in chunks of `chunks[i]`, one chunk after the other.

        The sizes are an argument, not constants: with constant rows the
        graph optimiser would specialise the shared catch-up for each table.
        The chunks are caught up as the read hook catches up ids (rows in a
        range are unique already; `tf.unique` keeps their order): the
        catch-up's trace from the steps serves, none is made for the flush.
        """
        for index, (layer, chunk) in enumerate(zip(self._tables, chunks)):
            vocab = sizes[index]
            if layer.vocabulary_size <= chunk:
                self._bring_current(index, tf.range(vocab))
                continue

            def flush_chunk(start, index=index, chunk=chunk, vocab=vocab):
                rows = tf.range(start, tf.minimum(start + chunk, vocab))
                with tf.control_dependencies([self._bring_current(index, rows)]):
                    return start + chunk

            tf.while_loop(lambda start, vocab=vocab: start < vocab, flush_chunk, [tf.constant(0, tf.int64)])

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

    # -- catching rows up: choosing the path ------------------------------------
    def _fused_step(self) -> bool:
        """True when a step runs on the fused path (`lazy_fused`).

        The catch-up stream exists exactly for the settings that path
        implements (`lazy_fused.applies`); under a distribution strategy the
        TensorFlow path runs.
        """
        return self._stream is not None and not tf.distribute.has_strategy()

    def _fused(self, index: int) -> bool:
        """True when table `index` is caught up by the fused ops (TF ops without the library)."""
        return self._fused_step() and sparse_rows.takes_table(self._tables[index].embeddings)

    @_plain_python
    @_raw_reads
    def _read_rows(self, index: int, ids):
        """The lookup's read: catches up `ids` and returns their rows in one op, or None.

        None (the layer then runs the read hook and its own gather) unless
        table `index` is caught up by the fused ops (`_fused`).
        """
        if not self._fused(index):
            return None
        return lazy_fused.catch_up_and_gather(
            self._tables[index].embeddings, self._histories[index], ids, self._op_state()
        )

    @_plain_python
    @_raw_reads
    def _bring_current(self, index: int, ids, *, unique: bool = False, stamp=None) -> tf.Tensor:
        """Catches up the rows among `ids` that are behind the current step; returns whether any were.

        `stamp` (default: current) is then written to the history of every
        row among `ids`; a stamp (stepped rows of a table the fused ops
        cannot update) takes the TensorFlow path.
        """
        if self._fused(index) and stamp is None:
            return lazy_fused.catch_up(self._tables[index].embeddings, self._histories[index], ids, self._op_state())
        if tf.executing_eagerly():
            return lazy_catch_up.bring_current(
                self._table_state(index), ids, self._now(), self._owed_noise(), unique=unique, stamp=stamp
            )
        # Traced (a step, a flush, an evaluation): one traced function for every table and call site,
        # called the same way everywhere, so it is traced once: a read stamps its rows current (what
        # catching up writes anyway), and rows known to be unique go through `tf.unique` too.
        now = self._now()
        stamp = lazy_history.current(now) if stamp is None else stamp
        return self._traced("bring_current")(self._table_state(index), ids, now, unique=False, stamp=stamp)

    def _op_state(self) -> lazy_fused.OpState:
        assert self._step_sums is not None  # the fused path runs only with noise (lazy_fused.applies)
        sums = self._step_sums.sums
        return lazy_fused.OpState(sums.p_hi, sums.p_lo, self.steps, self._stream)

    def _table_state(self, index: int) -> lazy_catch_up.TableState:
        layer = self._tables[index]
        momentum = self._optimizer.momentum_slot(layer.embeddings) if self._beta > 0 else None
        return lazy_catch_up.TableState(layer.embeddings, self._histories[index], momentum, layer.output_dim)

    def _owed_noise(self) -> lazy_catch_up.OwedNoise:
        return lazy_catch_up.OwedNoise(
            self._step_sums, self._beta, self._nesterov, self.aggregate, self.row_noise, self.seed, self._noise_like
        )

    def _traced(self, name: str) -> Callable:
        """This mechanism's traced function `name` (each serves every table), cached outside tracking.

        "bring_current": `lazy_catch_up.bring_current_function`; "flush":
        `_flush_tables` of `chunks` (one trace for all tables; the catch-ups
        in it call "bring_current"). They hold the mechanism by a weak
        reference (a cache entry must not keep its key alive).
        """
        functions = _TRACED.setdefault(self, {})
        if name not in functions:
            mechanism = weakref.ref(self)
            makers = {
                "bring_current": lambda: lazy_catch_up.bring_current_function(
                    functools.partial(_owed_noise, mechanism)
                ),
                "flush": lambda: tf.function(functools.partial(_flush_tables, mechanism), autograph=False),
            }
            functions[name] = makers[name]()
        return functions[name]

    # -- internals ------------------------------------------------------------
    def _require_init(self) -> None:
        if not self._initialized:
            raise RuntimeError("Call LazyDP.init(tables=..., dense_variables=..., optimizer=...) first.")

    def _table_index(self, table) -> int:
        for index, layer in enumerate(self._tables):
            if layer.embeddings is table.variable:
                return index
        raise ValueError(f"Table {table.layer.name!r} was not given to LazyDP.init.")

    def _now(self) -> tf.Tensor:
        return tf.cast(self.steps, tf.int32)


def _flush_tables(mechanism: weakref.ref, chunks: tuple, sizes) -> None:
    owner = mechanism()
    assert owner is not None  # the op's owner outlives its graph
    owner._flush_tables(chunks, sizes)  # noqa: SLF001


def _owed_noise(mechanism: weakref.ref) -> lazy_catch_up.OwedNoise:
    owner = mechanism()
    assert owner is not None  # the op's owner outlives its graph
    return owner._owed_noise()  # noqa: SLF001


__all__ = ["LazyDP"]
