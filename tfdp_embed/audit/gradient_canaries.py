"""White-box gradient (Dirac) canaries: a one-run audit of a mechanism's noising itself, no model needed.

The auditor owns the gradients: canary i's clipped gradient is C e_i, the
clip norm along its own coordinate (coordinate 0 of row i of one parameter
[m + extra rows, dim]), and it is put in (with probability 1/2, the
auditor's coin) or not. Each of T steps Poisson-samples every example at
rate q, sums the sampled clipped gradients (the canaries' and, optionally,
`num_background` examples with random directions of norm C) and hands the
sum to `mechanism.update` exactly as a training step does (a `ClippedGradients`
of one dense variable, or of one embedding table `CanaryTable` named
`TABLE_NAME` with `where="table"`; there each sampled canary is an example
that looks up its own row, a background example every row, and the
`TableGradient` carries these lookups as `occurrences`, so DP-AdaFEST's
contribution map counts them as it counts a batch's).

Two observations of the same run (`observe`):

* "update": the auditor sees every step's noised update g_t and scores
  score_i = sum_t <g_t, e_i> * B   (B: the expected batch size the update divided by);
* "released": the updates are applied by SGD at a constant rate eta and the
  auditor reads the released table after T steps (flushed first: LazyDP adds
  every row's owed noise, as a release does), scoring
  score_i = -<theta_T - theta_0, e_i> * B / eta,
  the same number for mechanisms that noise each step, and the only one for
  LazyDP, whose per-step table update holds no noise. Every mechanism supports it.

DP-FEST, when built without `counts`, selects its rows here from the
auditor's data (`lookup_counts`: an included canary's row counts 1), so the
selection's own leak is audited and its event is part of the claimed epsilon.
Then the one-run bound, the tightest of Steinke et al.'s and the f-DP analyses
(`tfdp_embed.audit.fdp_one_run.audit_lower_bound`). This is the Dirac-canary
white-box setting of Nasr et al. 2023 and Steinke et al. 2023 §6: with q = 1
the dense DP-SGD scores are exactly N(T C [in], T sigma^2 C^2), a
(sqrt(T) / sigma)-GDP observation per canary, and the audit is as tight as m
canaries allow.

Refused: a mechanism that does not clip per example (audit DenseDPSGD with
noise_multiplier=0 instead), observe="update" of a table by a mechanism that
defers its noise or takes a lookahead (LazyDP: use observe="released"), and
DP-FEST with where="dense" (it selects table rows).

Example:
    >>> mechanism = DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=sigma, seed=0)
    >>> audit = gradient_canary_audit(mechanism, num_canaries=1000, steps=20, sampling_probability=1.0,
    ...                               audit_seed=7, delta=1e-5)
    >>> audit.bound.epsilon_lb, audit.bound.method, audit.claimed_epsilon
    >>> lazy = gradient_canary_audit(LazyDP(l2_norm_clip=1.0, noise_multiplier=sigma, seed=0), num_canaries=1000,
    ...                              steps=20, sampling_probability=1.0, audit_seed=7, delta=1e-5,
    ...                              where="table", observe="released")

References: Nasr, Hayes, Steinke, Balle, Tramèr, Jagielski, Carlini & Terzis,
"Tight Auditing of Differentially Private Machine Learning", USENIX Security
2023 (gradient canaries, Dirac canaries); Steinke, Nasr & Jagielski, NeurIPS
2023, §6 (white-box one-run audits); Mahloujifar, Melis & Chaudhuri, ICML 2025;
Lim et al., ASPLOS 2024, §3 (LazyDP: only the flushed model is released).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import dp_accounting
import numpy as np
import tensorflow as tf

from tfdp_embed import read_guard
from tfdp_embed._checks import check_int, check_positive
from tfdp_embed.audit.fdp_one_run import METHODS, AuditBound, audit_lower_bound
from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.layers.lookup import EmbeddingOccurrences
from tfdp_embed.mechanisms.base import ClippedGradients, NoiseMechanism, TableGradient, one_off_events
from tfdp_embed.mechanisms.capabilities import capabilities_of
from tfdp_embed.mechanisms.fest import DPFEST
from tfdp_embed.mechanisms.lazy import sgd as lazy_sgd

WHERE = ("dense", "table", "scored-table")
TABLES = ("table", "scored-table")  # the `where`s that audit an embedding table
OBSERVE = ("update", "released")
TABLE_NAME = "canaries"  # the audited table's name (DP-AdaFEST+'s `selected_rows`, per-table options)
_INCLUSION_TAG, _SAMPLING_TAG, _BACKGROUND_TAG = 0xD1AC, 0x5A3F, 0xB6C0


@dataclasses.dataclass
class CanaryTable:
    """The smallest `EmbeddingTable` (the protocol mechanisms noise): a variable and its sizes."""

    name: str
    embeddings: tf.Variable
    vocabulary_size: int
    output_dim: int

    def set_read_hook(self, hook) -> None:
        """No reads here: the auditor never looks rows up (LazyDP's catch-up runs in `update` and `flush`)."""


class ConstantSgd:
    """Plain SGD at a constant rate, seen through LazyDP's `SgdOptimizer` protocol (no Keras).

    The released-table observation applies each step's update itself,
    theta <- theta - eta g_t (`_apply`); LazyDP reads eta from here for the
    noise it defers.
    """

    def __init__(self, learning_rate: float):
        self._learning_rate = float(learning_rate)
        self._iterations = tf.Variable(0, dtype=tf.int64, trainable=False, name="iterations")

    @property
    def iterations(self) -> tf.Variable:
        return self._iterations

    def settings(self) -> lazy_sgd.SgdSettings:
        return lazy_sgd.SgdSettings(0.0, False, 0.0)

    def learning_rate(self) -> tf.Tensor:
        return tf.constant(self._learning_rate, tf.float32)

    def momentum_slot(self, variable: tf.Variable, *, create: bool = False) -> tf.Variable:
        raise ValueError("ConstantSgd has no momentum.")


@dataclasses.dataclass(frozen=True)
class GradientCanaryAudit:
    """What `gradient_canary_audit` measured.

    Attributes:
      bound: the tightest one-run bound and its method (`AuditBound`).
      claimed_epsilon: the mechanism's epsilon at `delta` for this run (PLD), None when it has none
        (not DP, or sigma = 0).
      mechanism_name, noise_multiplier, l2_norm_clip: the audited mechanism.
      steps, sampling_probability, where, observe, learning_rate: the run (the rate of the
        released-table observation's SGD).
      scores: [m] the canaries' scores (summed dot products, times B); included: [m] the auditor's coins.
    """

    bound: AuditBound
    claimed_epsilon: float | None
    mechanism_name: str
    noise_multiplier: float
    l2_norm_clip: float
    steps: int
    sampling_probability: float
    where: str
    scores: np.ndarray
    included: np.ndarray
    observe: str = "update"
    learning_rate: float = 1.0

    def as_dict(self) -> dict:
        """JSON-able summary (per-canary arrays left out)."""
        fields = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("bound", "scores", "included")}
        return {**self.bound.as_dict(), **fields, "num_included": int(self.included.sum()), "kind": "white-box"}


def _rng(audit_seed: int, tag: int) -> np.random.Generator:
    if isinstance(audit_seed, bool) or not isinstance(audit_seed, (int, np.integer)):
        raise TypeError(f"`audit_seed` must be an int (an audit is reproducible); received {audit_seed!r}.")
    return np.random.default_rng(np.random.SeedSequence([int(audit_seed), tag]))


def canary_inclusion(num_canaries: int, *, audit_seed: int) -> np.ndarray:
    """The auditor's coins: [m] bool, canary i put in with probability 1/2 (the draw the audit makes)."""
    return _rng(audit_seed, _INCLUSION_TAG).random(check_int("num_canaries", num_canaries)) < 0.5


def lookup_counts(included: np.ndarray, *, num_background: int = 0) -> np.ndarray:
    """The table's bucket counts in the auditor's data: each example counts each row it looks up once.

    An included canary looks up its own row (count 1, an excluded one 0); each background example
    looks up every row (the extra row after the canaries exists when `num_background` > 0). What DP-FEST
    and DP-AdaFEST+ select from (`DPAdaFESTPlus.from_counts`, `plan_run(..., counts=...)`).
    """
    included = np.asarray(included, bool)
    background = check_int("num_background", num_background, minimum=0)
    counts = np.append(included.astype(np.float64), np.zeros(1 if background else 0))
    return counts + background


def _check_mechanism(mechanism, where: str, observe: str) -> None:
    if not isinstance(mechanism, NoiseMechanism) or not mechanism.clips_per_example:
        raise ValueError(
            f"`mechanism` must be a clipping `NoiseMechanism` (e.g. DenseDPSGD); received {mechanism!r}. "
            "For a run without noise audit DenseDPSGD with noise_multiplier=0."
        )
    if where not in WHERE:
        raise ValueError(f"`where` must be one of {WHERE}; received {where!r}.")
    if observe not in OBSERVE:
        raise ValueError(f"`observe` must be one of {OBSERVE}; received {observe!r}.")
    caps, name = capabilities_of(mechanism), type(mechanism).__name__
    if where in TABLES and observe == "update" and (caps.lookahead or caps.defers_noise):
        raise ValueError(
            f"{name} takes a lookahead or deferred noise: its per-step table update holds no noise, so "
            "where='table' needs observe='released' (the flushed table after T steps)."
        )
    if where == "dense" and isinstance(mechanism, DPFEST):
        raise ValueError(f"{name} selects table rows before training: audit it with where='table'.")


def _check_run(mechanism, where, observe, num_canaries, steps, sampling_probability, num_background, dim, rate):
    """(m, T, q, dim, eta) after the checks."""
    _check_mechanism(mechanism, where, observe)
    m, steps = check_int("num_canaries", num_canaries), check_int("steps", steps)
    check_int("num_background", num_background, minimum=0)
    q = float(sampling_probability)
    if not 0 < q <= 1:
        raise ValueError(f"`sampling_probability` must be in (0, 1]; received {sampling_probability!r}.")
    return m, steps, q, check_int("dim", dim), check_positive("learning_rate", rate)


def _claimed_epsilon(mechanism: NoiseMechanism, q: float, steps: int, delta: float) -> float | None:
    """epsilon at delta of T steps (and one-off events) by PLD; None when there is none."""
    from tfdp_embed.accounting.calibration import compute_epsilon

    if not mechanism.is_dp or mechanism.noise_multiplier == 0 or delta <= 0:
        return None
    events = [dp_accounting.SelfComposedDpEvent(mechanism.step_event(q), steps), *one_off_events(mechanism)]
    epsilon = compute_epsilon(dp_accounting.ComposedDpEvent(events), target_delta=delta)
    return epsilon if math.isfinite(epsilon) else None


def _step_sum(sampled: np.ndarray, clip: float, rows: int, dim: int, background) -> np.ndarray:
    """The clipped sum of one step: C at (i, 0) for each sampled canary, plus the sampled background."""
    total = np.zeros((rows, dim), np.float32)
    total[np.flatnonzero(sampled), 0] = clip
    if background is not None:
        total += background.reshape(rows, dim)
    return total


def _occurrences(sampled: np.ndarray, taken: int, rows: int) -> EmbeddingOccurrences:
    """The step's lookups: sampled canary k reads its own row, each background example every row."""
    canaries = np.flatnonzero(sampled)
    batch = canaries.size + taken
    ids = np.concatenate([canaries, np.tile(np.arange(rows), taken)])
    examples = np.concatenate([np.arange(canaries.size), np.repeat(np.arange(canaries.size, batch), rows)])
    return EmbeddingOccurrences(
        ids=tf.constant(ids, tf.int64),
        segments=tf.constant(examples, tf.int32),
        weights=tf.ones([ids.size], tf.float32),
        num_segments=tf.constant(batch, tf.int32),
        segment_examples=tf.range(batch, dtype=tf.int32),
        batch_size=tf.constant(batch, tf.int32),
    )


def _clipped(variable, total: np.ndarray, where: str, table, batch: float, lookups) -> ClippedGradients:
    """The step's `ClippedGradients`: a dense variable, a table's touched rows, or a scored table's every row.

    "scored-table" is a two-tower's full-softmax item table: every example's gradient reaches every row each
    step (the gradient holds all rows, zeros included) and the rows are `shared_rows`, read whatever the data.
    """
    size = int(lookups.batch_size)
    value = tf.constant(total)
    if where == "dense":
        return ClippedGradients([], [(variable, value)], batch, tf.constant(size))
    scored = where == "scored-table"
    rows = tf.constant(np.arange(total.shape[0]) if scored else np.flatnonzero(np.any(total != 0, axis=1)), tf.int64)
    grad = tf.IndexedSlices(tf.gather(value, rows), rows, tf.constant(total.shape, tf.int64))
    factors = tf.ones([size], tf.float32)
    gradient = TableGradient(table, variable, grad, [lookups], factors, shared_rows=rows if scored else None)
    return ClippedGradients([gradient], [], batch, tf.constant(size))


def _gradient_of(updates: list, variable, mechanism):
    """The mechanism's noised update of `variable` (a tensor or `tf.IndexedSlices`), divided by B."""
    for grad, target in updates:
        if target is variable:
            return grad
    raise ValueError(f"{type(mechanism).__name__}.update returned no gradient for the audited variable.")


def _apply(variable: tf.Variable, grad, learning_rate: float) -> None:
    """One SGD step, theta <- theta - eta g, as the optimizer applies it (rows only for a sparse g)."""
    if isinstance(grad, tf.IndexedSlices):
        variable.scatter_sub(tf.IndexedSlices(learning_rate * grad.values, grad.indices, grad.dense_shape))
    else:
        variable.assign_sub(learning_rate * tf.convert_to_tensor(grad))


def _released(mechanism: NoiseMechanism, variable: tf.Variable) -> np.ndarray:
    """The released parameter: the mechanism flushed (owed noise added) first, as every release does."""
    mechanism.flush()
    if mechanism.owes_noise():
        raise PrivacyContractError(
            f"Mechanism {mechanism.name!r} still owes noise after flush(); its table cannot be released."
        )
    with read_guard.unguarded():  # flushed above: the raw read is the release
        return variable.numpy()


def _select_rows(mechanism, included: np.ndarray, num_background: int) -> None:
    """DP-FEST built without `counts` selects here, from the auditor's data (its event is then claimed)."""
    if isinstance(mechanism, DPFEST) and int(mechanism.selection_count.numpy()) == 0:
        mechanism.select({TABLE_NAME: lookup_counts(included, num_background=num_background)})


def _run(mechanism, included, *, steps, q, where, observe, learning_rate, num_background, dim, audit_seed):
    """T steps of the mechanism on canary (and background) sums; the [m] scores."""
    m = included.size
    rows = m + (1 if num_background else 0)
    variable = tf.Variable(tf.zeros([rows, dim]), name="canary_parameters")
    table = CanaryTable(TABLE_NAME, variable, rows, dim) if where in TABLES else None
    optimizer = ConstantSgd(learning_rate)
    mechanism.init(tables=[table] if table else [], dense_variables=[] if table else [variable], optimizer=optimizer)
    if table is not None:
        _select_rows(mechanism, included, num_background)
    sampling, background_rng = _rng(audit_seed, _SAMPLING_TAG), _rng(audit_seed, _BACKGROUND_TAG)
    batch = max(q * (m / 2 + num_background), 1.0)  # fixed before the coins: no data-dependent divisor
    scores = np.zeros(m)
    for _ in range(steps):
        sampled = included & (sampling.random(m) < q)
        taken = int((sampling.random(num_background) < q).sum()) if num_background else 0
        background = None
        if taken:
            directions = background_rng.normal(size=(taken, rows * dim))
            directions *= mechanism.l2_norm_clip / np.linalg.norm(directions, axis=1, keepdims=True)
            background = directions.sum(axis=0)
        total = _step_sum(sampled, mechanism.l2_norm_clip, rows, dim, background)
        clipped = _clipped(variable, total, where, table, batch, _occurrences(sampled, taken, rows))
        grad = _gradient_of(mechanism.update(clipped), variable, mechanism)
        if observe == "update":
            scores += tf.convert_to_tensor(grad).numpy()[:m, 0] * batch
            continue
        _apply(variable, grad, learning_rate)
        optimizer.iterations.assign_add(1)
        mechanism.after_apply(None)
    if observe == "released":  # theta_0 = 0: the displacement is the released table
        scores = -_released(mechanism, variable)[:m, 0].astype(np.float64) * batch / learning_rate
    return scores


def gradient_canary_audit(
    mechanism: NoiseMechanism,
    *,
    num_canaries: int,
    steps: int,
    sampling_probability: float,
    audit_seed: int,
    delta: float,
    confidence: float = 0.95,
    where: str = "dense",
    observe: str = "update",
    learning_rate: float = 1.0,
    num_background: int = 0,
    dim: int = 1,
    methods: Sequence[str] = METHODS,
) -> GradientCanaryAudit:
    """Runs the mechanism's noising on T steps of clipped sums with m Dirac canaries; the one-run bound.

        score_i = sum_t <g_t, e_i> B  (observe="update"),   -<theta_T - theta_0, e_i> B / eta  (observe="released")

    Args:
      mechanism: a fresh clipping `NoiseMechanism` (its C and sigma are audited; `init` is called here).
      num_canaries: m, each put in with probability 1/2 (the auditor's coin, from `audit_seed`).
      steps: T noised steps.
      sampling_probability: q in (0, 1], each example's Poisson rate per step (1: every step).
      audit_seed: seeds the coins, the Poisson sampling and the background directions.
      delta: delta of the bound and of the claimed epsilon.
      confidence: the bound holds with this probability.
      where: "dense" (a dense variable), "table" (an embedding table `TABLE_NAME`, rows touched by the
        canaries, their lookups passed as a training step passes them) or "scored-table" (the same table
        scored by a full softmax, as a two-tower's item table: every row in every step's gradient and in
        `shared_rows`; DP-FEST and DP-AdaFEST+ refuse it).
      observe: "update" (each step's noised update) or "released" (the flushed parameter after T steps of
        SGD at `learning_rate`; every mechanism supports it, LazyDP's tables only it).
      learning_rate: eta > 0 of the released-table observation's SGD.
      num_background: other examples per run, each a random direction of norm C, sampled like the canaries.
      dim: columns of the parameter (the canary uses column 0).
      methods: the bound's methods (`tfdp_embed.audit.fdp_one_run.METHODS`).

    Returns:
      A `GradientCanaryAudit`.

    Raises:
      ValueError: not a clipping mechanism, `where` or `observe` unknown or refused for the mechanism, bad
        counts or rate, or what `audit_lower_bound` refuses.
      TypeError: `audit_seed` not an int.
      PrivacyContractError: noise still owed after the mechanism's flush (observe="released").

    References: Nasr et al. 2023 (Dirac canaries); Steinke, Nasr & Jagielski 2023, §6.
    """
    m, steps, q, dim, rate = _check_run(
        mechanism, where, observe, num_canaries, steps, sampling_probability, num_background, dim, learning_rate
    )
    included = canary_inclusion(m, audit_seed=audit_seed)
    run = dict(steps=steps, q=q, where=where, observe=observe, num_background=num_background, dim=dim)
    scores = _run(mechanism, included, learning_rate=rate, audit_seed=audit_seed, **run)
    bound = audit_lower_bound(scores, included, delta=delta, confidence=confidence, methods=methods)
    return _result(
        mechanism, bound, scores, included, q=q, steps=steps, where=where, observe=observe, rate=rate, delta=delta
    )


def _result(mechanism, bound, scores, included, *, q, steps, where, observe, rate, delta) -> GradientCanaryAudit:
    """The `GradientCanaryAudit` of one run: the bound beside what the mechanism claims for it."""
    return GradientCanaryAudit(
        bound=bound,
        claimed_epsilon=_claimed_epsilon(mechanism, q, steps, delta),
        mechanism_name=mechanism.name,
        noise_multiplier=float(mechanism.noise_multiplier),
        l2_norm_clip=float(mechanism.l2_norm_clip),
        steps=steps,
        sampling_probability=q,
        where=where,
        scores=scores,
        included=included,
        observe=observe,
        learning_rate=rate,
    )


__all__ = [
    "OBSERVE",
    "TABLES",
    "TABLE_NAME",
    "WHERE",
    "CanaryTable",
    "ConstantSgd",
    "GradientCanaryAudit",
    "canary_inclusion",
    "gradient_canary_audit",
    "lookup_counts",
]
