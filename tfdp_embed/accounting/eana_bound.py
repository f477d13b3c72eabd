"""EANA's data-dependent Rényi bound (Theorem 3.1) and per-instance bound (Remark 2, eq. 9).

EANA (`tfdp_embed.mechanisms.eana`) is **not** differentially private: a row
that no example touches never changes, so the released model reveals which
ids occurred. What the paper proves instead is a *data-dependent* bound: for
the linear loss l(w, x) = <w, x> trained for one pass, if every coordinate
received at least C_0 noise draws, then for neighbours D' = D ∪ {x_*}

    D_alpha <= alpha L^2 / (2 (C_0 + 1 - alpha) sigma^2)
               + (d_0 / 2) ln(1 + 1/C_0)
               + d_0 / (2 (alpha - 1)) ln((C_0 + 1) / (C_0 + 1 - alpha))     (eq. 1)

and, for one given example x_* touching coordinates S_* (Remark 2),

    D_alpha <= sum_{j in S_*} [ alpha (x_*^j)^2 / (2 (C_j + 1 - alpha) sigma^2)
               + (1/2) ln(1 + 1/C_j)
               + 1 / (2 (alpha - 1)) ln((C_j + 1) / (C_j + 1 - alpha)) ].        (eq. 9)

The numbers these functions return hold only for datasets whose counts are
at least the ones given, only for the final model (not for intermediate
ones), and only for the linear loss the theorem analyses. They are labelled
as such and never carry `is_dp=True`.

Mapping the paper to this library:

* sigma / L is the noise multiplier z: EANA adds N(0, z^2 C^2) per coordinate
  of a touched row, C the clip norm, so L^2 / sigma^2 = 1 / z^2. Learning
  rate and batch divisor scale signal and noise alike (post-processing).
* C_j is the number of noise draws row j received: the number of steps in
  which it was touched. In the paper's setting (one example per step) that
  is the number of examples with a non-zero coordinate j. With batches the
  bound still holds with draws: if x_* joins a batch that already touches
  row j, the row gets no extra draw and the divergence is the pure mean
  shift alpha x^2 / (2 C_j sigma^2), which is below the first term (alpha
  >= 1) while the two log terms are >= 0.
* Coordinates, not rows: a row of an embedding of dimension k is k
  coordinates with the same count, so d_0 = sum over tables of (ids per
  example) x (embedding dimension), and in eq. 9 a touched row contributes
  its squared gradient norm to the first term and k times each log term.
* Neither sampling nor the number of steps enters: the theorem is about one
  pass over the data with the batch composition given (no amplification by
  subsampling is claimed); the steps are inside the counts. For several
  passes, compute one bound per pass (with that pass's counts) and add the
  RDP curves (adaptive composition, Mironov 2017 Prop. 1).
* Orders: the theorem states integers 2 <= alpha <= C_0; the Gaussian Rényi
  formula it uses (van Erven & Harremoës 2014, eq. 10) holds for every real
  alpha > 1 with C_0 + 1 - alpha > 0, which is what is allowed here. Other
  orders get +inf.

Example:
    >>> bound = eana_rdp_bound(noise_multiplier=1.0, touch_counts=[400, 900],
    ...                        max_coordinates_per_example=10, delta=1e-5)
    >>> bound.epsilon, bound.is_dp          # data-dependent, not DP
    (..., False)

References: Berlowitz et al., "EANA: Reducing Privacy Risk on Large-scale
Recommendation Models", RecSys 2022: §3.1, Theorem 3.1 (eq. 1), eqs. (3)
and (8), Remark 2 (eq. 9); Mironov 2017 (RDP -> (eps, delta), Prop. 3);
Canonne, Kamath & Steinke 2020, Prop. 12 (tighter conversion, as in
`dp_accounting.rdp`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant

from tfdp_embed._checks import check_positive

#: Orders tried by default: every integer to 128, then geometric to ~10^6
#: (the best order grows like sqrt(2 z^2 C_0 ln(1/delta))).
DEFAULT_ORDERS: tuple = tuple(
    [float(a) for a in range(2, 129)]
    + sorted({float(round(128 * 1.25**i)) for i in range(1, 60) if 128 * 1.25**i < 2e6})
)

NOT_DP_LABEL = (
    "data-dependent RDP bound for EANA (Berlowitz et al. 2022, {source}); NOT a "
    "differential-privacy guarantee: it holds only for datasets whose per-row noise "
    "counts are at least those given, for the final model only, and for the linear "
    "loss analysed in the paper"
)


@dataclasses.dataclass(frozen=True)
class EanaRdpBound:
    """A data-dependent (or per-instance) Rényi bound for EANA; never a DP guarantee.

    Attributes:
      kind: "theorem_3_1" (data-dependent, eq. 1) or "remark_2_eq_9" (per instance).
      orders: Rényi orders alpha.
      rdp: the bound at each order (+inf where the order is not allowed).
      delta: the delta of the conversion.
      epsilon: min over orders of the conversion of `dp_accounting.rdp`
        (Canonne et al. 2020, Prop. 12).
      optimal_order: the order achieving `epsilon` (None when epsilon is inf).
      epsilon_classic: min over orders of rdp + ln(1/delta) / (alpha - 1), the
        conversion the paper quotes (§2.2; Mironov 2017, Prop. 3).
      label: plain-words statement of what the numbers mean.
      is_dp: always False.
    """

    kind: str
    orders: tuple
    rdp: tuple
    delta: float
    epsilon: float
    optimal_order: float | None
    epsilon_classic: float
    label: str
    is_dp: bool = False

    def as_dict(self) -> dict:
        """The fields for a privacy report (is_dp False, label spelled out)."""
        return {
            "kind": self.kind,
            "is_dp": False,
            "label": self.label,
            "data_dependent_epsilon": self.epsilon,
            "data_dependent_epsilon_classic": self.epsilon_classic,
            "delta": self.delta,
            "optimal_order": self.optimal_order,
        }


def _check_orders(orders: Sequence[float]) -> np.ndarray:
    grid = np.asarray(list(orders), dtype=np.float64)
    if grid.ndim != 1 or grid.size == 0:
        raise ValueError(f"`orders` must be a non-empty list of numbers > 1; received {grid!r}.")
    if not np.all(np.isfinite(grid)) or np.any(grid <= 1):
        raise ValueError(f"`orders` must all be finite and > 1; received {grid.tolist()!r}.")
    return grid


def _check_delta(delta) -> float:
    delta = check_positive("delta", delta)
    if delta >= 1:
        raise ValueError(f"`delta` must lie in (0, 1); received {delta!r}.")
    return delta


def _check_counts(name: str, counts) -> np.ndarray:
    counts = np.asarray(counts, dtype=np.float64).reshape(-1)
    if counts.size == 0:
        raise ValueError(f"`{name}` must hold at least one count; received an empty array.")
    if not np.all(np.isfinite(counts)) or np.any(counts < 0):
        raise ValueError(f"`{name}` must be finite counts >= 0; received min {counts.min()!r}.")
    return counts


def _check_row_squared_norms(row_squared_norms, counts: np.ndarray, clip: float) -> np.ndarray:
    """s_j, one per row of `counts`, finite, >= 0 and summing to at most L^2 (x_* is clipped)."""
    norms = np.asarray(row_squared_norms, dtype=np.float64).reshape(-1)
    if norms.shape != counts.shape:
        raise ValueError(
            f"`row_squared_norms` needs one value per row of `touch_counts` ({counts.size}); received {norms.size}."
        )
    if np.any(norms < 0) or not np.all(np.isfinite(norms)):
        raise ValueError(f"`row_squared_norms` must be finite and >= 0; received {norms.tolist()!r}.")
    if norms.sum() > clip * clip * (1 + 1e-6):
        raise ValueError(
            f"`row_squared_norms` sum to {norms.sum()!r} > L^2 = {clip * clip!r}: x_* is a clipped "
            "example, its squared norm is at most the clip norm squared."
        )
    return norms


def _log_terms(orders: np.ndarray, count: np.ndarray) -> np.ndarray:
    """(1/2) ln(1 + 1/C) + ln((C + 1) / (C + 1 - alpha)) / (2 (alpha - 1)), [orders, rows].

    +inf where C = 0 or alpha >= C + 1 (the divergence is infinite there).
    """
    a = orders[:, None]
    c = count[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        room = c + 1.0 - a
        first = 0.5 * np.log1p(1.0 / c)
        second = (np.log(c + 1.0) - np.log(room)) / (2.0 * (a - 1.0))
        out = first + second
    return np.where((room > 0) & (c > 0), out, np.inf)


def _convert(kind: str, orders: np.ndarray, rdp: np.ndarray, delta: float, source: str) -> EanaRdpBound:
    rdp = np.where(np.isfinite(rdp) & (rdp >= 0), rdp, np.inf)
    epsilon, order = rdp_privacy_accountant.compute_epsilon(orders.tolist(), rdp.tolist(), delta)
    classic = float(np.min(rdp + math.log(1.0 / delta) / (orders - 1.0)))
    epsilon = float(epsilon)
    return EanaRdpBound(
        kind=kind,
        orders=tuple(orders.tolist()),
        rdp=tuple(float(r) for r in rdp),
        delta=delta,
        epsilon=epsilon,
        optimal_order=float(order) if math.isfinite(epsilon) else None,
        epsilon_classic=classic,
        label=NOT_DP_LABEL.format(source=source),
    )


def eana_rdp_bound(
    *,
    noise_multiplier: float,
    touch_counts,
    max_coordinates_per_example: int,
    delta: float,
    orders: Sequence[float] = DEFAULT_ORDERS,
) -> EanaRdpBound:
    """Theorem 3.1: the data-dependent RDP bound of EANA from per-row noise counts.

        rdp(alpha) = alpha / (2 (C_0 + 1 - alpha) z^2) + (d_0/2) ln(1 + 1/C_0)
                     + d_0 / (2 (alpha - 1)) ln((C_0 + 1) / (C_0 + 1 - alpha))

    with C_0 = min_j touch_counts[j], d_0 = `max_coordinates_per_example` and
    z = sigma / L the noise multiplier.

    Args:
      noise_multiplier: z = sigma / L (> 0): EANA's noise std on a coordinate
        is z times the clip norm.
      touch_counts: for **every** row of every table an example could touch,
        the number of noise draws it received (steps in which it was
        touched). A row with count 0 makes the bound infinite: its value
        reveals that no example used it.
      max_coordinates_per_example: d_0, the most non-zero gradient
        coordinates of one example over the embeddings: sum over tables of
        (most ids per example) x (embedding dimension).
      delta: the delta of the (eps, delta) conversion, in (0, 1).
      orders: Rényi orders alpha > 1; orders >= C_0 + 1 get +inf.

    Returns:
      An `EanaRdpBound` (kind "theorem_3_1", is_dp False).

    Raises:
      ValueError: on a noise multiplier <= 0, negative counts, d_0 < 1, a
        delta outside (0, 1), or orders <= 1.

    References: EANA (RecSys 2022) §3.1, Theorem 3.1, eqs. (1), (5)-(6).
    """
    z = check_positive("noise_multiplier", noise_multiplier)
    counts = _check_counts("touch_counts", touch_counts)
    if (
        isinstance(max_coordinates_per_example, bool)
        or not isinstance(max_coordinates_per_example, (int, np.integer))
        or max_coordinates_per_example < 1
    ):
        raise ValueError(
            "`max_coordinates_per_example` (d_0) must be an int >= 1 (ids per example x "
            f"embedding dimension, summed over tables); received {max_coordinates_per_example!r}."
        )
    delta = _check_delta(delta)
    grid = _check_orders(orders)
    c0 = np.array([counts.min()])
    d0 = float(max_coordinates_per_example)
    with np.errstate(divide="ignore"):
        room = c0[0] + 1.0 - grid
        mean_term = np.where(room > 0, grid / (2.0 * np.where(room > 0, room, 1.0) * z * z), np.inf)
    rdp = mean_term + d0 * _log_terms(grid, c0)[:, 0]
    return _convert("theorem_3_1", grid, rdp, delta, "Theorem 3.1, eq. 1")


def eana_per_instance_rdp_bound(
    *,
    noise_multiplier: float,
    touch_counts,
    row_squared_norms,
    row_dims,
    delta: float,
    l2_norm_clip: float = 1.0,
    orders: Sequence[float] = DEFAULT_ORDERS,
) -> EanaRdpBound:
    """Remark 2, eq. 9: the per-instance RDP bound for one example x_*.

        rdp(alpha) = sum_rows j [ alpha s_j / (2 (C_j + 1 - alpha) z^2 L^2)
                     + k_j ( (1/2) ln(1 + 1/C_j)
                             + ln((C_j + 1) / (C_j + 1 - alpha)) / (2 (alpha - 1)) ) ]

    over the rows j the example touches, s_j its squared (clipped) gradient
    norm on row j, k_j the row's dimension (its number of coordinates), C_j
    the row's noise count in D (without x_*).

    Args:
      noise_multiplier: z = sigma / L (> 0).
      touch_counts: C_j(D) for each row x_* touches.
      row_squared_norms: s_j, squared gradient norm of x_* on each of those
        rows, in the same units as `l2_norm_clip`; their sum must be <= L^2
        (x_* is clipped).
      row_dims: k_j, an int (all rows) or one int per row.
      delta: the delta of the conversion, in (0, 1).
      l2_norm_clip: L (> 0).
      orders: Rényi orders alpha > 1; orders >= min_j C_j + 1 get +inf.

    Returns:
      An `EanaRdpBound` (kind "remark_2_eq_9", is_dp False).

    Raises:
      ValueError: on mismatched lengths, a noise multiplier or clip <= 0,
        squared norms summing above L^2, or orders <= 1.

    References: EANA (RecSys 2022) §3.1, eq. (3), (8) and Remark 2, eq. (9).
    """
    z = check_positive("noise_multiplier", noise_multiplier)
    clip = check_positive("l2_norm_clip", l2_norm_clip)
    counts = _check_counts("touch_counts", touch_counts)
    norms = _check_row_squared_norms(row_squared_norms, counts, clip)
    dims = np.broadcast_to(np.asarray(row_dims), counts.shape).astype(np.float64)
    if np.any(dims < 1) or np.any(dims != np.round(dims)):
        raise ValueError(f"`row_dims` must be ints >= 1; received {np.asarray(row_dims).tolist()!r}.")
    delta = _check_delta(delta)
    grid = _check_orders(orders)
    a = grid[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        room = counts[None, :] + 1.0 - a
        mean = np.where(room > 0, a * norms[None, :] / (2.0 * room * (z * clip) ** 2), np.inf)
    rdp = np.sum(mean + dims[None, :] * _log_terms(grid, counts), axis=1)
    return _convert("remark_2_eq_9", grid, rdp, delta, "Remark 2, eq. 9")


__all__ = ["DEFAULT_ORDERS", "NOT_DP_LABEL", "EanaRdpBound", "eana_per_instance_rdp_bound", "eana_rdp_bound"]
