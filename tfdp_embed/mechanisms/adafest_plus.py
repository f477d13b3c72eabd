"""DP-AdaFEST+: DP-FEST pre-selection, then DP-AdaFEST inside the selected rows.

Before training, DP-FEST selects a set S_t of rows per table with DP top-k
(Gumbel noise on bucket counts, budget eps1; `tfdp_embed.mechanisms.fest`
and `topk_selection`). Every step then runs DP-AdaFEST restricted to S_t:

    v_i <- v_i restricted to S_t,  V_t = sum_i [v_i]_{C1} + N(0, sigma1^2 C1^2) on S_t,
    survivors = {j in S_t : V_t[j] >= tau},  noise N(0, sigma2^2 C2^2) on survivors only.

Rows outside S_t are never updated, touched or not. Untouched selected rows
survive by noise with p = P(N(0, sigma1^2 C1^2) >= tau); their positions are
drawn by geometric skips over the |S_t| selected rows, so per-step work is
proportional to the survivors, never to |S_t| or the vocabulary. The
selection is public after its DP release, so restricting the contribution
vectors to it keeps the map's sensitivity at C1.

Accounting: `setup_event()` is the selection's event (spent once, before
training); each step is PoissonSampled(q, Gaussian((sigma1^-2 + sigma2^-2)^-1/2))
as for DP-AdaFEST.

Example:
    >>> mechanism = DPAdaFESTPlus(
    ...     selected_rows={"user_id": top_rows}, selection_event=topk_event,
    ...     l2_norm_clip=1.0, noise_multiplier=1.2, contribution_clip=1.0,
    ...     contribution_noise_multiplier=2.0, threshold=5.0)  # no seed: OS entropy (ints are for tests)

References: Zhang et al., "Sparsity-Preserving Differentially Private
Training of Large Embedding Models", NeurIPS 2023: §4.2 (DP-AdaFEST+),
§3.1 and App. B.1 (DP-FEST selection), §3.2, Alg. 1, App. B.2, C.4.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import dp_accounting
import numpy as np
import tensorflow as tf

from tfdp_embed.mechanisms.adafest import DPAdaFEST
from tfdp_embed.mechanisms.capabilities import ALL_STRATEGIES, MechanismCapabilities
from tfdp_embed.mechanisms.fest import COUNTS_UNITS, refuse_scored_tables


def _as_rows(name: str, rows) -> np.ndarray:
    """Sorted distinct int64 rows, or a clear error naming the table."""
    array = np.asarray(rows.numpy() if hasattr(rows, "numpy") else rows)
    if array.ndim != 1 or not (array.size == 0 or np.issubdtype(array.dtype, np.integer)):
        raise ValueError(
            f"`selected_rows[{name!r}]` must be a 1-D sequence of integer row ids; received "
            f"dtype {array.dtype} and shape {array.shape}."
        )
    return np.unique(array.astype(np.int64))


class DPAdaFESTPlus(DPAdaFEST):
    """DP-AdaFEST restricted to rows pre-selected by DP-FEST (DP top-k per feature).

    Args (keyword-only):
      selected_rows: maps each `DPEmbedding` layer name to the row ids it may
        update (the DP-FEST selection, e.g. from `fest.py`). Every table must
        appear.
      selection_event: the `dp_accounting.DpEvent` of the selection (its eps1),
        returned by `setup_event()`. Pass `dp_accounting.NoOpDpEvent()` only
        when the selection comes from public data (e.g. a public frequency
        prior, §3.1).
      l2_norm_clip, noise_multiplier, contribution_clip,
      contribution_noise_multiplier, threshold, seed: as `DPAdaFEST` (`threshold`
        may map each table name to its own tau).
      counts_unit: what the selection's counts counted, as `DPFEST`'s: "example" or "user" (each user's
        distinct ids once); only a selection counted per user (or from public data) trains on
        user-level batches.

    Tables read by a data-independent scoring computation (a candidate tower
    over the catalogue, a full softmax) are refused at the first step: the
    scored rows outside the selection would never update yet keep being
    scored. `DPAdaFEST` noises scored rows every step instead.

    Raises:
      ValueError: a hyperparameter out of range, a table missing from
        `selected_rows`, or a selected row outside `[0, vocabulary_size)`.
      TypeError: `selection_event` is not a `dp_accounting.DpEvent`.

    References: DP-AdaFEST §4.2; DP-FEST §3.1, App. B.1.
    """

    name = "adafest+"
    capabilities = MechanismCapabilities(
        strategies=ALL_STRATEGIES,
        tpu=True,
        one_off_events=True,
        mixed_precision=True,
        noised_rows="thresholded",
        user_level=True,
    )

    def __init__(
        self,
        *,
        selected_rows: Mapping[str, object],
        selection_event: dp_accounting.DpEvent,
        l2_norm_clip: float,
        noise_multiplier: float,
        contribution_clip: float,
        contribution_noise_multiplier: float,
        threshold: float | Mapping[str, float],
        seed: int | None = None,
        counts_unit: str = "example",
    ):
        super().__init__(
            l2_norm_clip=l2_norm_clip,
            noise_multiplier=noise_multiplier,
            contribution_clip=contribution_clip,
            contribution_noise_multiplier=contribution_noise_multiplier,
            threshold=threshold,
            seed=seed,
        )
        if not isinstance(selected_rows, Mapping):
            raise TypeError(
                f"`selected_rows` must map DPEmbedding layer names to row ids; received {type(selected_rows).__name__}."
            )
        if not isinstance(selection_event, dp_accounting.DpEvent):
            raise TypeError(
                "`selection_event` must be the dp_accounting.DpEvent of the DP-FEST selection "
                "(dp_accounting.NoOpDpEvent() only for a selection made from public data); "
                f"received {selection_event!r}."
            )
        if counts_unit not in COUNTS_UNITS:
            raise ValueError(f"`counts_unit` must be one of {COUNTS_UNITS}; received {counts_unit!r}.")
        self.counts_unit = counts_unit
        self.selection_event = selection_event
        self.selection_epsilon: float | None = None  # pure-DP eps1, when known
        self._selected_rows = {str(k): _as_rows(str(k), v) for k, v in selected_rows.items()}
        self._selected: list = []

    @classmethod
    def from_selection(cls, selection, **kwargs) -> DPAdaFESTPlus:
        """Builds the mechanism from a `topk_selection.TopKSelection` (its rows and event).

        Args:
          selection: the DP-FEST selection (`select_top_k` / `DPFEST.select`).
          **kwargs: the keyword arguments of `DPAdaFEST`.
        """
        mechanism = cls(selected_rows=selection.rows, selection_event=selection.event, **kwargs)
        mechanism.selection_epsilon = float(selection.epsilon)
        return mechanism

    @classmethod
    def from_counts(
        cls,
        counts: Mapping[str, np.ndarray],
        *,
        selection_epsilon: float,
        top_k: Mapping[str, int] | None = None,
        top_fraction: float | None = None,
        **kwargs,
    ) -> DPAdaFESTPlus:
        """Runs the DP-FEST selection (eps1, DP top-k per table) and builds the mechanism.

            rows_f = top-k_f(h_f + Gumbel(k_f / eps_f)),  eps_f = eps1 / #tables that choose

        Args:
          counts: table name -> vocabulary-length bucket counts
            (`topk_selection.bucket_counts` over the training data).
          selection_epsilon: eps1 (> 0), pure-DP budget of the selection.
          top_k: table name -> rows kept k_f.
          top_fraction: alternative to `top_k`, as in `DPFEST`: a fraction in
            (0, 1] of every table's rows, k_f = max(1, floor(fraction x len(counts[f]))).
          **kwargs: the keyword arguments of `DPAdaFEST` (`seed` also seeds
            the selection; None draws it from OS entropy).

        Returns:
          A `DPAdaFESTPlus` whose `setup_event()` is the selection's event.

        References: DP-AdaFEST §4.2; DP-FEST App. B.1 (`topk_selection.select_top_k`).
        """
        from tfdp_embed.mechanisms.topk_selection import select_top_k

        if (top_k is None) == (top_fraction is None):
            raise ValueError(
                "Pass exactly one of `top_k` (rows per table) and `top_fraction` (fraction of each table's "
                f"rows); received top_k={top_k!r}, top_fraction={top_fraction!r}."
            )
        if top_fraction is not None:
            number = isinstance(top_fraction, (int, float)) and not isinstance(top_fraction, bool)
            if not number or not 0 < top_fraction <= 1:
                raise ValueError(f"`top_fraction` must be a number in (0, 1]; received {top_fraction!r}.")
            top_k = {name: max(1, int(math.floor(top_fraction * len(c)))) for name, c in counts.items()}
        assert top_k is not None
        seed = kwargs.get("seed")
        rng = None if seed is None else np.random.default_rng([int(seed), 0x5E1EC7])
        selection = select_top_k(counts, top_k=top_k, epsilon=selection_epsilon, rng=rng)
        return cls.from_selection(selection, **kwargs)

    def _init_selections(self) -> None:
        """Stores each table's sorted selection (plus a sentinel) as a variable."""
        names = [t.name for t in self._tables]
        missing = [n for n in names if n not in self._selected_rows]
        if missing:
            raise ValueError(
                f"`selected_rows` has no selection for table(s) {missing}; it has "
                f"{sorted(self._selected_rows)}. DP-AdaFEST+ needs a (possibly empty) selection "
                "for every DPEmbedding table."
            )
        unused = sorted(set(self._selected_rows) - set(names))
        if unused:
            raise ValueError(f"`selected_rows` names {unused}, which are not tables of this model (tables: {names}).")
        self._selected = []
        for i, table in enumerate(self._tables):
            rows = self._selected_rows[table.name]
            vocab = int(table.vocabulary_size)
            if rows.size and (rows[0] < 0 or rows[-1] >= vocab):
                raise ValueError(
                    f"`selected_rows[{table.name!r}]` has rows outside [0, {vocab}): min {rows[0]}, max {rows[-1]}."
                )
            self._selected.append(
                tf.Variable(
                    np.append(rows, vocab),  # sentinel: larger than every row id
                    trainable=False,
                    name=f"selected_rows_{i}",
                )
            )

    def update(self, clipped) -> list:
        refuse_scored_tables(self, clipped.tables)
        return super().update(clipped)

    # -- restriction hook -----------------------------------------------------
    def _selection(self, index: int) -> tf.Variable:
        """Table `index`'s selection (sorted, plus a sentinel): the map, the draw and the update keep to it."""
        return self._selected[index]

    # -- accounting and reporting ------------------------------------------
    @property
    def selection_unit(self) -> str | None:
        """The unit of the selection's counts (`counts_unit`); None for a selection from public data."""
        return None if isinstance(self.selection_event, dp_accounting.NoOpDpEvent) else self.counts_unit

    def setup_event(self) -> dp_accounting.DpEvent:
        """The DP-FEST selection's cost, spent once before training."""
        return self.selection_event

    def report(self) -> dict:
        report = super().report()
        report["selection_event"] = repr(self.selection_event)
        report["selection_epsilon"] = self.selection_epsilon
        report["selected_rows"] = {name: int(rows.size) for name, rows in self._selected_rows.items()}
        for i, entry in enumerate(report["tables"]):
            entry["expected_noise_only_rows"] = self._selected_rows[entry["table"]].size * self._thresholds.survival(i)
        report["caveats"] = list(report["caveats"]) + [
            "Rows outside the DP-FEST selection are never updated; the selection's privacy "
            "cost is the setup event, composed once with the per-step events."
        ]
        return report


__all__ = ["DPAdaFESTPlus"]
