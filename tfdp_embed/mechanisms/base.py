"""The one interface every noise mechanism implements.

A mechanism is a small object with explicit state (optax style): `init`
creates its state as `tf.Variable`s it owns (step counter, RNG, LazyDP's
history table, FEST's selection, ...), so a `tf.train.Checkpoint` of the
mechanism captures all of it; `update` takes the clipped sums of
per-example gradients of one step and returns the gradients to apply.
Each step's privacy cost is reported as a `dp_accounting` event.

Train-step order (see `tfdp_embed.keras2.training`):
  forward + per-example loss -> per-example norms -> clip ->
  mechanism.update -> optimizer.apply -> mechanism.after_apply(lookahead)

Adding a mechanism means subclassing `NoiseMechanism`, declaring what it
supports in its `capabilities` (`tfdp_embed.mechanisms.capabilities`; the
base declares one device only) and registering it
(`tfdp_embed.mechanisms.register_mechanism`); no other mechanism changes.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import dp_accounting
import tensorflow as tf

from tfdp_embed._checks import check_positive
from tfdp_embed._rng import make_generator
from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.mechanisms.capabilities import MechanismCapabilities, capabilities_of, how_to_declare
from tfdp_embed.mechanisms.tables import EmbeddingTable
from tfdp_embed.ops import fast_normal, sparse_rows


@dataclasses.dataclass
class TableGradient:
    """The clipped gradient sum of one embedding table for one step.

    Attributes:
      layer: the `DPEmbedding` owning the table.
      variable: the table (`layer.embeddings`).
      gradient: `tf.IndexedSlices`, sum_i c_i * grad_i over touched rows,
        indices unique.
      occurrences: the batch's lookups into this table (for mechanisms
        that need per-example contribution maps, e.g. DP-AdaFEST).
      clip_factors: float32 `[batch]` per-example clip factors c_i.
      averaged: optional; returns `gradient` divided by the expected batch
        size B, computed in the clipping stage as sum_i (c_i / B) * grad_i:
        one `[batch]` multiply instead of one over the `[rows, dim]` values
        (rounding differs from `gradient.values / B` by about an ulp). Inside
        a `tf.function` only the sum that is used is computed: a mechanism
        that calls `averaged()` instead of dividing `gradient` costs nothing
        extra. None where the step cannot provide it (replicated steps).
      shared_rows: optional int64 rows read by data-independent computations
        this step (a candidate tower over the catalogue or a sample of it, a
        full-softmax scoring): every example's gradient touches them, and
        which rows they are does not depend on the data. Not in `occurrences`.
    """

    layer: EmbeddingTable
    variable: tf.Variable
    gradient: tf.IndexedSlices
    occurrences: list
    clip_factors: tf.Tensor
    averaged: Callable[[], tf.IndexedSlices] | None = None
    shared_rows: tf.Tensor | None = None

    def averaged_gradient(self, expected_batch_size: float) -> tf.IndexedSlices:
        """`gradient / expected_batch_size`: from `averaged` when given, else by dividing the values."""
        if self.averaged is not None:
            return self.averaged()
        grad = self.gradient
        return tf.IndexedSlices(grad.values / expected_batch_size, grad.indices, grad.dense_shape)


@dataclasses.dataclass
class ClippedGradients:
    """Everything a mechanism sees of one step.

    Attributes:
      tables: one `TableGradient` per embedding table.
      dense: `(variable, clipped_sum)` pairs for every other trainable variable.
      expected_batch_size: the divisor of the noised sum (q * N under Poisson
        sampling; Abadi et al. 2016 divide by the expected, not actual, size).
      batch_size: actual number of examples in the batch (int32 scalar).
    """

    tables: list
    dense: list
    expected_batch_size: float
    batch_size: tf.Tensor


class NoiseMechanism(tf.Module, abc.ABC):
    """Base class of all noise mechanisms.

    Subclasses set `name`, `is_dp`, `capabilities` (what they support:
    strategies, lookahead, deferred noise, one-off events; the base declares
    one device only), and implement `update` and `step_event`. They must
    noise every variable they are given: a mechanism never returns a
    noiseless gradient for a private variable.

    Args (keyword-only, shared by all subclasses):
      l2_norm_clip: per-example clip norm C (> 0).
      noise_multiplier: sigma (>= 0); noise std on a coordinate is sigma * C.
      seed: int for reproducible noise (tests), None for OS entropy.
    """

    name: ClassVar[str] = "base"
    is_dp: ClassVar[bool] = True
    clips_per_example: ClassVar[bool] = True
    capabilities: ClassVar[MechanismCapabilities] = MechanismCapabilities()

    def __init__(self, *, l2_norm_clip: float, noise_multiplier: float, seed: int | None = None):
        super().__init__(name=f"{self.name}_mechanism".replace("+", "_plus"))
        self.l2_norm_clip = check_positive("l2_norm_clip", l2_norm_clip)
        self.noise_multiplier = check_positive("noise_multiplier", noise_multiplier, allow_zero=True)
        self.seed = seed
        self.generator = make_generator(seed, seed_as="key")
        self.steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="steps")
        self._tables: list = []
        self._dense_variables: list = []
        self._optimizer: Any = None  # the Keras optimizer, from init

    # -- state --------------------------------------------------------------
    def init(self, *, tables: Sequence[EmbeddingTable], dense_variables: Sequence[tf.Variable], optimizer) -> None:
        """Creates per-variable state. Called once, before the first step."""
        self._tables = list(tables)
        self._dense_variables = list(dense_variables)
        self._optimizer = optimizer

    # -- the step -----------------------------------------------------------
    @abc.abstractmethod
    def update(self, clipped: ClippedGradients) -> list:
        """Returns `(gradient, variable)` pairs to apply: noised, divided by the expected batch size."""

    @tf.autograph.experimental.do_not_convert
    def after_apply(self, lookahead: dict | None) -> None:
        """Runs after the optimizer step; `lookahead` maps table name -> next batch's unique ids."""
        return None

    def flush(self) -> None:
        """Adds every owed noise term now; the model is then a DP-SGD model."""

    def owes_noise(self) -> bool:
        """True when some table rows still lack noise (only lazy mechanisms)."""
        return False

    def rekey_from_entropy(self) -> bool:
        """Replaces every random-number state with fresh OS entropy, unless `seed` was given.

        Called after restoring a checkpoint (`tfdp_embed.keras2.checkpointing`). An
        unseeded mechanism never writes its random-number state
        (`_trackable_children`), so there is none to restore; re-keying makes
        sure no state read from anywhere else is replayed: two runs drawing
        the same noise would differ by their exact gradient difference. With
        an explicit `seed` (tests) the restored state is kept, so a resumed
        run reproduces an uninterrupted one. Subclasses with more RNG state
        override this and call `super()`.

        Returns:
          True when the state was re-keyed.
        """
        if self.seed is not None:
            return False
        state = self.generator.state
        self.generator.reset(tf.raw_ops.NonDeterministicInts(shape=tf.shape(state), dtype=state.dtype))
        return True

    def _unseeded_rng_state(self) -> tuple:
        """Names of the attributes holding random-number state; never written to a file when unseeded."""
        return ("generator",)

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        """Checkpoints and SavedModels of an unseeded mechanism hold no random-number state.

        The state of a generator seeded from OS entropy is a secret of the
        run: from it every step's noise can be regenerated, and a restore of
        it replays that noise. It is therefore never written; a restored
        unseeded mechanism keeps its own fresh state (`rekey_from_entropy`).
        With an explicit `seed` (tests) the state is saved, so a resumed run
        reproduces an uninterrupted one.

        The optimizer is not the mechanism's state: its owner checkpoints it.
        Under `mixed_float16` the mechanism holds the `LossScaleOptimizer`'s
        inner optimizer, a second optimizer node beside the wrapper whose
        slots TensorFlow would then list twice and refuse to save.
        """
        children = super()._trackable_children(save_type, **kwargs)
        children.pop("_optimizer", None)
        if self.seed is None:
            for name in self._unseeded_rng_state():
                children.pop(name, None)
        return children

    # -- accounting ---------------------------------------------------------
    @abc.abstractmethod
    def step_event(self, sampling_probability: float) -> dp_accounting.DpEvent:
        """The privacy cost of one training step."""

    def setup_event(self) -> dp_accounting.DpEvent | None:
        """A one-off cost spent before training (e.g. DP-FEST's top-k selection).

        Only mechanisms declaring `capabilities.one_off_events` may return one
        (`one_off_events` refuses the others).
        """
        return None

    @property
    def selection_unit(self) -> str | None:
        """The privacy unit the counts behind a DP selection count in ("example", "user"); None: no selection.

        User-level batches (`tfdp_embed.contract.unit_axis`) need a selection counted per user.
        """
        return None

    def one_off_events(self) -> list:
        """Every one-off accounting event so far (`tfdp_embed.accounting.EventSource`); see `one_off_events()`."""
        return one_off_events(self)

    def report(self) -> dict:
        """Fields for the privacy report (noise multipliers, clip norms, caveats).

        Written beside released models (`privacy_report.json`): every field is
        a hyperparameter, a constant, or post-processing of the mechanism's
        DP outputs, never a statistic of un-noised training data (those go
        to `diagnostics`).
        """
        return {
            "mechanism": self.name,
            "is_dp": self.is_dp,
            "l2_norm_clip": self.l2_norm_clip,
            "noise_multiplier": self.noise_multiplier,
            "caveats": [],
        }

    def diagnostics(self) -> dict:
        """Training statistics computed from UN-NOISED data: NOT differentially private.

        For the operator's console or log during development only; never
        written beside a model, into a privacy report, or anywhere released
        (e.g. DP-AdaFEST's count of touched rows dropped by the threshold,
        which depends on the exact, un-noised row touches).
        """
        return {}

    def epoch_warnings(self) -> list:
        """Warnings for the operator at the end of an epoch (`DPModel.fit` emits them); none by default.

        Like `diagnostics`, they may come from un-noised statistics: they go
        to the console only, never into a report or anything released.
        """
        return []

    # -- helpers for subclasses ---------------------------------------------
    @tf.autograph.experimental.do_not_convert
    def _noise_like(self, shape, stddev) -> tf.Tensor:
        """float32 N(0, stddev^2) of `shape` from `self.generator` (fast op; falls back to generator.normal)."""
        return fast_normal.normal(self.generator, shape, stddev)

    @tf.autograph.experimental.do_not_convert
    def _dense_noised(self, clipped: ClippedGradients, noise_multiplier: float) -> list:
        """Dense DP-SGD on the non-table variables: (sum + N(0, (sigma C)^2)) / B."""
        std = noise_multiplier * self.l2_norm_clip
        grads = self._noised_sums([grad for _, grad in clipped.dense], std, clipped.expected_batch_size)
        return [(grad, variable) for grad, (variable, _) in zip(grads, clipped.dense)]

    @tf.autograph.experimental.do_not_convert
    def _noised_sums(self, values_list, stddev: float, divisor: float) -> list:
        """`_noised_sum` of several tensors from one generator draw (independent streams)."""
        if stddev > 0:
            return sparse_rows.noised_values_many(self.generator, values_list, stddev=stddev, divisor=divisor)
        return [values / divisor for values in values_list]

    @tf.autograph.experimental.do_not_convert
    def _noised_sum(self, values, stddev: float, divisor: float) -> tf.Tensor:
        """(values + N(0, stddev^2)) / divisor; one fused pass (same bits as the two-op form)."""
        if stddev > 0:
            return sparse_rows.noised_values(self.generator, values, stddev=stddev, divisor=divisor)
        return values / divisor


def one_off_events(mechanism: NoiseMechanism) -> list:
    """The mechanism's one-off accounting events: `selection_events` if it has them, else `[setup_event()]`.

    Budgets and reports compose these once (DP-FEST: one per (re-)selection).

    Raises:
      PrivacyContractError: the mechanism returned a one-off event without
        declaring `capabilities.one_off_events`.
    """
    events = getattr(mechanism, "selection_events", None)
    if events is None:
        setup = mechanism.setup_event()
        events = [] if setup is None else [setup]
    events = list(events)
    if events and not capabilities_of(mechanism).one_off_events:
        raise PrivacyContractError(
            f"Mechanism {type(mechanism).__name__} returned one-off accounting events {events} but "
            + how_to_declare(mechanism, "one-off events (`one_off_events=True`)")
        )
    return events


def check_declared_use(mechanism, *, lookahead: bool) -> None:
    """Refuses uses of `mechanism` its class does not declare (called by `DPModel`).

    Raises:
      ValueError: `lookahead=True` with a mechanism that does not declare
        `lookahead` (it would ignore the ids, or misuse them).
      PrivacyContractError: a mechanism declaring `defers_noise` without
        its own `flush` and `owes_noise` (releases could not pay what it owes).
    """
    capabilities = capabilities_of(mechanism)
    if lookahead and not capabilities.lookahead:
        raise ValueError(
            "`lookahead=True` feeds the next batch's ids to the mechanism, but "
            + how_to_declare(mechanism, "lookahead (`lookahead=True`)")
            + " Build DPModel with lookahead=False for it (only lazy mechanisms use the lookahead)."
        )
    cls = type(mechanism)
    if capabilities.defers_noise and (cls.flush is NoiseMechanism.flush or cls.owes_noise is NoiseMechanism.owes_noise):
        raise PrivacyContractError(
            f"Mechanism class {cls.__name__} declares `defers_noise` but does not override both `flush` and "
            "`owes_noise`: a release could not add the noise it still owes. Implement them."
        )


__all__ = ["ClippedGradients", "NoiseMechanism", "TableGradient", "check_declared_use", "one_off_events"]
