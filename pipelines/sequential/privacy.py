"""Privacy side of the sequential pipeline: item frequencies and the run's plan.

User-level DP: one training sequence per user, so Poisson sampling over
users at q = B / N and DP-SGD's Gaussian noise make the released model
(epsilon, delta)-DP for adding or removing one user with all their items.

Item frequencies (Re-Attention's p_i, the popularity prior, head rows) are
either released from the training data with DP or supplied as public:

    private (default):  a Gaussian/Laplace count release sized for a share s of the budget
                        (eps(release(z), delta) = s eps, or z given), composed with the T steps:
                        sigma is the smallest with eps(release + T steps, delta) <= eps
    public (a file):    sigma for the steps alone; the guarantee is conditional on the file
                        being independent of the training data

The planning is the library's (`tfdp_embed.plan_run` with a `Release`); the
release event is in the plan's ledger, so the `PrivacyBudget` callback and
the privacy report count it. Frequencies are never taken from the training
data as if they were public.

References: DPFormer Remark A.2 (public frequencies), Claim A.6 (privacy
inherited from DP-SGD); Abadi et al. 2016.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, cast

import numpy as np

from pipelines import run_limits
from pipelines.sequential import vocabulary as sequential_vocabulary
from pipelines.sequential.vocabulary import ItemVocabulary
from tfdp_embed import Release, ReleasedDatasetSize, RunPlan, plan_run, release_dataset_size
from tfdp_embed._checks import check_int
from tfdp_embed.accounting.one_off_releases import RELEASE_MECHANISMS
from tfdp_embed.data.sequences import SequenceData
from tfdp_embed.keras2.attention import (
    ItemFrequencies,
    exact_item_frequencies,
    private_item_frequencies,
    read_item_frequencies,
)

SOURCES = ("private", "public")
ITEM_FREQUENCIES = "item_frequencies"
# The count release needs little budget: composing it with the steps raises sigma
# only slightly at this share (docs/pipelines.md, "sequential": +0.25% on Amazon Games at
# epsilon 8, +0.7-1.6% on a 300-user file), while its noise stays below the counts of the
# items Re-Attention and the prior care most about.
DEFAULT_FREQUENCY_EPSILON_SHARE = 0.1
PUBLIC_NEEDS_FILE = (
    "`frequencies='public'` needs a frequencies file (`--frequencies-file`): item frequencies computed "
    "from the training data are not public, and shipping them (Re-Attention's errors, the prior, head rows) "
    "would release every item's exact user count outside the privacy guarantee. Use 'private' (the default: "
    "a DP release charged to the budget) or supply frequencies that are independent of the training data."
)


@dataclasses.dataclass(frozen=True)
class SequentialPrivacy:
    """The privacy plan of one run: the library's `RunPlan` and the item frequencies it uses.

    Attributes:
      run: the `tfdp_embed.RunPlan` (its mechanism, noise, ledger, budget and report).
      epsilon: the target (inf for a non-private run).
      frequencies: the item frequencies the model uses (with their event if released).
      size: N~, the number of users released with DP (the report's `dataset_size`).
      items: the run's item ids (a DP vocabulary, a public catalogue, or the data's in a non-private run).
      data: the data in those ids (`sequential_vocabulary.apply`): what the model trains and is evaluated on.
    """

    run: RunPlan
    epsilon: float
    frequencies: ItemFrequencies
    size: ReleasedDatasetSize
    items: ItemVocabulary
    data: SequenceData

    @property
    def private(self) -> bool:
        return self.run.is_dp

    def frequency_report(self) -> dict:
        """What the privacy report says about the item frequencies (share and epsilon of their release)."""
        released = ITEM_FREQUENCIES in [r.name for r in self.run.releases]
        release = self.run.release(ITEM_FREQUENCIES) if released else None
        out = self.frequencies.report()
        out["epsilon_share"] = None if release is None else release.epsilon_share
        out["release_epsilon"] = None if release is None else release.epsilon
        return out


def check_frequency_options(
    *, frequencies: str, frequencies_file: str | None, epsilon_share: float | None, noise_multiplier: float | None
) -> None:
    """Raises ValueError (naming the option) for a combination of frequency options that is not allowed."""
    if frequencies not in SOURCES:
        raise ValueError(f"`frequencies` must be one of {SOURCES}; received {frequencies!r}.")
    if frequencies == "public" and frequencies_file is None:
        raise ValueError(PUBLIC_NEEDS_FILE)
    if frequencies == "private" and frequencies_file is not None:
        raise ValueError("`frequencies_file` is read only with `frequencies='public'`; received 'private'.")
    if frequencies == "public" and (epsilon_share is not None or noise_multiplier is not None):
        raise ValueError(
            "Public frequencies are not released: drop `frequency_epsilon_share`/`frequency_noise_multiplier`."
        )
    if epsilon_share is not None and noise_multiplier is not None:
        raise ValueError("Pass `frequency_epsilon_share` or `frequency_noise_multiplier`, not both.")
    if epsilon_share is not None and not 0 < epsilon_share < 1:
        raise ValueError(f"`frequency_epsilon_share` must lie in (0, 1); received {epsilon_share!r}.")
    if noise_multiplier is not None and not (noise_multiplier > 0 and math.isfinite(noise_multiplier)):
        raise ValueError(f"`frequency_noise_multiplier` must be a finite number > 0; received {noise_multiplier!r}.")


def plan(
    data: SequenceData,
    *,
    epsilon: float,
    delta: float | None,
    batch: int,
    epochs: int,
    mechanism: str,
    max_steps: int | None = None,
    l2_norm_clip: float = 1.0,
    frequencies: str = "private",
    frequencies_file: str | None = None,
    frequency_epsilon_share: float | None = None,
    frequency_noise_multiplier: float | None = None,
    frequency_mechanism: str = "gaussian",
    accountant: str = "pld",
    seed: int | None = None,
    item_catalogue: str | None = None,
    vocabulary_epsilon_share: float | None = None,
    vocabulary_max_items: int = sequential_vocabulary.DEFAULT_MAX_ITEMS_PER_USER,
    time_limit: tuple | None = None,
) -> SequentialPrivacy:
    """q, T, the plan (sigma, the mechanism), the item ids and the item frequencies of a run.

    Args:
      frequencies: "private" (release the training data's counts with DP) or "public" (read `frequencies_file`).
      frequency_epsilon_share: share of `epsilon` the release is sized for (default
        `DEFAULT_FREQUENCY_EPSILON_SHARE`); or give `frequency_noise_multiplier` (z) instead.
      max_steps: at most this many steps (None: epochs x round(N / B)); sigma is calibrated for them.
      item_catalogue: a public list of item ids (nothing spent); None: a private run releases the data's
        item set with `dp_vocabulary` (`vocabulary_epsilon_share` of epsilon, D0 = `vocabulary_max_items`).
      time_limit: `(forward_backward, max_hours)`: `run_limits.check_time` once T is known, before calibration.
      (the rest: the run's settings.)

    Raises:
      ValueError: a batch larger than the number of users, bad frequency options (public without a file, both
        share and z, ...), a malformed frequencies file, a target the accountant cannot meet, a run too long.
    """
    check_frequency_options(
        frequencies=frequencies,
        frequencies_file=frequencies_file,
        epsilon_share=frequency_epsilon_share,
        noise_multiplier=frequency_noise_multiplier,
    )
    size = release_dataset_size(data.num_users, seed=seed)  # N~: q, delta and T come from it, never from N
    common = _run_arguments(size, batch, epochs, max_steps, time_limit, delta=delta, accountant=accountant, seed=seed)
    private = mechanism != "none" and math.isfinite(epsilon)
    vocabulary = dict(catalogue=item_catalogue, max_items_per_user=vocabulary_max_items, seed=seed)
    releases, assumptions = _vocabulary_terms(item_catalogue, vocabulary_epsilon_share, seeded=seed is not None)
    dp = dict(target_epsilon=float(epsilon), l2_norm_clip=l2_norm_clip, assumptions=assumptions, **common)
    terms = _RunTerms(data, float(epsilon), size, private, common, dp, releases, vocabulary)
    if frequencies == "public":
        return _public_plan(terms, cast(str, frequencies_file))  # given with "public" (check_frequency_options)
    if not private:
        return _exact_plan(terms)
    release = _frequency_release(
        frequency_epsilon_share, frequency_noise_multiplier, frequency_mechanism, seeded=seed is not None
    )
    return _private_plan(terms, release, frequency_mechanism, seed)


@dataclasses.dataclass(frozen=True)
class _RunTerms:
    """What every kind of run shares: the data, the target, N~, `plan_run`'s arguments and the item ids' terms.

    Attributes:
      common: `plan_run`'s arguments of any run (delta, accountant, q, T, seed).
      dp: `common` plus a DP run's (target epsilon, C, assumptions).
      releases: the item ids' release (none with a public catalogue).
      vocabulary: `sequential_vocabulary.item_vocabulary`'s arguments.
    """

    data: SequenceData
    epsilon: float
    size: ReleasedDatasetSize
    private: bool
    common: dict
    dp: dict
    releases: list
    vocabulary: dict


def _run_arguments(
    size: ReleasedDatasetSize,
    batch: int,
    epochs: int,
    max_steps: int | None,
    time_limit: tuple | None,
    *,
    delta,
    accountant,
    seed,
) -> dict[str, Any]:
    """`plan_run`'s arguments of any run: delta, accountant, q = B / N~ and T (checks B against N~; T against
    `run_limits.MAX_STEPS` and, with `time_limit`, its estimated time)."""
    n = size.value
    if not 1 <= batch <= n:
        raise ValueError(f"`batch` must lie in [1, {n}] (the number of users, released with DP); received {batch}.")
    steps = size.steps(epochs, batch)
    if max_steps is not None:
        steps = min(steps, check_int("max_steps", max_steps))
    per_epoch = size.steps(1, batch)
    what = f"`--epochs` {epochs:,} x {per_epoch:,} batches per epoch (N~ / `--batch`)"
    fix = "lower --epochs, raise --batch or give --max-steps"
    run_limits.check_steps(steps, what=what, fix=fix)
    if time_limit is not None:
        step, max_hours = time_limit
        run_limits.check_time(step, batch=batch, steps=steps, max_hours=max_hours, what=what, fix=fix)
    return dict(
        target_delta=size.delta() if delta is None else float(delta),
        accountant=accountant,
        sampling_probability=size.sampling_probability(batch),
        steps=steps,
        seed=seed,
    )


def _exact_plan(terms: _RunTerms) -> SequentialPrivacy:
    """A non-private reference run: nothing is guaranteed, the exact counts are used."""
    items, data = _items(terms.data, None, terms.vocabulary)
    n = terms.size.value
    exact = exact_item_frequencies(np.minimum(data.item_user_counts(), n), num_users=n)
    return SequentialPrivacy(plan_run("none", **terms.common), terms.epsilon, exact, terms.size, items, data)


def _private_plan(
    terms: _RunTerms, frequency: Release, frequency_mechanism: str, seed: int | None
) -> SequentialPrivacy:
    """A DP run with private frequencies: N~, the item ids (unless public) and the counts released in one plan."""
    run = plan_run("dense", **terms.dp, releases=[Release.dataset_size(terms.size), *terms.releases, frequency])
    items, data = _items(terms.data, run, terms.vocabulary)
    n = terms.size.value
    counts = np.minimum(data.item_user_counts(), n)  # min(c, N~): 1-Lipschitz, so the sensitivity is unchanged
    release = run.release(ITEM_FREQUENCIES)
    freq = private_item_frequencies(
        counts,
        num_users=n,
        max_items_per_user=data.max_len,
        noise_multiplier=cast(float, release.noise_multiplier),  # a Gaussian/Laplace release has one
        mechanism=frequency_mechanism,
        seed=seed,
    )
    if (freq.event,) != release.events:
        raise AssertionError(f"The frequency release {freq.event} is not the planned {release.events}.")
    return SequentialPrivacy(run, terms.epsilon, freq, terms.size, items, data)


def _vocabulary_terms(item_catalogue: str | None, epsilon_share: float | None, *, seeded: bool) -> tuple[list, tuple]:
    """(releases, assumptions) of the item ids: the DP vocabulary's release, or the catalogue's assumption."""
    if item_catalogue is None:
        return [sequential_vocabulary.vocabulary_release(epsilon_share, seeded=seeded)], ()
    return [], (
        f"the item catalogue {item_catalogue!r} (the item ids the model knows) is independent of the training "
        "data (public)",
    )


def _items(data: SequenceData, run: RunPlan | None, vocabulary: dict) -> tuple:
    """(the run's item ids, the data in them)."""
    items = sequential_vocabulary.item_vocabulary(data, run=run, **vocabulary)
    return items, sequential_vocabulary.apply(data, items)


def _public_plan(terms: _RunTerms, frequencies_file: str) -> SequentialPrivacy:
    """The plan with public frequencies read from a file: nothing is released, the guarantee assumes them public."""
    assumptions = (
        f"the item frequencies supplied in {frequencies_file!r} are independent of the training data (public); "
        "they and everything computed from them (Re-Attention's errors, the popularity prior, head rows) are "
        "released without privacy cost",
    )
    if terms.private:
        dp = {**terms.dp, "assumptions": (*assumptions, *terms.dp["assumptions"])}
        run = plan_run("dense", **dp, releases=[Release.dataset_size(terms.size), *terms.releases])
    else:
        run = plan_run("none", **terms.common)
    data = terms.data
    items, dense = _items(data, run if terms.private else None, terms.vocabulary)
    # The file names the data's own ids: read up to the largest of them or of the map, then take the map's.
    largest = max(data.num_items, int(items.ids.ids[-1]))
    freq = read_item_frequencies(frequencies_file, num_items=largest)
    freq = dataclasses.replace(freq, frequencies=freq.frequencies[np.concatenate([[0], items.ids.ids])])
    return SequentialPrivacy(run, terms.epsilon, freq, terms.size, items, dense)


def _frequency_release(share: float | None, noise_multiplier: float | None, mechanism: str, *, seeded: bool) -> Release:
    """The count release: sized for its share of epsilon, or with the given noise multiplier z."""
    if noise_multiplier is not None:
        event = RELEASE_MECHANISMS[mechanism](float(noise_multiplier))
        return Release(ITEM_FREQUENCIES, event=event, seeded=seeded)
    share = DEFAULT_FREQUENCY_EPSILON_SHARE if share is None else float(share)
    return Release(ITEM_FREQUENCIES, epsilon_share=share, noise=mechanism, seeded=seeded)


__all__ = [
    "DEFAULT_FREQUENCY_EPSILON_SHARE",
    "ITEM_FREQUENCIES",
    "SOURCES",
    "SequentialPrivacy",
    "check_frequency_options",
    "plan",
]
