"""One-off releases of a planned run (`Release`) and what each costs in the plan (`PlannedRelease`).

A pure-DP share is deducted from the target (basic composition); a Gaussian
or Laplace release sized for its share, or an explicit event, is composed
with the steps by the accountant (`tfdp_embed.accounting.one_off_releases`).

References: Dwork & Roth 2014 §3.5 (composition); DP-FEST (NeurIPS 2023)
App. C.3 (selection + steps).
"""

from __future__ import annotations

import dataclasses
from typing import cast

import dp_accounting

from tfdp_embed.accounting.contribution_bound import CONTRIBUTION_BOUND, ReleasedContributionBound
from tfdp_embed.accounting.dataset_size import DATASET_SIZE, ReleasedDatasetSize
from tfdp_embed.accounting.one_off_releases import RELEASE_MECHANISMS, release_epsilon, release_noise_multiplier

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
      seeded: its noise is (or will be) drawn from an explicit seed (tests):
        the report then names it among what whoever knows the seed can undo.
    """

    name: str
    epsilon_share: float | None = None
    noise: str | None = None
    event: dp_accounting.DpEvent | None = None
    count: int = 1
    seeded: bool = False

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

    @classmethod
    def dataset_size(cls, size: ReleasedDatasetSize) -> Release:
        """The DP release of N (`tfdp_embed.release_dataset_size`): its Gaussian event, composed with the steps."""
        if not isinstance(size, ReleasedDatasetSize):
            raise TypeError(f"`size` must be a `ReleasedDatasetSize` (release_dataset_size); received {size!r}.")
        return cls(DATASET_SIZE, event=size.event, seeded=size.seeded)

    @classmethod
    def contribution_bound(cls, bound: ReleasedContributionBound) -> Release:
        """The DP release of k (`tfdp_embed.release_contribution_bound`): its Gaussian event, composed with the steps."""
        if not isinstance(bound, ReleasedContributionBound):
            raise TypeError(
                f"`bound` must be a `ReleasedContributionBound` (release_contribution_bound); received {bound!r}."
            )
        return cls(CONTRIBUTION_BOUND, event=bound.event, seeded=bound.seeded)

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
      seeded: the release's `seeded`.
    """

    name: str
    composition: str
    epsilon: float
    epsilon_share: float | None
    count: int = 1
    noise_multiplier: float | None = None
    events: tuple = ()
    seeded: bool = False

    @property
    def epsilon_each(self) -> float:
        return self.epsilon / self.count

    def summary(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "events"}


def plan_releases(releases: tuple, *, target: float, delta: float, accountant: str) -> tuple[tuple, float]:
    """(planned releases, training epsilon) for a target: pure-DP shares deducted, the others sized as events.

    Raises:
      TypeError: an item that is not a `Release`.
      ValueError: shares leaving nothing for training.
    """
    planned, training = [], target
    for release in releases:
        if not isinstance(release, Release):
            raise TypeError(f"`releases` must hold `Release`s; received {release!r}.")
        if release.pure:
            epsilon = target * cast(float, release.epsilon_share)  # a pure release has a share
            training -= epsilon  # basic composition with a pure-DP release
            each = dp_accounting.LaplaceDpEvent(release.count / epsilon)  # exactly (epsilon / count)-DP
            events = () if release.name == SELECTION else (each,) * release.count
            share, count = release.epsilon_share, release.count
            planned.append(PlannedRelease(release.name, BASIC, epsilon, share, count, None, events, release.seeded))
        else:
            planned.append(plan_composed(release, target, delta, accountant))
    if training <= 0:
        shares = {r.name: r.epsilon_share for r in planned if r.composition == BASIC}
        raise ValueError(f"The release shares {shares} of epsilon leave nothing for training; their sum must be < 1.")
    return tuple(planned), training


def plan_event_releases(releases: tuple, *, delta: float, accountant: str) -> tuple:
    """Planned releases when the noise is given: no target to take shares of, only explicit events.

    Raises:
      ValueError: a release that is not `Release(name, event=...)`.
    """
    planned = []
    for release in releases:
        if not isinstance(release, Release) or release.event is None:
            raise ValueError(
                f"With `noise_multiplier` given there is no target epsilon to take shares of: pass releases as "
                f"`Release(name, event=...)`; received {release!r}."
            )
        planned.append(plan_composed(release, None, delta, accountant))
    return tuple(planned)


def plan_composed(release: Release, target: float | None, delta: float, accountant: str) -> PlannedRelease:
    """A release composed by the accountant: its event (sized for its share if it has one) and what it spends."""
    event = release.event
    if event is None:  # a share with `noise`, planned against a target
        noise = cast(str, release.noise)
        z = release_noise_multiplier(
            epsilon=cast(float, release.epsilon_share) * cast(float, target),
            delta=delta,
            mechanism=noise,
            accountant=accountant,
        )
        event = RELEASE_MECHANISMS[noise](z)
    spent = release_epsilon([event], delta=delta, accountant=accountant)
    share = release.epsilon_share if release.epsilon_share is not None else None if target is None else spent / target
    noise_multiplier = getattr(event, "noise_multiplier", None)
    return PlannedRelease(release.name, ACCOUNTANT, spent, share, 1, noise_multiplier, (event,), release.seeded)


__all__ = ["ACCOUNTANT", "BASIC", "SELECTION", "PlannedRelease", "Release", "plan_event_releases", "plan_releases"]
