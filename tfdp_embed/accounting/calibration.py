"""Noise calibration and epsilon computation with `dp_accounting` (PLD or RDP).

DP-SGD with Poisson sampling rate q, noise multiplier sigma and T steps is the
`dp_accounting` event

    SelfComposed(PoissonSampled(q, Gaussian(sigma)), T)

and `calibrate_noise_multiplier` finds the smallest sigma whose epsilon at
`target_delta` is at most `target_epsilon`. Every calibration in the library
(DP-SGD, with one-off releases, per streaming period, a release's own noise,
a hyperparameter search) is `calibrate` with an event factory sigma -> event,
as `dp_accounting.calibrate_dp_mechanism` takes one. All accounting is done by
`dp_accounting` accountants; this module only builds events, validates
arguments and searches. A PLD search runs on coarse grids and asks the
exact grid (the one asked for) only to confirm the answer
(`accounting.coarse_to_exact`); a search that runs over a second says so
(`accounting.progress`).

Example:
    >>> sigma = calibrate_noise_multiplier(target_epsilon=3.0, target_delta=1e-5,
    ...     sampling_probability=0.01, steps=1_000)
    >>> compute_epsilon(dpsgd_event(sampling_probability=0.01, noise_multiplier=sigma,
    ...     steps=1_000), target_delta=1e-5)  # <= 3.0, within 1%

References: Abadi et al. 2016 (DP-SGD, moments accountant); Mironov 2017 and
Mironov, Talwar, Zhang 2019 (RDP of the sampled Gaussian); Koskela et al.
2020 and Doroshenko et al. 2022 (PLD accounting, `dp_accounting.pld`).
"""

from __future__ import annotations

import functools
import logging
import math
import numbers
from collections.abc import Callable, Iterable
from typing import cast

import dp_accounting

from tfdp_embed.accounting.coarse_to_exact import Unreachable, search_intervals, smallest_parameter
from tfdp_embed.accounting.pld_steps import StepMemoPLDAccountant
from tfdp_embed.accounting.progress import announced

_LOG = logging.getLogger(__name__)

ACCOUNTANTS = ("pld", "rdp")

# dp_accounting's own default. The PLD accountant discretises the privacy loss
# pessimistically, so a coarser grid only ever over-states epsilon; 1e-4 keeps
# the over-statement below ~0.1% for typical DP-SGD runs (1e3-1e5 steps) at
# ~0.5 s per evaluation.
PLD_VALUE_DISCRETIZATION_INTERVAL = 1e-4

# Largest noise multiplier the calibration considers. A target that needs more
# noise than this is reported as unreachable for the given q and steps (it is
# then also usually below the accountant's numerical floor).
MAX_NOISE_MULTIPLIER = 1e4
# Smallest noise multiplier considered; a target met even at this value is
# returned with a warning (the returned sigma is then conservative).
MIN_NOISE_MULTIPLIER = 1e-2
# Relative tolerance on sigma: epsilon then lies within ~0.05% below the target.
_SIGMA_RTOL = 1e-4


def make_accountant(
    accountant: str = "pld", *, value_discretization_interval: float | None = None
) -> dp_accounting.PrivacyAccountant:
    """A fresh `dp_accounting` accountant.

    Args:
      accountant: "pld" (privacy loss distributions, tight; default) or "rdp"
        (Renyi DP with `dp_accounting`'s default orders 1.1..10.9, 11..63,
        128, 256, 512, 1024).
      value_discretization_interval: PLD grid step (PLD only); default
        `PLD_VALUE_DISCRETIZATION_INTERVAL`.

    Returns:
      An empty `dp_accounting.PrivacyAccountant` (add-or-remove-one adjacency).

    Raises:
      ValueError: `accountant` is not "pld" or "rdp".
    """
    accountant = check_accountant(accountant)
    if accountant == "rdp":
        return dp_accounting.rdp.RdpAccountant()
    interval = value_discretization_interval
    if interval is None:
        interval = PLD_VALUE_DISCRETIZATION_INTERVAL
    if not (isinstance(interval, (int, float)) and 0 < interval <= 1):
        raise ValueError(f"`value_discretization_interval` must be a number in (0, 1]; received {interval!r}.")
    return StepMemoPLDAccountant(value_discretization_interval=float(interval))


def dpsgd_event(*, sampling_probability: float, noise_multiplier: float, steps: int) -> dp_accounting.DpEvent:
    """The event of `steps` DP-SGD steps: SelfComposed(PoissonSampled(q, Gaussian(sigma)), T).

    Args:
      sampling_probability: Poisson sampling rate q in (0, 1].
      noise_multiplier: sigma >= 0 (noise std / clip norm).
      steps: T >= 1.

    Returns:
      A `dp_accounting.DpEvent`.

    References: Abadi et al. 2016, Alg. 1.
    """
    q = check_sampling_probability(sampling_probability)
    steps = check_steps(steps)
    if not noise_multiplier >= 0:
        raise ValueError(f"`noise_multiplier` must be >= 0; received {noise_multiplier!r}.")
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(float(noise_multiplier))), steps
    )


def compute_epsilon(
    events_or_ledger,
    *,
    target_delta: float,
    accountant: str = "pld",
    value_discretization_interval: float | None = None,
) -> float:
    """Epsilon at `target_delta` of everything in a ledger or a list of events.

    epsilon = accountant.compose(e_1, ..., e_n).get_epsilon(delta)

    Args:
      events_or_ledger: a `dp_accounting.DpEvent`, an iterable of them, or
        anything with an `as_event()` method (a `PrivacyLedger`).
      target_delta: delta in (0, 1).
      accountant: "pld" (default) or "rdp".
      value_discretization_interval: PLD grid step (PLD only).

    Returns:
      epsilon (float, `inf` if an event is non-private, e.g. sigma = 0).

    Raises:
      ValueError: bad delta or accountant, or an event the accountant cannot
        compose (e.g. EANA's `UnsupportedDpEvent`: EANA is not DP).

    References: `dp_accounting.PrivacyAccountant.get_epsilon`.
    """
    delta = check_delta(target_delta)
    event = _as_event(events_or_ledger)
    acc = make_accountant(accountant, value_discretization_interval=value_discretization_interval)
    if not acc.supports(event):
        raise ValueError(
            f"The {accountant!r} accountant cannot compose the event {event!r}. Only "
            "Gaussian/Laplace events, Poisson-sampled Gaussian/Laplace events and their "
            "compositions are allowed; an `UnsupportedDpEvent` comes from a mechanism that "
            "has no DP guarantee (e.g. EANA), for which no epsilon exists."
        )
    return float(acc.compose(event).get_epsilon(delta))


def calibrate(
    make_event: Callable[[float], dp_accounting.DpEvent],
    *,
    target_epsilon: float,
    target_delta: float,
    accountant: str = "pld",
    value_discretization_interval: float | None = None,
    what: str = "the event given",
    start: float = 1.0,
    factor: float = 2.0,
    accelerate: bool = False,
    lowest: float = MIN_NOISE_MULTIPLIER,
) -> float:
    """The smallest noise multiplier x with eps(make_event(x), delta) <= target_epsilon (eps decreasing in x).

    x* = min{x : eps(make_event(x), delta) <= eps_target}

    The library's one calibration; like `dp_accounting.calibrate_dp_mechanism`
    it takes an event factory. A bracket search from `start`, then Brent's
    method (`accounting.coarse_to_exact`); with PLD on coarse grids first,
    the exact grid confirming x and that x / (1 + 1e-4) misses the target.
    Epsilons are memoised by event (`entries_epsilon`).

    Args:
      make_event: x -> the whole run's `dp_accounting.DpEvent` at noise multiplier x.
      target_epsilon, target_delta: epsilon > 0 and delta in (0, 1).
      accountant, value_discretization_interval: "pld" (default, tight) or "rdp"; the PLD grid step.
      what: what is calibrated, for the progress line and the warning.
      start, factor, accelerate: the bracket search (`coarse_to_exact.bracket`).
      lowest: the smallest x considered; a target met there returns the
        lowest probe, with a warning (conservative).

    Returns:
      x (float), at most a relative 1e-4 above the smallest.

    Raises:
      ValueError: a bad argument (named).
      Unreachable: (a ValueError) even x = `MAX_NOISE_MULTIPLIER` misses the target.

    References: `dp_accounting.mechanism_calibration.calibrate_dp_mechanism`; Brent 1973.
    """
    target_epsilon, delta = check_epsilon(target_epsilon), check_delta(target_delta)
    accountant = check_accountant(accountant)
    interval = pld_interval(accountant, value_discretization_interval)
    levels = epsilon_levels(_event_entries(make_event), delta=delta, accountant=accountant, interval=interval)
    with announced(f"calibrating the noise multiplier for {what}") as note:
        sigma, at_lowest = smallest_parameter(
            levels,
            target_epsilon,
            start=start,
            factor=factor,
            accelerate=accelerate,
            lowest=lowest,
            highest=MAX_NOISE_MULTIPLIER,
            rtol=_SIGMA_RTOL,
        )
        note.result = f"noise multiplier {sigma:.6g} for {what}"
    if at_lowest:
        _LOG.warning("Even noise_multiplier=%g meets %s; returning it (conservative).", sigma, what)
    return sigma


def calibrate_noise_multiplier(
    *,
    target_epsilon: float,
    target_delta: float,
    sampling_probability: float,
    steps: int,
    accountant: str = "pld",
    value_discretization_interval: float | None = None,
) -> float:
    """The smallest noise multiplier sigma with epsilon(q, sigma, T, delta) <= target_epsilon (DP-SGD).

    sigma* = min{sigma : eps(SelfComposed(PoissonSampled(q, Gaussian(sigma)), T), delta) <= eps_target}

    `calibrate` with the DP-SGD event factory (`dpsgd_event`).

    Args:
      target_epsilon: epsilon > 0.
      target_delta: delta in (0, 1).
      sampling_probability: Poisson sampling rate q in (0, 1].
      steps: number of steps T >= 1.
      accountant: "pld" (default, tight) or "rdp".
      value_discretization_interval: PLD grid step (PLD only).

    Returns:
      sigma (float).

    Raises:
      ValueError: a bad argument (named in backticks), or a target that
        cannot be met with these q and steps (it would need sigma >
        `MAX_NOISE_MULTIPLIER` or lies below the accountant's precision).

    Example:
        >>> calibrate_noise_multiplier(target_epsilon=1.0, target_delta=1e-5,
        ...     sampling_probability=0.01, steps=1000, accountant="rdp")

    References: Abadi et al. 2016 §3.1.
    """
    q, steps = check_sampling_probability(sampling_probability), check_steps(steps)
    delta, accountant = check_delta(target_delta), check_accountant(accountant)
    what = f"epsilon={check_epsilon(target_epsilon):g} at delta={delta:.3g} (q={q:.4g}, {steps} steps, {accountant.upper()})"
    try:
        return calibrate(
            lambda sigma: dpsgd_event(sampling_probability=q, noise_multiplier=sigma, steps=steps),
            target_epsilon=target_epsilon,
            target_delta=delta,
            accountant=accountant,
            value_discretization_interval=value_discretization_interval,
            what=what,
        )
    except Unreachable as err:
        unreachable = (
            f"`target_epsilon`={target_epsilon!r} cannot be met at `target_delta`={delta!r} with "
            f"`sampling_probability`={q!r} and `steps`={steps!r} using the {accountant!r} accountant"
        )
        raise ValueError(_unreachable_message(unreachable, err.epsilon_at_highest)) from None


def pld_interval(accountant: str, value_discretization_interval: float | None) -> float | None:
    """The PLD grid step asked for (the default if None); None for RDP."""
    if accountant != "pld":
        return None
    if value_discretization_interval is None:
        return PLD_VALUE_DISCRETIZATION_INTERVAL
    make_accountant("pld", value_discretization_interval=value_discretization_interval)  # checks it
    return float(value_discretization_interval)


def epsilon_levels(make_entries: Callable, *, delta: float, accountant: str, interval: float | None) -> list:
    """eps(make_entries(x), delta) on each grid of a coarse-to-exact search (`search_intervals`; RDP: one).

    `make_entries(x)` gives `(event, count)` entries (`entries_epsilon`).
    """
    grids = search_intervals(cast(float, interval)) if accountant == "pld" else (None,)  # PLD: a float (pld_interval)

    def level(grid: float | None) -> Callable[[float], float]:
        return lambda x: entries_epsilon(make_entries(x), delta=delta, accountant=accountant, interval=grid)

    return [level(grid) for grid in grids]


def entries_epsilon(
    entries: tuple, *, delta: float, accountant: str, interval: float | None, merge: bool = True
) -> float:
    """epsilon of `(event, count)` entries, each `SelfComposed(event, count)`, all composed.

    With `merge`, neighbouring entries of the same event are merged into one
    self-composition (a budget's "ledger plus k more steps"); without, the
    entries are composed as they are (a `PrivacyLedger`'s `as_event`).
    Memoised when the events are hashable (a pure function of the entries,
    delta, accountant and grid), so every epsilon of one run, from the
    calibration to the report, is computed once per distinct event sequence.
    """
    merged: list = []
    for event, count in entries:
        if merge and merged and merged[-1][0] == event:
            merged[-1] = (event, merged[-1][1] + count)
        else:
            merged.append((event, int(count)))
    interval = pld_interval(accountant, interval)  # one memo key for the default grid, however it is named
    try:
        return _entries_epsilon(tuple(merged), delta, accountant, interval)
    except TypeError:  # an unhashable event: compute without the memo
        return _entries_epsilon.__wrapped__(tuple(merged), delta, accountant, interval)


def _event_entries(make_event: Callable[[float], dp_accounting.DpEvent]) -> Callable[[float], tuple]:
    """x -> the `(event, count)` entries of make_event(x): a composition's parts, self-compositions as counts."""

    def entry(event: dp_accounting.DpEvent) -> tuple:
        if isinstance(event, dp_accounting.SelfComposedDpEvent):
            return (event.event, event.count)
        return (event, 1)

    def make_entries(x: float) -> tuple:
        event = make_event(x)
        parts = event.events if isinstance(event, dp_accounting.ComposedDpEvent) else [event]
        return tuple(entry(part) for part in parts)

    return make_entries


@functools.lru_cache(maxsize=1024)
def _entries_epsilon(entries: tuple, delta: float, accountant: str, interval: float | None) -> float:
    # Built as `PrivacyLedger.as_event` builds them, so a ledger's epsilon is the same number either way.
    events = [event if count == 1 else dp_accounting.SelfComposedDpEvent(event, count) for event, count in entries]
    return compute_epsilon(events, target_delta=delta, accountant=accountant, value_discretization_interval=interval)


def _unreachable_message(unreachable: str, eps_max: float) -> str:
    return (
        f"{unreachable}: even `noise_multiplier`={MAX_NOISE_MULTIPLIER:g} gives "
        f"epsilon={eps_max:.6g}. Allowed: a larger `target_epsilon`, fewer `steps` "
        "or a smaller `sampling_probability`."
    )


# -- validation ------------------------------------------------------------------


def check_epsilon(value, name: str = "target_epsilon") -> float:
    """epsilon must be a finite number > 0."""
    if not _is_number(value) or not (0 < value < math.inf):
        raise ValueError(f"`{name}` must be a finite number > 0; received {value!r}.")
    return float(value)


def check_delta(value, name: str = "target_delta") -> float:
    """delta must be a number in (0, 1)."""
    if not _is_number(value) or not (0 < value < 1):
        raise ValueError(f"`{name}` must be a number in the open interval (0, 1); received {value!r}.")
    return float(value)


def check_sampling_probability(value, name: str = "sampling_probability") -> float:
    """q must be a number in (0, 1]."""
    if not _is_number(value) or not (0 < value <= 1):
        raise ValueError(f"`{name}` must be a number in (0, 1]; received {value!r}.")
    return float(value)


def check_steps(value, name: str = "steps", *, allow_zero: bool = False) -> int:
    """steps must be an int >= 1 (>= 0 with `allow_zero`)."""
    low = 0 if allow_zero else 1
    if isinstance(value, bool) or not _is_integral(value) or int(value) < low:
        raise ValueError(f"`{name}` must be an integer >= {low}; received {value!r}.")
    return int(value)


def check_accountant(accountant) -> str:
    """accountant must be "pld" or "rdp"."""
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"`accountant` must be one of {ACCOUNTANTS}; received {accountant!r}.")
    return accountant


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and value == value  # not NaN


def _is_integral(value) -> bool:
    return isinstance(value, numbers.Real) and math.isfinite(value) and math.trunc(value) == value


def _as_event(events_or_ledger) -> dp_accounting.DpEvent:
    if isinstance(events_or_ledger, dp_accounting.DpEvent):
        return events_or_ledger
    if hasattr(events_or_ledger, "as_event"):
        return events_or_ledger.as_event()
    if isinstance(events_or_ledger, Iterable) and not isinstance(events_or_ledger, (str, bytes)):
        events = list(events_or_ledger)
        for event in events:
            if not isinstance(event, dp_accounting.DpEvent):
                raise TypeError(f"`events_or_ledger` must hold `dp_accounting.DpEvent`s; received {event!r}.")
        return dp_accounting.ComposedDpEvent(events)
    raise TypeError(
        "`events_or_ledger` must be a `dp_accounting.DpEvent`, an iterable of them or a "
        f"`PrivacyLedger`; received {type(events_or_ledger).__name__}."
    )


__all__ = [
    "ACCOUNTANTS",
    "MAX_NOISE_MULTIPLIER",
    "MIN_NOISE_MULTIPLIER",
    "PLD_VALUE_DISCRETIZATION_INTERVAL",
    "calibrate",
    "calibrate_noise_multiplier",
    "check_accountant",
    "check_delta",
    "check_epsilon",
    "check_sampling_probability",
    "check_steps",
    "compute_epsilon",
    "dpsgd_event",
    "entries_epsilon",
    "epsilon_levels",
    "make_accountant",
    "pld_interval",
]
