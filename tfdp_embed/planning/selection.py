"""Private hyperparameter selection: random search with a random number of runs (Papernot & Steinke 2022).

Picking the best of several DP runs is itself a release: the score that
decides it is computed on private data, and K runs cost up to K x epsilon by
basic composition. Papernot & Steinke show that when the NUMBER of runs is
random (truncated negative binomial or Poisson) and each run is one
data-independent random draw from the candidates, releasing only the best
run costs about as much as a few runs, whatever the number of candidates:

    K ~ D(mean, shape)                   drawn once, before any run
    for k = 1..K: c_k ~ Uniform(candidates); (model_k, score_k) = train(c_k)
    release argmax_k score_k (and its model), nothing else

`dp_accounting.dp_event.RepeatAndSelectDpEvent(run_event, mean, shape)` is
that whole search; its RDP accountant composes it (Theorems 2 and 6), which
is the epsilon reported here and the event put in the ledger.

    search = select_privately(candidates, train, run_event=plan_event(plan), mean_runs=5,
                              target_delta=1e-5, ledger=ledger, rng=np.random.default_rng())
    search.model, search.candidate, search.score, search.epsilon
    report = search_report(search, sampling_probability=q, dataset_size=N)  # the search's epsilon

The released model's report is the SEARCH's (`search_report`: the search's
ledger, the selected run's steps); a report built from one run's own ledger
would state that run's epsilon only, so after the search every run's
mechanism is marked (`accounting.search_runs`) and such a report is refused.
To spend a given epsilon on the whole search, plan it first (`plan_search`:
the per-run noise multiplier that makes the search meet the target).

A run whose score is not finite (a diverged run: NaN, +-inf) ranks below
every finite score, deterministically (the earliest run wins ties); it never
stops the search, which would make whether anything is released depend on
the data.

Distributions (`shape`): `GEOMETRIC` (1, P[K = k] = g (1 - g)^(k-1), the
paper's default), `POISSON` (inf; K = 0 happens with probability e^-mean and
then nothing is selected), `LOGARITHMIC` (0) or any shape in (0, inf)
(truncated negative binomial).

References: Papernot & Steinke, "Hyperparameter Tuning with Renyi
Differential Privacy", ICLR 2022 (arXiv 2110.03620), §3 and Theorems 2, 6;
`dp_accounting.rdp.RdpAccountant`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import dp_accounting
import numpy as np

from tfdp_embed.accounting.calibration import check_delta, compute_epsilon
from tfdp_embed.accounting.ledger import PrivacyLedger
from tfdp_embed.accounting.search_runs import mark_search_runs, searching
from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.planning.releases import SELECTION

GEOMETRIC = 1.0
POISSON = math.inf
LOGARITHMIC = 0.0


@dataclasses.dataclass(frozen=True)
class SelectionResult:
    """What a private search releases, and what it cost.

    Attributes:
      model: the selected run's model (None when no run was drawn, Poisson K = 0).
      candidate: the selected candidate (None when no run was drawn).
      score: its score as the run returned it (None when no run was drawn;
        non-finite only when every run's was).
      runs: K, the number of runs drawn. For the operator only: the analysis
        needs K hidden (best-of-k for a KNOWN k costs up to k x a run), so
        releasing K beside the model voids the search's epsilon.
      event: the `RepeatAndSelectDpEvent` of the whole search (in the ledger).
      epsilon: the search's epsilon at `delta` (RDP accountant).
      delta: delta.
      ledger: the search's `PrivacyLedger`: the caller's `ledger` (or a new
        one) holding the search's event; the released model's report is
        built from it (`search_report`).
    """

    model: Any
    candidate: Any
    score: float | None
    runs: int
    event: dp_accounting.DpEvent
    epsilon: float
    delta: float
    ledger: PrivacyLedger = dataclasses.field(default_factory=PrivacyLedger, repr=False)


def plan_event(plan) -> dp_accounting.DpEvent:
    """One run of `plan` (a `RunPlan`) as a single event: its one-off releases, its selections, all its steps.

    A DP selection the mechanism makes itself (DP-FEST's top-k: `Release.selection`,
    or `selection_epsilon` when the noise was given) is not in the plan's
    ledger; each planned selection of eps_1 is charged as the Gaussian that
    dominates every eps_1-DP mechanism (`pure_dp_dominating_noise_multiplier`,
    an upper bound of the mechanism's own selection event).

    Raises:
      ValueError: a plan without DP (its runs have no event to repeat).
    """
    if not plan.is_dp or plan.mechanism_name == "none":
        raise ValueError(f"`plan` must be a DP plan to repeat privately; received {plan.mechanism_name!r}.")
    from tfdp_embed.mechanisms.topk_selection import pure_dp_dominating_noise_multiplier

    ledger = plan.ledger()
    for epsilon in _planned_selections(plan):
        ledger.record_setup(dp_accounting.GaussianDpEvent(pure_dp_dominating_noise_multiplier(epsilon)))
    step = plan.mechanism.step_event(plan.sampling_probability)
    return ledger.as_event(extra_steps=plan.steps, step_event=step)


def _planned_selections(plan) -> list[float]:
    """eps_1 of every selection a run of `plan` makes (none for mechanisms that do not select)."""
    planned = [r for r in plan.releases if r.name == SELECTION]
    if planned:
        return [r.epsilon_each for r in planned for _ in range(r.count)]
    selection_epsilon = plan.mechanism_arguments.get("selection_epsilon")
    if selection_epsilon is None:
        selection_epsilon = getattr(plan.mechanism, "selection_epsilon", None)
    return [] if selection_epsilon is None else [float(selection_epsilon)] * len(plan.periods)


def select_privately(
    candidates: Sequence,
    train: Callable[[Any], tuple[Any, float]],
    *,
    run_event: dp_accounting.DpEvent | Callable[[Any], dp_accounting.DpEvent],
    mean_runs: float,
    target_delta: float,
    shape: float = GEOMETRIC,
    higher_is_better: bool = True,
    ledger=None,
    rng: np.random.Generator | int | None = None,
) -> SelectionResult:
    """Runs a random number of randomly drawn candidates and returns the best (Papernot & Steinke 2022).

    Args:
      candidates: non-empty sequence of hyperparameter settings (any objects;
        chosen uniformly at random, independently of the data).
      train: `train(candidate) -> (model, score)`, one DP run whose whole
        privacy cost is `run_event`; `score` a number computed by that run
        (e.g. its validation metric). A non-finite score ranks last.
      run_event: the event of ONE run (`plan_event(plan)`), or a function
        candidate -> event; then every candidate's event must be the same.
      mean_runs: E[K] >= 1.
      target_delta: delta in (0, 1) for the reported epsilon.
      shape: the distribution of K (`GEOMETRIC`, `POISSON`, `LOGARITHMIC` or
        a truncated-negative-binomial shape in (0, inf)).
      higher_is_better: select the largest score (False: the smallest).
      ledger: a `PrivacyLedger`; the search's event is recorded in it as one
        setup event BEFORE the first run (ask it with accountant="rdp": PLD
        cannot compose this event). None: a new ledger (`SelectionResult.ledger`).
      rng: numpy Generator or seed for K and the draws (None: fresh entropy).
        A seed is for tests and benchmarks: a known seed makes K public, and
        then `epsilon` no longer holds (see `SelectionResult.runs`).

    Returns:
      `SelectionResult`; only its model, candidate and score may be released,
      with `search_report(result, ...)`.

    Raises:
      ValueError: empty candidates, a bad mean/shape/delta, an event the RDP
        accountant cannot compose, or a run returning no (model, number) pair.
      PrivacyContractError: candidates whose runs cost different events.
    """
    candidates = _check_candidates(candidates)
    if not callable(train):
        raise ValueError(f"`train` must be callable as train(candidate) -> (model, score); received {train!r}.")
    event = dp_accounting.dp_event.RepeatAndSelectDpEvent(
        _one_run_event(run_event, candidates), *_mean_shape(mean_runs, shape)
    )
    epsilon = _search_epsilon(event, check_delta(target_delta))
    generator = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    runs = sample_run_count(generator, mean=event.mean, shape=event.shape)
    ledger = PrivacyLedger() if ledger is None else ledger
    ledger.record_setup(event)
    with searching(event):
        (model, candidate, score), mechanisms = _best_run(train, candidates, runs, generator, higher_is_better)
    mark_search_runs(mechanisms, selected=getattr(model, "mechanism", None), event=event)
    return SelectionResult(model, candidate, score, runs, event, epsilon, float(target_delta), ledger)


def _best_run(train, candidates: list, runs: int, generator, higher_is_better: bool) -> tuple[tuple, list]:
    """((model, candidate, score) of the best of `runs` uniformly drawn candidates, each run's mechanism)."""
    best: tuple | None = None
    mechanisms = []
    for _ in range(runs):
        candidate = candidates[int(generator.integers(len(candidates)))]
        model, score, rank = _checked_run(train, candidate, higher_is_better)
        mechanisms.append(getattr(model, "mechanism", None))
        if best is None or rank > best[3]:
            best = (model, candidate, score, rank)
    return (best[:3] if best is not None else (None, None, None)), mechanisms


def sample_run_count(rng: np.random.Generator, *, mean: float, shape: float) -> int:
    """Draws K: Poisson(mean) for shape inf, else the truncated negative binomial with E[K] = mean."""
    mean, shape = _mean_shape(mean, shape)
    if shape == POISSON:
        return int(rng.poisson(mean))
    gamma = tnb_gamma(mean=mean, shape=shape)
    if gamma >= 1.0:
        return 1
    if shape == GEOMETRIC:
        return int(rng.geometric(gamma))
    if shape == LOGARITHMIC:
        return int(rng.logseries(1.0 - gamma))
    while True:  # NB(shape, gamma) conditioned on K >= 1 (rejection: P[K = 0] = gamma^shape < 1)
        k = int(rng.negative_binomial(shape, gamma))
        if k > 0:
            return k


def tnb_gamma(*, mean: float, shape: float) -> float:
    """gamma of the truncated negative binomial with shape eta and E[K] = mean (P&S Definition 1).

    E[K] = eta (1 - g) / (g (1 - g^eta)) for eta > 0, (1 - g) / (g log(1/g)) for eta = 0; decreasing in g.
    """
    if mean == 1.0:
        return 1.0
    if shape == GEOMETRIC:
        return 1.0 / mean

    def excess(g: float) -> float:
        if shape == LOGARITHMIC:
            return (1.0 - g) / (g * -math.log(g)) - mean
        return shape * (1.0 - g) / (g * -math.expm1(shape * math.log(g))) - mean

    lo, hi = 1e-300, 1.0 - 1e-15
    for _ in range(200):
        mid = math.sqrt(lo * hi) if hi / lo > 4 else 0.5 * (lo + hi)
        lo, hi = (mid, hi) if excess(mid) > 0 else (lo, mid)
    return 0.5 * (lo + hi)


def _check_candidates(candidates) -> list:
    if isinstance(candidates, (str, bytes)) or not isinstance(candidates, Sequence) or len(candidates) == 0:
        raise ValueError(f"`candidates` must be a non-empty sequence of settings; received {candidates!r}.")
    return list(candidates)


def _mean_shape(mean, shape) -> tuple[float, float]:
    try:
        shape = float(shape)
    except (TypeError, ValueError):
        shape = math.nan
    if math.isnan(shape) or shape < 0:
        raise ValueError(
            f"`shape` must be >= 0 (0 logarithmic, 1 geometric, inf Poisson, else truncated negative binomial); "
            f"received {shape!r}."
        )
    if isinstance(mean, bool) or not isinstance(mean, (int, float)) or not math.isfinite(mean) or not mean >= 1:
        raise ValueError(f"`mean_runs` must be a finite number >= 1 (dp_accounting's bound); received {mean!r}.")
    return float(mean), shape


def _one_run_event(run_event, candidates: list) -> dp_accounting.DpEvent:
    if isinstance(run_event, dp_accounting.DpEvent):
        return run_event
    if not callable(run_event):
        raise ValueError(f"`run_event` must be a DpEvent or a function candidate -> DpEvent; received {run_event!r}.")
    events = [run_event(c) for c in candidates]
    for candidate, event in zip(candidates, events):
        if not isinstance(event, dp_accounting.DpEvent):
            raise ValueError(f"`run_event({candidate!r})` must return a DpEvent; received {event!r}.")
        if event != events[0]:
            raise PrivacyContractError(
                f"Candidate {candidate!r} costs {event!r} but candidate {candidates[0]!r} costs {events[0]!r}: "
                "the repeat-and-select analysis needs one event for every run. Plan every candidate to the "
                "same event (same sigma, sampling rate, steps and releases)."
            )
    return events[0]


def _search_epsilon(event, delta: float) -> float:
    try:
        return compute_epsilon(event, target_delta=delta, accountant="rdp")
    except ValueError as err:
        raise ValueError(f"`run_event` must be an event the RDP accountant composes; {err}") from None


def _checked_run(train, candidate, higher_is_better: bool) -> tuple[Any, float, float]:
    """(model, score, rank): rank orders runs, larger is better; a non-finite score ranks -inf (never an error)."""
    result = train(candidate)
    if not (isinstance(result, tuple) and len(result) == 2):
        raise ValueError(f"`train({candidate!r})` must return (model, score); received {type(result).__name__}.")
    model, score = result
    try:
        score = float(score)
    except (TypeError, ValueError):
        raise ValueError(
            f"`train({candidate!r})` must return (model, score) with a number as score; received {score!r}."
        ) from None
    if not math.isfinite(score):
        return model, score, -math.inf  # a diverged run: last, deterministically, whatever its sign
    return model, score, score if higher_is_better else -score


__all__ = [
    "GEOMETRIC",
    "LOGARITHMIC",
    "POISSON",
    "SelectionResult",
    "plan_event",
    "sample_run_count",
    "select_privately",
    "tnb_gamma",
]
