"""Searches that run on coarse accountant grids and ask the exact grid only to confirm the answer.

The PLD accountant's cost grows as its grid (`value_discretization_interval`)
shrinks: a DP-SGD evaluation on the default grid (1e-4) costs about as much
as a hundred on 1e-2. A search for a noise multiplier or a step count
therefore runs on the coarse grids first, each narrowing the bracket for
the next finer one; the exact grid (the one the caller asked for) is asked
about the answer and its neighbour only. Nothing is assumed of the coarse
grids (PLD's pessimistic rounding makes them over-state epsilon, but no
answer relies on it); what the exact grid says decides:

    smallest_parameter:  eps_exact(x) <= target, and eps_exact(x / (1 + rtol)) > target
                         (checked, or predicted from the next coarser grid's slope)
    largest_count:       eps_exact(k) <= target < eps_exact(k + 1)

Each search takes its epsilon functions as a sequence of levels, coarse to
exact: `levels[i](x)` is epsilon at parameter x on grid i (callers memoise
them). One level is a plain search on that level.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import cast

from scipy import optimize

# The grids tried before the exact one (only those coarser than it).
COARSE_INTERVALS = (1e-2, 1e-3)

Level = Callable[[float], float]

# Secant steps on a finer grid before falling back to widening the bracket and Brent's method.
_SECANT_STEPS = 8


class Unreachable(ValueError):
    """Even the largest parameter allowed misses the target (on the exact grid)."""

    def __init__(self, epsilon_at_highest: float):
        super().__init__(f"epsilon {epsilon_at_highest:.6g} at the largest parameter")
        self.epsilon_at_highest = epsilon_at_highest


def search_intervals(exact_interval: float) -> tuple:
    """The PLD grids a search uses, coarse to exact: `COARSE_INTERVALS` coarser than `exact_interval`, then it."""
    return (*(g for g in COARSE_INTERVALS if g > 1.5 * exact_interval), exact_interval)


def smallest_parameter(
    levels: Sequence[Level],
    target: float,
    *,
    start: float,
    factor: float,
    lowest: float,
    highest: float,
    rtol: float,
    accelerate: bool = False,
) -> tuple[float, bool]:
    """(x, at_lowest): about the smallest x in [lowest, highest] with eps(x) <= target, eps decreasing in x.

    Args:
      levels: epsilon functions, coarse to exact.
      target: epsilon to meet.
      start: first probe of the first level's bracket search.
      factor: step of that bracket search (multiply going up, divide going down).
      accelerate: square the upward step after each probe (`bracket`).
      lowest, highest: the range searched.
      rtol: relative tolerance on x.

    Returns:
      x with levels[-1](x) <= target, and at_lowest: True when x is the
      lowest probe of a downward search that met the target all the way to
      `lowest` (x is then conservative, not the smallest).

    Raises:
      Unreachable: levels[-1](highest) > target.
    """
    exact, found, at_lowest = levels[-1], None, False
    for i, level in enumerate(levels):
        try:
            if found is None:
                lo, x = bracket(
                    level, target, start=start, factor=factor, lowest=lowest, highest=highest, accelerate=accelerate
                )
            else:
                lo, x = _bracket_near(level, levels[i - 1], target, found, rtol=rtol, lowest=lowest, highest=highest)
        except Unreachable:
            if level is exact or exact(highest) > target:
                raise Unreachable(exact(highest)) from None
            found = None  # a coarse grid's artefact: search the finer grid from scratch
            continue
        at_lowest = lo is None
        if lo is not None and x - lo > rtol * x:
            x = _brent(level, target, lo, x, tol=rtol * x)
        found = x
    return cast(float, found), at_lowest  # the exact level answered (or raised)


def largest_count(levels: Sequence[Level], target: float, *, start: int, highest: int) -> int:
    """The largest k in [0, highest] with eps(k) <= target, eps increasing in k and eps(0) <= target.

    Args:
      levels: epsilon functions of the count, coarse to exact.
      target: epsilon not to exceed.
      start: first count probed (e.g. one epoch's steps).
      highest: the largest count considered (returned when it still fits).

    Returns:
      k with levels[-1](k) <= target and (k == highest or levels[-1](k + 1) > target).
    """
    k: int | None = None
    for level in levels:
        if k is None:
            lo, hi = _bracket_count(level, target, lo=0, start=start, highest=highest)
        elif level(k) > target:
            lo, hi = 0, k
        elif k == highest or level(k + 1) > target:
            continue
        else:  # this grid allows more: extrapolate from the last step's increment of eps^2
            e0, e1 = level(k) ** 2, level(k + 1) ** 2
            extra = (target**2 - e1) / (e1 - e0) if e1 > e0 else k
            lo, hi = _bracket_count(level, target, lo=k + 1, start=k + 2 + int(1.1 * extra), highest=highest)
        k = lo if hi is None else _largest_fitting(level, target, lo, hi)
    return cast(int, k)  # the first level always answers


# -- continuous parameter -------------------------------------------------------------------


def _bracket_near(
    level: Level, coarser: Level, target: float, x: float, *, rtol: float, lowest: float, highest: float
) -> tuple[float | None, float]:
    """(lo, hi) around this grid's root, at most `rtol` wide when the secant steps converge; x: the coarser root.

    Secant steps on this grid, the first with the coarser grid's slope at x,
    each aimed just above the predicted root. When a feasible point is known
    and the root is predicted within `rtol` below it, that point is kept
    unchecked: on the last grid that costs one evaluation when the coarser
    root was already right. lo is None when the target is met down to `lowest`.
    """
    below = x / (1 + rtol)
    slope = (coarser(below) - coarser(x)) / (below - x)
    lo = hi = None
    for _ in range(_SECANT_STEPS):
        eps = level(x)
        if eps <= target:
            hi = x if hi is None else min(hi, x)
        else:
            lo = x if lo is None else max(lo, x)
        if lo is not None and hi is not None and hi - lo <= rtol * hi:
            return lo, hi
        if not slope < 0:
            break
        root = x + (target - eps) / slope
        if hi is not None and root >= hi / (1 + rtol):
            return hi / (1 + rtol), hi  # predicted: the root lies within rtol below hi
        step = max(root * (1 + rtol / 2), x * (1 + rtol)) if eps > target else root * (1 + rtol / 2)
        step = min(max(step, lowest, x / 4), highest, x * 4)
        if hi is not None and step >= hi:
            step = hi / (1 + rtol)
        if lo is not None and step <= lo:
            step = lo * (1 + rtol)
        if step == x:
            break
        eps_step = level(step)
        if eps_step != eps:
            slope = (eps_step - eps) / (step - x)
        x = step
    return _widen(level, target, lo, hi, lowest=lowest, highest=highest)


def _widen(level: Level, target: float, lo, hi, *, lowest, highest) -> tuple[float | None, float]:
    """Completes a bracket with one end known (both: returned as is), doubling the step away from it."""
    step = 1e-3
    while hi is None:
        candidate = min(lo * (1 + step), highest)
        if level(candidate) <= target:
            hi = candidate
        elif candidate == highest:
            raise Unreachable(level(candidate))
        else:
            lo, step = candidate, 2 * step
    while lo is None:
        candidate = max(hi / (1 + step), lowest)
        if level(candidate) > target:
            lo = candidate
        elif candidate == lowest:
            return None, candidate
        else:
            hi, step = candidate, 2 * step
    return lo, hi


def bracket(
    level: Level, target: float, *, start, factor, lowest, highest, accelerate: bool = False
) -> tuple[float | None, float]:
    """(lo, hi) with eps(lo) > target >= eps(hi); lo is None when eps <= target down to `lowest`.

    Going down it divides by `factor`; going up it multiplies by `factor`,
    or with `accelerate` by a step that squares after each probe (1.05, 1.1,
    1.22, 1.48, ...: a small first step still reaches a far bracket quickly).

    Raises:
      Unreachable: eps(highest) > target.
    """
    x = min(max(start, lowest), highest)
    if level(x) <= target:  # go down until infeasible
        hi = x
        while True:
            lo = hi / factor
            if lo < lowest:
                return None, hi
            if level(lo) > target:
                return lo, hi
            hi = lo
    lo, step = x, factor  # go up until feasible
    while True:
        hi = min(lo * step, highest)
        if level(hi) <= target:
            return lo, hi
        if hi == highest:
            raise Unreachable(level(hi))
        lo, step = hi, step * step if accelerate else step


def _brent(level: Level, target: float, lo: float, hi: float, *, tol: float) -> float:
    """Brent's method in [lo, hi] (eps(lo) > target >= eps(hi)); the result meets the target."""
    root = float(optimize.brentq(lambda x: level(x) - target, lo, hi, xtol=tol))
    if level(root) <= target:
        return root
    above = min(root + tol, hi)
    return above if level(above) <= target else hi


# -- integer count --------------------------------------------------------------------------


def _bracket_count(level: Level, target: float, *, lo: int, start: int, highest: int) -> tuple[int, int | None]:
    """(lo, hi) with eps(lo) <= target < eps(hi), eps(lo) known to fit; hi None when `highest` fits.

    Extrapolates: eps grows at least like sqrt(k), so k (target / eps_k)^2 tends to overshoot.
    """
    k = max(start, lo + 1)
    while True:
        k = min(k, highest)
        eps = level(k)
        if eps > target:
            return lo, k
        lo = k
        if k == highest:
            return lo, None
        ratio = (target / eps) ** 2 if eps > 0 else math.inf
        k = int(min(k * max(2.0, 1.1 * ratio), k * 1024.0, float(highest)))


def _largest_fitting(level: Level, target: float, lo: int, hi: int) -> int:
    """The largest k in [lo, hi) with eps(k) <= target, given eps(lo) <= target < eps(hi).

    Interpolation in eps^2 (about linear in k), with bisection as a safeguard;
    each probe also tries a neighbour a little beyond the guess, so an
    accurate guess ends the search at once.
    """
    bisect = False
    while hi - lo > 1:
        width = hi - lo
        if bisect:
            guess = (lo + hi) // 2
        else:
            e_lo, e_hi = level(lo) ** 2, level(hi) ** 2
            frac = (target**2 - e_lo) / (e_hi - e_lo) if math.isfinite(e_hi) and e_hi > e_lo else 0.5
            guess = lo + int(round(frac * width))
        guess = min(max(guess, lo + 1), hi - 1)
        offset = max(1, width // 256)
        if level(guess) <= target:
            lo = guess
            if guess + offset < hi and level(guess + offset) > target:
                hi = guess + offset
        else:
            hi = guess
            if guess - offset > lo and level(guess - offset) <= target:
                lo = guess - offset
        bisect = (hi - lo) > width / 2
    return lo


__all__ = ["COARSE_INTERVALS", "Unreachable", "bracket", "largest_count", "search_intervals", "smallest_parameter"]
