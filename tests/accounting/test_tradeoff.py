"""Tests of the PLD TPR-at-FPR bound and the CLT mu-GDP (tfdp_embed/accounting/tradeoff.py) and their report rows."""

from __future__ import annotations

import math

import dp_accounting
import pytest
from scipy import stats

from tfdp_embed.accounting import PrivacyLedger, dpsgd_event, privacy_report
from tfdp_embed.accounting.tradeoff import (
    gaussian_steps,
    gdp_mu_clt,
    gdp_tpr,
    pld_tpr_bounds,
    tradeoff_fields,
)
from tfdp_embed.mechanisms.dense import DenseDPSGD

DELTA, Q, STEPS, N = 1e-5, 0.01, 500, 10_000


def test_one_gaussian_release_recovers_its_exact_tradeoff_curve():
    # One Gaussian with sensitivity 1 and sigma = 1 is exactly 1-GDP: TPR = Phi(Phi^-1(FPR) + 1).
    # FPR 0.01: Phi(-2.3263 + 1) = 0.0924;  FPR 0.1: Phi(-1.2816 + 1) = 0.3891.
    rows = pld_tpr_bounds(dp_accounting.GaussianDpEvent(1.0), fprs=(0.01, 0.1))
    for row, exact in zip(rows, (0.0924, 0.3891)):
        assert exact == pytest.approx(stats.norm.cdf(stats.norm.ppf(row["fpr"]) + 1.0), abs=1e-4)
        assert exact - 1e-3 <= row["max_tpr"] <= exact + 0.02, rows  # a bound, and close to the exact curve


def test_pld_rows_are_never_above_the_epsilon_delta_rows_of_the_report():
    mechanism = DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0)
    ledger = PrivacyLedger()
    ledger.record_steps(mechanism.step_event(Q), STEPS)
    report = privacy_report(
        mechanism=mechanism, ledger=ledger, delta=DELTA, sampling_probability=Q, dataset_size=N, batching="poisson"
    )
    bound = report["attacker_bound"]
    for line, pld in zip(bound["bounds"], bound["pld_bounds"]):
        assert line["fpr"] == pld["fpr"] and pld["fpr"] <= pld["max_tpr"] <= line["max_tpr"] + 1e-12
    assert bound["pld_bounds"][0]["max_tpr"] < bound["bounds"][0]["max_tpr"]  # strictly tighter at FPR 0.001
    # mu = 0.01 sqrt(500 (e - 1)) = 0.01 * 29.311 = 0.29311
    assert bound["gdp_clt"]["mu"] == pytest.approx(0.29311, abs=1e-4)
    assert "not a bound" in bound["gdp_clt"]["note"]


def test_gdp_mu_and_tpr_by_hand():
    # q = 0.01, T = 10,000, sigma = 1: 0.01 sqrt(10,000 (e - 1)) = 0.01 * 131.0832 = 1.310832
    assert gdp_mu_clt(sampling_probability=0.01, noise_multiplier=1.0, steps=10_000) == pytest.approx(1.310832, 1e-6)
    assert gdp_mu_clt(sampling_probability=0.01, noise_multiplier=0.0, steps=10) == math.inf
    assert gdp_tpr(0.0, 0.05) == pytest.approx(0.05)  # mu = 0: no test beats a coin
    assert gdp_tpr(1.0, 0.01) == pytest.approx(0.0924, abs=1e-4)
    assert gdp_tpr(math.inf, 0.01) == 1.0


def test_gdp_only_for_plain_gaussian_steps():
    step = dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(1.0))
    assert gaussian_steps([(step, 3), (dp_accounting.SelfComposedDpEvent(step, 2), 1)]) == (Q, 1.0, 5)
    release = (dp_accounting.GaussianDpEvent(20.0), 1)
    assert gaussian_steps([(step, 3), release]) is None
    other = dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(2.0))
    assert gaussian_steps([(step, 3), (other, 1)]) is None
    fields = tradeoff_fields([(step, STEPS), release], epsilon=1.0)
    assert "pld_bounds" in fields and "gdp_clt" not in fields


def test_bad_input_is_refused():
    event = dpsgd_event(sampling_probability=Q, noise_multiplier=1.0, steps=10)
    with pytest.raises(ValueError, match="fprs"):
        pld_tpr_bounds(event, fprs=(1.5,))
    with pytest.raises(ValueError, match="epsilons"):
        pld_tpr_bounds(event, epsilons=[-1.0])
    with pytest.raises(ValueError, match="cannot compose"):
        pld_tpr_bounds(dp_accounting.UnsupportedDpEvent())
    with pytest.raises(ValueError, match="fpr"):
        gdp_tpr(1.0, 2.0)
