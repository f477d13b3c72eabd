"""Privacy side of the sequential pipeline: item frequencies, noise calibration, the ledger.

User-level DP: one training sequence per user, so Poisson sampling over
users at q = B / N and DP-SGD's Gaussian noise make the released model
(epsilon, delta)-DP for adding or removing one user with all their items.

Item frequencies (Re-Attention's p_i, the popularity prior, head rows) are
either released from the training data with DP or supplied as public:

    private (default):  z from a share s of the budget, eps(release(z), delta) = s eps;
                        the count release is composed with the T steps and sigma is the smallest with
                        eps(Compose(count release, T x PoissonSampled(q, Gaussian(sigma))), delta) <= eps
    public (a file):    sigma = calibrate_noise_multiplier(eps, delta, q, T); the guarantee is
                        conditional on the file being independent of the training data

The planning itself is the library's (`tfdp_embed.accounting.planning`);
the release event goes into the `PrivacyLedger` as a setup event, so the
`PrivacyBudget` callback and the privacy report count it. Frequencies are
never taken from the training data as if they were public.

References: DPFormer Remark A.2 (public frequencies), Claim A.6 (privacy
inherited from DP-SGD); Abadi et al. 2016.
"""

from __future__ import annotations

import dataclasses
import math

from tfdp_embed.accounting import (
    PrivacyLedger,
    calibrate_noise_multiplier_with_releases,
    release_epsilon,
    release_noise_multiplier,
)
from tfdp_embed.attention import (
    ItemFrequencies,
    exact_item_frequencies,
    private_item_frequencies,
    read_item_frequencies,
)
from tfdp_embed.data.sequences import SequenceData

SOURCES = ("private", "public")
# The count release needs little budget: composing it with the steps raises sigma
# only slightly at this share (see README), while its noise stays below the counts
# of the items Re-Attention and the prior care most about.
DEFAULT_FREQUENCY_EPSILON_SHARE = 0.1
PUBLIC_NEEDS_FILE = (
    "`frequencies='public'` needs a frequencies file (`--frequencies-file`): item frequencies computed "
    "from the training data are not public, and shipping them (Re-Attention's errors, the prior, head rows) "
    "would release every item's exact user count outside the privacy guarantee. Use 'private' (the default: "
    "a DP release charged to the budget) or supply frequencies that are independent of the training data."
)


@dataclasses.dataclass(frozen=True)
class SequentialPrivacy:
    """The privacy plan of one run.

    Attributes:
      private: False for a non-private run (epsilon = inf or mechanism none).
      epsilon, delta: the target.
      sampling_probability: q = B / N.
      steps: T = epochs x round(N / B).
      noise_multiplier: sigma_dp (0 when not private).
      frequencies: the item frequencies the model uses (with their event if released).
      frequency_epsilon_share: the share of epsilon the release was sized for, or spends when its
        noise multiplier was given (None unless released).
      frequency_epsilon: epsilon of the release alone at delta (None unless released).
      assumptions: conditions the guarantee rests on (public frequencies).
    """

    private: bool
    epsilon: float
    delta: float
    sampling_probability: float
    steps: int
    noise_multiplier: float
    frequencies: ItemFrequencies
    frequency_epsilon_share: float | None = None
    frequency_epsilon: float | None = None
    assumptions: tuple[str, ...] = ()

    def new_ledger(self) -> PrivacyLedger | None:
        """A ledger holding the frequency release (if any); None for a non-private run."""
        if not self.private:
            return None
        ledger = PrivacyLedger()
        if self.frequencies.event is not None:
            ledger.record_setup(self.frequencies.event)
        return ledger

    def frequency_report(self) -> dict:
        """What the privacy report says about the item frequencies."""
        out = self.frequencies.report()
        out["epsilon_share"] = self.frequency_epsilon_share
        out["release_epsilon"] = self.frequency_epsilon
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
        raise ValueError("Public frequencies are not released: drop `frequency_epsilon_share`/`frequency_noise_multiplier`.")
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
    frequencies: str = "private",
    frequencies_file: str | None = None,
    frequency_epsilon_share: float | None = None,
    frequency_noise_multiplier: float | None = None,
    frequency_mechanism: str = "gaussian",
    accountant: str = "pld",
    seed: int | None = None,
) -> SequentialPrivacy:
    """q, T, sigma and the item frequencies of a run.

    Args:
      frequencies: "private" (release the training data's counts with DP) or
        "public" (read `frequencies_file`).
      frequency_epsilon_share: share of `epsilon` the release is sized for
        (default `DEFAULT_FREQUENCY_EPSILON_SHARE`); or give
        `frequency_noise_multiplier` (z) instead.
      (the rest: the run's settings.)

    Raises:
      ValueError: a batch larger than the number of users, bad frequency
        options (public without a file, both share and z, ...), a malformed
        frequencies file, or a target the accountant cannot meet.
    """
    check_frequency_options(
        frequencies=frequencies, frequencies_file=frequencies_file,
        epsilon_share=frequency_epsilon_share, noise_multiplier=frequency_noise_multiplier,
    )  # fmt: skip
    n = data.num_users
    if not 1 <= batch <= n:
        raise ValueError(f"`batch` must lie in [1, {n}] (the number of users); received {batch}.")
    q = batch / n
    steps = epochs * max(1, round(n / batch))
    delta = 1.0 / n if delta is None else float(delta)
    private = mechanism != "none" and math.isfinite(epsilon)
    common = dict(epsilon=float(epsilon), delta=delta, sampling_probability=q, steps=steps)
    if frequencies == "public":
        freq = read_item_frequencies(frequencies_file, num_items=data.num_items)
        assumptions = (
            f"the item frequencies supplied in {frequencies_file!r} are independent of the training data (public); "
            "they and everything computed from them (Re-Attention's errors, the popularity prior, head rows) are "
            "released without privacy cost",
        )
        sigma = 0.0
        if private:
            sigma = calibrate_noise_multiplier_with_releases(
                target_epsilon=epsilon, target_delta=delta, sampling_probability=q, steps=steps, accountant=accountant
            )
        return SequentialPrivacy(private, noise_multiplier=sigma, frequencies=freq, assumptions=assumptions, **common)
    counts = data.item_user_counts()
    if not private:  # a non-private reference run: nothing is guaranteed, the exact counts are used
        return SequentialPrivacy(False, noise_multiplier=0.0, frequencies=exact_item_frequencies(counts, num_users=n), **common)
    share = None
    if frequency_noise_multiplier is None:
        share = DEFAULT_FREQUENCY_EPSILON_SHARE if frequency_epsilon_share is None else float(frequency_epsilon_share)
        frequency_noise_multiplier = release_noise_multiplier(
            epsilon=share * epsilon, delta=delta, mechanism=frequency_mechanism, accountant=accountant
        )
    freq = private_item_frequencies(
        counts, num_users=n, max_items_per_user=data.max_len, noise_multiplier=frequency_noise_multiplier,
        mechanism=frequency_mechanism, seed=seed,
    )  # fmt: skip
    sigma = calibrate_noise_multiplier_with_releases(
        target_epsilon=epsilon, target_delta=delta, sampling_probability=q, steps=steps,
        releases=[freq.event], accountant=accountant,
    )  # fmt: skip
    spent = release_epsilon([freq.event], delta=delta, accountant=accountant)
    share = spent / epsilon if share is None else share  # z given: the share it spends
    return SequentialPrivacy(
        True, noise_multiplier=sigma, frequencies=freq, frequency_epsilon_share=share, frequency_epsilon=spent, **common
    )


__all__ = [
    "DEFAULT_FREQUENCY_EPSILON_SHARE",
    "SOURCES",
    "SequentialPrivacy",
    "check_frequency_options",
    "plan",
]
