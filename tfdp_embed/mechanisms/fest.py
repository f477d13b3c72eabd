"""DP-FEST: DP top-k row selection once (or per streaming period), then DP-SGD on the selected rows.

Selection (`tfdp_embed.mechanisms.topk_selection`): per table f, the k_f
rows with the largest Gumbel-noised counts; eps_1 pure DP in total.

Training step, for each table with selected rows S_f (|S_f| = k_f):

    g[S_f] = (sum_i c_i grad_i [S_f] + N(0, sigma^2 C^2 I_{k_f x dim})) / B_expected
    g[rows not in S_f] = 0   (frozen)

and dense DP-SGD on every other variable. This is DP-SGD over the selected
parameter subspace, so **every selected row gets fresh noise every step,
touched or not**: the per-step cost is O(k_f x dim) per table (plus O(batch)
to route the touched rows), independent of the vocabulary but not of k.
Gradients of unselected rows are dropped, which is post-processing of the DP
selection: those rows keep their initial values (or, after a
re-selection, the values they had).

Accounting (App. C.3): the selection is (eps_1, 0)-DP and the training
steps are Poisson-subsampled Gaussians, so by basic composition the model is
(eps_1 + eps_SGD(delta), delta)-DP: `tfdp_embed.plan_run` charges the
selection as a pure-DP release (`Release.selection`) and calibrates sigma
for eps - eps_1. For a ledger, `setup_event()` is the selection as a
`dp_accounting` event (a Gaussian that dominates every eps-DP mechanism,
see `topk_selection`), which composes with the steps under PLD or RDP;
each streaming re-selection adds one more such event (`selection_events`).

Example:
    >>> counts = bucket_counts(train_ds, vocabulary_sizes={"cat_0": 10_000})
    >>> plan = plan_run("fest", target_epsilon=1.0, target_delta=1e-5,
    ...     sampling_probability=0.01, steps=5_000, releases=[Release.selection(0.01)],
    ...     top_k={"cat_0": 500}, counts=counts)
    >>> mechanism = plan.mechanism        # DPFEST with sigma for eps - eps_1

References: Zhang et al., "Sparsity-Preserving Differentially Private
Training of Large Embedding Models", NeurIPS 2023: §3.1, App. B.1, App. C.3,
§4.3 (streaming periods).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import dp_accounting
import numpy as np
import tensorflow as tf

from tfdp_embed._checks import check_positive
from tfdp_embed.mechanisms.base import ClippedGradients, NoiseMechanism
from tfdp_embed.mechanisms.capabilities import ALL_STRATEGIES, MechanismCapabilities
from tfdp_embed.mechanisms.tables import EmbeddingTable
from tfdp_embed.mechanisms.topk_selection import TopKSelection, select_top_k
from tfdp_embed.ops import sparse_rows

COUNTS_UNITS = ("example", "user")


def refuse_scored_tables(mechanism, tables: Sequence) -> None:
    """Raises ValueError for a table that a data-independent computation scores every step.

    A table read by a candidate tower over the catalogue (or a sample of it),
    or scored by a full softmax (`TableGradient.shared_rows`), gets a gradient
    on every scored row from every example, every step. A frequency selection
    made before training updates only the selected rows: every other scored
    row would keep its initial value while queries keep being scored against
    it, silently.
    """
    for table in tables:
        if table.shared_rows is not None:
            raise ValueError(
                f"Mechanism {mechanism.name!r} cannot train table {table.layer.name!r}: every example is "
                "scored against its rows (a candidate tower over the catalogue or a sample of it, or a "
                "full softmax), so every scored row has a gradient every step, but this mechanism only "
                "ever updates the rows it selected from frequency counts before training: the other "
                "scored rows would stay at their initial values and still be scored. Use DPAdaFEST "
                "(it noises the scored rows every step: which rows are scored does not depend on the "
                "data), LazyDP or DenseDPSGD."
            )


def _per_table(name: str, value, tables: Sequence[EmbeddingTable]) -> dict:
    if isinstance(value, Mapping):
        missing = sorted({t.name for t in tables} - set(value))
        if missing:
            raise ValueError(f"`{name}` has no entry for tables {missing}; it has {sorted(value)}.")
        return {t.name: value[t.name] for t in tables}
    return {t.name: value for t in tables}


def _check_k_type(k) -> None:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k <= 0:
        raise ValueError(f"`top_k` must be an int > 0 (or a mapping of them); received {k!r}.")


def _check_fraction(f) -> None:
    if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= 1:
        raise ValueError(f"`top_fraction` must be a number in (0, 1] (or a mapping of them); received {f!r}.")


@dataclasses.dataclass
class _Config:
    top_k: object
    top_fraction: object
    counts: Mapping[str, np.ndarray] | None
    resolved_k: dict = dataclasses.field(default_factory=dict)
    selections: list = dataclasses.field(default_factory=list)


def _selected_positions(rows: tf.Variable, indices: tf.Tensor) -> tuple:
    """(position of each index in the sorted selected `rows`, whether it is selected) for int64 `indices`.

    A binary search in the k selected rows (they stay in cache) instead of a
    lookup in a vocabulary-sized array, which costs 4 bytes a row (400 MB at
    10^8 rows) and a cache miss per id.
    """
    rows = rows.read_value()
    found = tf.searchsorted(rows, indices, side="left")
    positions = tf.minimum(found, tf.size(rows, out_type=found.dtype) - 1)
    return positions, tf.gather(rows, positions) == indices


class DPFEST(NoiseMechanism):
    """DP-SGD restricted to DP-selected rows: noise on every selected row, unselected rows frozen.

    Args (keyword-only):
      l2_norm_clip: per-example clip norm C (> 0).
      noise_multiplier: sigma (>= 0) of the training steps (`tfdp_embed.plan_run`
        calibrates it for the budget left after the selection).
      selection_epsilon: eps_1 (> 0), pure-DP budget of each selection,
        split equally over the tables that must choose.
      top_k: rows kept per table: an int for all tables or {table name: int}.
      top_fraction: alternative to `top_k`: a fraction in (0, 1] of each
        table's vocabulary (k = max(1, floor(fraction x vocabulary))).
      counts: optional {table name: count vector} (`bucket_counts`); when
        given, `init` runs the selection. Otherwise call `select` after `init`.
      counts_unit: what one count counts: "example" (each example's distinct ids once), or "user" (each
        user's distinct ids once: `bucket_counts` over user-level batches); only "user" counts train on
        user-level batches (`poisson_user_batches`).
      seed: int for reproducible noise and selection (tests), None for OS entropy.

    Raises:
      ValueError: on C <= 0, sigma < 0, eps_1 <= 0, k <= 0 or k > vocabulary,
        a fraction outside (0, 1], or both/neither of `top_k`, `top_fraction`.

    References: DP-FEST (NeurIPS 2023) §3.1, App. B.1, App. C.3, §4.3.
    """

    name = "fest"
    capabilities = MechanismCapabilities(
        strategies=ALL_STRATEGIES,
        tpu=True,
        one_off_events=True,
        needs_lookups=False,
        mixed_precision=True,
        noised_rows="selected",
        reselects=True,
        user_level=True,
    )

    def __init__(
        self,
        *,
        l2_norm_clip: float,
        noise_multiplier: float,
        selection_epsilon: float,
        top_k: int | Mapping[str, int] | None = None,
        top_fraction: float | Mapping[str, float] | None = None,
        counts: Mapping[str, np.ndarray] | None = None,
        counts_unit: str = "example",
        seed: int | None = None,
    ):
        super().__init__(l2_norm_clip=l2_norm_clip, noise_multiplier=noise_multiplier, seed=seed)
        self.selection_epsilon = check_positive("selection_epsilon", selection_epsilon)
        if counts_unit not in COUNTS_UNITS:
            raise ValueError(f"`counts_unit` must be one of {COUNTS_UNITS}; received {counts_unit!r}.")
        self.counts_unit = counts_unit
        if (top_k is None) == (top_fraction is None):
            raise ValueError(
                "Pass exactly one of `top_k` (rows per table) and `top_fraction` (fraction of "
                f"each vocabulary); received top_k={top_k!r}, top_fraction={top_fraction!r}."
            )
        if top_k is not None:
            for k in top_k.values() if isinstance(top_k, Mapping) else [top_k]:
                _check_k_type(k)
        else:
            for f in top_fraction.values() if isinstance(top_fraction, Mapping) else [top_fraction]:
                _check_fraction(f)
        # Plain Python config in a dataclass: tf.Module would wrap bare dicts in trackers.
        self._config = _Config(top_k=top_k, top_fraction=top_fraction, counts=counts)
        self._rows: dict = {}
        self.selection_count = tf.Variable(0, dtype=tf.int64, trainable=False, name="selection_count")

    # -- state ----------------------------------------------------------------------
    def init(self, *, tables, dense_variables, optimizer) -> None:
        """Creates each table's selection state: its `rows` ([k] int64, sorted; nothing of vocabulary size)."""
        super().init(tables=tables, dense_variables=dense_variables, optimizer=optimizer)
        names = [t.name for t in self._tables]
        if len(set(names)) != len(names):
            raise ValueError(f"DP-FEST keys its selection by table name; the names repeat: {names}.")
        if self._config.top_k is not None:
            ks = _per_table("top_k", self._config.top_k, self._tables)
        else:
            fractions = _per_table("top_fraction", self._config.top_fraction, self._tables)
            ks = {t.name: max(1, math.floor(fractions[t.name] * t.vocabulary_size)) for t in self._tables}
        for table in self._tables:
            k = ks[table.name]
            _check_k_type(k)
            if k > table.vocabulary_size:
                raise ValueError(
                    f"`top_k` for table {table.name!r} is {k}, more than its vocabulary of "
                    f"{table.vocabulary_size} rows; allowed: 1..{table.vocabulary_size}."
                )
            self._config.resolved_k[table.name] = int(k)
            with tf.name_scope(table.name):
                self._rows[table.name] = tf.Variable(tf.zeros([k], tf.int64), trainable=False, name="fest_rows")
        if self._config.counts is not None:
            self.select(self._config.counts)

    # -- selection --------------------------------------------------------------------
    def select(self, counts: Mapping[str, np.ndarray], *, epsilon: float | None = None) -> TopKSelection:
        """Runs the DP top-k selection (eps_1 pure DP) and freezes every other row.

        Args:
          counts: {table name: vocabulary-length count vector} for every table.
          epsilon: budget of this selection; defaults to `selection_epsilon`.

        Returns:
          The `TopKSelection` (rows, per-table eps, accounting event).

        Raises:
          RuntimeError: before `init`. ValueError: on missing tables or
            count vectors of the wrong length.
        """
        if not self._rows:
            raise RuntimeError("Call `init` (DPModel.prepare does it) before selecting rows.")
        missing = sorted(set(self._config.resolved_k) - set(counts))
        if missing:
            raise ValueError(f"`counts` has no count vector for tables {missing}.")
        vectors = {}
        for table in self._tables:
            vector = np.asarray(counts[table.name])
            if vector.shape != (table.vocabulary_size,):
                raise ValueError(
                    f"`counts[{table.name!r}]` must have shape ({table.vocabulary_size},) (the "
                    f"vocabulary); received {vector.shape}."
                )
            vectors[table.name] = vector
        eps = self.selection_epsilon if epsilon is None else check_positive("epsilon", epsilon)
        selection = select_top_k(vectors, top_k=self.top_k, epsilon=eps, rng=self.generator)
        for name, rows in selection.rows.items():
            self._rows[name].assign(rows)  # sorted (`select_top_k`): `_selected_positions` searches them
        self._config.selections.append(selection)
        self.selection_count.assign_add(1)
        return selection

    def reselect(self, counts: Mapping[str, np.ndarray], *, epsilon: float | None = None) -> TopKSelection:
        """Streaming re-selection (one per streaming period) from running counts; costs eps_1 again.

        Rows that leave the selection keep their current values; rows that
        enter it are trained from their current values. The new selection's
        event is appended to `selection_events` for the ledger.

        References: DP-FEST §4.3 (streaming-based frequency, running sum per period).
        """
        if not self._config.selections:
            raise RuntimeError("No selection yet: call `select(counts)` first, then `reselect` per period.")
        return self.select(counts, epsilon=epsilon)

    @property
    def top_k(self) -> dict:
        """Rows kept per table, {table name: k} (resolved by `init`)."""
        return dict(self._config.resolved_k)

    @property
    def selections(self) -> list:
        """Every `TopKSelection` so far, in order."""
        return list(self._config.selections)

    @property
    def selection_events(self) -> list:
        """The `dp_accounting` event of every selection so far (the first is `setup_event()`)."""
        return [s.event for s in self._config.selections]

    def selected_rows(self, table_name: str) -> np.ndarray:
        """The rows currently trained in table `table_name` (sorted)."""
        return self._rows[table_name].numpy()

    # -- the step -------------------------------------------------------------------
    @tf.autograph.experimental.do_not_convert
    def update(self, clipped: ClippedGradients) -> list:
        """Selected rows: clipped sum + N(0, sigma^2 C^2) on all k rows; unselected: dropped."""
        refuse_scored_tables(self, clipped.tables)
        tf.debugging.assert_positive(
            self.selection_count,
            message="DP-FEST has not selected any rows: pass `counts=` to DPFEST or call "
            "`select(counts)` after `init`, before training.",
        )
        std = self.noise_multiplier * self.l2_norm_clip
        blocks, rows_out = [], []
        for table in clipped.tables:
            name = table.layer.name
            if name not in self._rows:
                raise ValueError(f"Table {name!r} was not given to `init`; DP-FEST has no selection for it.")
            grad = table.gradient
            if std > 0:  # all k rows get written, most of them not read by this step's lookups
                sparse_rows.prefetch_rows(table.variable, self._rows[name])
            indices = tf.cast(grad.indices, tf.int64)
            positions, keep = _selected_positions(self._rows[name], indices)
            kept_values = tf.boolean_mask(grad.values, keep)
            if std > 0:  # DP-SGD on the selected subspace: all k rows, every step
                # Touched selected rows hold their clipped sum, the others 0 (positions are
                # unique: one write per row); the noise is added with the division below.
                shape = tf.stack([self._config.resolved_k[name], tf.shape(grad.values)[1]])
                blocks.append(tf.scatter_nd(tf.boolean_mask(positions, keep)[:, None], kept_values, shape))
                rows_out.append(self._rows[name].read_value())
            else:  # no noise: only the touched selected rows change
                blocks.append(kept_values)
                rows_out.append(tf.boolean_mask(indices, keep))
        # One generator draw: dense variables and every table's k rows as independent streams.
        dense = [grad for _, grad in clipped.dense]
        noised = self._noised_sums(dense + blocks, std, clipped.expected_batch_size)
        out = [(grad, variable) for grad, (variable, _) in zip(noised, clipped.dense)]
        for table, values, rows in zip(clipped.tables, noised[len(dense) :], rows_out):
            out.append((tf.IndexedSlices(values, rows, table.gradient.dense_shape), table.variable))
        self.steps.assign_add(1)
        return out

    # -- accounting -----------------------------------------------------------------
    def step_event(self, sampling_probability: float) -> dp_accounting.DpEvent:
        """One step: a Poisson-subsampled Gaussian with sigma (App. C.2/C.3)."""
        return dp_accounting.PoissonSampledDpEvent(
            sampling_probability, dp_accounting.GaussianDpEvent(self.noise_multiplier)
        )

    def setup_event(self) -> dp_accounting.DpEvent | None:
        """The first selection's event (None before it); re-selections are in `selection_events[1:]`."""
        return self._config.selections[0].event if self._config.selections else None

    @property
    def selection_unit(self) -> str:
        """The unit of the selection's counts (`counts_unit`)."""
        return self.counts_unit

    def report(self) -> dict:
        report = super().report()
        selections = self._config.selections
        total = sum(s.epsilon for s in selections)
        report.update(
            selection_epsilon=self.selection_epsilon,
            selections=[
                {
                    "top_k": dict(s.top_k),
                    "epsilon_per_table": dict(s.epsilons),
                    "gumbel_scale_per_table": dict(s.gumbel_scales),
                    "epsilon": s.epsilon,
                    "event": str(s.event),
                }
                for s in selections
            ],
            selection_epsilon_spent=total,
            caveats=[
                f"DP-FEST: {len(selections)} DP top-k selection(s), {total:g}-DP in total "
                "(pure DP, basic composition), then DP-SGD on the selected rows only; every "
                "selected row gets noise every step and unselected rows are frozen "
                "(post-processing). Total guarantee (App. C.3): (selection eps + DP-SGD eps at "
                "delta, delta); the ledger's composition of the selection event (a Gaussian "
                "dominating every eps-DP mechanism) with the steps is another valid bound.",
                f"Selection counts each {self.counts_unit}'s distinct ids once per table (add/remove-one "
                f"neighbours, one {self.counts_unit} = one privacy unit). The Gumbel scale is k_f / eps_f, "
                "not the paper's 1 / eps_f: one-shot top-k with Gumbel(1/eps) is k*eps-DP "
                "(Durfee & Rogers 2021).",
            ],
        )
        return report


__all__ = ["DPFEST", "refuse_scored_tables"]
