"""Noise calibration and epsilon computation (tfdp_embed/accounting/calibration.py).

Cross-checks against tensorflow-privacy's `compute_dp_sgd_privacy_lib` (the
RDP numbers every DP-SGD paper quotes) and dp_accounting's accountants.
"""

from __future__ import annotations

import math
import re
import sys

import dp_accounting
import pytest

from tfdp_embed.accounting.calibration import (
    MAX_NOISE_MULTIPLIER,
    calibrate,
    calibrate_noise_multiplier,
    compute_epsilon,
    dpsgd_event,
)

DELTA = 1e-5


def _tf_privacy_lib():
    sys.skip_tf_privacy_import = True  # tensorflow_privacy/__init__ fails on TF 2.21
    pytest.importorskip("tensorflow_privacy", reason="the peer runs in .venv-peers (make test-peers)")
    from tensorflow_privacy.privacy.analysis import compute_dp_sgd_privacy_lib

    return compute_dp_sgd_privacy_lib


@pytest.mark.parametrize(
    "q, steps, target",
    [
        (0.01, 1000, 1.0),
        (2**-7, 1280, 3.0),
        (1.0, 10, 1.0),  # full batch: Gaussian mechanism composed 10 times
    ],
)
def test_rdp_calibration_meets_target_within_1_percent(q, steps, target):
    sigma = calibrate_noise_multiplier(
        target_epsilon=target, target_delta=DELTA, sampling_probability=q, steps=steps, accountant="rdp"
    )
    eps = compute_epsilon(
        dpsgd_event(sampling_probability=q, noise_multiplier=sigma, steps=steps), target_delta=DELTA, accountant="rdp"
    )
    assert eps <= target  # never above the target
    assert eps == pytest.approx(target, rel=0.01)


def test_pld_calibration_meets_target_within_1_percent_and_beats_rdp():
    q, steps, target = 0.01, 1000, 1.0
    sigma = calibrate_noise_multiplier(target_epsilon=target, target_delta=DELTA, sampling_probability=q, steps=steps)
    eps = compute_epsilon(dpsgd_event(sampling_probability=q, noise_multiplier=sigma, steps=steps), target_delta=DELTA)
    assert eps <= target
    assert eps == pytest.approx(target, rel=0.01)
    # PLD is tighter than RDP: less noise for the same target (about 7% here:
    # RDP needs sigma ~1.513, PLD ~1.415).
    sigma_rdp = calibrate_noise_multiplier(
        target_epsilon=target, target_delta=DELTA, sampling_probability=q, steps=steps, accountant="rdp"
    )
    assert sigma < sigma_rdp
    assert sigma == pytest.approx(1.4146, rel=2e-3)
    assert sigma_rdp == pytest.approx(1.5131, rel=2e-3)


@pytest.mark.peer
@pytest.mark.parametrize("sigma", [0.8, 1.1, 4.0])
def test_rdp_epsilon_equals_tensorflow_privacy(sigma):
    lib = _tf_privacy_lib()
    # q = 2^-7 and epochs = steps * q are exact in binary, so tf-privacy's
    # ceil(epochs / q) is exactly `steps`.
    q, steps = 2**-7, 1280
    ours = compute_epsilon(
        dpsgd_event(sampling_probability=q, noise_multiplier=sigma, steps=steps), target_delta=DELTA, accountant="rdp"
    )
    theirs = lib._compute_dp_sgd_example_privacy(
        num_epochs=steps * q,
        noise_multiplier=sigma,
        example_delta=DELTA,
        used_microbatching=False,
        poisson_subsampling_probability=q,
        accountant_type=lib.AccountantType.RDP,
    )
    assert ours == pytest.approx(theirs, rel=1e-6)
    # The public statement (3 decimals) agrees too: N = 12800 examples, batch 100.
    statement = lib.compute_dp_sgd_privacy_statement(
        number_of_examples=12800,
        batch_size=100,
        num_epochs=steps * q,
        noise_multiplier=sigma,
        delta=DELTA,
        used_microbatching=False,
    )
    printed = float(re.search(r"Poisson sampling \(\*\):\s+([0-9.]+)", statement).group(1))
    assert printed == pytest.approx(ours, abs=5e-4)


def test_compute_epsilon_accepts_event_list_and_ledger_like():
    step = dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.1))
    one = compute_epsilon(dp_accounting.SelfComposedDpEvent(step, 100), target_delta=DELTA, accountant="rdp")
    listed = compute_epsilon([dp_accounting.SelfComposedDpEvent(step, 50)] * 2, target_delta=DELTA, accountant="rdp")
    assert listed == pytest.approx(one, rel=1e-12)

    class LedgerLike:
        def as_event(self):
            return dp_accounting.SelfComposedDpEvent(step, 100)

    assert compute_epsilon(LedgerLike(), target_delta=DELTA, accountant="rdp") == pytest.approx(one, rel=1e-12)
    # sigma = 0 is non-private: infinite epsilon, not an error.
    assert math.isinf(
        compute_epsilon(dpsgd_event(sampling_probability=0.1, noise_multiplier=0.0, steps=1), target_delta=DELTA)
    )


def test_compute_epsilon_refuses_unsupported_event():
    with pytest.raises(ValueError, match="no DP guarantee"):
        compute_epsilon(dp_accounting.UnsupportedDpEvent(), target_delta=DELTA)


BASE = dict(target_epsilon=1.0, target_delta=DELTA, sampling_probability=0.01, steps=100, accountant="rdp")


@pytest.mark.parametrize(
    "override, pattern",
    [
        ({"target_epsilon": 0.0}, r"`target_epsilon` must be a finite number > 0; received 0.0"),
        ({"target_epsilon": -1.0}, r"`target_epsilon`.*received -1.0"),
        ({"target_epsilon": math.inf}, r"`target_epsilon`.*received inf"),
        ({"target_delta": 0.0}, r"`target_delta` must be a number in the open interval \(0, 1\); received 0.0"),
        ({"target_delta": 1.0}, r"`target_delta`.*received 1.0"),
        ({"sampling_probability": 0.0}, r"`sampling_probability` must be a number in \(0, 1\]; received 0.0"),
        ({"sampling_probability": 1.5}, r"`sampling_probability`.*received 1.5"),
        ({"steps": 0}, r"`steps` must be an integer >= 1; received 0"),
        ({"steps": 2.5}, r"`steps`.*received 2.5"),
        ({"accountant": "moments"}, r"`accountant` must be one of \('pld', 'rdp'\); received 'moments'"),
    ],
)
def test_bad_arguments_name_the_argument(override, pattern):
    with pytest.raises(ValueError, match=pattern):
        calibrate_noise_multiplier(**{**BASE, **override})


def test_unreachable_target_says_so():
    # Full batch, 10^4 steps, epsilon 1e-4: needs sigma ~ 5e5 > MAX_NOISE_MULTIPLIER.
    with pytest.raises(ValueError, match=r"cannot be met.*`steps`=10000.*even `noise_multiplier`=10000"):
        calibrate_noise_multiplier(
            target_epsilon=1e-4, target_delta=DELTA, sampling_probability=1.0, steps=10_000, accountant="pld"
        )
    assert MAX_NOISE_MULTIPLIER == 1e4


def test_keyword_only():
    with pytest.raises(TypeError):
        calibrate_noise_multiplier(1.0, DELTA, 0.01, 100)


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_calibrate_takes_any_event_factory_and_returns_the_smallest_sigma(accountant):
    # Two Gaussian releases composed: eps(z) decreasing in z; the answer meets the target, z / (1 + 2e-4) does not.
    def make_event(z):
        return dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(z), dp_accounting.GaussianDpEvent(2 * z)])

    z = calibrate(make_event, target_epsilon=1.0, target_delta=DELTA, accountant=accountant)
    assert compute_epsilon(make_event(z), target_delta=DELTA, accountant=accountant) <= 1.0
    assert compute_epsilon(make_event(z / (1 + 2e-4)), target_delta=DELTA, accountant=accountant) > 1.0


def test_calibrate_with_the_dpsgd_factory_is_calibrate_noise_multiplier():
    args = dict(sampling_probability=0.01, steps=200)
    expected = calibrate_noise_multiplier(target_epsilon=2.0, target_delta=DELTA, accountant="rdp", **args)
    sigma = calibrate(
        lambda s: dpsgd_event(noise_multiplier=s, **args), target_epsilon=2.0, target_delta=DELTA, accountant="rdp"
    )
    assert sigma == expected


def test_calibrate_says_when_no_sigma_reaches_the_target():
    with pytest.raises(ValueError, match="epsilon .* at the largest parameter"):
        calibrate(
            lambda s: dp_accounting.GaussianDpEvent(0.1), target_epsilon=1.0, target_delta=DELTA, accountant="rdp"
        )
