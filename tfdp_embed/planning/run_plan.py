"""`RunPlan`: a planned run's calibrated mechanism, and the ledger, budget and report that go with it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from tfdp_embed import front_end
from tfdp_embed.accounting import PrivacyLedger, privacy_report
from tfdp_embed.accounting.budget_history import record_setup_events
from tfdp_embed.accounting.dataset_size import DATASET_SIZE, ReleasedDatasetSize
from tfdp_embed.accounting.periods import add_period_accounting, parallel_epsilon, period_ledgers
from tfdp_embed.accounting.truncated import truncated_steps
from tfdp_embed.mechanisms.base import NoiseMechanism
from tfdp_embed.planning.releases import SELECTION, PlannedRelease


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """A planned run: the calibrated mechanism and everything its budget and report need.

    Attributes:
      mechanism: the built `NoiseMechanism`.
      mechanism_name: its `MECHANISMS` name.
      target_epsilon: the run's epsilon (None when the noise was given).
      target_delta: delta.
      accountant: "pld" or "rdp".
      periods: the `AccountingPeriod`s (one for a plain run; several compose in parallel).
      parallel: True when several streaming periods were planned.
      l2_norm_clip: C (None for "none").
      noise_multiplier: the step's DP-SGD-equivalent sigma (NOMINAL for non-DP mechanisms; 0 for "none").
      noise_source: "calibrated", "given" or "non-private".
      mechanism_arguments: the noise arguments given to the mechanism
        (its noise multipliers, threshold, selection epsilon).
      training_epsilon: what the steps were calibrated for (target minus pure-DP shares).
      releases: the `PlannedRelease`s.
      assumptions: conditions the guarantee rests on (go into the report).
      dataset_size: N when the plan knows it (from `batching` or `dataset_size`), the report's default.
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
    dataset_size: int | None = None

    @property
    def is_dp(self) -> bool:
        return bool(self.mechanism.is_dp)

    @property
    def step_source(self):
        """What the budget and report charge: the mechanism, as `truncated_steps` when the batches are truncated."""
        truncation = self.periods[0].truncation
        if self.parallel or truncation is None or self.mechanism_name == "none":
            return self.mechanism  # several periods: each `AccountingPeriod` truncates its own steps
        return truncated_steps(self.mechanism, dataset_size=truncation[0], max_batch_size=truncation[1])

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

    def steps_ledger(self, steps: int) -> PrivacyLedger:
        """What a budget would hold after `steps` steps: the plan's one-off events, the mechanism's own, the steps.

        For a run without a budget (sigma given): its report and any epsilon
        derived from it still count every release the plan made.
        """
        ledger = self.ledger()
        record_setup_events(ledger, self.step_source)
        ledger.record_steps(self.step_source.step_event(self.sampling_probability), steps)
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
        target: dict[str, Any] = dict(
            target_epsilon=self.target_epsilon, target_delta=self.target_delta, accountant=self.accountant
        )
        if not self.parallel:
            if period is not None:
                raise ValueError("`period` is only for plans with several streaming `periods`.")
            kwargs.setdefault("ledger", self.ledger())
            kwargs.setdefault("planned_steps", self.steps)
            return front_end.callbacks().PrivacyBudget(
                self.step_source, sampling_probability=self.sampling_probability, **target, **kwargs
            )
        if period is None or not 0 <= period < len(self.periods):
            raise ValueError(f"`period` must be an index in [0, {len(self.periods)}); received {period!r}.")
        return front_end.callbacks().PeriodBudget(
            self.mechanism,
            period=self.periods[period],
            planned_one_off_events=self._mechanism_one_off_events(),
            events=self.events,
            **target,
            **kwargs,
        )

    def report(
        self,
        *,
        dataset_size: int | ReleasedDatasetSize | None = None,
        dp_model=None,
        batching=None,
        ledger: PrivacyLedger | None = None,
        steps: int | None = None,
        steps_by_period: Sequence[int] | None = None,
        epsilon: float | None = None,
        accountant: str | None = None,
        assumptions: Sequence[str] = (),
        extra: Mapping | None = None,
        **unit,
    ) -> dict:
        """The run's privacy report (`accounting.privacy_report`) under the plan's assumptions.

        Args:
          dataset_size: N~ (`release_dataset_size`, charged with `Release.dataset_size`): the report
            states N~ only; an int N is stated exactly, under the assumption that N is public.
            None: the plan's N (`plan_run(batching=)` or `dataset_size=`).
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
          **unit: `privacy_unit`, `contribution_bound` (see `privacy_report`).
        """
        if batching is None and dp_model is None:
            raise ValueError("Pass `dp_model` (its recorded batching is reported) or `batching`.")
        dataset_size = self._report_dataset_size(dataset_size)
        if ledger is not None and not self.is_dp:
            steps, ledger = ledger.steps if steps is None else steps, None
        self._check_size_charged(dataset_size)
        if ledger is None and epsilon is None and steps is not None and self._releases_beyond_size():
            ledger, steps = self.steps_ledger(steps), None  # sigma given: the plan's other releases still count
        common = dict(
            mechanism=self.step_source,
            delta=self.target_delta,
            dataset_size=dataset_size if isinstance(dataset_size, ReleasedDatasetSize) else int(dataset_size),
            batching=dp_model.batching if batching is None else batching,
            accountant=accountant or self.accountant,
            assumptions=[*self.assumptions, *assumptions],
            extra={"plan": self.summary(), **(extra or {})},
            seeded_releases=[r.name for r in self.releases if r.seeded and r.name != DATASET_SIZE],
            **unit,
        )
        if self.parallel and self.mechanism_name != "none":
            report = self._parallel_report(common, steps=steps, steps_by_period=steps_by_period)
        else:
            report = privacy_report(
                **common, sampling_probability=self.sampling_probability, ledger=ledger, epsilon=epsilon, steps=steps
            )
        self._add_nominal_noise_caveat(report)
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

    def _releases_beyond_size(self) -> bool:
        """A one-DP-plan, one-period plan with accounted releases other than N~ (which the report adds itself)."""
        if not self.is_dp or self.parallel:
            return False
        return any(release.events for release in self.releases if release.name != DATASET_SIZE)

    def _report_dataset_size(self, dataset_size):
        """The report's N: the one given, else the plan's (ValueError when neither is known)."""
        dataset_size = self.dataset_size if dataset_size is None else dataset_size
        if dataset_size is None:
            raise ValueError("Pass `dataset_size`: this plan does not know N (plan with `batching=` to record it).")
        return dataset_size

    def _add_nominal_noise_caveat(self, report: dict) -> None:
        """A non-DP mechanism with a calibrated sigma: the report says the sigma's epsilon does not apply."""
        if not self.is_dp and self.noise_source == "calibrated":
            report["caveats"].append(
                f"The noise multiplier {self.noise_multiplier:.4g} is what dense DP-SGD would need for "
                f"epsilon={self.target_epsilon:g} at delta={self.target_delta:.3g}; {self.mechanism_name} with it "
                "has no such guarantee."
            )

    def _check_size_charged(self, size) -> None:
        """A released N~ of a DP plan must be one of its releases (else its cost is missing from epsilon)."""
        if not isinstance(size, ReleasedDatasetSize) or not self.is_dp:
            return
        if not any(size.event in r.events for r in self.releases if r.name == DATASET_SIZE):
            raise ValueError(
                "`dataset_size` is a released N~ this plan did not charge: pass "
                "`releases=[Release.dataset_size(size), ...]` to `plan_run`."
            )

    def _mechanism_one_off_events(self) -> int:
        """One-off events the mechanism itself records over the run (its selections)."""
        return sum(r.count for r in self.releases if r.name == SELECTION)

    def _parallel_report(self, common: dict, *, steps, steps_by_period) -> dict:
        if steps_by_period is None or len(steps_by_period) != len(self.periods):
            raise ValueError(f"`steps_by_period` must give the steps of each of the {len(self.periods)} periods.")
        ran = [dataclasses.replace(p, steps=s) for p, s in zip(self.periods, steps_by_period)]
        ledgers = period_ledgers(self.mechanism, ran, events=self.events)
        epsilons, worst = [None] * len(ledgers), 0
        if self.is_dp:
            epsilons, worst = parallel_epsilon(ledgers, delta=self.target_delta, accountant=common["accountant"])
        report = privacy_report(
            **common,
            sampling_probability=ran[worst].sampling_probability,
            epsilon=epsilons[worst],
            steps=sum(steps_by_period) if steps is None else steps,
        )
        return add_period_accounting(report, ledgers, epsilons, worst)


__all__ = ["RunPlan"]
