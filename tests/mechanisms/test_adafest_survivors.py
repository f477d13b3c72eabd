"""The survivor set of DP-AdaFEST(+) has exactly the law of per-row threshold tests.

Brute force (the definition, Alg. 1 lines 6-7): every row j of the table
gets its own noisy count V[j] = count[j] + N(0, sigma1^2 C1^2) and survives
when V[j] >= tau, independently of all other rows. So the survivor set is a
vector of independent Bernoulli(q_j) bits with

    q_j = P(N(0, (sigma1 C1)^2) >= tau - count[j])

(count 0 for untouched rows). The mechanism never builds that vector: it
tests touched rows and draws the untouched survivors by geometric skips.
These tests run it many times on a small vocabulary and compare with the
exact law: per-row frequencies, pairwise joint frequencies (independence,
including adjacent untouched rows and touched/untouched pairs), and the
distribution of the number of survivors (the exact Poisson-binomial pmf).

Tolerances: per-row and pairwise frequencies within 5 binomial standard
deviations (about 6e-7 two-sided false-alarm rate per check); the count
distribution by a chi-square goodness-of-fit test at p > 1e-4.
Also tests `threshold_for_noise_rows`, the rule that sets tau from the
vocabulary for a fixed expected number of noise-only rows.
"""

from __future__ import annotations

import itertools
import math

import dp_accounting
import numpy as np
import pytest
from scipy import stats

from tfdp_embed.keras2._keras import tf
from tfdp_embed.keras2.layers.embedding import DPEmbedding
from tfdp_embed.mechanisms.adafest import (
    DPAdaFEST,
    noise_survival_probability,
    threshold_for_noise_rows,
)
from tfdp_embed.mechanisms.adafest_plus import DPAdaFESTPlus
from tfdp_embed.mechanisms.base import ClippedGradients, TableGradient

VOCAB = 24
# Examples (one per list) and the rows they touch: row 0 has count 3, rows
# 1-2 count 2, rows 3-6 count 1; rows 7-23 are untouched. C1 = 10 keeps
# every example's weight at 1 (n_i <= 4 distinct rows, sqrt(4) < 10).
EXAMPLES = [[0, 1, 3], [0, 1, 2, 4], [0, 2, 5], [6]]
COUNTS = np.zeros(VOCAB)
for _rows in EXAMPLES:
    COUNTS[_rows] += 1
SCALE = 1.0  # sigma1 C1 = 0.1 * 10
TAU = 1.5  # untouched: q = P(Z >= 1.5) = 0.0668, collisions with touched rows are frequent
RUNS = 3000


def _step(layer):
    occ = layer.occurrences(tf.ragged.constant(EXAMPLES, dtype=tf.int64))
    rows = sorted({r for ex in EXAMPLES for r in ex})
    grad = tf.IndexedSlices(tf.ones([len(rows), 2]), tf.constant(rows, tf.int64), tf.constant([VOCAB, 2], tf.int64))
    table = TableGradient(
        layer=layer,
        variable=None,
        gradient=grad,
        occurrences=[occ],
        clip_factors=tf.ones([len(EXAMPLES)]),
    )
    return ClippedGradients(
        tables=[table],
        dense=[],
        expected_batch_size=1.0,
        batch_size=tf.constant(len(EXAMPLES), tf.int32),
    )


def _survivor_bits(mechanism, runs: int) -> np.ndarray:
    """[runs, VOCAB] 0/1 matrix of the rows each update returned."""
    layer = DPEmbedding(VOCAB, 2, combiner="sum", name="t")
    mechanism.init(tables=[layer], dense_variables=[], optimizer=None)
    step = _step(layer)

    @tf.function
    def survivors():
        ((slices, _),) = mechanism.update(step)
        return slices.indices

    bits = np.zeros((runs, VOCAB), np.int8)
    for i in range(runs):
        rows = survivors().numpy()
        assert len(np.unique(rows)) == len(rows), "a row was returned twice"
        bits[i, rows] = 1
    return bits


def _exact_probabilities(allowed=None) -> np.ndarray:
    q = stats.norm.sf((TAU - COUNTS) / SCALE)
    if allowed is not None:
        q = np.where(allowed, q, 0.0)
    return q


def _poisson_binomial_pmf(q: np.ndarray) -> np.ndarray:
    pmf = np.array([1.0])
    for p in q:
        pmf = np.convolve(pmf, [1.0 - p, p])
    return pmf


def _check_against_exact_law(bits: np.ndarray, q: np.ndarray) -> None:
    runs = bits.shape[0]
    freq = bits.mean(axis=0)
    sd = np.sqrt(q * (1 - q) / runs)
    bad = np.abs(freq - q) > 5 * sd + 1e-12
    assert not bad.any(), f"rows {np.flatnonzero(bad)}: frequency {freq[bad]} vs exact {q[bad]}"
    # Independence: touched/touched, touched/untouched, adjacent untouched rows
    # (geometric gaps), untouched rows far apart.
    for i, j in [(0, 3), (3, 7), (6, 7), (7, 8), (8, 9), (12, 13), (9, 23)]:
        if q[i] == 0 or q[j] == 0:
            continue
        joint, want = float(np.mean(bits[:, i] & bits[:, j])), q[i] * q[j]
        assert abs(joint - want) <= 5 * math.sqrt(want * (1 - want) / runs), (i, j, joint, want)
    # Number of survivors: exact Poisson-binomial law, cells with expectation < 5 pooled.
    pmf = _poisson_binomial_pmf(q)
    observed = np.bincount(bits.sum(axis=1), minlength=len(pmf)).astype(float)
    expected = pmf * runs
    keep = expected >= 5
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    if exp[-1] < 5:  # fold a small pooled cell into the last kept one
        obs, exp = np.append(obs[:-2], obs[-2:].sum()), np.append(exp[:-2], exp[-2:].sum())
    assert stats.chisquare(obs, exp).pvalue > 1e-4, (observed, expected)


def _mechanism(cls=DPAdaFEST, **extra):
    with pytest.warns(UserWarning, match="fraction of every table"):  # q = 0.067: dense on purpose
        return cls(
            l2_norm_clip=1.0,
            noise_multiplier=0.0,
            contribution_clip=10.0,
            contribution_noise_multiplier=0.1,
            threshold=TAU,
            seed=123,
            **extra,
        )


def test_adafest_survivors_have_the_law_of_independent_per_row_tests():
    mechanism = _mechanism()
    assert mechanism.noise_survival_probability == pytest.approx(stats.norm.sf(TAU), rel=1e-12)
    bits = _survivor_bits(mechanism, RUNS)
    _check_against_exact_law(bits, _exact_probabilities())


def test_adafest_plus_survivors_have_the_law_of_per_row_tests_inside_the_selection():
    # Selected: touched rows 0, 3, 5 and untouched rows 7..15; rows 1, 2, 4, 6 and
    # 16..23 must never survive.
    selected = np.array([0, 3, 5] + list(range(7, 16)))
    allowed = np.isin(np.arange(VOCAB), selected)
    mechanism = _mechanism(DPAdaFESTPlus, selected_rows={"t": selected}, selection_event=dp_accounting.NoOpDpEvent())
    bits = _survivor_bits(mechanism, RUNS)
    assert not bits[:, ~allowed].any()
    _check_against_exact_law(bits, _exact_probabilities(allowed))


# -- tau for a fixed number of noise-only rows ---------------------------------------
@pytest.mark.parametrize("vocab", [10**5, 10**7, 5 * 10**7, 10**12])
@pytest.mark.parametrize("rows,c1,sigma1", [(1000.0, 1.0, 5.1), (10.0, 2.0, 0.7), (1.0, 1.0, 3.0)])
def test_threshold_for_noise_rows_gives_that_many_rows(vocab, rows, c1, sigma1):
    tau = threshold_for_noise_rows(
        vocabulary_size=vocab,
        expected_noise_rows=rows,
        contribution_clip=c1,
        contribution_noise_multiplier=sigma1,
    )
    assert tau == pytest.approx(c1 * sigma1 * stats.norm.isf(rows / vocab), rel=1e-9)
    p = noise_survival_probability(threshold=tau, contribution_clip=c1, contribution_noise_multiplier=sigma1)
    assert p * vocab == pytest.approx(rows, rel=1e-9)


def test_threshold_for_noise_rows_grows_with_vocabulary_and_is_zero_at_half():
    taus = [
        threshold_for_noise_rows(
            vocabulary_size=v,
            expected_noise_rows=1000,
            contribution_clip=1.0,
            contribution_noise_multiplier=5.1,
        )
        for v in (10**4, 10**5, 10**6, 10**7, 5 * 10**7)
    ]
    assert all(a < b for a, b in itertools.pairwise(taus))
    assert (
        threshold_for_noise_rows(
            vocabulary_size=10,
            expected_noise_rows=5,
            contribution_clip=1.0,
            contribution_noise_multiplier=1.0,
        )
        == 0.0
    )


def test_mechanism_with_that_threshold_draws_that_many_rows_per_step():
    vocab, rows = 10**10, 500.0  # unbuilt layer: the vocabulary costs nothing
    tau = threshold_for_noise_rows(
        vocabulary_size=vocab,
        expected_noise_rows=rows,
        contribution_clip=1.0,
        contribution_noise_multiplier=2.0,
    )
    mechanism = DPAdaFEST(
        l2_norm_clip=1.0,
        noise_multiplier=1.0,
        contribution_clip=1.0,
        contribution_noise_multiplier=2.0,
        threshold=tau,
        seed=5,
    )
    layer = DPEmbedding(vocab, 4, combiner="sum", name="big")
    mechanism.init(tables=[layer], dense_variables=[], optimizer=None)
    occ = layer.occurrences(tf.ragged.constant([[3], [7]], dtype=tf.int64))
    grad = tf.IndexedSlices(tf.ones([2, 4]), tf.constant([3, 7], tf.int64), tf.constant([vocab, 4], tf.int64))
    step = ClippedGradients(
        tables=[TableGradient(layer=layer, variable=None, gradient=grad, occurrences=[occ], clip_factors=tf.ones([2]))],
        dense=[],
        expected_batch_size=2.0,
        batch_size=tf.constant(2, tf.int32),
    )
    steps = 8
    total = sum(int(mechanism.update(step)[0][0].indices.shape[0]) for _ in range(steps))
    # Touched rows (count 1, tau ~ 2 * 6.1) essentially never survive.
    assert abs(total - steps * rows) < 5 * math.sqrt(steps * rows)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(vocabulary_size=0), "`vocabulary_size`"),
        (dict(vocabulary_size=10.5), "`vocabulary_size`"),
        (dict(expected_noise_rows=0.0), "`expected_noise_rows`"),
        (dict(expected_noise_rows=-3.0), "`expected_noise_rows`"),
        (dict(expected_noise_rows=600.0), "vocabulary_size / 2"),
        (dict(contribution_clip=0.0), "`contribution_clip`"),
        (dict(contribution_noise_multiplier=-1.0), "`contribution_noise_multiplier`"),
    ],
)
def test_threshold_for_noise_rows_rejects_bad_arguments(kwargs, match):
    args = dict(
        vocabulary_size=1000, expected_noise_rows=10.0, contribution_clip=1.0, contribution_noise_multiplier=1.0
    )
    args.update(kwargs)
    with pytest.raises(ValueError, match=match) as info:
        threshold_for_noise_rows(**args)
    assert "received" in str(info.value)
    with pytest.raises(TypeError):
        threshold_for_noise_rows(1000, 10.0, 1.0, 1.0)  # keyword-only
