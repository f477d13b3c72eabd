"""Group privacy: what an example-level guarantee says about a group of k units (a user with k examples).

Datasets that differ in a user's k examples are joined by a chain D_0 ~ D_1 ~ ... ~ D_k of
neighbours. If the mechanism is (eps', delta')-DP for one unit, chaining the
definition k times gives (Dwork & Roth 2014, Thm 2.2 with the delta terms kept):

    (k eps',  delta' (e^{k eps'} - 1) / (e^{eps'} - 1))-DP  for the group   (<= k e^{(k-1) eps'} delta')

An accountant gives a whole curve delta'(eps'), so the group's epsilon at a
target delta is the best point of the curve:

    eps_k(delta) = min { k eps' : delta'(eps') (e^{k eps'} - 1) / (e^{eps'} - 1) <= delta }

searched on a grid of eps' (refined by bisection around the first point that
meets the target). This is an upper bound for every mechanism the accountant
covers. It is *not* the tight group bound of a Poisson-subsampled Gaussian
(one step sees between 0 and k of the group's examples, sensitivity up to k C),
which `dp_accounting` has no event for; and composing the unit's PLD k times is
not a group bound at all (it describes k independent runs, not one run on
data that differ in k examples), so it is not offered.

Example:
    >>> group_epsilon(ledger, group_size=50, target_delta=1e-6)["epsilon"]   # a user with 50 ratings (PLD or RDP)

References: Dwork & Roth, "The Algorithmic Foundations of Differential Privacy", 2014, Thm 2.2;
Vadhan, "The Complexity of Differential Privacy", 2017, Lemma 2.2 (group privacy for (eps, delta)).
"""

from __future__ import annotations

import math

import numpy as np

from tfdp_embed.accounting.calibration import _as_event, make_accountant

METHOD = (
    "group privacy by chaining k neighbours: (k eps', delta' (e^{k eps'} - 1) / (e^{eps'} - 1)), minimised "
    "over the accountant's (eps', delta') curve; an upper bound, not the tight subsampled-Gaussian group bound"
)
_GRID = np.geomspace(1e-4, 1e3, 281)


def group_epsilon(
    events_or_ledger, *, group_size: int, target_delta: float, accountants: tuple = ("pld", "rdp")
) -> dict:
    """The epsilon at `target_delta` for a group of `group_size` units under a unit-level guarantee.

    eps_k(delta) = min over eps' of k eps'  s.t.  delta'(eps') (e^{k eps'} - 1) / (e^{eps'} - 1) <= delta

    Each accountant's curve delta'(eps') is a valid bound, so the smallest eps_k over `accountants` is
    kept. Both are tried by default: PLD is tight for small groups, but its pessimistic grid leaves a
    floor of about 1e-14 on delta'(eps'), which e^{(k-1) eps'} blows up for large k; RDP's tail has no
    such floor.

    Args:
      events_or_ledger: the run's `dp_accounting.DpEvent`(s) or `PrivacyLedger` (per unit, e.g. per example).
      group_size: k >= 1, the units of the group (a user's number of examples).
      target_delta: the group's delta in (0, 1).
      accountants: which curves to search ("pld", "rdp").

    Returns:
      dict: group_size, epsilon (inf when no point of any curve meets the target), delta, unit_epsilon and
      unit_delta (the point of the unit's curve used), accountant (the one that gave it), method.

    Raises:
      ValueError: k < 1 or delta outside (0, 1).

    References: Dwork & Roth 2014, Thm 2.2.
    """
    if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) or group_size < 1:
        raise ValueError(f"`group_size` must be an int >= 1; received {group_size!r}.")
    if not 0 < target_delta < 1:
        raise ValueError(f"`target_delta` must lie in (0, 1); received {target_delta!r}.")
    event = _as_event(events_or_ledger)
    best = {"epsilon": math.inf, "unit_epsilon": None, "unit_delta": None, "accountant": None}
    for name in accountants:
        found = _search(make_accountant(name).compose(event), int(group_size), float(target_delta))
        if found["epsilon"] < best["epsilon"]:
            best = {**found, "accountant": name}
    return dict(group_size=int(group_size), delta=float(target_delta), method=METHOD, **best)


def _search(curve, k: int, target_delta: float) -> dict:
    """The smallest k eps' on `curve` whose chained group delta meets the target (grid, then bisection)."""
    if k == 1:
        eps = float(curve.get_epsilon(target_delta))
        return {"epsilon": eps, "unit_epsilon": eps, "unit_delta": target_delta}
    log_target = math.log(target_delta)
    meets = [_log_group_delta(curve, eps, k) <= log_target for eps in _GRID]
    if not any(meets):
        return {"epsilon": math.inf, "unit_epsilon": None, "unit_delta": None}
    first = int(np.argmax(meets))
    low, high = (_GRID[first - 1], _GRID[first]) if first > 0 else (0.0, _GRID[0])
    for _ in range(30):  # between the last grid point that misses and the first that meets
        middle = 0.5 * (low + high)
        low, high = (low, middle) if _log_group_delta(curve, middle, k) <= log_target else (middle, high)
    return {"epsilon": k * float(high), "unit_epsilon": float(high), "unit_delta": float(curve.get_delta(high))}


def _log_group_delta(curve, unit_epsilon: float, k: int) -> float:
    """log of delta'(eps') (e^{k eps'} - 1) / (e^{eps'} - 1), the chained group delta at eps' > 0."""
    delta = float(curve.get_delta(unit_epsilon))
    if delta <= 0.0:
        return -math.inf
    x = unit_epsilon
    log_ratio = (k - 1) * x + math.log(-math.expm1(-k * x)) - math.log(-math.expm1(-x))
    return math.log(delta) + log_ratio


__all__ = ["METHOD", "group_epsilon"]
