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
(TensorFlow ops) for momentum, per-step draws and stateless noise. `init`
chooses once which path, and which implementation of the fused one, runs
each table (`lazy_fused.choose`). Non-table variables get ordinary dense
DP-SGD noise. Helpers: `lazy_rows` (each table's catch-ups, on the path
chosen at init), `lazy_hooks` (read hooks, read guards, lookahead rows),
`lazy_traced` (the flush and the shared traced catch-up).

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
from tfdp_embed.mechanisms.lazy import hooks as lazy_hooks
from tfdp_embed.mechanisms.lazy import rows as lazy_rows
from tfdp_embed.mechanisms.lazy import sgd as lazy_sgd
from tfdp_embed.mechanisms.lazy import traced as lazy_traced
from tfdp_embed.mechanisms.row_noise import check_row_noise

# Why LazyDP does not declare the synchronous strategies (quoted in their refusals).
_LAZY_SYNC_REASON = (
    "LazyDP adds each row's owed noise in its read hook, inside every replica's forward pass, "
    "for the ids that replica reads: the replicas of a synchronous strategy would add different "
    "noise to their copies of the mirrored table (and a row read on two replicas would get its "
    "owed noise twice). Use ParameterServerStrategy with one worker, one device, or a mechanism "
    "without deferred noise (DenseDPSGD, DPFEST, DPAdaFEST, DPAdaFESTPlus)."
)
# The report's caveat: what a released LazyDP model is, and what must not be released.
_RELEASE_CAVEAT = (
    "LazyDP defers the noise (and momentum drift) of embedding rows a step does not "
    "read and adds the exact owed Gaussian in one draw before the row is read again; "
    "every released model is flushed first, so it has the distribution of a dense "
    "DP-SGD model and the same (epsilon, delta). Un-flushed intermediate checkpoints "
    "are not DP-SGD iterates and must not be released (LazyDP §3 threat model)."
)

_plain_python, _raw_reads = lazy_rows.plain_python, lazy_rows.raw_reads


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
        user_level=True,
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
        self._rows: lazy_rows.TableRows | None = None
        self._beta, self._nesterov, self._decay = 0.0, False, 0.0

    # -- state --------------------------------------------------------------
    def init(self, *, tables, dense_variables, optimizer) -> None:
        """Creates one history per table, the step sums and momentum slots; installs hooks and guards.

        Then chooses, once, what catches up each table (`lazy_fused.choose`).

        Raises:
          ValueError: for an optimizer without an exact lazy form or an unbuilt table.
        """
        if self._rows is not None:
            raise RuntimeError("LazyDP.init was already called; use one LazyDP per model.")
        optimizer = lazy_sgd.adapt(optimizer)
        self._beta, self._nesterov, self._decay = optimizer.settings()
        super().init(tables=tables, dense_variables=dense_variables, optimizer=optimizer)
        optimizer.iterations  # noqa: B018 - created eagerly, read in update()
        momenta = []
        for layer in self._tables:
            lazy_hooks.check_table(layer)
            # Appended to the list made in __init__ (not a new list): a checkpoint restored before
            # init fills each history as it is created (and one restored after overrides it).
            self._histories.append(lazy_history.new_history(layer, self._now()))
            momenta.append(self._momentum(layer, create=True))
        self._by_name = {layer.name: i for i, layer in enumerate(self._tables)}
        self._step_sums = lazy_history.StepSums() if self.noise_multiplier > 0 else None
        if lazy_fused.applies(
            beta=self._beta, aggregate=self.aggregate, row_noise=self.row_noise, noise_multiplier=self.noise_multiplier
        ):
            self._stream = lazy_fused.new_catch_up_stream(self.seed)
        state = None if self._stream is None else self._op_state()
        paths = lazy_fused.choose([layer.embeddings for layer in self._tables], self._histories, state)
        traced = functools.partial(self._traced, "bring_current")
        self._rows = lazy_rows.TableRows(
            self._tables, self._histories, momenta, paths, state, now=self._now, owed=self._owed_noise, traced=traced
        )
        self._rows.attach(guard=self._flush_before_read)

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
        if self._rows is not None:
            self._rows.detach()

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
        rows = self._require_init()
        # State changes wait for the batch: at the end of a dataset Keras runs the step
        # function once more and only its data-dependent ops fail, so without this the
        # step counter and the step sums would advance for a step that never happened.
        # (Table indices, not values: the values unused here are pruned, see TableGradient.averaged.)
        batch = [clipped.batch_size, *(t.gradient.indices for t in clipped.tables), *(g for _, g in clipped.dense)]
        with tf.control_dependencies(batch):
            if rows.fused_step():
                return self._fused_update(rows, clipped)
            return self._tf_update(rows, clipped)

    def _fused_update(self, rows: lazy_rows.TableRows, clipped: ClippedGradients) -> list:
        """`update` on the fused path (`lazy_fused`): a handful of ops per step."""
        key, out = lazy_fused.noised_dense(self.generator, clipped, stddev=self.noise_multiplier * self.l2_norm_clip)
        out += rows.stepped(clipped)  # a table the ops cannot update (float64, not a resource variable) is stamped
        assert rows.paths.step is not None and rows.state is not None  # a fused step has its ops
        learning_rate, scale = self._optimizer.learning_rate(), self._noise_scale(clipped)
        lazy_fused.record_step(rows.paths.step, rows.state, learning_rate, scale, key, first_stream=len(clipped.dense))
        return out

    def _tf_update(self, rows: lazy_rows.TableRows, clipped: ClippedGradients) -> list:
        """`update` on the TensorFlow path: step sums, dense noise, stepped rows flagged."""
        now = self._now()
        tf.debugging.assert_less(now, lazy_history.MAX_STEPS, message="LazyDP's int32 history holds 2^30 steps.")
        if self._step_sums is not None:
            lr = tf.cast(self._optimizer.learning_rate(), tf.float64)
            std = lr * self._noise_scale(clipped)
            self._step_sums.record(now + 1, tf.square(std), beta=self._beta)
        out = self._dense_noised(clipped, self.noise_multiplier)
        out += rows.stepped(clipped, now)
        self.steps.assign_add(1)
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
        rows = self._require_init()
        for name, ids in (lookahead or {}).items():
            if name not in self._by_name:
                raise KeyError(f"`lookahead` names table {name!r}; LazyDP's tables are {sorted(self._by_name)}.")
            rows.next_batch(self._by_name[name], ids)

    # -- leaving training -----------------------------------------------------
    @_raw_reads
    def flush(self) -> None:
        """Brings every row of every table up to date, `flush_chunk_rows` rows at a time."""
        self._require_init()
        chunks = lazy_traced.chunk_rows(self._tables, self.flush_chunk_rows, momentum=self._beta > 0)
        sizes = tf.constant([layer.vocabulary_size for layer in self._tables], tf.int64)
        self._traced("flush")(chunks, sizes)
        self.flushed_at.assign(self.steps)

    def _flush_tables(self, chunks: tuple, sizes: tf.Tensor) -> None:
        """The traced flush's body (`lazy_traced.flush_tables`)."""
        lazy_traced.flush_tables(self._require_init().bring_current, self._tables, chunks, sizes)

    def owes_noise(self) -> bool:
        """True when some row may be behind (a step ran since the last flush); O(1)."""
        if self._rows is None:
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
        report["caveats"].append(_RELEASE_CAVEAT)
        return report

    # -- catching rows up (`lazy_rows`) ----------------------------------------
    def _fused(self, index: int) -> bool:
        """True when table `index` is caught up by the fused path's ops (chosen at init)."""
        return self._require_init().table_ops(index) is not None

    def _op_state(self) -> lazy_fused.OpState:
        assert self._step_sums is not None  # the fused path runs only with noise (lazy_fused.applies)
        sums = self._step_sums.sums
        return lazy_fused.OpState(sums.p_hi, sums.p_lo, self.steps, self._stream)

    def _momentum(self, layer, *, create: bool = False) -> tf.Variable | None:
        """The momentum slot of `layer`'s table (created at init), None without momentum."""
        return self._optimizer.momentum_slot(layer.embeddings, create=create) if self._beta > 0 else None

    def _owed_noise(self) -> lazy_catch_up.OwedNoise:
        return lazy_catch_up.OwedNoise(
            self._step_sums, self._beta, self._nesterov, self.aggregate, self.row_noise, self.seed, self._noise_like
        )

    def _traced(self, name: str) -> Callable:
        """This mechanism's traced function `name`: "bring_current" or "flush" (`lazy_traced.function`)."""
        return lazy_traced.function(self, name)

    # -- internals ------------------------------------------------------------
    def _require_init(self) -> lazy_rows.TableRows:
        if self._rows is None:
            raise RuntimeError("Call LazyDP.init(tables=..., dense_variables=..., optimizer=...) first.")
        return self._rows

    def _now(self) -> tf.Tensor:
        return tf.cast(self.steps, tf.int32)


__all__ = ["LazyDP"]
