"""DP-AdaFEST: noise only the embedding rows a noisy, clipped contribution map selects.

Per step and per table (Alg. 1 of Zhang et al. 2023):

    V_t = sum_i [v_i]_{C1} + N(0, sigma1^2 C1^2 I_c)        (contribution map)
    S_t = {j : V_t[j] >= tau}                                (surviving rows)
    G_t = sum_i [g_i]_{C2} restricted to S_t + N(0, sigma2^2 C2^2) on S_t rows

where v_i is example i's binary vector of touched rows. The map is never
built over the vocabulary (App. B.2): touched rows get their clipped count
plus one Gaussian draw each; an untouched row survives by noise alone with
probability p = P(N(0, sigma1^2 C1^2) >= tau), independently, so the
positions of those survivors are drawn directly with geometric gaps
Geom(p). Time and memory are proportional to the number of survivors,
never to the vocabulary. Non-embedding variables get dense DP-SGD with
sigma2.

Cost per step and table: one `Unique` over the gradient rows, the
contribution pairs and the noise draw, one Gaussian per touched row for the
map, and the gradient noise and the optimizer's write on the survivors:
touched survivors plus ~p V noise-only rows. At a fixed tau the noise-only
rows grow with the vocabulary (p V), and they are cold rows, so at large V
writing them dominates the step. The paper tunes tau per setting; `threshold_for_noise_rows` sets tau for a fixed
expected number of noise-only rows, which keeps the step flat in V.

Contribution clipping is joint over all tables: [v_i]_{C1} scales example
i's vector by min(1, C1 / sqrt(n_i)), n_i = number of distinct rows it
touches in *all* tables ("including those to other features", Fig. 2), so
the whole map has sensitivity C1 and one sigma1 accounts for it.

Accounting (§3.3): one step composes two Gaussian mechanisms, which is one
Gaussian with sigma = (sigma1^-2 + sigma2^-2)^(-1/2) (App. C.4 prints the
exponent as -2; that is a typo: the composition of N(1, s1^2) and
N(1, s2^2) tests is the Gaussian with mu^2 = s1^-2 + s2^-2). App. B.2's
survival probability Psi(tau / (sigma1^2 C1^2)) is likewise read as
Psi(tau / (sigma1 C1)), the Gaussian tail at tau.

Example:
    >>> sigma1, sigma2 = split_noise_multiplier(1.0, ratio=2.0)
    >>> mechanism = DPAdaFEST(l2_norm_clip=1.0, noise_multiplier=sigma2,
    ...     contribution_clip=1.0, contribution_noise_multiplier=sigma1,
    ...     threshold=5.0)  # no seed: OS entropy (ints are for tests)

References: Zhang et al., "Sparsity-Preserving Differentially Private
Training of Large Embedding Models", NeurIPS 2023: §3.2, Alg. 1, §3.3,
App. B.2, App. C.4, App. D.1 (tau tuned); Dong, Roth & Su 2019, Cor. 3.3
(Gaussian composition).
"""

from __future__ import annotations

import functools
import math
import statistics
import weakref
from collections.abc import Mapping, Sequence

import dp_accounting
import numpy as np
import tensorflow as tf

from tfdp_embed._checks import check_int, check_positive
from tfdp_embed._sorted_sets import is_member
from tfdp_embed.mechanisms.any_shape import AnyShapeFunction
from tfdp_embed.mechanisms.base import ClippedGradients, NoiseMechanism
from tfdp_embed.mechanisms.capabilities import ALL_STRATEGIES, MechanismCapabilities
from tfdp_embed.mechanisms.table_thresholds import TableThresholds, survival_probability
from tfdp_embed.ops import sparse_rows

# An epoch warning is raised when a table drops more than this fraction of its touched rows.
TAU_TUNING_NOTE = (
    "DP-AdaFEST: tau (`threshold`) decides which touched rows are updated; if a table trains poorly, tune tau on "
    "public or held-out data, or with `select_privately` (the search is accounted), never from this run's "
    "un-noised row counts (`diagnostics()`, development on non-sensitive data only): a tau fitted to them is "
    "not covered by the guarantee."
)


def effective_noise_multiplier(contribution_noise_multiplier: float, noise_multiplier: float) -> float:
    """The one Gaussian equivalent to one DP-AdaFEST step.

        sigma = (sigma1^-2 + sigma2^-2)^(-1/2)

    Args:
      contribution_noise_multiplier: sigma1 (> 0), noise of the contribution map.
      noise_multiplier: sigma2 (>= 0), noise of the gradient; 0 gives 0 (no privacy).

    Returns:
      sigma, the noise multiplier of the equivalent Gaussian mechanism.

    Raises:
      ValueError: if sigma1 <= 0 or sigma2 < 0.

    References: DP-AdaFEST §3.3; Dong, Roth & Su 2019, Cor. 3.3.
    """
    sigma1 = check_positive("contribution_noise_multiplier", contribution_noise_multiplier)
    sigma2 = check_positive("noise_multiplier", noise_multiplier, allow_zero=True)
    if sigma2 == 0.0:
        return 0.0
    return (sigma1**-2 + sigma2**-2) ** -0.5


def split_noise_multiplier(sigma: float, *, ratio: float) -> tuple[float, float]:
    """Splits a target noise multiplier into (sigma1, sigma2) with sigma1/sigma2 = ratio.

        sigma2 = sigma * sqrt(1 + ratio^-2),  sigma1 = ratio * sigma2 = sigma * sqrt(1 + ratio^2)

    so that (sigma1^-2 + sigma2^-2)^(-1/2) = sigma exactly: calibrate sigma
    as for DP-SGD, then split it. The paper tunes ratio in [0.1, 10] (App. D.1).

    Args:
      sigma: the DP-SGD-equivalent noise multiplier (> 0).
      ratio: sigma1 / sigma2 (> 0); larger spends less budget on the map.

    Returns:
      (contribution_noise_multiplier, noise_multiplier).

    Raises:
      ValueError: if `sigma` or `ratio` is not finite and > 0.

    Example:
        >>> split_noise_multiplier(1.0, ratio=1.0)   # (sqrt 2, sqrt 2)

    References: DP-AdaFEST §3.3, App. D.1 (the ratio sigma1/sigma2).
    """
    sigma = check_positive("sigma", sigma)
    ratio = check_positive("ratio", ratio)
    sigma2 = sigma * math.sqrt(1.0 + ratio**-2)
    sigma1 = sigma * math.sqrt(1.0 + ratio**2)
    return sigma1, sigma2


def noise_survival_probability(
    *, threshold: float, contribution_clip: float, contribution_noise_multiplier: float
) -> float:
    """P(N(0, sigma1^2 C1^2) >= tau): the chance an untouched row survives by noise.

    References: DP-AdaFEST App. B.2.
    """
    return survival_probability(threshold, contribution_noise_multiplier * contribution_clip)


def threshold_for_noise_rows(
    *,
    vocabulary_size: int,
    expected_noise_rows: float,
    contribution_clip: float,
    contribution_noise_multiplier: float,
) -> float:
    """The threshold tau at which `expected_noise_rows` untouched rows survive per step on average.

        tau = sigma1 C1 * Phi^-1(1 - r / V),   so that   V * P(N(0, sigma1^2 C1^2) >= tau) = r

    With a fixed tau the rows that pass by noise alone grow as p V, and so
    does the step (they are noised and written like any update); the paper
    tunes tau per setting (App. D.1). This is the rule that keeps that
    number, and the step's cost, fixed as the vocabulary grows: pick the
    number r of noise-only rows per step you accept (e.g. a fraction of the
    rows a batch touches) and derive tau from V, sigma1 and C1. tau is a
    hyperparameter, not data: choosing it from V costs no privacy.

    Args:
      vocabulary_size: V (>= 1), rows in the table (for DP-AdaFEST+: the
        number of selected rows, over which the noise-only draw runs).
      expected_noise_rows: r, in (0, V / 2]; r = V / 2 gives tau = 0.
      contribution_clip: C1 (> 0).
      contribution_noise_multiplier: sigma1 (> 0).

    Returns:
      tau (>= 0). `noise_survival_probability(threshold=tau, ...) * V` equals
      r to about 1e-12 relative.

    Raises:
      ValueError: V < 1, r outside (0, V / 2], or C1, sigma1 not > 0.

    Example:
        >>> tau = threshold_for_noise_rows(vocabulary_size=10**7, expected_noise_rows=1000,
        ...     contribution_clip=1.0, contribution_noise_multiplier=5.1)   # ~19.0

    References: DP-AdaFEST App. B.2 (noise-only survivors), App. D.1 (tau tuned).
    """
    vocabulary_size = check_int("vocabulary_size", vocabulary_size)
    rows = check_positive("expected_noise_rows", expected_noise_rows)
    if rows > vocabulary_size / 2:
        raise ValueError(
            f"`expected_noise_rows` must be in (0, vocabulary_size / 2] = (0, {vocabulary_size / 2:g}] "
            f"(more than half the rows would need a negative threshold); received {rows!r}."
        )
    scale = check_positive("contribution_clip", contribution_clip) * check_positive(
        "contribution_noise_multiplier", contribution_noise_multiplier
    )
    # -Phi^-1(q) = Phi^-1(1 - q), computed in the lower tail (no 1 - q rounding).
    return max(0.0, -scale * statistics.NormalDist().inv_cdf(rows / vocabulary_size))


def contribution_map(tables: Sequence, batch_size, contribution_clip: float, selections=None) -> list:
    """The clipped contribution counts sum_i [v_i]_{C1}, on touched rows only.

        count[t][j] = sum_{i touches row j of table t} min(1, C1 / sqrt(n_i)),
        n_i = number of distinct (table, row) pairs example i touches.

    Args:
      tables: `TableGradient`s of one step (their `occurrences` are read;
        weight-0 examples, the padding of a static-shape batch, have none:
        `tfdp_embed.absent_examples` drops them, else adding an
        example would also remove a padding vector and move the map by
        sqrt(2) C1).
      batch_size: scalar int, number of examples.
      contribution_clip: C1 (> 0).
      selections: optional, per table: its sorted selected rows (a trailing
        sentinel is harmless) restricting the map to them, or None for every
        row (DP-AdaFEST+ restricts it to the FEST-selected rows).

    Returns:
      One `(rows, counts)` pair per table: int64 `[m_t]` distinct touched rows
      and float32 `[m_t]` their clipped counts.

    References: DP-AdaFEST Alg. 1 line 6; App. B.2 (touched rows only).
    """
    out = []
    for rows, weights in contribution_pairs(tables, batch_size, contribution_clip, selections=selections):
        unique_rows, position = sparse_rows.unique(rows)
        out.append((unique_rows, tf.math.unsorted_segment_sum(weights, position, tf.size(unique_rows))))
    return out


def contribution_pairs(
    tables: Sequence, batch_size, contribution_clip: float, selections=None, vocabularies=None
) -> list:
    """The contribution map before summing: one `(row, weight)` per distinct (example, row).

    `contribution_map` sums these weights per row; the mechanism sums them
    itself, inside the one deduplication that also merges the gradient rows
    and the noise-only survivors (one `Unique` per table and step).

    Args:
      tables, batch_size, contribution_clip, selections: as `contribution_map`.
      vocabularies: optional int64 scalar tensors, each table's vocabulary
        size (read from a variable, the traced step sees no constants);
        None: the layers' sizes.

    Returns:
      One `(rows, weights)` pair per table: int64 `[n_t]` rows (a row appears
      once per distinct example touching it) and float32 `[n_t]` weights
      min(1, C1 / sqrt(n_i)) of those examples.

    References: DP-AdaFEST Alg. 1 line 6 (per-example clipping to C1).
    """
    pairs = []
    for index, table in enumerate(tables):
        ids, examples = _occurrence_pairs(table)
        selected = None if selections is None else selections[index]
        if vocabularies is None:
            vocab = tf.constant(int(table.layer.vocabulary_size), tf.int64)
        else:
            vocab = vocabularies[index]
        pairs.append(_DISTINCT_PAIRS(ids, examples, vocab, selected))
    batch_size = tf.cast(batch_size, tf.int32)
    touched = tf.zeros([batch_size], tf.float32)
    for _, examples in pairs:
        touched += tf.math.unsorted_segment_sum(tf.ones_like(examples, tf.float32), examples, batch_size)
    scale = tf.minimum(1.0, contribution_clip * tf.math.rsqrt(tf.maximum(touched, 1.0)))
    return [(rows, tf.gather(scale, examples)) for rows, examples in pairs]


def _occurrence_pairs(table) -> tuple:
    """int64 ids and int32 examples of every id one table's calls read this step."""
    ids, examples = [], []
    for occ in table.occurrences:
        examples.append(tf.cast(tf.gather(occ.segment_examples, occ.segments), tf.int32))
        ids.append(tf.cast(occ.ids, tf.int64))
    if not ids:
        return tf.zeros([0], tf.int64), tf.zeros([0], tf.int32)
    return (ids[0], examples[0]) if len(ids) == 1 else (tf.concat(ids, 0), tf.concat(examples, 0))


def _distinct_example_rows(ids, examples, vocab, selected) -> tuple:
    """Distinct (row, example) pairs of one table, restricted to `selected` rows unless it is None.

    Deduplicates the keys example * vocab + row, then reads each pair's row
    and example back at its first occurrence (no int64 division). Traced
    once for every table (`_DISTINCT_PAIRS`).
    """
    keys = tf.cast(examples, tf.int64) * vocab + ids
    distinct, position = sparse_rows.unique(keys)
    first = tf.math.unsorted_segment_min(tf.range(tf.size(keys)), position, tf.size(distinct))
    rows, examples = tf.gather(ids, first), tf.gather(examples, first)
    if selected is None:
        return rows, examples
    mask = is_member(rows, selected)
    return tf.boolean_mask(rows, mask), tf.boolean_mask(examples, mask)


_DISTINCT_PAIRS = AnyShapeFunction(_distinct_example_rows, noinline=True)


def geometric_skip_positions(generator, size: int, probability: float) -> tf.Tensor:
    """Positions of the ones of a Bernoulli(p)^size bit vector, in O(#ones) work.

    The gap between consecutive ones is Geom(p) on {1, 2, ...}:
    gap = floor(log U / log(1 - p)) + 1 with U uniform on (0, 1]. Gaps are
    drawn in chunks (sized for the expected count plus 8 standard
    deviations, so one chunk almost always suffices) until their running sum
    passes `size`; positions are running sums minus one.

    Args:
      generator: a `tf.random.Generator`.
      size: length of the bit vector (the number of candidate rows).
      probability: p in [0, 1).

    Returns:
      int64 `[k]` sorted, distinct positions in `[0, size)`, k ~ Binomial(size, p).

    References: DP-AdaFEST App. B.2.
    """
    if probability <= 0.0 or size <= 0:
        return tf.zeros([0], tf.int64)
    if probability >= 1.0:
        return tf.range(size, dtype=tf.int64)
    return skip_positions(generator, *skip_parameters(size, probability))


def skip_parameters(size: int, probability: float) -> tuple:
    """(chunk, log(1 - p), size) for `skip_positions`, computed in Python (0 < p < 1, size > 0)."""
    mean = size * probability
    return int(min(size + 1, mean + 8.0 * math.sqrt(mean) + 16)), math.log1p(-probability), float(size)


def skip_positions(generator, chunk, log_q, limit) -> tf.Tensor:
    """`geometric_skip_positions` given its parameters (Python numbers or scalar tensors: any table)."""

    def gaps():
        u = 1.0 - generator.uniform(tf.reshape(chunk, [1]), dtype=tf.float64)  # (0, 1]
        return tf.floor(tf.math.log(u) / log_q) + 1.0

    def body(positions):
        return (tf.concat([positions, positions[-1] + tf.cumsum(gaps())], 0),)

    (positions,) = tf.while_loop(
        lambda positions: positions[-1] < limit,
        body,
        (tf.cumsum(gaps()) - 1.0,),
        shape_invariants=(tf.TensorShape([None]),),
    )
    return tf.cast(tf.boolean_mask(positions, positions < limit), tf.int64)


def _noise_draw(generator, selected, chunk, log_q, limit) -> tf.Tensor:
    """The untouched candidates' draw: `skip_positions` over the rows, or over `selected` (DP-AdaFEST+); none when `chunk` is None."""
    if chunk is None:
        return tf.zeros([0], tf.int64)
    drawn = skip_positions(generator, chunk, log_q, limit)
    return drawn if selected is None else tf.gather(selected, drawn)


# Per-mechanism traced table steps, kept out of the mechanism (checkpoints never see them).
_TABLE_STEPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_TABLE_PARAMETERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _table_step(
    mechanism: weakref.ref,
    grad_values,
    grad_rows,
    pair_rows,
    pair_weights,
    shared,
    tau,
    selected,
    chunk,
    log_q,
    limit,
    divisor: float,
) -> tuple:
    """One table's step: (survivors' values, their rows, int64 [4] statistics).

    One `Unique` over [gradient rows, contribution rows, shared rows, noise
    draw] numbers the rows: the gradient rows (unique) keep positions
    [0, g), every touched row gets a position below m (the number of
    distinct touched rows), and drawn rows that nobody touched get
    positions >= m. Touched rows take the noisy-count test; a drawn row
    that was touched is ignored (its test is its own count's), so the
    untouched survivors are exactly the untouched rows' Bernoulli(p)
    events (drawn over `selected` for DP-AdaFEST+; `chunk` None: p = 0).
    Surviving gradient rows come first in the output, so their values are
    one boolean mask of the gradient, and the rest are zero rows (padding)
    before the one fused noise pass.
    """
    ada = mechanism()
    assert ada is not None, "traced while the mechanism is alive"
    shared = tf.zeros([0], tf.int64) if shared is None else shared
    drawn = _noise_draw(ada.generator, selected, chunk, log_q, limit)
    num_grad = tf.size(grad_rows)
    num_counted = num_grad + tf.size(pair_rows)
    num_touched_entries = num_counted + tf.size(shared)
    rows, position = sparse_rows.unique(tf.concat([grad_rows, pair_rows, shared, drawn], 0))
    num_rows = tf.size(rows)
    # First-appearance numbering: the touched entries' positions are exactly [0, m).
    num_touched = tf.maximum(tf.reduce_max(position[:num_touched_entries]), -1) + 1
    count = tf.math.unsorted_segment_sum(pair_weights, position[num_grad:num_counted], num_touched)
    noisy = count + ada._noise_like([num_touched], ada.contribution_noise_multiplier * ada.contribution_clip)  # noqa: SLF001
    # Rows every example scores against (data-independent) always survive.
    scored = tf.math.unsorted_segment_max(
        tf.ones_like(shared, tf.int32), position[num_counted:num_touched_entries], num_touched
    )
    survive_touched = (noisy >= tau) | (scored > 0)
    if selected is not None:  # AdaFEST+: rows outside the selection never update
        survive_touched = tf.logical_and(survive_touched, is_member(rows[:num_touched], selected))
    survive = tf.concat([survive_touched, tf.ones([num_rows - num_touched], tf.bool)], 0)
    rows_out = tf.boolean_mask(rows, survive)
    kept_values = tf.boolean_mask(grad_values, survive[:num_grad])
    num_out = tf.size(rows_out)
    values_out = tf.pad(kept_values, [[0, num_out - tf.shape(kept_values)[0]], [0, 0]])
    values_out = ada._noised_sum(values_out, ada.noise_multiplier * ada.l2_norm_clip, divisor)  # noqa: SLF001
    num_out = tf.cast(num_out, tf.int64)
    num_extra = tf.cast(num_rows - num_touched, tf.int64)
    touched = tf.cast(num_touched, tf.int64)
    return values_out, rows_out, tf.stack([num_out, num_extra, touched, touched - (num_out - num_extra)])


def _released_tables(tables: Sequence, thresholds: TableThresholds, rows_noised: tf.Variable, steps: int) -> list:
    """The report's per-table entries: hyperparameters and DP-released statistics only."""
    return [
        {
            "table": table.name,
            "vocabulary_size": int(table.vocabulary_size),
            # Survivors of the noisy threshold: post-processing of the DP map.
            "mean_rows_noised": float(rows_noised[i].numpy()) / max(steps, 1),
            "threshold": thresholds.tau(i),
            # A constant: V * P(N(0, sigma1^2 C1^2) >= tau).
            "expected_noise_only_rows": table.vocabulary_size * thresholds.survival(i),
        }
        for i, table in enumerate(tables)
    ]


class DPAdaFEST(NoiseMechanism):
    """DP-AdaFEST: per-batch noisy thresholding of contributions, noise on survivors only.

    Per table and step: touched rows j get
    V[j] = sum_i min(1, C1/sqrt(n_i)) + N(0, sigma1^2 C1^2) and survive when
    V[j] >= tau; untouched rows survive with p = P(N(0, sigma1^2 C1^2) >= tau),
    drawn by geometric skips. The returned `tf.IndexedSlices` covers the
    survivors only: (clipped gradient sum (0 for untouched survivors) +
    N(0, sigma2^2 C2^2)) / B. Touched rows that do not survive are not
    updated. Dense variables: DP-SGD with sigma2.

    Tables used for scoring: rows read by a data-independent computation (a
    candidate tower over the catalogue or over a sample drawn independently
    of the data, a full-softmax item table; `TableGradient.shared_rows`) are
    touched by every example's gradient, whatever the data. They always
    survive, like the rows DP-SGD noises: which rows they are is public, so
    selecting them costs no privacy and needs no count. The contribution map
    covers the batch's own lookups only (its sensitivity stays C1). Counting
    the scored rows instead would dilute every example's clipped
    contribution over the whole catalogue (n_i ~ catalogue size), in every
    table, and leave both the scored table and the others mostly dropped.

    Args (keyword-only):
      l2_norm_clip: C2 (> 0), per-example gradient clip norm.
      noise_multiplier: sigma2 (>= 0), gradient noise on survivors and dense variables.
      contribution_clip: C1 (> 0), per-example clip of the binary contribution vector.
      contribution_noise_multiplier: sigma1 (> 0), noise of the contribution map.
      threshold: tau (>= 0), survival threshold on the noisy count; or a
        mapping `{table_name: tau}` naming every `DPEmbedding` table (tau per
        vocabulary; `tfdp_embed.mechanisms.table_thresholds`).
      seed: int for reproducible noise (tests), None for OS entropy.

    After the first epoch of `DPModel.fit`, one fixed note says how to tune
    tau without the run's un-noised row touches (`epoch_warnings`); the
    per-table drop counts are in `diagnostics()` only (not DP).

    Raises:
      ValueError: a hyperparameter outside its range (the message names it);
        at `init`, a `threshold` mapping that does not name exactly the tables.

    Example:
        >>> mechanism = DPAdaFEST(l2_norm_clip=1.0, noise_multiplier=1.2,
        ...     contribution_clip=1.0, contribution_noise_multiplier=2.0,
        ...     threshold=5.0)  # no seed: OS entropy (ints are for tests)
        >>> DPModel(model, mechanism=mechanism, expected_batch_size=1024)

    References: DP-AdaFEST (Zhang et al. 2023) §3.2, Alg. 1, §3.3, App. B.2, C.4.
    """

    name = "adafest"
    # How the planner splits a calibrated sigma into (sigma1, sigma2): through the class (`planning.plan_run`).
    split_noise_multiplier = staticmethod(split_noise_multiplier)
    capabilities = MechanismCapabilities(
        strategies=ALL_STRATEGIES, tpu=True, mixed_precision=True, noised_rows="thresholded", user_level=True
    )

    def __init__(
        self,
        *,
        l2_norm_clip: float,
        noise_multiplier: float,
        contribution_clip: float,
        contribution_noise_multiplier: float,
        threshold: float | Mapping[str, float],
        seed: int | None = None,
    ):
        super().__init__(l2_norm_clip=l2_norm_clip, noise_multiplier=noise_multiplier, seed=seed)
        self.contribution_clip = check_positive("contribution_clip", contribution_clip)
        self.contribution_noise_multiplier = check_positive(
            "contribution_noise_multiplier", contribution_noise_multiplier
        )
        self._thresholds = TableThresholds(threshold, scale=self.contribution_noise_multiplier * self.contribution_clip)
        self.threshold = self._thresholds.given  # a number, or {table: tau}
        self.effective_noise_multiplier = effective_noise_multiplier(
            self.contribution_noise_multiplier, self.noise_multiplier
        )
        # p for a scalar threshold, {table: p} for a mapping.
        self.noise_survival_probability = self._thresholds.probability()
        self._stats_ready = False

    # -- state --------------------------------------------------------------
    def init(self, *, tables, dense_variables, optimizer) -> None:
        """Creates the running gradient-size statistics (one entry per table)."""
        super().init(tables=tables, dense_variables=dense_variables, optimizer=optimizer)
        self._thresholds.bind(self._tables)
        n = len(self._tables)

        def counter(name):
            return tf.Variable(tf.zeros([n], tf.int64), trainable=False, name=name)

        self.rows_noised = counter("rows_noised")  # survivors (touched + noise-only)
        self.noise_only_rows = counter("noise_only_rows")  # untouched survivors
        self.touched_rows = counter("touched_rows")  # rows with a gradient or contribution
        self.dropped_touched_rows = counter("dropped_touched_rows")  # touched, below tau
        self._init_selections()
        # Untracked (checkpoints never see it): read in the step, so the graph optimiser sees no
        # per-table constants to push into the table step, and keeps one copy of it, not one per table.
        _TABLE_PARAMETERS[self] = tf.Variable(self._table_parameters(), trainable=False, name="table_parameters")
        self._stats_ready = True

    # -- the step -----------------------------------------------------------
    @tf.autograph.experimental.do_not_convert
    def update(self, clipped: ClippedGradients) -> list:
        if not self._stats_ready:
            raise RuntimeError(
                f"Mechanism {self.name!r} is not initialised: call `init(tables=..., "
                "dense_variables=..., optimizer=...)` first (DPModel.fit does it)."
            )
        if len(clipped.tables) != len(self._tables):
            raise ValueError(
                f"Mechanism {self.name!r} was initialised with {len(self._tables)} tables; "
                f"the step has {len(clipped.tables)}."
            )
        out = self._dense_noised(clipped, self.noise_multiplier)
        parameters = tf.unstack(_TABLE_PARAMETERS[self].read_value())
        selections = [self._selection(index) for index in range(len(self._tables))]
        vocabularies = [tf.cast(row[4], tf.int64) for row in parameters]
        pairs = contribution_pairs(
            clipped.tables, clipped.batch_size, self.contribution_clip, selections=selections, vocabularies=vocabularies
        )
        stats = []
        for index, (table, (rows, weights)) in enumerate(zip(clipped.tables, pairs)):
            slices, table_stats = self._noised_table(
                index, table, rows, weights, parameters[index], clipped.expected_batch_size
            )
            out.append((slices, table.variable))
            stats.append(table_stats)
        if stats:
            stats = tf.stack([tf.stack(s) for s in stats], axis=1)  # [4, tables]
            self.rows_noised.assign_add(stats[0])
            self.noise_only_rows.assign_add(stats[1])
            self.touched_rows.assign_add(stats[2])
            self.dropped_touched_rows.assign_add(stats[3])
        self.steps.assign_add(1)
        return out

    def _noised_table(self, index: int, table, pair_rows, pair_weights, parameters, divisor: float) -> tuple:
        """Thresholds one table's noisy map; (survivors' sum + noise) / divisor as IndexedSlices.

        The ops are `_table_step`'s, traced once for every table
        (`AnyShapeFunction`): what differs between tables (tau and the noise
        draw's parameters, `parameters` = its row of `_table_parameters`;
        the selection) are its arguments.
        """
        vocab, dim = int(table.layer.vocabulary_size), int(table.layer.output_dim)
        grad = table.gradient
        shared = None if table.shared_rows is None else tf.cast(table.shared_rows, tf.int64)
        tau, chunk, log_q, limit, _ = tf.unstack(parameters)
        draw = (None,) * 3  # nothing to draw (p = 0 or no rows): a trace without the draw
        if self._draws(index):
            draw = (tf.cast(chunk, tf.int32), log_q, limit)
        values, rows, stats = self._table_step_function()(
            tf.reshape(grad.values, [-1, dim]),
            tf.cast(grad.indices, tf.int64),
            pair_rows,
            pair_weights,
            shared,
            tf.cast(tau, tf.float32),
            self._selection(index),
            *draw,
            float(divisor),
        )
        values = tf.ensure_shape(values, [None, dim])
        # The noise-only survivors are rows no lookup read: warm them for the optimizer's scatter.
        sparse_rows.prefetch_rows(table.variable, rows)
        return tf.IndexedSlices(values, rows, tf.constant([vocab, dim], tf.int64)), tuple(tf.unstack(stats))

    def _draw_size(self, index: int) -> int:
        """The rows table `index`'s noise draw runs over: its vocabulary, or its selection (DP-AdaFEST+)."""
        selected = self._selection(index)
        return int(self._tables[index].vocabulary_size) if selected is None else int(selected.shape[0]) - 1

    def _draws(self, index: int) -> bool:
        return self._thresholds.survival(index) > 0.0 and self._draw_size(index) > 0

    def _table_parameters(self) -> np.ndarray:
        """float64 `[tables, 5]`: tau, the noise draw's chunk, log(1 - p), size (zeros without a draw), vocabulary."""
        rows = []
        for index in range(len(self._tables)):
            probability = self._thresholds.survival(index)
            assert probability < 1.0, "tau >= 0 keeps p <= 1/2"
            draw = skip_parameters(self._draw_size(index), probability) if self._draws(index) else (0, 0.0, 0.0)
            rows.append((float(self._thresholds.tau(index)), *draw, float(self._tables[index].vocabulary_size)))
        return np.array(rows, np.float64)

    def _table_step_function(self) -> AnyShapeFunction:
        if self not in _TABLE_STEPS:
            _TABLE_STEPS[self] = AnyShapeFunction(functools.partial(_table_step, weakref.ref(self)), noinline=True)
        return _TABLE_STEPS[self]

    # -- hooks for DP-AdaFEST+ ------------------------------------------------
    def _init_selections(self) -> None:
        """Creates the selections `_selection` returns (at `init`, once the tables are known)."""

    def _selection(self, index: int) -> tf.Variable | None:
        """Table `index`'s selected rows, sorted, plus a sentinel (DP-AdaFEST+); None means every row."""
        del index
        return None

    # -- accounting and reporting ------------------------------------------
    def step_event(self, sampling_probability: float) -> dp_accounting.DpEvent:
        """PoissonSampled(q, Gaussian(sigma)), sigma = (sigma1^-2 + sigma2^-2)^(-1/2) (§3.3)."""
        return dp_accounting.PoissonSampledDpEvent(
            sampling_probability, dp_accounting.GaussianDpEvent(self.effective_noise_multiplier)
        )

    def gradient_size_fraction(self) -> float:
        """Mean embedding-gradient size per step relative to dense DP-SGD's (rows x dim)."""
        steps = int(self.steps.numpy()) if self._stats_ready else 0
        if steps == 0:
            return float("nan")
        noised = self.rows_noised.numpy()
        dims = [int(t.output_dim) for t in self._tables]
        vocabs = [int(t.vocabulary_size) for t in self._tables]
        size = sum(int(n) * d for n, d in zip(noised, dims))
        dense = sum(v * d for v, d in zip(vocabs, dims))
        return size / (steps * dense) if dense else float("nan")

    def gradient_size_reduction(self) -> float:
        """Dense DP-SGD's embedding-gradient size over ours, averaged over steps (Fig. 3)."""
        fraction = self.gradient_size_fraction()
        if fraction != fraction:
            return float("nan")
        return float("inf") if fraction == 0 else 1.0 / fraction

    def report(self) -> dict:
        """Hyperparameters and DP-released statistics only (see `diagnostics` for the others).

        `mean_rows_noised` and the gradient size count the survivors of the
        noisy threshold: the rows the released sparse gradient updates, a
        function of the noised contribution map (post-processing of DP
        outputs). Which survivors were touched, how many touched rows were
        dropped, or how many rows were touched at all depends on the
        un-noised touches: those are in `diagnostics`, never here.
        """
        report = super().report()
        steps = int(self.steps.numpy())
        per_table = (
            _released_tables(self._tables, self._thresholds, self.rows_noised, steps) if self._stats_ready else []
        )
        report.update(
            contribution_clip=self.contribution_clip,
            contribution_noise_multiplier=self.contribution_noise_multiplier,
            threshold=self.threshold,
            effective_noise_multiplier=self.effective_noise_multiplier,
            noise_survival_probability=self.noise_survival_probability,
            gradient_size_fraction=self.gradient_size_fraction(),
            gradient_size_reduction=self.gradient_size_reduction(),
            tables=per_table,
        )
        report["caveats"] = list(report["caveats"]) + [
            "Accounting composes the contribution-map and gradient Gaussians into one Gaussian "
            f"with sigma = (sigma1^-2 + sigma2^-2)^(-1/2) = {self.effective_noise_multiplier:.6g} "
            "per step (DP-AdaFEST §3.3), under Poisson sampling.",
            "Touched rows whose noisy count falls below the threshold are not updated this step "
            "(a bias; how many were dropped depends on the un-noised touches, so it is not reported here).",
        ]
        return report

    def diagnostics(self) -> dict:
        """Per-table statistics of the UN-NOISED row touches: NOT DP, for the operator's console only.

        `mean_noise_only_rows` (untouched survivors), `mean_touched_rows` and
        `dropped_touched_fraction` (touched rows below the threshold) need the
        exact touched set; never write them beside a model or into a report.
        """
        if not self._stats_ready:
            return {"tables": []}
        steps = max(int(self.steps.numpy()), 1)
        tables = []
        for i, table in enumerate(self._tables):
            touched = float(self.touched_rows[i].numpy())
            tables.append(
                {
                    "table": table.name,
                    "mean_noise_only_rows": float(self.noise_only_rows[i].numpy()) / steps,
                    "mean_touched_rows": touched / steps,
                    "dropped_touched_fraction": float(self.dropped_touched_rows[i].numpy()) / max(touched, 1.0),
                }
            )
        return {"not_differentially_private": True, "tables": tables}

    def epoch_warnings(self) -> list:
        """One fixed note after the first epoch on how to tune tau: nothing read from the training data.

        Tuning tau on this run's row touches (how many touched rows fell
        below it) would fit a hyperparameter to un-noised statistics of the
        private data, outside the guarantee; the note says what to do
        instead. The note is the same for every run (its presence does not
        depend on the data); the per-table counts stay in `diagnostics()`.
        """
        if getattr(self, "_tau_note_given", False):
            return []
        self._tau_note_given = True
        return [TAU_TUNING_NOTE]


__all__ = [
    "TAU_TUNING_NOTE",
    "DPAdaFEST",
    "contribution_map",
    "contribution_pairs",
    "effective_noise_multiplier",
    "geometric_skip_positions",
    "noise_survival_probability",
    "skip_parameters",
    "skip_positions",
    "split_noise_multiplier",
    "threshold_for_noise_rows",
]
