"""DP top-k bucket selection per feature (Gumbel noise on counts) and its accounting event.

Per table (feature) f with bucket counts h (each example adds 1 to each of
its *distinct* ids, so one example moves any count by at most 1 and only
upwards under add/remove-one neighbours):

    h_hat = h + Gumbel(0, k_f / eps_f)^{vocab},   selected = top-k_f of h_hat

One-shot Gumbel top-k equals k_f rounds of the exponential mechanism
P(i) ∝ exp(h_i eps_f / k_f), each removing its pick (Durfee & Rogers 2021),
and each round is (eps_f / k_f)-DP (counts move by <= 1 in one direction),
so table f's selection is eps_f-DP and all tables together are
eps_1 = sum_f eps_f. The budget eps_1 is split equally over the tables that
must choose (DP-FEST App. B.1); a table that keeps every row chooses
nothing and spends nothing.

Departure from the paper (on purpose): App. B.1 adds Gumbel(1/eps_f) and
counts eps_f for the whole top-k_f. By the peeling equivalence that noise
is k_f * eps_f-DP (e.g. for a bucket whose count dominates, the probability
of *leaving it out* changes by e^{k_f eps_f} when its count moves by 1), so
we use scale k_f / eps_f to make the stated eps_1 true.

Accounting event. dp-accounting has no pure-DP, zCDP or
exponential-mechanism event, and the zCDP route (rho = eps^2/8 per
round, Cesar & Rogers 2021) is only an RDP statement: a Gaussian event with
the same rho would be honest under `RdpAccountant` but not under
`PLDAccountant`, which treats a Gaussian event as its exact privacy-loss
distribution. We therefore represent each round by the Gaussian that
*dominates every eps-DP mechanism* (in hockey-stick divergence at every
e^eps', hence also in every Rényi divergence), which is honest under both
accountants and composes with the training steps:

    sigma(eps) = 1 / (2 Phi^{-1}(e^eps / (1 + e^eps)))    (mu = 1/sigma)

Proof: an eps-DP pair is dominated by randomized response RR(eps) (Kairouz,
Oh & Viswanath 2015), whose curve delta(x) = (e^eps - x)/(1 + e^eps),
x = e^eps' in [1, e^eps], is a line. The Gaussian pair N(1, sigma^2) vs
N(0, sigma^2) has a convex curve in x with delta(1) = 2 Phi(mu/2) - 1 and
slope -Phi(-mu/2) at x = 1. With Phi(mu/2) = e^eps/(1 + e^eps) both value
and slope match RR's at x = 1, so by convexity the Gaussian lies above RR
for every x >= 1 (x < 1 follows by the symmetry of both pairs), and no
larger sigma works (it would lose at x = 1). Rounds compose as Gaussians:
mu^2 = sum over rounds of mu(eps_round)^2 (Dong, Roth & Su 2022), so the
whole selection is one `GaussianDpEvent(1 / mu)`. For small eps,
mu ≈ eps sqrt(pi/2), i.e. rho = mu^2/2 ≈ (pi/4) eps^2 per round, 6.3x the
zCDP eps^2/8 (which only RDP could use honestly). Rounds are tiny
(eps_1 / sum_f k_f each), so the whole selection has
rho ≈ (pi/4) eps_1^2 / sum_f k_f: negligible next to training.

Example:
    >>> counts = {"cat_0": np.array([50, 3, 40, 7])}
    >>> sel = select_top_k(counts, top_k={"cat_0": 2}, epsilon=1.0,
    ...                    rng=np.random.default_rng(0))
    >>> sel.rows["cat_0"], sel.event   # rows and the accounting event

References: Zhang et al., "Sparsity-Preserving Differentially Private
Training of Large Embedding Models", NeurIPS 2023: §3.1, App. B.1 (Alg. 2),
App. C.3; Durfee & Rogers 2021 (one-shot top-k = peeling exponential
mechanism); Cesar & Rogers 2021 (bounded range); Kairouz et al. 2015;
Zhu, Dong & Wang 2022 (dominating pairs); Dong, Roth & Su 2022 (GDP).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping

import dp_accounting
import numpy as np
import tensorflow as tf
from scipy import special

from tfdp_embed._checks import check_positive
from tfdp_embed.absent_examples import present_examples


# -- the accounting event ------------------------------------------------------------
def pure_dp_dominating_noise_multiplier(epsilon: float) -> float:
    """The largest Gaussian noise multiplier whose mechanism dominates every eps-DP one.

        sigma = 1 / (2 Phi^{-1}(e^eps / (1 + e^eps))) = 1 / (2 sqrt(2) erfinv(tanh(eps / 2)))

    Args:
      epsilon: the pure-DP epsilon (> 0).

    Returns:
      sigma such that `GaussianDpEvent(sigma)` upper-bounds any (eps, 0)-DP
      mechanism under both PLD and RDP accounting; 0.0 (non-private) when
      eps is so large (~> 700) that no float64 Gaussian dominates.

    Raises:
      ValueError: if epsilon <= 0 or is not finite.

    References: Kairouz, Oh & Viswanath 2015 (RR is the worst eps-DP pair);
    Zhu, Dong & Wang 2022 (dominating pairs compose); proof in the module docstring.
    """
    epsilon = check_positive("epsilon", epsilon)
    if epsilon < 1.0:  # erfinv(tanh) keeps full precision for small eps
        half_mu = math.sqrt(2.0) * float(special.erfinv(math.tanh(epsilon / 2.0)))
    else:  # Phi^{-1}(1 - p) = -Phi^{-1}(p) with p = 1 / (1 + e^eps), precise for large eps
        half_mu = -float(special.ndtri(special.expit(-epsilon)))
    if not math.isfinite(half_mu):
        return 0.0  # eps ~> 700: no finite Gaussian dominates; account it as non-private
    return 1.0 / (2.0 * half_mu)


def selection_dp_event(*, top_k: Mapping[str, int], epsilons: Mapping[str, float]) -> dp_accounting.DpEvent:
    """The `dp_accounting` event of one top-k selection over several tables.

    Each table f is k_f exponential-mechanism rounds of eps_f / k_f each;
    every round is replaced by its dominating Gaussian and the Gaussians are
    composed: mu^2 = sum_f k_f mu(eps_f / k_f)^2.

    Args:
      top_k: k_f per table.
      epsilons: eps_f per table (0 for a table that keeps every row).

    Returns:
      `GaussianDpEvent(1 / mu)`; `GaussianDpEvent(0)` (infinite epsilon) if a
      round's eps is too large to dominate; `NoOpDpEvent()` if no table
      spends budget.

    References: DP-FEST App. C.3; module docstring (dominating Gaussian).
    """
    mu_squared = 0.0
    for name, eps in epsilons.items():
        if eps == 0:
            continue
        k = top_k[name]
        sigma_round = pure_dp_dominating_noise_multiplier(eps / k)
        if sigma_round == 0.0:
            return dp_accounting.GaussianDpEvent(noise_multiplier=0.0)  # non-private
        mu_squared += k / sigma_round**2
    if mu_squared == 0.0:
        return dp_accounting.NoOpDpEvent()
    return dp_accounting.GaussianDpEvent(noise_multiplier=1.0 / math.sqrt(mu_squared))


# -- the selection -------------------------------------------------------------------
def _gumbel(rng, size: int, scale: float) -> np.ndarray:
    if rng is None:
        rng = np.random.default_rng()  # OS entropy
    if isinstance(rng, np.random.Generator):
        return rng.gumbel(loc=0.0, scale=scale, size=size)
    if isinstance(rng, tf.random.Generator):
        u = rng.uniform([size], minval=0.0, maxval=1.0, dtype=tf.float64).numpy()
        u = np.maximum(u, np.finfo(np.float64).tiny)
        return -scale * np.log(-np.log(u))
    raise TypeError(
        f"`rng` must be a numpy Generator, a tf.random.Generator or None (OS entropy); received {type(rng).__name__}."
    )


def _check_k(name: str, k, vocabulary_size: int) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k <= 0:
        raise ValueError(f"`top_k` for {name!r} must be an int > 0; received {k!r}.")
    if k > vocabulary_size:
        raise ValueError(
            f"`top_k` for {name!r} is {k}, more than its vocabulary of {vocabulary_size} rows; "
            f"allowed: 1..{vocabulary_size}."
        )
    return int(k)


SELECTION_CHUNK_ROWS = 1 << 22
"""Rows noised at a time: the top k of each chunk, then of their union (the same k rows as at once)."""


def dp_top_k(counts, *, k: int, epsilon: float, rng=None) -> np.ndarray:
    """eps-DP top-k of one count vector: Gumbel(k / eps) noise, then the k largest.

        selected = argmax_k (h + Gumbel(0, k / eps))

    Args:
      counts: the vocabulary-length count vector h (public shape); each
        example must add at most 1 to any entry (see `bucket_counts`).
      k: rows to select, 1..len(counts).
      epsilon: pure-DP budget of this selection (> 0); each of the k
        equivalent exponential-mechanism rounds spends eps / k.
      rng: numpy Generator, tf.random.Generator, or None (OS entropy).

    Returns:
      int64 array of the k selected rows, sorted.

    Raises:
      ValueError: on k outside 1..len(counts), eps <= 0, or counts that are
        not a finite 1-D vector.

    References: DP-FEST App. B.1, Alg. 2 (scale corrected to k / eps, see the
    module docstring); Durfee & Rogers 2021.
    """
    counts = np.asarray(counts)
    if counts.dtype.kind not in "biuf" or counts.ndim != 1 or counts.size == 0 or not _all_finite(counts):
        raise ValueError(f"`counts` must be a finite, non-empty 1-D vector; received shape {counts.shape}.")
    k = _check_k("counts", k, counts.size)
    epsilon = check_positive("epsilon", epsilon)
    rows, scores = [], []
    for start in range(0, counts.size, SELECTION_CHUNK_ROWS):  # memory O(chunk + k), not O(vocabulary)
        noisy = counts[start : start + SELECTION_CHUNK_ROWS] + _gumbel(
            rng, min(SELECTION_CHUNK_ROWS, counts.size - start), k / epsilon
        )
        kept = _largest(noisy, k)
        rows.append(kept + start)
        scores.append(noisy[kept])
    if k == counts.size:
        return np.arange(k, dtype=np.int64)
    candidates, noisy_counts = np.concatenate(rows), np.concatenate(scores)
    return np.sort(candidates[_largest(noisy_counts, k)]).astype(np.int64)


def _largest(values: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k largest `values` (all of them when there are at most k), in no order."""
    if values.size <= k:
        return np.arange(values.size)
    return np.argpartition(-values, k - 1)[:k]


def _all_finite(counts: np.ndarray) -> bool:
    if counts.dtype.kind != "f":
        return True
    return all(
        np.isfinite(counts[i : i + SELECTION_CHUNK_ROWS]).all() for i in range(0, counts.size, SELECTION_CHUNK_ROWS)
    )


@dataclasses.dataclass(frozen=True)
class TopKSelection:
    """The outcome of one DP top-k selection over tables.

    Attributes:
      rows: table name -> sorted int64 selected rows.
      top_k: table name -> k_f.
      epsilons: table name -> eps_f spent (0 for tables keeping every row).
      gumbel_scales: table name -> Gumbel scale k_f / eps_f (0: no noise needed).
      epsilon: total pure-DP epsilon, sum_f eps_f (basic composition).
      event: the `dp_accounting` event (dominating Gaussian, or NoOp).
    """

    rows: dict
    top_k: dict
    epsilons: dict
    gumbel_scales: dict
    epsilon: float
    event: dp_accounting.DpEvent


def select_top_k(
    counts: Mapping[str, np.ndarray],
    *,
    top_k: Mapping[str, int],
    epsilon: float,
    rng=None,
) -> TopKSelection:
    """DP top-k per table with the budget eps_1 split equally over the tables that choose.

        eps_f = eps_1 / |{f : k_f < vocab_f}|,  rows_f = dp_top_k(h_f, k_f, eps_f)

    Args:
      counts: table name -> vocabulary-length count vector (`bucket_counts`).
      top_k: table name -> k_f (every table in `counts` needs one).
      epsilon: eps_1 (> 0), the pure-DP budget of the whole selection.
      rng: numpy Generator, tf.random.Generator, or None (OS entropy).

    Returns:
      A `TopKSelection` with the rows and the accounting event.

    Raises:
      ValueError: on a missing or out-of-range k, or eps_1 <= 0.

    References: DP-FEST App. B.1 (equal split over features), App. C.3.
    """
    epsilon = check_positive("epsilon", epsilon)
    missing = sorted(set(counts) - set(top_k))
    if missing:
        raise ValueError(f"`top_k` has no entry for tables {missing}; it has {sorted(top_k)}.")
    ks = {name: _check_k(name, top_k[name], np.asarray(counts[name]).size) for name in counts}
    choosing = [name for name in counts if ks[name] < np.asarray(counts[name]).size]
    share = epsilon / len(choosing) if choosing else 0.0
    rows, epsilons, scales = {}, {}, {}
    for name in counts:
        if name in choosing:
            rows[name] = dp_top_k(counts[name], k=ks[name], epsilon=share, rng=rng)
            epsilons[name], scales[name] = share, ks[name] / share
        else:  # keeps every row: data-independent, free
            rows[name] = np.arange(ks[name], dtype=np.int64)
            epsilons[name], scales[name] = 0.0, 0.0
    return TopKSelection(
        rows=rows,
        top_k=ks,
        epsilons=epsilons,
        gumbel_scales=scales,
        epsilon=float(sum(epsilons.values())),
        event=selection_dp_event(top_k=ks, epsilons=epsilons),
    )


# -- counting ------------------------------------------------------------------------
def _example_rows_and_ids(ids):
    """(example index, id) for every occurrence of a batch of ids; int64."""
    if isinstance(ids, tf.SparseTensor):
        return ids.indices[:, 0], tf.cast(ids.values, tf.int64)
    if isinstance(ids, tf.RaggedTensor):
        if ids.ragged_rank != 1:
            raise ValueError(f"Ragged ids must be [batch, None]; received ragged_rank {ids.ragged_rank}.")
        return ids.value_rowids(), tf.cast(ids.flat_values, tf.int64)
    ids = tf.convert_to_tensor(ids)
    if not ids.dtype.is_integer:
        raise TypeError(
            f"Bucket ids must be integers (hash raw values with DPEmbedding.bucket_ids in `ids_fn`); "
            f"received dtype {ids.dtype.name}."
        )
    ids = tf.cast(ids, tf.int64)
    if ids.shape.rank == 0:
        return tf.zeros([1], tf.int64), tf.reshape(ids, [1])
    if ids.shape.rank == 1:  # one id per example
        return tf.range(tf.size(ids, out_type=tf.int64)), ids
    if ids.shape.rank == 2:
        batch, width = tf.shape(ids, out_type=tf.int64)[0], tf.shape(ids, out_type=tf.int64)[1]
        return tf.repeat(tf.range(batch), width), tf.reshape(ids, [-1])
    raise ValueError(f"Ids must be [batch], [batch, n], ragged or sparse; received shape {ids.shape}.")


def _present(sample_weight):
    """bool `[batch]` of the examples with a non-zero weight (None: all), as `DPModel` counts them."""
    weights = tf.convert_to_tensor(sample_weight)
    return present_examples(weights, tf.shape(tf.reshape(weights, [-1]))[0])


def _real_unit_rows(ids, weights):
    """User-level ids `[users, k, n]`: the ids of each user's rows of non-zero weight `[users, k]`, ragged `[users, None]`."""
    if not isinstance(ids, tf.Tensor) or ids.shape.rank != 3:
        return ids
    if weights is None:
        return tf.reshape(ids, [tf.shape(ids)[0], -1])
    real = tf.not_equal(tf.convert_to_tensor(weights), 0)
    return tf.ragged.boolean_mask(ids, real).merge_dims(1, 2)


def _distinct_counts(ids, vocabulary_size: int, present=None):
    """Each example's distinct ids, counted once: (rows, counts) of this batch (`present` examples only)."""
    examples, flat = _example_rows_and_ids(ids)
    if present is not None:
        keep = tf.gather(present, examples)
        examples, flat = tf.boolean_mask(examples, keep), tf.boolean_mask(flat, keep)
    check = tf.debugging.assert_less(
        flat, tf.constant(vocabulary_size, tf.int64), message="bucket id >= vocabulary size"
    )
    check_low = tf.debugging.assert_non_negative(flat, message="negative bucket id")
    with tf.control_dependencies([check, check_low]):
        keys, _ = tf.unique(examples * vocabulary_size + flat)
    rows, _, counts = tf.unique_with_counts(keys % vocabulary_size)
    return rows, counts


def _default_ids_fn(element):
    features = element[0] if isinstance(element, tuple) else element
    if not isinstance(features, Mapping):
        raise ValueError(
            "`bucket_counts` needs `ids_fn` unless the dataset yields a dict of features (or (features, labels))."
        )
    return features


def bucket_counts(
    dataset: tf.data.Dataset,
    *,
    vocabulary_sizes: Mapping[str, int],
    ids_fn: Callable | None = None,
) -> dict:
    """Per-table bucket counts of a dataset, each example counting each distinct id once.

        h_f[j] = |{examples whose ids for table f contain j}|

    so adding or removing one example moves every count by at most 1, in one
    direction: the sensitivity `dp_top_k` assumes (DP-FEST App. B.1). The
    privacy unit is the dataset element's example; if one person contributes
    several examples, count per person instead. Work per batch is
    O(batch x ids); the counts themselves are O(vocabulary) host memory.

    Args:
      dataset: batched `tf.data.Dataset`; by default it yields a dict of
        features (or `(features, labels[, weights])`) keyed by table name.
        An example whose weights are all 0 (the padding of
        `fixed_shape_batches`) is not counted: counting it would move row
        counts down when an example is added (one padding example fewer).
      vocabulary_sizes: table name -> vocabulary size; these tables are counted.
      ids_fn: optional `element -> {table name: bucket ids}`; ids are
        `[batch]`, `[batch, n]`, ragged `[batch, None]` or sparse, already
        in `[0, vocabulary_size)` (apply `DPEmbedding.bucket_ids` here for
        hashed features), or user-level `[users, k, n]` (`poisson_user_batches`
        with k >= every user's count and q = 1: each user's distinct ids count
        once, the padding rows of weight 0 not at all; then `DPFEST(counts_unit="user")`).
        Must be traceable (it runs in `dataset.map`).

    Returns:
      table name -> int64 numpy count vector of length vocabulary_size.

    Raises:
      ValueError / tf.errors.InvalidArgumentError: on ids outside the vocabulary.

    References: DP-FEST App. B.1 (Alg. 2, lines 1-3).
    """
    for name, size in vocabulary_sizes.items():
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size <= 0:
            raise ValueError(f"`vocabulary_sizes[{name!r}]` must be an int > 0; received {size!r}.")
    fn = ids_fn or _default_ids_fn

    def per_batch(*element):
        ids = fn(element[0] if len(element) == 1 else element)
        # (features, labels, sample_weight): weight-0 examples (fixed-shape padding) are absent, not counted.
        weights = element[2] if len(element) == 3 else None
        present = _present(weights) if weights is not None else None
        return {
            name: _distinct_counts(_real_unit_rows(ids[name], weights), int(size), present)
            for name, size in vocabulary_sizes.items()
        }

    totals = {name: np.zeros(int(size), np.int64) for name, size in vocabulary_sizes.items()}
    for batch in dataset.map(per_batch).as_numpy_iterator():
        for name, (rows, counts) in batch.items():
            np.add.at(totals[name], rows, counts)
    return totals


__all__ = [
    "SELECTION_CHUNK_ROWS",
    "TopKSelection",
    "bucket_counts",
    "dp_top_k",
    "pure_dp_dominating_noise_multiplier",
    "select_top_k",
    "selection_dp_event",
]
