"""Closed forms of LazyDP's deferred noise (tfdp_embed/mechanisms/lazy/closed_form.py).

Every closed form is checked against a brute-force float64 simulation of the
Keras momentum recursion, m_r = beta m_(r-1) + u_r, theta_r = theta_(r-1) + m_r
(Nesterov: theta_r = theta_(r-1) + beta m_r + u_r), with u_r the noise that
step r's gradient noise puts into the momentum (variance w_r).
"""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed.keras2._keras import tf
from tfdp_embed.mechanisms.lazy import closed_form as lazy_math


def _weights(steps: int, seed: int = 0) -> np.ndarray:
    """w_r = (eta_r sigma C / B_r)^2 with a piecewise-constant lr and varying batch size."""
    rng = np.random.default_rng(seed)
    eta = np.where(np.arange(1, steps + 1) <= steps // 2, 0.5, 0.05) * rng.uniform(0.5, 1.5, steps)
    batch = rng.integers(4, 12, steps)
    return np.concatenate([[0.0], (eta * 1.3 * 0.7 / batch) ** 2])  # index 0 unused


def _brute_force(w, h, t, beta, nesterov):
    """Exact (Var M, Cov, Var Theta) by propagating each noise u_r through the recursion."""
    cov = np.zeros((2, 2))
    for r in range(h + 1, t + 1):
        m, theta = 1.0, (1.0 + beta if nesterov else 1.0)  # u_r = 1 entering at step r
        for _ in range(r + 1, t + 1):
            m = beta * m
            theta = theta + (beta * m if nesterov else m)
        psi = np.array([m, theta])
        cov += w[r] * np.outer(psi, psi)
    return cov[0, 0], cov[0, 1], cov[1, 1]


def _running_sums(w, beta):
    sums = [lazy_math.zero_running_sums()]
    for r in range(1, len(w)):
        sums.append(lazy_math.advance_running_sums(sums[-1], w[r], beta=beta))
    return lazy_math.RunningSums(*[tf.stack([getattr(s, f) for s in sums]) for f in lazy_math.RunningSums._fields])


@pytest.mark.parametrize("beta,nesterov", [(0.0, False), (0.5, False), (0.9, False), (0.99, False), (0.9, True)])
def test_moments_match_brute_force_with_schedule(beta, nesterov):
    steps, window = 60, 8
    w = _weights(steps)
    table = _running_sums(w, beta)
    for t in [1, 7, 31, 60]:
        h = np.array(sorted({0, *range(0, t + 1, 3), t - 1, t}))
        start = lazy_math.RunningSums(*[tf.gather(x, h) for x in table])
        end = lazy_math.RunningSums(*[x[t] for x in table])
        recent = np.array([w[t - j] if t - j >= 1 else 0.0 for j in range(window)])
        got = lazy_math.owed_noise_moments(start, end, t - h, recent, beta=beta, nesterov=nesterov)
        ranged = lazy_math.deferred_noise_moments(
            *lazy_math.range_sums(start, end, t - h, beta=beta), beta=beta, nesterov=nesterov
        )
        for i, hh in enumerate(h):
            expected = np.array(_brute_force(w, hh, t, beta, nesterov))
            atol = 1e-300 + 1e-13 * expected[2]
            measured = np.array([x.numpy()[i] for x in got])
            if beta == 0:  # only Var Theta = S0 is used
                measured, expected = measured[2:], expected[2:]
            np.testing.assert_allclose(measured, expected, rtol=1e-10, atol=atol)
            # The prefix-sum form alone loses ~eps / (1 - beta)^4 at k = 1 (1e-8 at beta = 0.99).
            np.testing.assert_allclose(ranged[2].numpy()[i], expected[-1], rtol=1e-7, atol=atol)


def test_plain_sgd_is_the_papers_aggregated_noise():
    # Constant eta = 0.1, sigma C / B = 0.5: k missed steps give Var = k * 0.05^2 (LazyDP §5.2.2).
    w = np.concatenate([[0.0], np.full(10, (0.1 * 0.5) ** 2)])
    table = _running_sums(w, 0.0)
    start = lazy_math.RunningSums(*[x[3] for x in table])
    end = lazy_math.RunningSums(*[x[10] for x in table])
    s0, _, _ = lazy_math.range_sums(start, end, 7, beta=0.0)
    assert s0.numpy() == pytest.approx(7 * 0.0025, rel=1e-12)


@pytest.mark.parametrize("nesterov", [False, True])
def test_drift_and_propagation_match_the_recursion(nesterov):
    beta = 0.9
    for k in [0, 1, 2, 5, 40]:
        m, theta = 1.0, 0.0
        for _ in range(k):  # idle, noiseless steps
            m = beta * m
            theta = theta + (beta * m if nesterov else m)
        decay, gain = lazy_math.momentum_drift(tf.constant([k]), beta=beta, nesterov=nesterov)
        assert decay.numpy()[0] == pytest.approx(m, rel=1e-12)
        assert gain.numpy()[0] == pytest.approx(theta, rel=1e-12, abs=1e-15)
        coef_m, coef_theta = lazy_math.propagation_coefficients(tf.constant([k]), beta=beta, nesterov=nesterov)
        expected = _brute_force(np.array([0.0, 1.0] + [0.0] * k), 0, k + 1, beta, nesterov)
        # one unit noise at step 1, observed k steps later: Var = coef^2
        assert coef_m.numpy()[0] ** 2 == pytest.approx(expected[0], rel=1e-12)
        assert coef_theta.numpy()[0] ** 2 == pytest.approx(expected[2], rel=1e-12)


def test_zero_momentum_drift_and_propagation():
    decay, gain = lazy_math.momentum_drift(tf.constant([0, 3]), beta=0.0)
    np.testing.assert_array_equal(decay.numpy(), [1.0, 0.0])
    np.testing.assert_array_equal(gain.numpy(), [0.0, 0.0])
    _, coef_theta = lazy_math.propagation_coefficients(tf.constant([0, 3]), beta=0.0)
    np.testing.assert_array_equal(coef_theta.numpy(), [1.0, 1.0])


def test_sampled_pair_matches_monte_carlo_of_the_recursion():
    """Cholesky samples and a simulation of the recursion agree (200k draws, float64)."""
    beta, steps, n = 0.9, 12, 200_000
    w = _weights(steps, seed=3)
    rng = np.random.default_rng(1)
    m = np.zeros(n)
    theta = np.zeros(n)
    for r in range(1, steps + 1):
        m = beta * m + rng.normal(0.0, np.sqrt(w[r]), n)
        theta = theta + m
    table = _running_sums(w, beta)
    sums0 = lazy_math.RunningSums(*[x[0] for x in table])
    sums1 = lazy_math.RunningSums(*[x[steps] for x in table])
    moments = lazy_math.deferred_noise_moments(*lazy_math.range_sums(sums0, sums1, steps, beta=beta), beta=beta)
    l11, l21, l22 = (x.numpy() for x in lazy_math.cholesky_2x2(*moments))
    x, y = rng.normal(size=(2, n))
    sample_m, sample_theta = l11 * x, l21 * x + l22 * y
    var_m, cov, var_theta = (v.numpy() for v in moments)
    # Sample variance has relative std sqrt(2/n) = 0.32%; allow 5 sigma = 1.6%.
    for data_m, data_theta in [(m, theta), (sample_m, sample_theta)]:
        assert np.var(data_m) == pytest.approx(var_m, rel=0.016)
        assert np.var(data_theta) == pytest.approx(var_theta, rel=0.016)
        corr = cov / np.sqrt(var_m * var_theta)
        assert np.corrcoef(data_m, data_theta)[0, 1] == pytest.approx(corr, abs=5 * (1 - corr**2) / np.sqrt(n))


def test_cholesky_of_singular_and_zero_matrices():
    # k = 1: M = Theta = u (rank one), and k = 0: nothing owed.
    l11, l21, l22 = (x.numpy() for x in lazy_math.cholesky_2x2([4.0, 0.0], [4.0, 0.0], [4.0 * (1 + 1e-15), 0.0]))
    np.testing.assert_allclose([l11[0], l21[0]], [2.0, 2.0])
    assert l22[0] < 1e-6 and l22[1] == 0.0 and l11[1] == 0.0 and l21[1] == 0.0


def test_long_training_is_stable_and_accurate_at_small_gaps():
    """50k steps at beta = 0.99: no overflow; k = 1 stays rank one, k = 40 matches brute force."""
    beta, steps = 0.99, 50_000
    w = np.full(steps + 1, 1e-4)
    w[0] = 0.0

    @tf.function
    def scan(weights):
        return tf.scan(
            lambda acc, x: lazy_math.advance_running_sums(acc, x, beta=beta),
            weights,
            initializer=lazy_math.zero_running_sums(),
        )

    table = lazy_math.RunningSums(*scan(tf.constant(w[1:])))
    end = lazy_math.RunningSums(*[x[steps - 1] for x in table])  # sums at step `steps`
    recent = np.full(32, 1e-4)
    for k in [1, 40]:
        start = lazy_math.RunningSums(*[x[steps - 1 - k : steps - k] for x in table])
        moments = lazy_math.owed_noise_moments(start, end, [k], recent, beta=beta)
        expected = _brute_force(w[: k + 1], 0, k, beta, False)  # constant w: only the lags matter
        np.testing.assert_allclose([v.numpy()[0] for v in moments], expected, rtol=1e-8)
        l11, l21, l22 = (x.numpy()[0] for x in lazy_math.cholesky_2x2(*moments))
        if k == 1:  # M = Theta = u: rank one
            assert l22 <= 1e-7 * l11
    whole = lazy_math.range_sums(lazy_math.zero_running_sums(), end, steps, beta=beta)
    assert all(np.isfinite(v.numpy()) for v in whole)
    assert whole[0].numpy() == pytest.approx(steps * 1e-4, rel=1e-12)
