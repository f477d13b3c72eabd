"""PrivacyLedger: events as data, JSON round trip, epsilon via dp_accounting."""

from __future__ import annotations

import json

import dp_accounting
import pytest

from tfdp_embed.accounting import PrivacyLedger, compute_epsilon
from tfdp_embed.accounting.ledger import LedgerEntry, event_from_dict, event_to_dict

STEP = dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.1))
SETUP = dp_accounting.GaussianDpEvent(5.0)


def test_records_setup_once_and_merges_steps():
    ledger = PrivacyLedger()
    ledger.record_setup(SETUP)
    ledger.record_setup(None)  # no setup cost: ignored
    for _ in range(250):
        ledger.record_steps(STEP)
    ledger.record_steps(STEP, count=250)
    assert ledger.steps == 500
    assert [(e.kind, e.count) for e in ledger.entries] == [("setup", 1), ("step", 500)]
    assert ledger.has_setup(SETUP) and not ledger.has_setup(dp_accounting.GaussianDpEvent(4.0))


def test_epsilon_equals_accountant_on_composed_events():
    ledger = PrivacyLedger()
    ledger.record_setup(SETUP)
    ledger.record_steps(STEP, 500)
    expected = (
        dp_accounting.rdp.RdpAccountant()
        .compose(SETUP)
        .compose(dp_accounting.SelfComposedDpEvent(STEP, 500))
        .get_epsilon(1e-5)
    )
    assert ledger.epsilon(1e-5, "rdp") == pytest.approx(expected, rel=1e-12)
    pld = ledger.epsilon(1e-5)  # PLD default; tighter than RDP
    assert pld < expected
    assert PrivacyLedger().epsilon(1e-5, "rdp") == 0.0  # nothing spent


def test_json_round_trip_uses_dp_accounting_serialisation():
    ledger = PrivacyLedger()
    ledger.record_setup(SETUP)
    ledger.record_steps(STEP, 300)
    other = dp_accounting.ComposedDpEvent([STEP, dp_accounting.LaplaceDpEvent(2.0)])
    ledger.record_steps(other, 2)
    text = ledger.to_json()
    data = json.loads(text)
    assert data["format"] == "tfdp_embed.PrivacyLedger" and data["steps"] == 302
    assert data["entries"][1]["event"] == {
        "module_name": "dp_accounting.dp_event",
        "class_name": "PoissonSampledDpEvent",
        "sampling_probability": 0.01,
        "event": {"module_name": "dp_accounting.dp_event", "class_name": "GaussianDpEvent", "noise_multiplier": 1.1},
    }
    restored = PrivacyLedger.from_json(text)
    assert [(e.kind, e.event, e.count) for e in restored.entries] == [
        (e.kind, e.event, e.count) for e in ledger.entries
    ]
    assert restored.epsilon(1e-5, "rdp") == pytest.approx(ledger.epsilon(1e-5, "rdp"), rel=1e-12)
    assert compute_epsilon(restored, target_delta=1e-5, accountant="rdp") == restored.epsilon(1e-5, "rdp")


def test_bad_input():
    with pytest.raises(TypeError, match="`dp_accounting.DpEvent`"):
        PrivacyLedger().record_steps("gaussian")
    with pytest.raises(ValueError, match="`count` must be an integer >= 0"):
        PrivacyLedger().record_steps(STEP, -1)
    with pytest.raises(ValueError, match="`kind`"):
        PrivacyLedger([LedgerEntry("epoch", STEP, 1)])
    with pytest.raises(ValueError, match="format"):
        PrivacyLedger.from_json('{"entries": []}')
    with pytest.raises(ValueError, match="dp_accounting module"):
        event_from_dict({"module_name": "os", "class_name": "system"})
    assert event_from_dict(event_to_dict(STEP)) == STEP
