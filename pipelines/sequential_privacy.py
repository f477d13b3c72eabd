"""Privacy side of the sequential pipeline: item frequencies, noise calibration, the ledger.

User-level DP: one training sequence per user, so Poisson sampling over
users at q = B / N and DP-SGD's Gaussian noise make the released model
(epsilon, delta)-DP for adding or removing one user with all their items.

    public frequencies:   sigma = calibrate_noise_multiplier(eps, delta, q, T)
    private frequencies:  the count release Gaussian(z) (or Laplace(z)) is composed with
                          the T steps; sigma is the smallest with
                          eps(Compose(count event, T x PoissonSampled(q, Gaussian(sigma))), delta) <= eps

Both with `dp_accounting` (PLD by default); the count event goes into the
`PrivacyLedger` as a setup event, so the `PrivacyBudget` callback and the
privacy report count it.

References: DPFormer Remark A.2 (public frequencies), Claim A.6 (privacy
inherited from DP-SGD); Abadi et al. 2016.
"""

from __future__ import annotations

import dataclasses
import math

import dp_accounting

from tfdp_embed.accounting import (
    PrivacyLedger,
    calibrate_noise_multiplier,
    dpsgd_event,
    make_accountant,
)
from tfdp_embed.attention import (
    ItemFrequencies,
    private_item_frequencies,
    public_item_frequencies,
)
from tfdp_embed.data.sequences import SequenceData


@dataclasses.dataclass(frozen=True)
class SequentialPrivacy:
    """The privacy plan of one run.

    Attributes:
      private: False for a non-private run (epsilon = inf or mechanism none).
      epsilon, delta: the target.
      sampling_probability: q = B / N.
      steps: T = epochs x round(N / B).
      noise_multiplier: sigma_dp (0 when not private).
      frequencies: the item frequencies Re-Attention uses (with their event if private).
    """

    private: bool
    epsilon: float
    delta: float
    sampling_probability: float
    steps: int
    noise_multiplier: float
    frequencies: ItemFrequencies

    def new_ledger(self) -> PrivacyLedger | None:
        """A ledger holding the frequency release (if any); None for a non-private run."""
        if not self.private:
            return None
        ledger = PrivacyLedger()
        if self.frequencies.event is not None:
            ledger.record_setup(self.frequencies.event)
        return ledger


def item_frequencies(
    data: SequenceData,
    *,
    source: str,
    noise_multiplier: float | None = None,
    mechanism: str = "gaussian",
    seed: int | None = None,
) -> ItemFrequencies:
    """p_i from the training inputs: public (by assumption) or released with DP.

    Raises:
      ValueError: unknown `source`, or "private" without a positive `noise_multiplier`.
    """
    counts = data.item_user_counts()
    if source == "public":
        return public_item_frequencies(counts, num_users=data.num_users)
    if source != "private":
        raise ValueError(f"`frequencies` must be 'public' or 'private'; received {source!r}.")
    if noise_multiplier is None:
        raise ValueError("Private item frequencies need `frequency_noise_multiplier` > 0.")
    return private_item_frequencies(
        counts,
        num_users=data.num_users,
        max_items_per_user=data.max_len,
        noise_multiplier=noise_multiplier,
        mechanism=mechanism,
        seed=seed,
    )


def calibrate_with_setup(
    *, target_epsilon: float, target_delta: float, sampling_probability: float, steps: int, setup_event, accountant: str
) -> float:
    """The smallest sigma with eps(setup + T DP-SGD steps) <= target (`dp_accounting` calibration).

    Raises:
      ValueError: the setup event alone spends the budget.
    """
    base = calibrate_noise_multiplier(
        target_epsilon=target_epsilon,
        target_delta=target_delta,
        sampling_probability=sampling_probability,
        steps=steps,
        accountant=accountant,
    )
    if setup_event is None:
        return base

    def make_event(sigma):
        steps_event = dpsgd_event(sampling_probability=sampling_probability, noise_multiplier=sigma, steps=steps)
        return dp_accounting.ComposedDpEvent([setup_event, steps_event])

    setup_epsilon = make_accountant(accountant).compose(setup_event).get_epsilon(target_delta)
    if setup_epsilon >= target_epsilon:
        raise ValueError(
            f"The item-frequency release alone spends epsilon {setup_epsilon:.4g} >= the target "
            f"{target_epsilon:g}: raise `--frequency-noise-multiplier` or use public frequencies."
        )
    return float(
        dp_accounting.calibrate_dp_mechanism(
            lambda: make_accountant(accountant),
            make_event,
            target_epsilon,
            target_delta,
            dp_accounting.ExplicitBracketInterval(base, base * 50),
            tol=1e-4 * base,
        )
    )


def plan(
    data: SequenceData,
    *,
    epsilon: float,
    delta: float | None,
    batch: int,
    epochs: int,
    mechanism: str,
    frequencies: str = "public",
    frequency_noise_multiplier: float | None = None,
    frequency_mechanism: str = "gaussian",
    accountant: str = "pld",
    seed: int | None = None,
) -> SequentialPrivacy:
    """q, T, sigma and the item frequencies of a run.

    Raises:
      ValueError: a batch larger than the number of users, bad frequency options,
        or a target the accountant cannot meet.
    """
    n = data.num_users
    if not 1 <= batch <= n:
        raise ValueError(f"`batch` must lie in [1, {n}] (the number of users); received {batch}.")
    q = batch / n
    steps = epochs * max(1, round(n / batch))
    delta = 1.0 / n if delta is None else float(delta)
    private = mechanism != "none" and math.isfinite(epsilon)
    freq = item_frequencies(
        data,
        source=frequencies if private else "public",
        noise_multiplier=frequency_noise_multiplier,
        mechanism=frequency_mechanism,
        seed=seed,
    )
    sigma = 0.0
    if private:
        sigma = calibrate_with_setup(
            target_epsilon=epsilon,
            target_delta=delta,
            sampling_probability=q,
            steps=steps,
            setup_event=freq.event,
            accountant=accountant,
        )
    return SequentialPrivacy(private, float(epsilon), delta, q, steps, sigma, freq)


__all__ = ["SequentialPrivacy", "calibrate_with_setup", "item_frequencies", "plan"]
