"""Which candidates a retrieval loss scores each query against: all of them, or a data-independent sample.

* `FullSoftmax()`: every item of the catalogue (exact softmax).
* `SampledSoftmax(num_negatives, ...)`: per training step, ONE sample S of
  `num_negatives` items drawn with replacement from a fixed proposal Q
  (uniform, or a public or DP-released popularity), shared by every example
  of the batch; each example scores its own positive against S, with the
  log-Q correction (Bengio & Senecal 2008; Jean et al. 2015):

      logit_i(j) = s_ij / T - log(K Q_j),   j in {positive_i} + S,
      loss_i     = -log softmax(logit_i)[positive_i]

  and a sampled item equal to example i's positive masked out for example i
  ("accidental hit"). The sample is a function of a seed and the step
  number only, so it is drawn independently of the data: loss_i depends on
  example i, the weights and S. That is what keeps the per-example
  contract; in-batch negatives (the other examples' positives) do not.

The proposal must not be computed from the training data: a popularity
counted on the private data makes the sample, and so every example's
loss, depend on other examples. Give a public distribution, or one released
with DP, and say which with `proposal_provenance`. "dp_released" is not
taken on trust: it needs the release's `dp_accounting` event
(`proposal_event`, or a proposal object carrying `.event`, e.g. the
`ItemFrequencies` of `private_item_frequencies`); charge it with
`release()`. "public" is a declaration the library cannot check: it is
stated in `assumptions()`, for the run's report.

References: Bengio & Senecal 2008 (importance-sampled softmax); Jean et
al., ACL 2015 (sampled softmax, log-Q correction); Yi et al., RecSys 2019
(sampling-bias correction in two-tower retrieval).
"""

from __future__ import annotations

import math

import dp_accounting
import numpy as np

from tfdp_embed._checks import check_int
from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.keras2._keras import tf

PROVENANCES = ("public", "dp_released")


class FullSoftmax:
    """Score every query against the whole catalogue (an exact softmax over all items)."""

    full = True

    def config(self) -> dict:
        return {"negatives": "full_softmax"}

    def __repr__(self) -> str:
        return "FullSoftmax()"


class SampledSoftmax:
    """A shared sample of negatives per step from a fixed proposal, with log-Q correction.

    Args:
      num_negatives: K, items sampled per step (with replacement), shared by the batch.
      proposal: "uniform", or probabilities `[num_items]` (> 0, summing to 1; in
        catalogue row order) from public data or released with DP, or an
        object with `.frequencies` and `.event` (a DP release, e.g. `ItemFrequencies`).
      proposal_provenance: required with a probability vector: "public" (an
        assumption, see `assumptions()`) or "dp_released" (with its event).
      proposal_event: the `dp_accounting` event of the DP release the
        proposal came from (required for "dp_released" unless `proposal` carries one).
      log_q_correction: subtract log(K Q_j) from every logit (a constant for
        the uniform proposal, where it changes nothing).
      remove_accidental_hits: mask sampled items equal to the example's positive.
      seed: int seed of the sample sequence; None draws one from OS entropy.
        The sample needs no secrecy (it is independent of the data); the
        seed only makes runs reproducible.

    Raises:
      ValueError: bad `num_negatives`, or a proposal that is not a distribution.
      PrivacyContractError: a probability vector without `proposal_provenance`,
        or "dp_released" without the release's event.
    """

    full = False

    def __init__(
        self,
        num_negatives: int,
        *,
        proposal="uniform",
        proposal_provenance: str | None = None,
        proposal_event=None,
        log_q_correction: bool = True,
        remove_accidental_hits: bool = True,
        seed: int | None = None,
    ):
        self.num_negatives = check_int("num_negatives", num_negatives)
        self.log_q_correction = bool(log_q_correction)
        self.remove_accidental_hits = bool(remove_accidental_hits)
        self.seed = int(seed) if seed is not None else int(np.random.default_rng().integers(2**62))
        self.proposal_provenance = proposal_provenance
        proposal, self.proposal_event = _released_proposal(proposal, proposal_event)
        if isinstance(proposal, str):
            if proposal != "uniform":
                raise ValueError(f'`proposal` must be "uniform" or a probability vector; received {proposal!r}.')
            self.probabilities = None
        else:
            self.probabilities = _checked_probabilities(proposal)
            if proposal_provenance not in PROVENANCES:
                raise PrivacyContractError(
                    "A non-uniform `proposal` decides which negatives every example is scored against: "
                    "counted on the training data without DP, it makes each example's loss depend on the "
                    "other examples and is itself released through the model. Pass a public distribution "
                    "or one released with DP, and declare it with `proposal_provenance` in "
                    f"{PROVENANCES}; received proposal_provenance={proposal_provenance!r}."
                )
            if proposal_provenance == "dp_released" and self.proposal_event is None:
                raise PrivacyContractError(
                    '`proposal_provenance="dp_released"` needs the release\'s `dp_accounting` event (pass '
                    "`proposal_event`, or the release object itself, e.g. `ItemFrequencies`, as `proposal`): "
                    "without it nothing shows the proposal was released with DP or charges its cost. A proposal "
                    'independent of the training data is `proposal_provenance="public"` (stated as an assumption).'
                )

    def assumptions(self) -> list:
        """What the run's report must state: a "public" proposal is the caller's word, not checked."""
        if self.probabilities is None or self.proposal_provenance != "public":
            return []
        return [
            "the negative-sampling proposal declared public is independent of the training data (the caller's "
            "declaration; the library cannot check it)"
        ]

    def release(self):
        """`Release("negative_proposal", event=...)` for `plan_run(releases=...)`: the DP proposal's cost, else None."""
        from tfdp_embed.planning.releases import Release  # the planner imports the mechanisms, not retrieval

        return None if self.proposal_event is None else Release("negative_proposal", event=self.proposal_event)

    # -- sampling -------------------------------------------------------------
    def check_catalogue(self, size: int) -> None:
        """Raises ValueError if the proposal does not have one probability per catalogue item."""
        if self.probabilities is not None and self.probabilities.shape[0] != size:
            raise ValueError(
                f"`proposal` has {self.probabilities.shape[0]} probabilities for a catalogue of {size} items."
            )

    def sample(self, step: tf.Tensor, size: int) -> tf.Tensor:
        """int32 `[K]` catalogue rows drawn from the proposal, a function of (seed, step) only."""
        seed = tf.stack([tf.constant(self.seed % (2**63 - 1), tf.int64), tf.cast(step, tf.int64)])
        if self.probabilities is None:
            return tf.random.stateless_uniform([self.num_negatives], seed=seed, minval=0, maxval=size, dtype=tf.int32)
        cdf = tf.constant(np.cumsum(self.probabilities), tf.float64)
        u = tf.random.stateless_uniform([self.num_negatives], seed=seed, dtype=tf.float64) * cdf[-1]
        rows = tf.searchsorted(cdf, u, side="right", out_type=tf.int32)
        return tf.minimum(rows, size - 1)

    def log_expected_counts(self, rows: tf.Tensor, size: int) -> tf.Tensor:
        """float32 log(K Q_j) of catalogue rows `rows`."""
        if self.probabilities is None:
            return tf.fill(tf.shape(rows), tf.constant(math.log(self.num_negatives / size), tf.float32))
        log_q = tf.constant(np.log(self.probabilities), tf.float32)
        return math.log(self.num_negatives) + tf.gather(log_q, rows)

    def config(self) -> dict:
        return {
            "negatives": "sampled_softmax",
            "num_negatives": self.num_negatives,
            "proposal": "uniform" if self.probabilities is None else "given",
            "proposal_provenance": self.proposal_provenance,
            "proposal_event": None if self.proposal_event is None else repr(self.proposal_event),
            "log_q_correction": self.log_q_correction,
            "remove_accidental_hits": self.remove_accidental_hits,
        }

    def __repr__(self) -> str:
        return f"SampledSoftmax(num_negatives={self.num_negatives}, proposal={self.config()['proposal']})"


def _released_proposal(proposal, event):
    """(probabilities or "uniform", the release's event): a release object gives both (`.frequencies`, `.event`)."""
    if hasattr(proposal, "frequencies") and hasattr(proposal, "event"):
        if event is not None and event != proposal.event:
            raise ValueError(f"`proposal_event` {event!r} is not the proposal's own event {proposal.event!r}.")
        frequencies = np.maximum(np.asarray(proposal.frequencies, np.float64), 1e-9)  # a floor: Q_j > 0
        return frequencies / frequencies.sum(), proposal.event
    if event is not None and not isinstance(event, dp_accounting.DpEvent):
        raise TypeError(f"`proposal_event` must be a `dp_accounting.DpEvent`; received {event!r}.")
    return proposal, event


def _checked_probabilities(proposal) -> np.ndarray:
    p = np.asarray(proposal.numpy() if isinstance(proposal, tf.Tensor) else proposal, dtype=np.float64)
    if p.ndim != 1 or p.size == 0 or not np.all(np.isfinite(p)) or np.any(p <= 0):
        raise ValueError(
            "`proposal` must be a 1-D vector of probabilities > 0, one per catalogue item (the log-Q "
            f"correction divides by them); received shape {p.shape}, min {p.min() if p.size else None}."
        )
    if abs(p.sum() - 1.0) > 1e-6:
        raise ValueError(f"`proposal` must sum to 1; it sums to {p.sum():.8g}.")
    return p


__all__ = ["FullSoftmax", "PROVENANCES", "SampledSoftmax"]
