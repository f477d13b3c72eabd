"""The law every Poisson sampler must follow, as the accountant assumes it (shared by the samplers' tests)."""

import numpy as np
import pytest


def check_poisson_membership(m: np.ndarray, q: float) -> None:
    """m: [steps, examples] 0/1 membership; asserts independent Bernoulli(q) cells (5 sd bounds).

    Overall inclusion rate ~ Binomial(t n, q) / (t n); batch sizes ~ Binomial(n, q) (mean and
    variance); per-example counts ~ Binomial(t, q) (variance t q (1 - q), not ~0 as with
    shuffling, where each example joins once per epoch); co-inclusion in steps t and t + lag is
    q^2 (independence across steps).
    """
    t, n = m.shape
    sd = np.sqrt(q * (1 - q) / (t * n))
    assert abs(m.mean() - q) < 5 * sd, (m.mean(), q, sd)
    sizes = m.sum(1)
    assert abs(sizes.mean() - n * q) < 5 * np.sqrt(n * q * (1 - q) / t)
    assert abs(sizes.var(ddof=1) / (n * q * (1 - q)) - 1) < 5 * np.sqrt(2 / (t - 1))
    per_example = m.sum(0)
    assert abs(per_example.var(ddof=1) / (t * q * (1 - q)) - 1) < 5 * np.sqrt(2 / (n - 1))
    for lag in (1, 3):
        both, trials = (m[lag:] * m[:-lag]).sum(), (t - lag) * n
        assert abs(both / trials - q * q) < 5 * np.sqrt(q * q * (1 - q * q) / trials)


@pytest.fixture(name="check_poisson")
def _check_poisson_fixture():
    """`check_poisson_membership`, for the samplers' tests."""
    return check_poisson_membership
