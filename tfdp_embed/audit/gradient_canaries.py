"""White-box gradient (Dirac) canaries: a one-run audit of a mechanism's noising itself, no model needed.

The auditor owns the gradients: canary i's clipped gradient is C e_i, the
clip norm along its own coordinate (coordinate 0 of row i of one parameter
[m + extra rows, dim]), and it is put in (with probability 1/2, the
auditor's coin) or not. Each of T steps Poisson-samples every example at
rate q, sums the sampled clipped gradients (the canaries' and, optionally,
`num_background` examples with random directions of norm C) and hands the
sum to `mechanism.update` exactly as a training step does (a `ClippedGradients`
of one dense variable, or of one embedding table with `where="table"`). The
auditor sees every step's noised update g_t and scores

    score_i = sum_t <g_t, e_i> * B        (B: the expected batch size the update divided by)

which is also what the released weights show after T steps of SGD at a
constant rate (theta_T - theta_0 = -lr sum_t g_t). Then the one-run bound,
the tightest of Steinke et al.'s and the f-DP analyses
(`tfdp_embed.audit.fdp_one_run.audit_lower_bound`). This is the Dirac-canary
white-box setting of Nasr et al. 2023 and Steinke et al. 2023 §6: with q = 1
the scores are exactly N(T C [in], T sigma^2 C^2), a (sqrt(T) / sigma)-GDP
observation per canary, and the audit is as tight as m canaries allow.

Mechanisms whose table noise depends on lookups, a lookahead or deferred noise
(DP-AdaFEST, DP-AdaFEST+, LazyDP) are refused with `where="table"`: audit them
through a model (`tfdp_embed.keras2.audit_canaries.audit_run`). Every
mechanism noises its dense variables, so `where="dense"` takes them all.

Example:
    >>> mechanism = DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=sigma, seed=0)
    >>> audit = gradient_canary_audit(mechanism, num_canaries=1000, steps=20, sampling_probability=1.0,
    ...                               audit_seed=7, delta=1e-5)
    >>> audit.bound.epsilon_lb, audit.bound.method, audit.claimed_epsilon

References: Nasr, Hayes, Steinke, Balle, Tramèr, Jagielski, Carlini & Terzis,
"Tight Auditing of Differentially Private Machine Learning", USENIX Security
2023 (gradient canaries, Dirac canaries); Steinke, Nasr & Jagielski, NeurIPS
2023, §6 (white-box one-run audits); Mahloujifar, Melis & Chaudhuri, ICML 2025.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import dp_accounting
import numpy as np
import tensorflow as tf

from tfdp_embed._checks import check_int
from tfdp_embed.audit.fdp_one_run import METHODS, AuditBound, audit_lower_bound
from tfdp_embed.mechanisms.base import ClippedGradients, NoiseMechanism, TableGradient, one_off_events
from tfdp_embed.mechanisms.capabilities import capabilities_of

WHERE = ("dense", "table")
_INCLUSION_TAG, _SAMPLING_TAG, _BACKGROUND_TAG = 0xD1AC, 0x5A3F, 0xB6C0


@dataclasses.dataclass
class CanaryTable:
    """The smallest `EmbeddingTable` (the protocol mechanisms noise): a variable and its sizes."""

    name: str
    embeddings: tf.Variable
    vocabulary_size: int
    output_dim: int

    def set_read_hook(self, hook) -> None:
        """No reads here: the auditor never looks rows up."""


@dataclasses.dataclass(frozen=True)
class GradientCanaryAudit:
    """What `gradient_canary_audit` measured.

    Attributes:
      bound: the tightest one-run bound and its method (`AuditBound`).
      claimed_epsilon: the mechanism's epsilon at `delta` for this run (PLD), None when it has none
        (not DP, or sigma = 0).
      mechanism_name, noise_multiplier, l2_norm_clip: the audited mechanism.
      steps, sampling_probability, where: the run.
      scores: [m] summed dot products; included: [m] the auditor's coins.
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

    def as_dict(self) -> dict:
        """JSON-able summary (per-canary arrays left out)."""
        fields = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("bound", "scores", "included")}
        return {**self.bound.as_dict(), **fields, "num_included": int(self.included.sum()), "kind": "white-box"}


def _rng(audit_seed: int, tag: int) -> np.random.Generator:
    if isinstance(audit_seed, bool) or not isinstance(audit_seed, (int, np.integer)):
        raise TypeError(f"`audit_seed` must be an int (an audit is reproducible); received {audit_seed!r}.")
    return np.random.default_rng(np.random.SeedSequence([int(audit_seed), tag]))


def _check_mechanism(mechanism, where: str) -> None:
    if not isinstance(mechanism, NoiseMechanism) or not mechanism.clips_per_example:
        raise ValueError(
            f"`mechanism` must be a clipping `NoiseMechanism` (e.g. DenseDPSGD); received {mechanism!r}. "
            "For a run without noise audit DenseDPSGD with noise_multiplier=0."
        )
    if where not in WHERE:
        raise ValueError(f"`where` must be one of {WHERE}; received {where!r}.")
    caps = capabilities_of(mechanism)
    if where == "table" and (caps.needs_lookups or caps.lookahead or caps.defers_noise):
        raise ValueError(
            f"{type(mechanism).__name__} noises tables from the batch's lookups, a lookahead or deferred noise, "
            "which gradient canaries do not provide: use where='dense', or audit it through a model "
            "(tfdp_embed.keras2.audit_canaries.audit_run)."
        )


def _check_run(mechanism, where, num_canaries, steps, sampling_probability, num_background, dim) -> tuple:
    """(m, T, q, dim) after the checks."""
    _check_mechanism(mechanism, where)
    m, steps = check_int("num_canaries", num_canaries), check_int("steps", steps)
    check_int("num_background", num_background, minimum=0)
    q = float(sampling_probability)
    if not 0 < q <= 1:
        raise ValueError(f"`sampling_probability` must be in (0, 1]; received {sampling_probability!r}.")
    return m, steps, q, check_int("dim", dim)


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


def _clipped(variable, total: np.ndarray, where: str, table, batch: float, size: int) -> ClippedGradients:
    value = tf.constant(total)
    if where == "dense":
        return ClippedGradients([], [(variable, value)], batch, tf.constant(size))
    rows = tf.constant(np.flatnonzero(np.any(total != 0, axis=1)), tf.int64)
    grad = tf.IndexedSlices(tf.gather(value, rows), rows, tf.constant(total.shape, tf.int64))
    factors = tf.ones([size], tf.float32)
    return ClippedGradients([TableGradient(table, variable, grad, [], factors)], [], batch, tf.constant(size))


def _observe(mechanism, clipped: ClippedGradients, variable, batch: float) -> np.ndarray:
    """The mechanism's noised update of `variable`, times the divisor B (the noised sum)."""
    for grad, target in mechanism.update(clipped):
        if target is variable:
            return tf.convert_to_tensor(grad).numpy() * batch
    raise ValueError(f"{type(mechanism).__name__}.update returned no gradient for the audited variable.")


def _run(mechanism, included, *, steps, q, where, num_background, dim, audit_seed) -> np.ndarray:
    """T steps of the mechanism on canary (and background) sums; the [m] scores."""
    m = included.size
    rows = m + (1 if num_background else 0)
    variable = tf.Variable(tf.zeros([rows, dim]), name="canary_parameters")
    table = CanaryTable("canaries", variable, rows, dim) if where == "table" else None
    mechanism.init(tables=[table] if table else [], dense_variables=[] if table else [variable], optimizer=None)
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
        clipped = _clipped(variable, total, where, table, batch, int(sampled.sum()) + taken)
        scores += _observe(mechanism, clipped, variable, batch)[:m, 0]
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
    num_background: int = 0,
    dim: int = 1,
    methods: Sequence[str] = METHODS,
) -> GradientCanaryAudit:
    """Runs the mechanism's noising on T steps of clipped sums with m Dirac canaries; the one-run bound.

    Args:
      mechanism: a fresh clipping `NoiseMechanism` (its C and sigma are audited; `init` is called here).
      num_canaries: m, each put in with probability 1/2 (the auditor's coin, from `audit_seed`).
      steps: T noised steps.
      sampling_probability: q in (0, 1], each example's Poisson rate per step (1: every step).
      audit_seed: seeds the coins, the Poisson sampling and the background directions.
      delta: delta of the bound and of the claimed epsilon.
      confidence: the bound holds with this probability.
      where: "dense" (a dense variable) or "table" (an embedding table, rows touched by the canaries).
      num_background: other examples per run, each a random direction of norm C, sampled like the canaries.
      dim: columns of the parameter (the canary uses column 0).
      methods: the bound's methods (`tfdp_embed.audit.fdp_one_run.METHODS`).

    Returns:
      A `GradientCanaryAudit`.

    Raises:
      ValueError: not a clipping mechanism, `where` unknown or refused for the mechanism, bad counts or
        rate, or what `audit_lower_bound` refuses.
      TypeError: `audit_seed` not an int.

    References: Nasr et al. 2023 (Dirac canaries); Steinke, Nasr & Jagielski 2023, §6.
    """
    m, steps, q, dim = _check_run(mechanism, where, num_canaries, steps, sampling_probability, num_background, dim)
    included = _rng(audit_seed, _INCLUSION_TAG).random(m) < 0.5
    run = dict(steps=steps, q=q, where=where, num_background=num_background, dim=dim, audit_seed=audit_seed)
    scores = _run(mechanism, included, **run)
    bound = audit_lower_bound(scores, included, delta=delta, confidence=confidence, methods=methods)
    return GradientCanaryAudit(
        bound,
        _claimed_epsilon(mechanism, q, steps, delta),
        mechanism.name,
        float(mechanism.noise_multiplier),
        float(mechanism.l2_norm_clip),
        steps,
        q,
        where,
        scores,
        included,
    )


__all__ = ["WHERE", "CanaryTable", "GradientCanaryAudit", "gradient_canary_audit"]
