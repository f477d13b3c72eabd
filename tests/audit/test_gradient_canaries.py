"""Tests of white-box gradient (Dirac) canaries (tfdp_embed/audit/gradient_canaries.py): no Keras, the mechanisms
are called on `ClippedGradients` as a training step calls them.

Two-sided: without noise the audit separates every canary (power); with dense DP-SGD calibrated to
epsilon = 8 (q = 1, T = 10 steps: sigma = 1.898, mu = sqrt(10) / 1.898 = 1.666) the bound comes
within a factor 2 of the claim and stays below it; EANA, not DP, leaves un-put-in canary rows
without noise and is caught far above the epsilon DP-SGD would claim at its sigma.
"""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed.accounting.calibration import calibrate_noise_multiplier
from tfdp_embed.audit.gradient_canaries import gradient_canary_audit
from tfdp_embed.mechanisms import EANA, DenseDPSGD, LazyDP

DELTA, STEPS, CLAIMED = 1e-5, 10, 8.0


@pytest.fixture(scope="module")
def sigma() -> float:
    return calibrate_noise_multiplier(target_epsilon=CLAIMED, target_delta=DELTA, sampling_probability=1.0, steps=STEPS)


def _audit(mechanism, m: int, **kwargs):
    args = dict(num_canaries=m, steps=STEPS, sampling_probability=1.0, audit_seed=0, delta=DELTA)
    return gradient_canary_audit(mechanism, **{**args, **kwargs})


def test_without_noise_every_canary_is_told_apart():
    """sigma = 0: an in-canary scores T C = 10 exactly, an out-canary 0; every guess right.

    m = 1000: the bound is the most 1000 canaries can prove at 42 tests (observed 6.39, by the Gaussian curve).
    """
    audit = _audit(DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=0.0, seed=0), 1000)
    assert np.all(audit.scores[audit.included] == pytest.approx(10.0)) and np.all(audit.scores[~audit.included] == 0)
    assert audit.bound.correct == audit.bound.guesses and audit.claimed_epsilon is None
    assert audit.bound.epsilon_lb > 6.0, audit.as_dict()


def test_dense_dp_sgd_at_epsilon_8_is_audited_to_half_its_epsilon_and_no_further(sigma):
    """m = 20000 canaries, the Gaussian-curve method alone (14 tests), 0.2 s.

    Observed over audit seeds 0-5: 4.82, 4.42, 4.82, 4.45, 4.63, 4.61 (>= 0.5 eps = 4 in each; seed 0: mu_lb
    1.087 of the true 1.666). With all three methods (42 tests) and m = 5000 the seeds gave 3.37-4.46
    (median 3.79), with m = 100000 4.45-4.87: 0.5 eps needs m in the tens of thousands.
    """
    audit = _audit(DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=sigma, seed=0), 20000, methods=("fdp-gaussian",))
    assert audit.claimed_epsilon == pytest.approx(CLAIMED, abs=0.01)
    assert 0.5 * CLAIMED <= audit.bound.epsilon_lb <= CLAIMED, audit.as_dict()
    assert audit.bound.mu_lb <= np.sqrt(STEPS) / sigma


@pytest.mark.parametrize("where", ["dense", "table"])
def test_dense_dp_sgd_bound_stays_below_its_epsilon_with_poisson_batches_and_background(sigma, where):
    """q = 0.5, 50 background examples, a [m + 1, 2] parameter: the default methods, m = 2000.

    Observed: claimed eps 4.24 (q = 0.5), bound 1.77 (fdp-gaussian; the same in both layouts: same
    seeds, same noise): summing the steps' dot products ignores which steps sampled the canary, so
    Poisson batches weaken the audit.
    """
    mechanism = DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=sigma, seed=1)
    audit = _audit(mechanism, 2000, sampling_probability=0.5, where=where, num_background=50, dim=2, audit_seed=1)
    assert audit.where == where and 0 < audit.bound.epsilon_lb <= audit.claimed_epsilon < CLAIMED


def test_eana_is_caught_above_the_epsilon_dp_sgd_claims_at_its_sigma(sigma):
    """EANA noises only the rows touched this step: with q = 0.5 an out-canary's row never moves.

    Observed: every guess right, bound 4.72 (the most m = 1000 can prove) against DP-SGD's 4.24 at q = 0.5.
    """
    audit = _audit(
        EANA(l2_norm_clip=1.0, noise_multiplier=sigma, seed=0), 1000, sampling_probability=0.5, where="table"
    )
    assert np.all(audit.scores[~audit.included] == 0.0) and audit.claimed_epsilon is None
    assert audit.bound.correct == audit.bound.guesses and audit.bound.epsilon_lb > 4.5


@pytest.mark.parametrize(
    "mechanism, kwargs, match",
    [
        (LazyDP(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0), dict(where="table"), "lookahead or deferred"),
        (DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0), dict(where="rows"), "`where`"),
        (DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0), dict(sampling_probability=0.0), "sampling"),
        (DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0), dict(steps=0), "steps"),
        ("dense", {}, "NoiseMechanism"),
    ],
)
def test_bad_input_is_refused(mechanism, kwargs, match):
    with pytest.raises(ValueError, match=match):
        _audit(mechanism, 100, **kwargs)


def test_audit_seed_must_be_an_int():
    with pytest.raises(TypeError, match="audit_seed"):
        _audit(DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0), 100, audit_seed=None)
