"""Planning a private run: from the privacy target to the calibrated mechanism, its ledger, budget and report.

    plan = plan_run("adafest", target_epsilon=3.0, target_delta=1e-5, sampling_probability=q, steps=T,
                    releases=[Release("output_calibration", epsilon_share=0.05)],
                    contribution_clip=1.0, threshold_sigmas=2.0)
    dp_model = DPModel(model, mechanism=plan.mechanism, expected_batch_size=q * N)
    budget = plan.budget()
    dp_model.fit(batches, epochs=E, callbacks=[budget])
    report = plan.report(dp_model=dp_model, ledger=budget.ledger, dataset_size=N)

The training noise sigma is the smallest whose steps, composed with every
release given as an event, meet the epsilon left after the pure-DP shares
(`accounting.periods.calibrate_periods`, one period or the noisiest of
several). What each mechanism gets is read from its class (`is_dp`, its
constructor's keywords), never from its name:

    takes `noise_multiplier` (dense, lazy)      sigma
    takes `contribution_noise_multiplier`       (sigma1, sigma2) = split_noise_multiplier(sigma, ratio), so
      (adafest, adafest+)                       the step is DP-SGD's Gaussian with sigma (DP-AdaFEST §3.3)
    takes `selection_epsilon` (fest, adafest+)  eps1 of the `Release.selection` share, per selection
    `is_dp` False (eana)                        sigma as dense would need: NOMINAL, no epsilon is claimed
    no `noise_multiplier` (none)                nothing

One-off releases charged to the same budget (`Release`):

    Release(name, epsilon_share=s)              pure (s x eps, 0)-DP, basic composition: training gets the
                                                rest; its ledger event is Laplace(1 / (s x eps)), exactly s x eps-DP
    Release.selection(s, count=P)               the same for a DP selection (P times, s x eps / P each); the
                                                mechanism records its own selection events
    Release(name, epsilon_share=s, noise=...)   a Gaussian/Laplace release sized so that it alone is
                                                (s x eps, delta)-DP, composed with the steps by the accountant
    Release(name, event=e)                      any `dp_accounting` event, composed with the steps

References: Abadi et al. 2016 (DP-SGD calibration); Dwork & Roth 2014
§3.5 (composition); DP-FEST (NeurIPS 2023) App. C.3 (selection + steps),
§3.3 (AdaFEST's split), §4.3 (streaming periods).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import dp_accounting

from tfdp_embed.accounting import PrivacyBudget, PrivacyLedger, privacy_report
from tfdp_embed.accounting.calibration import check_accountant, check_delta, check_epsilon
from tfdp_embed.accounting.periods import (
    Period,
    PeriodBudget,
    add_period_accounting,
    calibrate_periods,
    parallel_epsilon,
    period_ledgers,
)
from tfdp_embed.accounting.planning import RELEASE_MECHANISMS, release_epsilon, release_noise_multiplier
from tfdp_embed.mechanisms import factory
from tfdp_embed.mechanisms.adafest import split_noise_multiplier
from tfdp_embed.mechanisms.base import NoiseMechanism

SELECTION = "selection"
BASIC, ACCOUNTANT = "basic composition", "accountant"


@dataclasses.dataclass(frozen=True)
class Release:
    """A one-off DP release charged to the run's budget (see the module docstring for the kinds).

    Attributes:
      name: what is released, e.g. "output_calibration", "item_frequencies"
        ("selection": a mechanism's DP selection, see `Release.selection`).
      epsilon_share: share s in (0, 1) of the target epsilon.
      noise: "gaussian" or "laplace": size that release's noise for the share
        at the run's delta and compose it (None: pure DP, basic composition).
      event: an explicit `dp_accounting` event instead of a share.
      count: times a pure-DP release is made (s x eps / count each), e.g.
        one selection per streaming period.
    """

    name: str
    epsilon_share: float | None = None
    noise: str | None = None
    event: dp_accounting.DpEvent | None = None
    count: int = 1

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"`Release.name` must be a non-empty string; received {self.name!r}.")
        if (self.epsilon_share is None) == (self.event is None):
            raise ValueError(f"Release {self.name!r}: give exactly one of `epsilon_share` and `event`.")
        if self.event is not None and not isinstance(self.event, dp_accounting.DpEvent):
            raise TypeError(f"Release {self.name!r}: `event` must be a dp_accounting.DpEvent; received {self.event!r}.")
        if self.epsilon_share is not None and not 0 < self.epsilon_share < 1:
            raise ValueError(
                f"Release {self.name!r}: `epsilon_share` must lie in (0, 1); received {self.epsilon_share!r}."
            )
        if self.noise is not None and (self.event is not None or self.noise not in RELEASE_MECHANISMS):
            raise ValueError(
                f"Release {self.name!r}: `noise` (with `epsilon_share` only) must be one of "
                f"{tuple(RELEASE_MECHANISMS)}; received {self.noise!r}."
            )
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise ValueError(f"Release {self.name!r}: `count` must be an int >= 1; received {self.count!r}.")
        if self.count > 1 and not self.pure:
            raise ValueError(f"Release {self.name!r}: `count` > 1 is for pure-DP shares (no `noise`, no `event`).")

    @classmethod
    def selection(cls, epsilon_share: float, *, count: int = 1) -> Release:
        """A mechanism's DP selection (DP-FEST top-k): pure DP, `count` selections of s x eps / count each."""
        return cls(SELECTION, epsilon_share=epsilon_share, count=count)

    @property
    def pure(self) -> bool:
        """True for a pure-DP share charged by basic composition."""
        return self.event is None and self.noise is None


@dataclasses.dataclass(frozen=True)
class PlannedRelease:
    """What a `Release` costs in the plan.

    Attributes:
      name: the release's name.
      composition: `BASIC` (pure DP, deducted from the target) or `ACCOUNTANT`
        (composed with the steps by the accountant).
      epsilon: its epsilon alone (at the run's delta for `ACCOUNTANT`).
      epsilon_share: epsilon / target epsilon (None without a target).
      count: how many times it is made; `epsilon / count` each.
      noise_multiplier: the noise multiplier of its Gaussian/Laplace event, if it has one.
      events: what the plan's ledger pre-charges for it (none for a
        selection: the mechanism records its own events).
    """

    name: str
    composition: str
    epsilon: float
    epsilon_share: float | None
    count: int = 1
    noise_multiplier: float | None = None
    events: tuple = ()

    @property
    def epsilon_each(self) -> float:
        return self.epsilon / self.count

    def summary(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "events"}


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """A planned run: the calibrated mechanism and everything its budget and report need.

    Attributes:
      mechanism: the built `NoiseMechanism`.
      mechanism_name: its `MECHANISMS` name.
      target_epsilon: the run's epsilon (None when the noise was given).
      target_delta: delta.
      accountant: "pld" or "rdp".
      periods: the `Period`s (one for a plain run; several compose in parallel).
      parallel: True when several streaming periods were planned.
      l2_norm_clip: C (None for "none").
      noise_multiplier: the step's DP-SGD-equivalent sigma (NOMINAL for non-DP mechanisms; 0 for "none").
      noise_source: "calibrated", "given" or "non-private".
      mechanism_arguments: the noise arguments given to the mechanism
        (its noise multipliers, threshold, selection epsilon).
      training_epsilon: what the steps were calibrated for (target minus pure-DP shares).
      releases: the `PlannedRelease`s.
      assumptions: conditions the guarantee rests on (go into the report).
    """

    mechanism: NoiseMechanism
    mechanism_name: str
    target_epsilon: float | None
    target_delta: float
    accountant: str
    periods: tuple
    parallel: bool
    l2_norm_clip: float | None
    noise_multiplier: float
    noise_source: str
    mechanism_arguments: Mapping
    training_epsilon: float | None = None
    releases: tuple = ()
    assumptions: tuple = ()

    @property
    def is_dp(self) -> bool:
        return bool(self.mechanism.is_dp)

    @property
    def sampling_probability(self) -> float:
        """q (the largest over periods: epsilon grows with q)."""
        return max(p.sampling_probability for p in self.periods)

    @property
    def steps(self) -> int:
        """T, all planned steps (summed over periods)."""
        return sum(p.steps for p in self.periods)

    @property
    def events(self) -> tuple:
        """The one-off events the plan pre-charges (releases; a mechanism's selections are its own)."""
        return tuple(event for release in self.releases for event in release.events)

    def release(self, name: str) -> PlannedRelease:
        """The planned release called `name`."""
        for release in self.releases:
            if release.name == name:
                return release
        raise ValueError(f"No release {name!r} in this plan; planned: {[r.name for r in self.releases]}.")

    def ledger(self) -> PrivacyLedger:
        """A new ledger holding the plan's one-off events (the budget records the steps)."""
        ledger = PrivacyLedger()
        for event in self.events:
            ledger.record_setup(event)
        return ledger

    def budget(self, *, period: int | None = None, **kwargs):
        """The callback that enforces the plan: a `PrivacyBudget`, or period `period`'s `PeriodBudget`.

        Args:
          period: with several streaming periods, the index of the one to train.
          **kwargs: more `PrivacyBudget` arguments (`report_path`, `dataset_size`,
            `ledger` to resume: it must already hold the plan's events).

        Raises:
          ValueError: a plan without a target (noise given), a non-private
            plan, or a missing/extra `period`.
        """
        if self.target_epsilon is None or self.mechanism_name == "none":
            raise ValueError(
                f"This plan ({self.mechanism_name}, noise {self.noise_source}) has no epsilon target to enforce."
            )
        target = dict(target_epsilon=self.target_epsilon, target_delta=self.target_delta, accountant=self.accountant)
        if not self.parallel:
            if period is not None:
                raise ValueError("`period` is only for plans with several streaming `periods`.")
            kwargs.setdefault("ledger", self.ledger())
            return PrivacyBudget(self.mechanism, sampling_probability=self.sampling_probability, **target, **kwargs)
        if period is None or not 0 <= period < len(self.periods):
            raise ValueError(f"`period` must be an index in [0, {len(self.periods)}); received {period!r}.")
        return PeriodBudget(
            self.mechanism, period=self.periods[period], planned_one_off_events=self._mechanism_one_off_events(),
            events=self.events, **target, **kwargs,
        )  # fmt: skip

    def report(
        self,
        *,
        dataset_size: int,
        dp_model=None,
        batching=None,
        ledger: PrivacyLedger | None = None,
        steps: int | None = None,
        steps_by_period: Sequence[int] | None = None,
        epsilon: float | None = None,
        accountant: str | None = None,
        assumptions: Sequence[str] = (),
        extra: Mapping | None = None,
    ) -> dict:
        """The run's privacy report (`accounting.privacy_report`) under the plan's assumptions.

        Args:
          dataset_size: N.
          dp_model: the trained `DPModel`; its `batching` (what `fit` was fed) is reported.
          batching: instead of `dp_model`, a batching statement (see `privacy_report`).
          ledger: the budget's ledger (DP mechanisms; ignored for non-DP ones,
            whose steps it still gives).
          steps: steps run (without a ledger).
          steps_by_period: several periods: steps each period ran (parallel composition).
          epsilon: an epsilon computed elsewhere (e.g. a nominal one for non-DP mechanisms).
          accountant: how epsilon is computed (default the plan's).
          assumptions: more conditions, after the plan's.
          extra: more fields, beside `extra.plan` (this plan's `summary()`).
        """
        if batching is None:
            if dp_model is None:
                raise ValueError("Pass `dp_model` (its recorded batching is reported) or `batching`.")
            batching = dp_model.batching
        if ledger is not None and not self.is_dp:
            steps, ledger = ledger.steps if steps is None else steps, None
        common = dict(
            mechanism=self.mechanism, delta=self.target_delta, dataset_size=int(dataset_size), batching=batching,
            accountant=accountant or self.accountant, assumptions=[*self.assumptions, *assumptions],
            extra={"plan": self.summary(), **(extra or {})},
        )  # fmt: skip
        if self.parallel and self.mechanism_name != "none":
            report = self._parallel_report(common, steps=steps, steps_by_period=steps_by_period)
        else:
            report = privacy_report(
                **common, sampling_probability=self.sampling_probability, ledger=ledger, epsilon=epsilon, steps=steps
            )
        if not self.is_dp and self.noise_source == "calibrated":
            report["caveats"].append(
                f"The noise multiplier {self.noise_multiplier:.4g} is what dense DP-SGD would need for "
                f"epsilon={self.target_epsilon:g} at delta={self.target_delta:.3g}; {self.mechanism_name} with it "
                "has no such guarantee."
            )
        return report

    def summary(self) -> dict:
        """Every chosen setting and each release's epsilon share, printable and JSON-able."""
        out = {
            "mechanism": self.mechanism_name,
            "is_dp": self.is_dp,
            "noise_source": self.noise_source,
            "target_epsilon": self.target_epsilon,
            "target_delta": self.target_delta,
            "accountant": self.accountant,
            "sampling_probability": self.sampling_probability,
            "steps": self.steps,
            "l2_norm_clip": self.l2_norm_clip,
            "noise_multiplier": self.noise_multiplier,
            "mechanism_arguments": dict(self.mechanism_arguments),
            "training_epsilon": self.training_epsilon,
            "releases": [r.summary() for r in self.releases],
            "assumptions": list(self.assumptions),
        }
        if self.parallel:
            out["periods"] = [dataclasses.asdict(p) for p in self.periods]
        return out

    def _mechanism_one_off_events(self) -> int:
        """One-off events the mechanism itself records over the run (its selections)."""
        return sum(r.count for r in self.releases if r.name == SELECTION)

    def _parallel_report(self, common: dict, *, steps, steps_by_period) -> dict:
        if steps_by_period is None or len(steps_by_period) != len(self.periods):
            raise ValueError(f"`steps_by_period` must give the steps of each of the {len(self.periods)} periods.")
        ran = [Period(p.sampling_probability, s) for p, s in zip(self.periods, steps_by_period)]
        ledgers = period_ledgers(self.mechanism, ran, events=self.events)
        epsilons, worst = [None] * len(ledgers), 0
        if self.is_dp:
            epsilons, worst = parallel_epsilon(ledgers, delta=self.target_delta, accountant=common["accountant"])
        report = privacy_report(
            **common, sampling_probability=ran[worst].sampling_probability, epsilon=epsilons[worst],
            steps=sum(steps_by_period) if steps is None else steps,
        )  # fmt: skip
        return add_period_accounting(report, ledgers, epsilons, worst)


def plan_run(
    mechanism: str,
    *,
    target_epsilon: float | None = None,
    target_delta: float,
    accountant: str = "pld",
    sampling_probability: float | None = None,
    steps: int | None = None,
    periods: Sequence[Period] | None = None,
    l2_norm_clip: float = 1.0,
    releases: Sequence[Release] = (),
    seed: int | None = None,
    noise_multiplier: float | None = None,
    assumptions: Sequence[str] = (),
    **mechanism_options,
) -> RunPlan:
    """Plans a run: calibrates every noise multiplier and builds the mechanism (`mechanisms.create`).

    Args:
      mechanism: a `tfdp_embed.mechanisms.MECHANISMS` name.
      target_epsilon: epsilon of the whole run (nominal for non-DP mechanisms).
      target_delta: delta.
      accountant: "pld" (default) or "rdp".
      sampling_probability, steps: q and T of a plain run; or
      periods: `Period`s of a streaming run (parallel composition; one
        sigma for all, the noisiest period's).
      l2_norm_clip: C.
      releases: `Release`s charged to the same budget.
      seed: noise seed (None: OS entropy).
      noise_multiplier: sigma given instead of `target_epsilon` (nothing is calibrated).
      assumptions: conditions the guarantee rests on (e.g. public data), for the report.
      **mechanism_options: the mechanism's constructor options (`mechanisms.options(name)`),
        plus `ratio` (sigma1 / sigma2 of a contribution map, default 1) and
        `threshold_sigmas` (tau in units of sigma1 x contribution_clip).

    Returns:
      A frozen `RunPlan`.

    Raises:
      ValueError: an unknown mechanism or option, both or neither of
        `target_epsilon`/`noise_multiplier`, releases leaving nothing for
        training, a selecting mechanism without `Release.selection`, or a
        target the accountant cannot meet.
    """
    options = dict(mechanism_options)
    allowed = factory.options(mechanism, counts="counts" in options)
    delta, accountant = check_delta(target_delta), check_accountant(accountant)
    periods, parallel = _periods(sampling_probability, steps, periods)
    releases = tuple(releases)
    common = dict(mechanism_name=mechanism, target_delta=delta, accountant=accountant, periods=periods,
                  parallel=parallel, assumptions=tuple(assumptions))  # fmt: skip
    if "noise_multiplier" not in allowed:
        return _non_private(common, target_epsilon, noise_multiplier, releases, options, seed)
    if (target_epsilon is None) == (noise_multiplier is None):
        raise ValueError(
            f"Mechanism {mechanism!r} needs exactly one of `target_epsilon` (sigma is calibrated) and "
            f"`noise_multiplier`; received {target_epsilon!r}, {noise_multiplier!r}."
        )
    if target_epsilon is None:
        sigma, planned, training, source = _given(noise_multiplier, releases, delta, accountant)
    else:
        sigma, planned, training = _calibrated(check_epsilon(target_epsilon), releases, delta, accountant, periods)
        source = "calibrated"
    arguments = _noise_arguments(mechanism, sigma, options, allowed) | _selection_arguments(
        mechanism, planned, options, allowed, calibrated=target_epsilon is not None
    )
    built = factory.create(mechanism, l2_norm_clip=l2_norm_clip, seed=seed, **arguments, **options)
    return RunPlan(
        mechanism=built, target_epsilon=None if target_epsilon is None else float(target_epsilon),
        l2_norm_clip=built.l2_norm_clip, noise_multiplier=sigma, noise_source=source,
        mechanism_arguments=arguments, training_epsilon=training, releases=planned, **common,
    )  # fmt: skip


# -- helpers -----------------------------------------------------------------------------


def _periods(sampling_probability, steps, periods) -> tuple[tuple, bool]:
    """(periods, parallel): one `Period` from (q, T), or the given ones."""
    if periods is None:
        if sampling_probability is None or steps is None:
            raise ValueError("Pass `sampling_probability` and `steps`, or `periods`.")
        return (Period(sampling_probability, steps),), False
    if sampling_probability is not None or steps is not None:
        raise ValueError("Pass `periods` or (`sampling_probability`, `steps`), not both.")
    periods = tuple(periods)
    if not periods or not all(isinstance(p, Period) for p in periods):
        raise ValueError(f"`periods` must be a non-empty sequence of `Period`s; received {periods!r}.")
    return periods, len(periods) > 1


def _non_private(common: dict, target_epsilon, noise_multiplier, releases, options, seed) -> RunPlan:
    """A mechanism without noise ("none"): nothing to calibrate, nothing to charge."""
    if releases or noise_multiplier:
        raise ValueError(
            f"Mechanism {common['mechanism_name']!r} trains without noise: it takes no `releases` (no budget to "
            f"charge them to) and no `noise_multiplier`; received {list(releases)}, {noise_multiplier!r}."
        )
    built = factory.create(common["mechanism_name"], seed=seed, **options)
    return RunPlan(
        mechanism=built, target_epsilon=None if target_epsilon is None else float(target_epsilon),
        l2_norm_clip=None, noise_multiplier=0.0, noise_source="non-private", mechanism_arguments={}, **common,
    )  # fmt: skip


def _calibrated(target: float, releases: tuple, delta: float, accountant: str, periods: tuple):
    """(sigma, planned releases, training epsilon) for a target: shares deducted, events composed."""
    planned, training = [], target
    for release in releases:
        if not isinstance(release, Release):
            raise TypeError(f"`releases` must hold `Release`s; received {release!r}.")
        if release.pure:
            epsilon = target * release.epsilon_share
            training -= epsilon  # basic composition with a pure-DP release
            each = dp_accounting.LaplaceDpEvent(release.count / epsilon)  # exactly (epsilon / count)-DP
            events = () if release.name == SELECTION else (each,) * release.count
            share, count = release.epsilon_share, release.count
            planned.append(PlannedRelease(release.name, BASIC, epsilon, share, count, None, events))
        else:
            planned.append(_composed(release, target, delta, accountant))
    if training <= 0:
        shares = {r.name: r.epsilon_share for r in planned if r.composition == BASIC}
        raise ValueError(f"The release shares {shares} of epsilon leave nothing for training; their sum must be < 1.")
    composed = [event for r in planned if r.composition == ACCOUNTANT for event in r.events]
    sigma = calibrate_periods(
        periods, target_epsilon=training, target_delta=delta, releases=composed, accountant=accountant
    )
    return float(sigma), tuple(planned), training


def _composed(release: Release, target: float | None, delta: float, accountant: str) -> PlannedRelease:
    """A release composed by the accountant: its event (sized for its share if it has one) and what it spends."""
    event = release.event
    if event is None:
        z = release_noise_multiplier(
            epsilon=release.epsilon_share * target, delta=delta, mechanism=release.noise, accountant=accountant
        )
        event = RELEASE_MECHANISMS[release.noise](z)
    spent = release_epsilon([event], delta=delta, accountant=accountant)
    share = release.epsilon_share if release.epsilon_share is not None else None if target is None else spent / target
    z = getattr(event, "noise_multiplier", None)
    return PlannedRelease(release.name, ACCOUNTANT, spent, share, 1, z, (event,))


def _given(sigma, releases: tuple, delta: float, accountant: str):
    """(sigma, planned releases, None, "given"): nothing calibrated; only explicit events can be charged."""
    planned = []
    for release in releases:
        if not isinstance(release, Release) or release.event is None:
            raise ValueError(
                f"With `noise_multiplier` given there is no target epsilon to take shares of: pass releases as "
                f"`Release(name, event=...)`; received {release!r}."
            )
        planned.append(_composed(release, None, delta, accountant))
    return float(sigma), tuple(planned), None, "given"


def _noise_arguments(name: str, sigma: float, options: dict, allowed: frozenset) -> dict:
    """The mechanism's noise keywords: sigma, or (sigma1, sigma2, tau) for a contribution map."""
    ratio, sigmas = options.pop("ratio", None), options.pop("threshold_sigmas", None)
    if "contribution_noise_multiplier" not in allowed:
        if ratio is not None or sigmas is not None:
            raise ValueError(
                f"`ratio` and `threshold_sigmas` are for mechanisms with a contribution map, not {name!r}."
            )
        return {"noise_multiplier": sigma}
    sigma1, sigma2 = split_noise_multiplier(sigma, ratio=1.0 if ratio is None else ratio)
    arguments = {"noise_multiplier": sigma2, "contribution_noise_multiplier": sigma1}
    if sigmas is not None and options.get("threshold") is None:
        if "contribution_clip" not in options:
            raise ValueError("`threshold_sigmas` sets tau = threshold_sigmas x sigma1 x `contribution_clip`: pass it.")
        options.pop("threshold", None)
        arguments["threshold"] = sigmas * sigma1 * options["contribution_clip"]
    return arguments


def _selection_arguments(name: str, planned: tuple, options: dict, allowed: frozenset, *, calibrated: bool) -> dict:
    """`selection_epsilon` (per selection) from `Release.selection` for mechanisms that select."""
    selection = [r for r in planned if r.name == SELECTION]
    if "selection_epsilon" not in allowed:
        if selection:
            raise ValueError(f"Mechanism {name!r} makes no DP selection; drop `Release.selection`.")
        return {}
    if not calibrated:
        return {}  # noise given: `selection_epsilon` is the caller's option
    if not selection or "selection_epsilon" in options:
        raise ValueError(
            f"Mechanism {name!r} makes a DP selection: pass its budget as `releases=[Release.selection(share)]` "
            "(deducted from the target), not as `selection_epsilon`."
        )
    return {"selection_epsilon": selection[0].epsilon_each}


__all__ = ["ACCOUNTANT", "BASIC", "SELECTION", "PlannedRelease", "Release", "RunPlan", "plan_run"]
