"""Tests of DP top-k selection and its accounting event (tfdp_embed/mechanisms/topk_selection.py)."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from scipy import special, stats

from tfdp_embed.keras2._keras import tf
from tfdp_embed.mechanisms import topk_selection
from tfdp_embed.mechanisms.topk_selection import (
    bucket_counts,
    dp_top_k,
    pure_dp_dominating_noise_multiplier,
    select_top_k,
    selection_dp_event,
)


# -- dominating Gaussian -------------------------------------------------------------
def gaussian_delta(sigma, eps):
    """Hockey-stick of N(1, sigma^2) vs N(0, sigma^2) at e^eps (exact)."""
    a, u = 1 / (2 * sigma), eps * sigma
    return (special.ndtr(a - u) - special.ndtr(-a - u)) - np.expm1(eps) * special.ndtr(-a - u)


def rr_delta(epsilon, eps):
    """Randomized response RR(epsilon): the worst epsilon-DP pair."""
    return np.maximum(0.0, (math.exp(epsilon) - np.exp(eps)) / (1 + math.exp(epsilon)))


@pytest.mark.parametrize("epsilon", [1e-6, 1e-3, 0.05, 0.5, 1.0, 3.0, 10.0])
def test_gaussian_dominates_every_pure_dp_mechanism(epsilon):
    sigma = pure_dp_dominating_noise_multiplier(epsilon)
    grid = np.concatenate([np.linspace(0, epsilon, 20001), [epsilon * 1.5, epsilon * 3]])
    gap = gaussian_delta(sigma, grid) - rr_delta(epsilon, grid)
    assert gap.min() >= -1e-15 * max(1.0, epsilon)
    # Tight: equality at eps' = 0, and a 0.1% larger sigma no longer dominates there.
    assert gaussian_delta(sigma, 0.0) == pytest.approx(math.tanh(epsilon / 2), rel=1e-7)
    assert gaussian_delta(sigma * 1.001, 0.0) < rr_delta(epsilon, 0.0)


def test_dominating_gaussian_small_epsilon_asymptote_and_pld():
    # mu = 2 Phi^{-1}(sigmoid(eps)) ~ 2 (eps / 4) / phi(0) = eps * sqrt(pi / 2) for small eps.
    assert 1 / pure_dp_dominating_noise_multiplier(1e-4) == pytest.approx(1e-4 * math.sqrt(math.pi / 2), rel=1e-6)
    # dp_accounting's (pessimistic) PLD of the event is at least RR's delta too.
    epsilon = 0.5
    event = dp_accounting.GaussianDpEvent(pure_dp_dominating_noise_multiplier(epsilon))
    accountant = dp_accounting.pld.PLDAccountant().compose(event)
    for eps in (0.0, 0.1, 0.3):
        assert accountant.get_delta(eps) >= rr_delta(epsilon, eps) - 1e-9
    assert pure_dp_dominating_noise_multiplier(1e4) == 0.0  # beyond float64: non-private
    with pytest.raises(ValueError, match="epsilon"):
        pure_dp_dominating_noise_multiplier(0.0)


def test_selection_event_composes_rounds_as_gaussians():
    # Table a: 4 rounds of eps 0.2/4 = 0.05; table b keeps everything (0).
    event = selection_dp_event(top_k={"a": 4, "b": 10}, epsilons={"a": 0.2, "b": 0.0})
    mu = math.sqrt(4) / pure_dp_dominating_noise_multiplier(0.05)
    assert event == dp_accounting.GaussianDpEvent(1 / mu)
    assert selection_dp_event(top_k={"b": 10}, epsilons={"b": 0.0}) == dp_accounting.NoOpDpEvent()
    for accountant in (dp_accounting.pld.PLDAccountant(), dp_accounting.rdp.RdpAccountant()):
        assert accountant.supports(event)


# -- selection ------------------------------------------------------------------------
def test_huge_epsilon_picks_true_top_k():
    counts = np.random.default_rng(0).permutation(1000).astype(np.int64)  # distinct counts
    rows = dp_top_k(counts, k=25, epsilon=1e9, rng=np.random.default_rng(1))
    np.testing.assert_array_equal(rows, np.sort(np.argsort(-counts)[:25]))
    # With a TF generator (what DPFEST uses) too.
    rows_tf = dp_top_k(counts, k=25, epsilon=1e9, rng=tf.random.Generator.from_seed(3))
    np.testing.assert_array_equal(rows_tf, rows)


def test_small_epsilon_is_noisy():
    counts = np.arange(200, dtype=np.int64) * 3  # top-10 is rows 190..199, gaps of 3
    true = set(range(190, 200))
    overlaps = [
        len(true & set(dp_top_k(counts, k=10, epsilon=0.1, rng=np.random.default_rng(s)).tolist())) for s in range(10)
    ]
    # Gumbel scale k / eps = 100 >> gaps of 3: the true top-10 is essentially never recovered.
    assert max(overlaps) < 10
    assert np.mean(overlaps) < 5


def test_top_1_is_the_exponential_mechanism():
    # k = 1: P(i) = exp(eps h_i) / sum_j exp(eps h_j). h = (0, 1, 2), eps = 1:
    # softmax = (0.0900306, 0.2447285, 0.6652410).
    rng = np.random.default_rng(7)
    n = 20_000
    picks = np.array([dp_top_k([0, 1, 2], k=1, epsilon=1.0, rng=rng)[0] for _ in range(n)])
    freq = np.bincount(picks, minlength=3) / n
    expected = np.array([0.0900306, 0.2447285, 0.6652410])
    # sd of a frequency <= sqrt(0.25 / 20000) = 0.0035; tolerance 0.015 (> 4 sd).
    np.testing.assert_allclose(freq, expected, atol=0.015)


def test_top_2_uses_scale_k_over_epsilon():
    # k = 2 on h = (0, 2, 4) with eps = 2: each peel is exp(h (eps/k)) = exp(h). The left-out
    # row is the last of a Plackett-Luce order with weights w = (1, e^2, e^4):
    # P(leave out 0) = sum over orders ending in 0 = w1/W * w2/(w0+w2) + w2/W * w1/(w0+w1).
    w = np.exp(np.array([0.0, 2.0, 4.0]))
    total = w.sum()

    def left_out(i):
        a, b = [j for j in range(3) if j != i]
        return w[a] / total * w[b] / (w[b] + w[i]) + w[b] / total * w[a] / (w[a] + w[i])

    expected = np.array([left_out(i) for i in range(3)])
    rng = np.random.default_rng(11)
    n = 20_000
    outs = np.array([3 - dp_top_k([0, 2, 4], k=2, epsilon=2.0, rng=rng).sum() for _ in range(n)])
    freq = np.bincount(outs, minlength=3) / n
    np.testing.assert_allclose(freq, expected, atol=0.015)
    # The paper's scale 1/eps would give weights exp(2h): P(leave out 0) = 0.99966, far off.
    assert freq[0] < 0.99


def test_select_top_k_splits_budget_over_choosing_tables():
    counts = {"a": np.arange(100), "b": np.arange(50)[::-1], "full": np.ones(5)}
    sel = select_top_k(counts, top_k={"a": 5, "b": 3, "full": 5}, epsilon=1e8, rng=np.random.default_rng(0))
    np.testing.assert_array_equal(sel.rows["a"], [95, 96, 97, 98, 99])
    np.testing.assert_array_equal(sel.rows["b"], [0, 1, 2])
    np.testing.assert_array_equal(sel.rows["full"], np.arange(5))
    assert sel.epsilons == {"a": 5e7, "b": 5e7, "full": 0.0}  # equal split, full table free
    assert sel.gumbel_scales["a"] == pytest.approx(5 / 5e7)
    assert sel.epsilon == pytest.approx(1e8)
    small = select_top_k(counts, top_k={"a": 5, "b": 3, "full": 5}, epsilon=0.01, rng=np.random.default_rng(0))
    assert small.event == selection_dp_event(top_k=small.top_k, epsilons={"a": 0.005, "b": 0.005, "full": 0.0})


@pytest.mark.parametrize(
    "k, epsilon, match",
    [
        (0, 1.0, "top_k"),
        (-2, 1.0, "top_k"),
        (11, 1.0, "vocabulary"),
        (2.5, 1.0, "top_k"),
        (3, 0.0, "epsilon"),
        (3, -1.0, "epsilon"),
    ],
)
def test_bad_selection_arguments(k, epsilon, match):
    with pytest.raises(ValueError, match=match):
        dp_top_k(np.arange(10), k=k, epsilon=epsilon, rng=np.random.default_rng(0))


def test_select_top_k_missing_table():
    with pytest.raises(ValueError, match="top_k"):
        select_top_k({"a": np.arange(10), "b": np.arange(10)}, top_k={"a": 2}, epsilon=1.0)


# -- counting ------------------------------------------------------------------------
def test_bucket_counts_counts_each_example_distinct_ids_once():
    ragged = tf.ragged.constant([[1, 1, 3], [3], [0, 3, 3, 3], [2]], dtype=tf.int64)
    dense = tf.constant([[4, 4], [0, 1], [1, 1], [4, 2]], tf.int32)
    labels = tf.zeros([4])
    ds = tf.data.Dataset.from_tensor_slices(({"ctx": ragged, "item": dense}, labels)).batch(3)
    counts = bucket_counts(ds, vocabulary_sizes={"ctx": 5, "item": 6})
    # ctx: example sets {1,3}, {3}, {0,3}, {2} -> row 0:1, 1:1, 2:1, 3:3, 4:0
    np.testing.assert_array_equal(counts["ctx"], [1, 1, 1, 3, 0])
    # item: {4}, {0,1}, {1}, {4,2} -> 0:1, 1:2, 2:1, 3:0, 4:2, 5:0
    np.testing.assert_array_equal(counts["item"], [1, 2, 1, 0, 2, 0])


def test_bucket_counts_ids_fn_and_range_check():
    ds = tf.data.Dataset.from_tensor_slices({"raw": tf.constant([7, 7, 9, 2])}).batch(2)
    counts = bucket_counts(ds, vocabulary_sizes={"t": 10}, ids_fn=lambda f: {"t": f["raw"]})
    np.testing.assert_array_equal(counts["t"], [0, 0, 1, 0, 0, 0, 0, 2, 0, 1])
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="vocabulary"):
        bucket_counts(ds, vocabulary_sizes={"t": 5}, ids_fn=lambda f: {"t": f["raw"]})
    with pytest.raises(ValueError, match="vocabulary_sizes"):
        bucket_counts(ds, vocabulary_sizes={"t": 0}, ids_fn=lambda f: {"t": f["raw"]})


def test_counts_feed_selection_end_to_end():
    rng = np.random.default_rng(0)
    ids = rng.zipf(1.5, size=(2000, 3)) % 50  # power law: low ids most frequent
    ds = tf.data.Dataset.from_tensor_slices({"f": ids}).batch(256)
    counts = bucket_counts(ds, vocabulary_sizes={"f": 50})
    exact = np.array([np.sum(np.any(ids == j, axis=1)) for j in range(50)])
    np.testing.assert_array_equal(counts["f"], exact)
    sel = select_top_k(counts, top_k={"f": 5}, epsilon=1e9, rng=np.random.default_rng(0))
    assert set(sel.rows["f"].tolist()) == set(np.argsort(-exact, kind="stable")[:5].tolist())
    assert stats.spearmanr(counts["f"], exact).statistic == pytest.approx(1.0)


def test_paper_scale_would_not_be_eps_dp_but_ours_is():
    # Why the Gumbel scale is k/eps and not the paper's 1/eps. Counts (0, 0, h), k = 2: the
    # set that leaves out the big bucket 2 has Plackett-Luce probability
    #   P = w0/W * w1/(w1 + w2) + w1/W * w0/(w0 + w2),  w_i = exp(h_i / scale), W = sum w.
    # Adding one example to bucket 2 (h -> h + 1) divides P by ~exp(k / scale) for large h.
    def leave_out_big(h, scale):
        w = np.exp(np.array([0.0, 0.0, h]) / scale)
        total = w.sum()
        return w[0] / total * w[1] / (w[1] + w[2]) + w[1] / total * w[0] / (w[0] + w[2])

    eps, k, h = 0.5, 2, 200.0
    paper = math.log(leave_out_big(h, 1 / eps) / leave_out_big(h + 1, 1 / eps))
    ours = math.log(leave_out_big(h, k / eps) / leave_out_big(h + 1, k / eps))
    assert paper == pytest.approx(k * eps, rel=1e-6)  # k * eps: not eps-DP
    assert ours == pytest.approx(eps, rel=1e-6)  # eps: as stated


@pytest.mark.parametrize("chunk", [64, 1000, 1 << 22], ids=["chunks_of_64", "chunk_is_vocabulary", "one_chunk"])
def test_chunked_selection_is_the_top_k_of_all_noisy_counts(monkeypatch, chunk):
    """Noised a chunk at a time (memory O(chunk + k)), it selects the k largest noisy counts of the whole vector."""
    monkeypatch.setattr(topk_selection, "SELECTION_CHUNK_ROWS", chunk)
    counts = np.random.default_rng(2).integers(0, 50, size=1000)
    k, epsilon = 37, 2.0
    noisy = counts + np.random.default_rng(5).gumbel(0.0, k / epsilon, size=counts.size)
    expected = np.sort(np.argsort(-noisy)[:k])
    np.testing.assert_array_equal(
        topk_selection.dp_top_k(counts, k=k, epsilon=epsilon, rng=np.random.default_rng(5)), expected
    )


def test_selection_refuses_non_numeric_counts():
    with pytest.raises(ValueError, match="finite, non-empty 1-D vector"):
        topk_selection.dp_top_k(np.array(["a", "b"]), k=1, epsilon=1.0, rng=np.random.default_rng(0))
