"""What a membership test can achieve against a run: TPR at each FPR from its PLD, and its mu-GDP (CLT).

One (eps, delta) pair bounds every test of "is this unit in the training data?":
TPR <= min(e^eps FPR + delta, 1 - e^-eps (1 - delta - FPR)) (`report.attacker_bound`).
The run's privacy loss distribution (PLD) gives delta(eps) for every eps at once,
and each pair is a true guarantee, so the minimum over a grid of eps is a bound
too, and never looser than the line of any eps on the grid:

    TPR(FPR) <= min over eps of min(e^eps FPR + delta(eps), 1 - e^-eps (1 - delta(eps) - FPR))

mu-GDP: the trade-off of telling N(0, 1) from N(mu, 1), TPR = Phi(Phi^-1(FPR) + mu).
For T Poisson-sampled Gaussian steps (q, sigma) the central limit theorem gives

    mu ~= q sqrt(T (e^(1 / sigma^2) - 1))

as T grows with q sqrt(T) fixed. It is an approximation, not a bound (it can
understate the loss for few steps or a large q): the report labels it so and
keeps the PLD rows as the bound.

Example:
    >>> event = dpsgd_event(sampling_probability=0.01, noise_multiplier=1.0, steps=10_000)
    >>> pld_tpr_bounds(event, fprs=(0.01,))        # [{"fpr": 0.01, "max_tpr": ...}]
    >>> gdp_mu_clt(sampling_probability=0.01, noise_multiplier=1.0, steps=10_000)   # 1.311

References: Kairouz, Oh & Viswanath 2015, Thm 2.1 (the (eps, delta) testing
region); Dong, Roth & Su, "Gaussian Differential Privacy", JRSS-B 2022, §2
(mu-GDP trade-off) and §5 (the CLT for noisy SGD); Bu, Dong, Long & Su,
"Deep Learning with Gaussian Differential Privacy", HDSR 2020, §3 (mu of DP-SGD).
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Sequence

import dp_accounting
import numpy as np
from scipy import stats

from tfdp_embed.accounting.calibration import check_sampling_probability, make_accountant

#: FPRs of the report's rows (those of `attacker_bound`).
DEFAULT_FPRS = (0.001, 0.01, 0.1)
#: eps grid points between 0 and the top of the default grid, then around each FPR's best eps.
GRID_POINTS = 24
# The reports' PLD grid step: a pessimistic PLD at 1e-2 bounds delta(eps) as the accounting's 1e-4 does
# (same TPRs to 4 decimals at sigma 0.3-2) and stays fast at small sigma, where 1e-4 took minutes.
REPORT_PLD_INTERVAL = 1e-2
REFINE_POINTS = 11


def _check_fprs(fprs) -> tuple[float, ...]:
    values = tuple(float(f) for f in fprs)
    if not values or not all(0 <= f <= 1 for f in values):
        raise ValueError(f"`fprs` must be numbers in [0, 1], at least one; received {fprs!r}.")
    return values


def pld_tpr_bounds(
    events_or_ledger,
    *,
    fprs: Sequence[float] = DEFAULT_FPRS,
    epsilons: Sequence[float] | None = None,
    extra_epsilons: Sequence[float] = (),
    value_discretization_interval: float | None = None,
) -> list[dict]:
    """The largest TPR any membership test reaches at each FPR, from the run's PLD (a bound).

    Args:
      events_or_ledger: a `dp_accounting.DpEvent`, a list of them, or a `PrivacyLedger`.
      fprs: false-positive rates in [0, 1].
      epsilons: the eps grid (>= 0); default 0 .. max(10, 4 eps(1e-6)) in `GRID_POINTS` steps, refined
        with `REFINE_POINTS` around each FPR's best eps.
      extra_epsilons: more grid points (the report adds its own eps: its rows are then never above
        `attacker_bound`'s).
      value_discretization_interval: the PLD grid step (default the library's).

    Returns:
      [{"fpr": FPR, "max_tpr": TPR}] in the order of `fprs`; max_tpr >= fpr (a coin reaches it).

    Raises:
      ValueError: FPRs outside [0, 1], negative epsilons, or an event the PLD accountant
        cannot compose (a non-DP mechanism).

    References: Kairouz, Oh & Viswanath 2015, Thm 2.1, applied at every eps of the PLD.
    """
    fprs = _check_fprs(fprs)
    accountant = _composed(events_or_ledger, value_discretization_interval)
    step = 0.0  # > 0: the default grid's spacing, refined around each FPR's best eps
    if epsilons is None:
        far = float(accountant.get_epsilon(1e-6))
        top = max(10.0, 4.0 * far) if math.isfinite(far) else 50.0
        base, step = np.linspace(0.0, top, GRID_POINTS + 1), top / GRID_POINTS
    else:
        base = np.asarray(epsilons, dtype=np.float64).reshape(-1)
    grid = np.concatenate([base, np.asarray(extra_epsilons, dtype=np.float64)])
    if grid.size == 0 or not np.all(np.isfinite(grid)) or grid.min() < 0:
        raise ValueError(f"`epsilons` must be a non-empty 1-D list of finite numbers >= 0; received {epsilons!r}.")
    curve = _DeltaCurve(accountant)
    rows = []
    for fpr in fprs:
        tpr, best = curve.best_tpr(fpr, np.unique(grid))
        if step:  # a finer grid around the coarse grid's best eps (any eps gives a valid bound)
            tpr = min(tpr, curve.best_tpr(fpr, np.linspace(max(0.0, best - step), best + step, REFINE_POINTS))[0])
        rows.append({"fpr": fpr, "max_tpr": float(min(1.0, max(fpr, tpr)))})
    return rows


def _composed(events_or_ledger, interval):
    """A PLD accountant with the run's events composed (a ledger, one event or a list of them)."""
    accountant = make_accountant("pld", value_discretization_interval=interval)
    event = events_or_ledger.as_event() if hasattr(events_or_ledger, "as_event") else events_or_ledger
    if isinstance(event, (list, tuple)):
        event = dp_accounting.ComposedDpEvent(list(event))
    if not accountant.supports(event):
        raise ValueError(f"the PLD accountant cannot compose {event!r}: no trade-off curve exists (not DP).")
    accountant.compose(event)
    return accountant


class _DeltaCurve:
    """delta(eps) of a composed accountant, each eps computed once (scalar calls: dp_accounting's
    vectorised one walks the whole support in Python, ~0.4 s)."""

    def __init__(self, accountant):
        self._accountant = accountant
        self._deltas: dict[float, float] = {}

    def delta(self, epsilon: float) -> float:
        if epsilon not in self._deltas:
            self._deltas[epsilon] = min(1.0, float(self._accountant.get_delta(epsilon)))
        return self._deltas[epsilon]

    def best_tpr(self, fpr: float, grid: np.ndarray) -> tuple[float, float]:
        """(min over the grid of min(e^eps FPR + delta, 1 - e^-eps (1 - delta - FPR)), the eps reaching it)."""
        deltas = np.array([self.delta(float(eps)) for eps in grid])
        lines = np.minimum(np.exp(grid) * fpr + deltas, 1.0 - np.exp(-grid) * (1.0 - deltas - fpr))
        at = int(np.argmin(lines))
        return float(lines[at]), float(grid[at])


def gdp_mu_clt(*, sampling_probability: float, noise_multiplier: float, steps: int) -> float:
    """mu ~= q sqrt(T (e^(1/sigma^2) - 1)): the CLT's mu-GDP of T Poisson-sampled Gaussian steps (an approximation).

    Returns `inf` for sigma = 0.

    References: Dong, Roth & Su 2022, §5 (CLT for noisy SGD); Bu et al. 2020, §3.
    """
    q = check_sampling_probability(sampling_probability)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"`steps` must be an int >= 0; received {steps!r}.")
    if not noise_multiplier >= 0:
        raise ValueError(f"`noise_multiplier` must be >= 0; received {noise_multiplier!r}.")
    if noise_multiplier == 0:
        return math.inf
    exponent = 1.0 / (noise_multiplier * noise_multiplier)
    if exponent > 700:  # e^(1/sigma^2) overflows: no useful approximation
        return math.inf
    return q * math.sqrt(steps * math.expm1(exponent))


def gdp_tpr(mu: float, fpr: float) -> float:
    """TPR = Phi(Phi^-1(FPR) + mu): the best test against mu-GDP at false-positive rate FPR.

    References: Dong, Roth & Su 2022, §2 (G_mu).
    """
    if not 0 <= fpr <= 1:
        raise ValueError(f"`fpr` must be in [0, 1]; received {fpr!r}.")
    if math.isinf(mu):
        return 1.0 if fpr > 0 else 0.0
    return float(stats.norm.cdf(stats.norm.ppf(fpr) + mu))


def gdp_fields(*, sampling_probability: float, noise_multiplier: float, steps: int, fprs=DEFAULT_FPRS) -> dict:
    """The report's mu-GDP section: mu by the CLT and its TPR rows, labelled an approximation."""
    mu = gdp_mu_clt(sampling_probability=sampling_probability, noise_multiplier=noise_multiplier, steps=steps)
    return {
        "mu": mu,
        "note": "central-limit approximation q sqrt(T (exp(1/sigma^2) - 1)) of the run's Gaussian DP, not a bound; "
        "the bound is pld_bounds",
        "bounds": [{"fpr": f, "tpr": gdp_tpr(mu, f)} for f in _check_fprs(fprs)],
    }


def gaussian_steps(entries) -> tuple[float, float, int] | None:
    """(q, sigma, T) when every (event, count) is a Poisson-sampled Gaussian step of one q and sigma; else None."""
    pair, total = None, 0
    for event, count in entries:
        while isinstance(event, dp_accounting.SelfComposedDpEvent):
            event, count = event.event, count * event.count
        if not (
            isinstance(event, dp_accounting.PoissonSampledDpEvent)
            and isinstance(event.event, dp_accounting.GaussianDpEvent)
        ):
            return None
        step = (float(event.sampling_probability), float(event.event.noise_multiplier))
        if pair not in (None, step):
            return None
        pair, total = step, total + int(count)
    return None if pair is None or total == 0 else (pair[0], pair[1], total)


def tradeoff_fields(entries, *, epsilon: float, fprs: Sequence[float] = DEFAULT_FPRS) -> dict:
    """The report's `pld_bounds` (a bound) and `gdp_clt` (an approximation) for a run's (event, count) entries.

    `pld_bounds` is left out when the PLD accountant cannot compose an event (e.g. truncated batches);
    `gdp_clt` when the run is not T Poisson-sampled Gaussian steps of one q and sigma (releases,
    selections, several sigmas). `epsilon` (the report's) joins the eps grid. Memoised per run
    (a report of the same ledger is written several times).
    """
    key = tuple((event, int(count)) for event, count in entries)
    return copy.deepcopy(_tradeoff_fields(key, float(epsilon), tuple(float(f) for f in fprs)))


@functools.lru_cache(maxsize=64)
def _tradeoff_fields(entries: tuple, epsilon: float, fprs: tuple) -> dict:
    events = [event if count == 1 else dp_accounting.SelfComposedDpEvent(event, count) for event, count in entries]
    fields: dict = {}
    if events and make_accountant("pld").supports(dp_accounting.ComposedDpEvent(events)):
        fields["pld_bounds"] = pld_tpr_bounds(
            events, fprs=fprs, extra_epsilons=(epsilon,), value_discretization_interval=REPORT_PLD_INTERVAL
        )
        fields["pld_note"] = (
            "the largest TPR at each FPR over all (eps, delta(eps)) of the run's privacy loss distribution: a bound, "
            "at most the (eps, delta) rows above"
        )
    steps = gaussian_steps(entries)
    if steps is not None:
        q, sigma, count = steps
        fields["gdp_clt"] = gdp_fields(sampling_probability=q, noise_multiplier=sigma, steps=count, fprs=fprs)
    return fields


__all__ = [
    "DEFAULT_FPRS",
    "GRID_POINTS",
    "REFINE_POINTS",
    "REPORT_PLD_INTERVAL",
    "gaussian_steps",
    "gdp_fields",
    "gdp_mu_clt",
    "gdp_tpr",
    "pld_tpr_bounds",
    "tradeoff_fields",
]
