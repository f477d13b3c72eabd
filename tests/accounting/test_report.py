"""The privacy report (tfdp_embed/accounting/report.py)."""

from __future__ import annotations

import json

import dp_accounting
import pytest
from scipy import stats

from tfdp_embed.accounting import (
    PrivacyLedger,
    compute_epsilon,
    dpsgd_event,
    privacy_report,
    read_privacy_report,
    truncation_delta,
    write_privacy_report,
)
from tfdp_embed.accounting.dataset_size import PUBLIC_N_ASSUMPTION, release_dataset_size
from tfdp_embed.data import fed_batching, fixed_size_batches, poisson_batches
from tfdp_embed.keras2._keras import tf
from tfdp_embed.mechanisms.dense import DenseDPSGD
from tfdp_embed.mechanisms.eana import EANA

DELTA = 1e-5
Q, STEPS, N = 0.01, 500, 10_000


def _ledger(mechanism, steps=STEPS):
    ledger = PrivacyLedger()
    ledger.record_setup(mechanism.setup_event())
    ledger.record_steps(mechanism.step_event(Q), steps)
    return ledger


def _verified_poisson():
    """What DPModel.fit records for batches of tfdp_embed.data.poisson_batches (q = Q, N examples)."""
    batches, _ = poisson_batches(tf.data.Dataset.range(N), sampling_probability=Q, seed=0)
    return fed_batching(batches.prefetch(2))


def test_dp_report_has_every_field_and_the_ledger_epsilon(tmp_path):
    mechanism = DenseDPSGD(l2_norm_clip=0.5, noise_multiplier=1.1, seed=0)
    ledger = _ledger(mechanism)
    report = privacy_report(
        mechanism=mechanism,
        ledger=ledger,
        delta=DELTA,
        accountant="rdp",
        sampling_probability=Q,
        dataset_size=N,
        batching=_verified_poisson(),
        extra={"run": "test"},
    )
    expected = compute_epsilon(
        dpsgd_event(sampling_probability=Q, noise_multiplier=1.1, steps=STEPS), target_delta=DELTA, accountant="rdp"
    )
    assert report["epsilon"] == pytest.approx(expected, rel=1e-12)
    for key in (
        "epsilon",
        "delta",
        "accountant",
        "mechanism",
        "noise_multiplier",
        "noise_multipliers",
        "l2_norm_clip",
        "sampling_probability",
        "steps",
        "dataset_size",
        "batching",
        "is_dp",
        "caveats",
    ):
        assert key in report, key
    assert report["is_dp"] is True and report["mechanism"] == "dense"
    assert report["noise_multiplier"] == 1.1 and report["l2_norm_clip"] == 0.5
    assert report["steps"] == STEPS and report["epochs"] == pytest.approx(5.0)
    assert report["expected_batch_size"] == pytest.approx(100.0)
    assert report["batching"] == "poisson" and report["batching_source"] == "verified"
    # An exact N is stated as public (an assumption); the seeded mechanism gets its caveat (no seed value).
    assert report["assumptions"] == [PUBLIC_N_ASSUMPTION] and report["seeded"] == [
        "the training noise",
        "the batch sampler",
    ]
    assert len(report["caveats"]) == 2 and "knows the seed" in report["guarantee"] and "seed" not in report["ledger"]
    assert "differential privacy" in report["guarantee"] and "not verified" not in report["guarantee"]
    assert report["extra"] == {"run": "test"}
    path = write_privacy_report(tmp_path / "model" / "privacy_report.json", report)
    assert read_privacy_report(path) == json.loads(json.dumps(report))
    # Without a ledger the report composes setup + steps itself: same epsilon.
    direct = privacy_report(
        mechanism=mechanism,
        delta=DELTA,
        accountant="rdp",
        sampling_probability=Q,
        dataset_size=N,
        steps=STEPS,
        batching=_verified_poisson(),
    )
    assert direct["epsilon"] == pytest.approx(expected, rel=1e-12)


def test_non_dp_mechanism_report_says_not_dp_and_has_no_epsilon(tmp_path):
    mechanism = EANA(l2_norm_clip=1.0, noise_multiplier=0.5, seed=0)
    report = privacy_report(
        mechanism=mechanism,
        ledger=_ledger(mechanism),
        delta=DELTA,
        sampling_probability=Q,
        dataset_size=N,
        batching=_verified_poisson(),
    )
    assert report["is_dp"] is False
    assert report["epsilon"] is None
    assert "NOT a differential-privacy guarantee" in report["guarantee"]
    assert any("NOT differentially private" in c for c in report["caveats"])
    written = read_privacy_report(write_privacy_report(tmp_path / "r.json", report))
    assert written["epsilon"] is None
    # A nominal number passed in is labelled as such, never as epsilon.
    nominal = privacy_report(
        mechanism=mechanism,
        epsilon=2.0,
        delta=DELTA,
        sampling_probability=Q,
        dataset_size=N,
        steps=STEPS,
        batching=_verified_poisson(),
    )
    assert nominal["epsilon"] is None and nominal["nominal_epsilon_not_dp"] == 2.0


def test_fixed_shuffled_batches_get_the_not_poisson_caveat():
    mechanism = DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.1, seed=0)
    ds = tf.data.Dataset.range(N)
    _, info = fixed_size_batches(ds, batch_size=100, seed=0, num_examples=N)
    for batching in ("fixed_shuffled", info):
        report = privacy_report(
            mechanism=mechanism,
            epsilon=1.0,
            delta=DELTA,
            sampling_probability=Q,
            dataset_size=N,
            steps=STEPS,
            batching=batching,
        )
        assert report["batching"] == "fixed_shuffled"
        assert any("assumes Poisson sampling" in c and "not Poisson-sampled" in c for c in report["caveats"])


def test_truncated_poisson_batches_are_accounted():
    # P[Bin(N + 1, q) > B] for N = 10^4, q = 0.01, B = 120 (2 standard deviations):
    # about 2.4%, times (1 + e^eps) * steps: delta' is capped at 1 -- an honest "useless".
    tail = stats.binom.sf(120, N + 1, Q)
    assert truncation_delta(dataset_size=N, sampling_probability=Q, max_batch_size=120, steps=10, epsilon=1.0) == (
        pytest.approx((1 + 2.718281828459045) * 10 * tail, rel=1e-9)
    )
    tiny = truncation_delta(dataset_size=N, sampling_probability=Q, max_batch_size=200, steps=STEPS, epsilon=1.0)
    assert tiny < 1e-15
    mechanism = DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.1, seed=0)
    _, info = poisson_batches(tf.data.Dataset.range(N), sampling_probability=Q, seed=0, max_batch_size=180)
    report = privacy_report(
        mechanism=mechanism,
        epsilon=1.0,
        delta=DELTA,
        sampling_probability=Q,
        dataset_size=N,
        steps=STEPS,
        batching=info,
    )
    assert report["batching"] == "poisson"
    assert report["batching_details"]["max_batch_size"] == 180
    assert report["batching_details"]["truncated_batches"] == 0
    assert DELTA <= report["delta_with_truncation"] < DELTA * 1.01
    assert any("truncated at max_batch_size=180" in c for c in report["caveats"])
    with pytest.raises(ValueError, match="sampled with q=0.01"):
        privacy_report(
            mechanism=mechanism,
            epsilon=1.0,
            delta=DELTA,
            sampling_probability=0.02,
            dataset_size=N,
            steps=STEPS,
            batching=info,
        )


def test_infinite_epsilon_is_written_as_a_string(tmp_path):
    mechanism = DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=0.0, seed=0)
    report = privacy_report(
        mechanism=mechanism, delta=DELTA, sampling_probability=Q, dataset_size=N, steps=10, batching=_verified_poisson()
    )
    assert report["epsilon"] == float("inf")
    assert read_privacy_report(write_privacy_report(tmp_path / "r.json", report))["epsilon"] == "inf"


def test_bad_arguments():
    mechanism = DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0)
    base = dict(mechanism=mechanism, delta=DELTA, sampling_probability=Q, dataset_size=N, batching="poisson")
    with pytest.raises(ValueError, match="either `ledger`"):
        privacy_report(**base, ledger=_ledger(mechanism), epsilon=1.0)
    with pytest.raises(ValueError, match="`steps`=3 but the ledger records 500"):
        privacy_report(**base, ledger=_ledger(mechanism), steps=3)
    with pytest.raises(ValueError, match="`steps` is required"):
        privacy_report(**base)
    with pytest.raises(ValueError, match="`batching` must be one of"):
        privacy_report(**{**base, "batching": "shuffled"}, steps=1)
    with pytest.raises(TypeError, match="batching"):  # required: no default that claims Poisson
        privacy_report(mechanism=mechanism, delta=DELTA, sampling_probability=Q, dataset_size=N, steps=1)
    with pytest.raises(ValueError, match="`delta`"):
        privacy_report(**{**base, "delta": 0.0}, steps=1)
    with pytest.raises(ValueError, match="`dataset_size`"):
        privacy_report(**{**base, "dataset_size": 0}, steps=1)
    with pytest.raises(TypeError):
        privacy_report(mechanism, DELTA)  # positional: keyword-only arguments refuse it
    # A DP mechanism whose ledger holds a non-DP event cannot get an epsilon.
    ledger = PrivacyLedger()
    ledger.record_steps(dp_accounting.UnsupportedDpEvent(), 1)
    with pytest.raises(ValueError, match="no DP guarantee"):
        privacy_report(**base, ledger=ledger)


def test_assumptions_make_the_guarantee_conditional():
    mechanism = DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.1)
    common = dict(
        mechanism=mechanism,
        epsilon=1.0,
        delta=DELTA,
        sampling_probability=Q,
        dataset_size=release_dataset_size(N),  # N~: no assumption about N
        steps=STEPS,
        batching=_verified_poisson(),
    )
    plain = privacy_report(**common)
    assert "CONDITIONAL" not in plain["guarantee"] and plain["assumptions"] == []
    report = privacy_report(assumptions=["the item frequencies in 'f.txt' are public"], **common)
    assert "CONDITIONAL on: the item frequencies in 'f.txt' are public." in report["guarantee"]
    assert report["assumptions"] == ["the item frequencies in 'f.txt' are public"]
    assert "The guarantee holds only if the item frequencies in 'f.txt' are public" in report["caveats"]
    with pytest.raises(TypeError, match="`assumptions`"):
        privacy_report(assumptions="public", **common)
    with pytest.raises(TypeError, match="`assumptions`"):
        privacy_report(assumptions=[""], **common)
