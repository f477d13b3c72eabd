"""The privacy report as text (tfdp_embed/accounting/report_text.py), from reports a user's run produces."""

from __future__ import annotations

import math

from tfdp_embed import Release, plan_run, release_dataset_size
from tfdp_embed.accounting import (
    PrivacyLedger,
    format_report,
    privacy_report,
    read_privacy_report,
    write_privacy_report,
)
from tfdp_embed.mechanisms.eana import EANA

DELTA = 1e-5
Q, STEPS, N = 0.01, 500, 10_000


SIZE = release_dataset_size(N, seed=0)  # N~ = 10003 (a seeded draw: the report says so)


def _plan_report(**kwargs):
    plan = plan_run(
        "adafest",
        target_epsilon=3.0,
        target_delta=DELTA,
        sampling_probability=Q,
        steps=STEPS,
        accountant="rdp",
        contribution_clip=1.0,
        threshold_sigmas=2.0,
        seed=0,
        releases=[Release.dataset_size(SIZE)],
        **kwargs,
    )
    ledger = plan.ledger()
    ledger.record_steps(plan.mechanism.step_event(Q), STEPS)
    return plan, plan.report(dataset_size=SIZE, batching="fixed_shuffled", ledger=ledger)


def test_a_dp_run_reads_as_its_guarantee_and_settings(tmp_path):
    plan, report = _plan_report(assumptions=["the vocabulary is public"])
    report = read_privacy_report(write_privacy_report(tmp_path / "privacy_report.json", report))  # as a reader gets it
    lines = format_report(report).splitlines()
    sigma1 = plan.mechanism_arguments["contribution_noise_multiplier"]
    eps = report["epsilon"]
    assert lines[0] == "== privacy report =="
    assert lines[1] == f"guarantee          {report['guarantee']}"
    assert report["guarantee"].startswith(f"({eps:.6g}, 1e-05)-differential privacy")
    assert lines[2] == "mechanism          adafest (differentially private)"
    assert lines[3] == f"epsilon / delta    {eps:.4g} / 1e-05 (target 3)"
    assert lines[4] == "accountant         RDP"
    assert lines[5].startswith(f"noise multiplier   {report['noise_multiplier']:.4g} (")
    assert f"contribution_noise_multiplier {sigma1:.4g}" in lines[5] and lines[5].endswith("); clip norm 1")
    n = SIZE.value
    assert lines[6] == (
        f"sampling           fixed_shuffled (stated), q = 0.01, expected batch {0.01 * n:.4g} of N~ = {n} "
        "(N released with DP)"
    )
    assert lines[7] == "steps              500 (5 epochs)"
    assert lines[8] == "assumptions        the vocabulary is public"
    # What an attacker learns (the hypothesis-testing view), from the report's own fields.
    tpr = report["attacker_bound"]["pld_bounds"]
    assert lines[9] == "attacker TPR       " + ", ".join(f"<= {r['max_tpr']:.3g} at FPR {r['fpr']:g}" for r in tpr) + (
        " (a bound)"
    )
    assert [r["fpr"] for r in tpr] == [0.001, 0.01, 0.1] and all(0 < r["max_tpr"] < 1 for r in tpr)
    assert "gdp_clt" not in report["attacker_bound"]  # two noise multipliers: no single mu
    assert lines[10] == "caveats:"
    caveats = lines[11:]
    assert len(caveats) == len(report["caveats"]) and all(c.startswith("  - ") for c in caveats)
    assert any("fixed-size shuffled batches" in c for c in caveats)


def test_a_dp_sgd_run_prints_its_mu_gdp_beside_the_tpr_bounds():
    plan = plan_run("dense", target_epsilon=4.0, target_delta=DELTA, sampling_probability=Q, steps=STEPS)
    text = format_report(plan.report(dataset_size=N, batching="poisson", steps=STEPS))
    mu = Q * math.sqrt(STEPS * (math.exp(plan.noise_multiplier**-2) - 1))  # the CLT's mu
    assert f"mu-GDP             mu ~ {mu:.3g} (central-limit approximation, not a bound)" in text
    assert "attacker TPR       <= " in text and text.index("attacker TPR") < text.index("mu-GDP")


def test_a_pipelines_details_not_released_note_and_warnings_follow(tmp_path):
    _, report = _plan_report()
    report.update(not_released="metrics are not DP", warnings=["a table dropped most rows"])
    text = format_report(report, title="criteo report", details={"AUC": "0.71", "skipped": None})
    lines = text.splitlines()
    assert lines[0] == "== criteo report =="
    assert lines[lines.index("caveats:") - 1] == "AUC                0.71"
    long = format_report(report, details={"a label longer than the column": "x"})
    assert "a label longer than the column x" in long.splitlines()
    assert "skipped" not in text
    assert lines[-2:] == ["not released: metrics are not DP", "WARNING: a table dropped most rows"]


def test_a_non_dp_run_says_so_and_claims_no_epsilon():
    mechanism = EANA(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0)
    report = privacy_report(
        mechanism=mechanism,
        delta=DELTA,
        sampling_probability=Q,
        dataset_size=N,
        batching="poisson",
        steps=STEPS,
        epsilon=2.5,
        ledger=None,
    )
    text = format_report(report)
    assert "mechanism          eana (NOT differentially private)" in text
    assert "epsilon / delta    n/a (no DP guarantee; nominal 2.5, NOT a guarantee) / 1e-05" in text
    assert f"guarantee          {report['guarantee']}" in text and report["guarantee"].startswith("NONE")
    assert "attacker TPR" not in text and "mu-GDP" not in text  # no guarantee, no attacker bound


def test_an_empty_ledger_report_still_formats():
    plan = plan_run(
        "dense", target_epsilon=1.0, target_delta=DELTA, sampling_probability=Q, steps=10, accountant="rdp", seed=0
    )
    report = plan.report(dataset_size=N, batching="poisson", ledger=PrivacyLedger())
    assert "steps              0 (0 epochs)" in format_report(report)
