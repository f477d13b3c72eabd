"""The DP output calibration reads a Bernoulli subset of the training rows: its size, its coins, its release.

Oracles: the subset's expected size M from a brute-force search over the
error formula written out here; the kept rows from the same seeded coins
drawn in one call; the released numbers from a histogram of a one-input
model whose logit is its input (so every logit is known).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipelines.criteo import calibration as criteo_calibration
from pipelines.criteo import data as criteo_data
from tfdp_embed import keras
from tfdp_embed.data.criteo import resolve_vocab_sizes
from tfdp_embed.data.criteo.synthetic import write_synthetic_criteo

TARGET = 0.005  # half the 0.01 skip limit


def _error(m: int, n: int, eps_c: float) -> float:
    """sqrt((sqrt(82) x 2 / eps_c / M)^2 + 0.25 (1 / M - 1 / N)): Laplace noise on M rows, plus M-of-N sampling."""
    return math.sqrt((math.sqrt(82) * 2 / eps_c / m) ** 2 + 0.25 * (1 / m - 1 / n))


def _smallest_m(n: int, eps_c: float) -> int:
    """Brute force: the smallest M in 1..N with _error(M) <= TARGET (N when none is)."""
    lo, hi = 1, n
    if _error(n, n, eps_c) > TARGET:
        return n
    while lo < hi:  # _error decreases in M
        mid = (lo + hi) // 2
        if _error(mid, n, eps_c) <= TARGET:
            hi = mid
        else:
            lo = mid + 1
    return lo


@pytest.mark.parametrize(("n", "eps_c"), [(200_000, 0.15), (200_000, 0.05), (10**9, 0.15), (45_000_000, 0.5)])
def test_subset_size_is_the_smallest_within_half_the_skip_limit(n, eps_c):
    m = criteo_calibration.subset_rows(n, eps_c)
    assert m == _smallest_m(n, eps_c) and m < n
    assert criteo_calibration.expected_click_rate_error(n, eps_c) == pytest.approx(_error(m, n, eps_c), rel=1e-12)
    assert criteo_calibration.skip_reason(n, eps_c) is None


def test_the_default_run_reads_about_29k_of_its_200k_rows():
    # eps 3 x 5% = 0.15: noise sqrt(82) x 2 / 0.15 = 120.74 / M and sampling 0.5 sqrt(1/M - 1/N) meet 0.005
    # at M = 28,804 (a u^2 + s^2 u = T^2 + s^2 / N with u = 1 / M, a = 120.74^2, s^2 = 1/4, T = 0.005).
    assert criteo_calibration.subset_rows(200_000, 0.15) == 28_804


def test_small_or_noisy_runs_read_every_row_and_keep_the_full_data_error():
    # Sampling alone needs 0.25 / 0.005^2 = 10,000 rows: below that M = N and the error is the Laplace term.
    for n in (1, 400, 1000, 9_999):
        assert criteo_calibration.subset_rows(n, 0.15) == n
        assert criteo_calibration.expected_click_rate_error(n, 0.15) == pytest.approx(math.sqrt(82) * 2 / 0.15 / n)
    # eps_c 0.005 on 200k rows: even all rows miss the target (0.018), so all are read; the skip rule decides.
    assert criteo_calibration.subset_rows(200_000, 0.005) == 200_000
    assert criteo_calibration.skip_reason(200_000, 0.005) is not None
    assert "of 200,000 rows" in criteo_calibration.skip_reason(200_000, 0.005)


def _batches(n: int, cuts: list[int]):
    """Batches of rows 0..n-1 (feature `x` = row index, label = index % 2) cut at `cuts`."""
    bounds = [0, *cuts, n]
    ids = np.arange(n)
    return [({"x": ids[a:b]}, (ids[a:b] % 2).astype(np.float32)) for a, b in zip(bounds[:-1], bounds[1:])]


def _subset(batches, p, seed):
    kept = list(criteo_calibration.row_subset(batches, probability=p, rng=np.random.default_rng(seed)))
    return np.concatenate([f["x"] for f, _ in kept]), np.concatenate([y for _, y in kept])


def test_the_subset_is_the_seeded_coins_rows_however_the_rows_are_batched():
    n, p = 10_000, 0.137
    oracle = np.flatnonzero(np.random.default_rng(7).random(n) < p)  # one coin per row, in row order
    for cuts in ([], [1, 2, 3], [4096, 8192], list(range(100, n, 997))):
        rows, labels = _subset(_batches(n, cuts), p, seed=7)
        np.testing.assert_array_equal(rows, oracle)
        np.testing.assert_array_equal(labels, (oracle % 2).astype(np.float32))  # labels travel with their rows
    assert not np.array_equal(_subset(_batches(n, []), p, seed=8)[0], oracle)  # another seed, another subset
    # The rows' content plays no part: other values at the same positions, the same positions kept.
    other = np.random.default_rng(99).integers(0, 1000, size=n)
    replaced = [({"x": other[a : a + 5000]}, y) for (_, y), a in zip(_batches(n, [5000]), (0, 5000))]
    np.testing.assert_array_equal(_subset(replaced, p, seed=7)[0], other[oracle])


def test_the_subset_has_m_rows_on_average():
    n, m = 100_000, 28_804
    sizes = [_subset(_batches(n, [50_000]), m / n, seed=s)[0].size for s in range(20)]
    sd = math.sqrt(n * (m / n) * (1 - m / n) / len(sizes))  # sd of the mean of 20 Binomial(N, p) sizes
    assert abs(np.mean(sizes) - m) < 5 * sd


def test_probability_one_passes_every_batch_through_and_bad_probabilities_raise():
    batches = _batches(50, [20])
    rng = np.random.default_rng(0)
    out = list(criteo_calibration.row_subset(batches, probability=1.0, rng=rng))
    assert len(out) == 2 and all(o[0] is b[0] and o[1] is b[1] for o, b in zip(out, batches))
    assert rng.random() == np.random.default_rng(0).random()  # no coin drawn
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="`probability` must lie in"):
            list(criteo_calibration.row_subset(batches, probability=bad, rng=np.random.default_rng(0)))


def _identity_logit_model():
    """One input `x` [B, 1]; click_logit = x (weight 1, bias 0): the logits are the inputs."""
    x = keras.Input((1,), name="x", dtype="float32")
    dense = keras.layers.Dense(1, name="click_logit", kernel_initializer="ones", bias_initializer="zeros")
    return keras.Model({"x": x}, dense(x))


def test_released_shift_on_a_subset_matches_the_formula():
    n, eps_c, seed = 40_000, 0.15, 3
    rng = np.random.default_rng(0)
    logits = rng.normal(-1.0, 2.0, size=n).astype(np.float32)
    labels = (rng.random(n) < 0.3).astype(np.float32)
    batches = [({"x": logits[a : a + 8192, None]}, labels[a : a + 8192]) for a in range(0, n, 8192)]
    model = _identity_logit_model()
    result = criteo_calibration.calibrate_output(model, [batches], epsilon=eps_c, rows=n, seed=seed)

    m = _smallest_m(n, eps_c)
    seeds = np.random.SeedSequence(seed)
    kept = np.random.default_rng(seeds.spawn(1)[0]).random(n) < m / n  # the subset's coins
    # Bins of width 0.5 on [-10, 10], logits clipped into the end bins.
    index = np.clip(np.floor((logits[kept].astype(np.float64) + 10) / 0.5).astype(int), 0, 39)
    counts, clicks = np.bincount(index, minlength=40), float(labels[kept].sum())
    noise = np.random.default_rng(seed)  # the noise: Laplace(2 / eps_c) on the 40 bins, then on the clicks
    noisy_counts = counts + noise.laplace(0.0, 2 / eps_c, size=40)
    noisy_clicks = clicks + noise.laplace(0.0, 2 / eps_c)
    assert (result.subset_rows, result.rows, result.rows_read) == (m, n, int(kept.sum()))
    assert result.sampling_probability == m / n < 1
    assert result.noisy_clicks == pytest.approx(noisy_clicks, abs=1e-9)
    assert result.noisy_rows == pytest.approx(noisy_counts.sum(), abs=1e-6)
    # s solves sum_b h~_b sigmoid(c_b + s) = Y~ with bin centres c_b = -10 + 0.5 (b + 1/2).
    centres = -10 + 0.5 * (np.arange(40) + 0.5)
    assert np.sum(noisy_counts / (1 + np.exp(-(centres + result.shift)))) == pytest.approx(noisy_clicks, abs=1e-6)
    assert float(model.get_layer("click_logit").bias.numpy()[0]) == pytest.approx(result.shift, abs=1e-6)
    report = result.report()
    assert report["subset_rows"] == m and report["rows_read"] == int(kept.sum())
    with pytest.raises(ValueError, match="`rows` must be >= 1"):
        criteo_calibration.calibrate_output(model, [batches], epsilon=eps_c, rows=0, seed=seed)


def test_streamed_and_in_memory_periods_give_the_same_subset(tmp_path):
    (path,) = write_synthetic_criteo(str(tmp_path), num_rows=3000, seed=1, days=1, vocab_scale=0.01)
    read = dict(vocab_sizes=resolve_vocab_sizes(None, 20), skip_bad_rows=False)
    memory = criteo_data.open_period([path], streaming="off", **read)
    stream = criteo_data.open_period([path], streaming="on", **read)
    subsets = []
    for period, size in ((memory, 1000), (stream, 512)):
        batches = criteo_data.row_batches(period, size)
        kept = list(criteo_calibration.row_subset(batches, probability=0.3, rng=np.random.default_rng(5)))
        subsets.append((np.concatenate([f["C1"] for f, _ in kept]), np.concatenate([y for _, y in kept])))
    np.testing.assert_array_equal(subsets[0][0], subsets[1][0])
    np.testing.assert_array_equal(subsets[0][1], subsets[1][1])
    oracle = np.random.default_rng(5).random(memory.size) < 0.3
    np.testing.assert_array_equal(subsets[0][1], memory.labels[oracle])
    # In memory the batches are views of the period's arrays: nothing is copied to iterate them.
    features, labels = next(iter(criteo_data.row_batches(memory, 1000)))
    assert np.shares_memory(features["C1"], memory.features["C1"]) and np.shares_memory(labels, memory.labels)
