"""Attack (low finding): pass a popularity counted on the training data as a "dp_released" negative proposal.

`SampledSoftmax` took `proposal_provenance` on the caller's word: exact
training counts declared "dp_released" were accepted, the sample of
negatives (and through log-Q every example's loss) then depended on the
other examples, and nothing was charged to the budget. On 6fce81d the
exact counts were accepted (no error; the proposal's probabilities equal
the training data's item frequencies exactly). Now "dp_released" needs the
release's `dp_accounting` event (or the release object itself, which
carries it) and `release()` charges it; "public" is stated as an
assumption for the report.
"""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest

from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.keras2.retrieval import SampledSoftmax

TRAINING_ITEMS = np.random.default_rng(0).integers(0, 9, 500)
EXACT = np.bincount(TRAINING_ITEMS, minlength=9) / TRAINING_ITEMS.size  # not private


def test_a_dp_released_proposal_needs_its_release():
    with pytest.raises(PrivacyContractError, match="needs the release's `dp_accounting` event"):
        SampledSoftmax(32, proposal=EXACT, proposal_provenance="dp_released", seed=1)
    event = dp_accounting.GaussianDpEvent(5.0)
    negatives = SampledSoftmax(32, proposal=EXACT, proposal_provenance="dp_released", proposal_event=event, seed=1)
    release = negatives.release()
    assert release.name == "negative_proposal" and release.event == event  # what plan_run charges
    assert negatives.assumptions() == []


class _Released:
    """What `private_item_frequencies` returns: the noisy frequencies and their event."""

    frequencies = np.maximum(EXACT + np.random.default_rng(1).normal(0, 0.01, 9), 0.0)
    event = dp_accounting.GaussianDpEvent(3.0)


def test_a_release_object_carries_its_event_and_public_is_an_assumption():
    negatives = SampledSoftmax(32, proposal=_Released(), proposal_provenance="dp_released", seed=1)
    assert negatives.release().event == _Released.event
    public = SampledSoftmax(32, proposal=EXACT, proposal_provenance="public", seed=1)
    assert public.release() is None and "declared public" in public.assumptions()[0]
