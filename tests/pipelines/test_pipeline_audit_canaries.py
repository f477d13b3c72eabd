"""`--audit-canaries M` on the MovieLens and Criteo pipelines: an audit run reports the empirical epsilon lower
bound beside the claimed epsilon and exports no model (pipelines/audit_canaries.py)."""

from __future__ import annotations

import json
import os

import pytest

from pipelines import movielens
from tests.pipelines.test_movielens_pipeline import write_ratings

MOVIELENS_FLAGS = ["--batch-size", "32", "--embedding-dim", "8", "--context-length", "3", "--seed", "1"]
MOVIELENS_FLAGS += ["--learning-rate", "0.1", "--accountant", "rdp", "--quiet", "--k", "5"]


@pytest.fixture(scope="module")
def ratings(tmp_path_factory):
    return write_ratings(tmp_path_factory.mktemp("ml") / "u.data")


def _movielens(ratings, out, *flags) -> dict:
    assert movielens.main([*MOVIELENS_FLAGS, "--data", ratings, "--out", str(out), *flags]) == 0
    with open(os.path.join(out, "report.json")) as f:
        return json.load(f)


def test_movielens_audit_without_noise_sees_the_canaries_and_exports_nothing(ratings, tmp_path, capsys):
    """mechanism none, 200 canaries, 10 epochs: the canaries trained on are told apart (power).

    Observed: epsilon_lb 1.57 (fdp-gaussian), 40/40 guesses right (EANA at sigma 0.01: 3.06, 198/200;
    dense DP-SGD at epsilon 8: 0.17, 71/100); out/ holds report.json only.
    """
    out = tmp_path / "out"
    report = _movielens(ratings, out, "--mechanism", "none", "--epochs", "10", "--audit-canaries", "200")
    audit = report["audit"]
    assert report["released"] is False and audit["released"] is False
    assert audit["kind"] == "rare-id" and audit["canaries"] == 200 and audit["confidence"] == 0.95
    assert audit["claimed_epsilon"] is None and audit["epsilon_lb"] > 1.0, audit
    assert os.listdir(out) == ["report.json"] and "saved_model" not in report
    assert "audit: 200 rare-id canaries" in capsys.readouterr().out


def test_movielens_audit_of_a_dp_run_stays_below_its_epsilon(ratings, tmp_path):
    """dense DP-SGD at epsilon 2 (RDP), 200 canaries, 2 epochs: the bound must not exceed the claim (observed 0.0)."""
    report = _movielens(ratings, tmp_path / "out", "--mechanism", "dense", "--epsilon", "2", "--epochs", "2",
                        "--audit-canaries", "200")  # fmt: skip
    audit = report["audit"]
    assert audit["claimed_epsilon"] == pytest.approx(report["epsilon"]) and audit["claimed_epsilon"] <= 2.0 + 1e-6
    assert 0.0 <= audit["epsilon_lb"] <= audit["claimed_epsilon"], audit


def test_too_few_canaries_are_refused(ratings, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        movielens.main([*MOVIELENS_FLAGS, "--data", ratings, "--out", str(tmp_path), "--mechanism", "none",
                        "--epochs", "1", "--audit-canaries", "5"])  # fmt: skip
    assert exit_.value.code == 2 and "at least 16 canaries" in capsys.readouterr().err


# -- Criteo ----------------------------------------------------------------------------------------------------------

CRITEO_FLAGS = ["--hash-size", "20", "--embedding-dim", "2", "--hidden-units", "8", "--batch", "100", "--epochs", "3"]
CRITEO_FLAGS += ["--momentum", "0", "--seed", "0", "--verbose", "0", "--accountant", "rdp", "--learning-rate", "0.5"]


@pytest.fixture(scope="module")
def days(tmp_path_factory):
    from tfdp_embed.data.criteo.synthetic import write_synthetic_criteo

    directory = tmp_path_factory.mktemp("criteo")
    return write_synthetic_criteo(str(directory), num_rows=1200, seed=0, days=3, vocab_scale=0.01)


def _criteo(days, out, *flags) -> dict:
    from pipelines import criteo

    argv = ["--train", days[0], "--eval", days[2], "--out", str(out), *CRITEO_FLAGS, *flags]
    assert criteo.main(argv) == 0
    with open(os.path.join(out, "report.json")) as f:
        return json.load(f)


def test_criteo_audit_runs_report_the_bound_beside_the_claim_and_export_nothing(days, tmp_path, capsys):
    """200 canaries on rows 21..220 of C1 (real ids 0..20), 3 epochs.

    Observed: none 1.93 (fdp-gaussian, 190/200 right: power); dense DP-SGD at epsilon 4: 0.0 (LazyDP 0.0;
    EANA at the same sigma, not DP, 1.49); --out holds report.json only.
    """
    none = _criteo(days, tmp_path / "none", "--mechanism", "none", "--audit-canaries", "200")
    dense = _criteo(days, tmp_path / "dense", "--mechanism", "dense", "--epsilon", "4", "--audit-canaries", "200")
    for report, out in ((none, "none"), (dense, "dense")):
        assert report["released"] is False and report["audit"]["kind"] == "rare-id"
        assert os.listdir(tmp_path / out) == ["report.json"]
    assert none["audit"]["claimed_epsilon"] is None and none["audit"]["epsilon_lb"] > 1.0, none["audit"]
    assert dense["audit"]["claimed_epsilon"] == 4.0 and "earlier_runs" in dense  # OUT.budget.jsonl counts it
    assert dense["audit"]["epsilon_lb"] <= dense["audit"]["claimed_epsilon"], dense["audit"]
    assert "Audit run: no model exported." in capsys.readouterr().out


def _criteo_dp_audit(days, tmp_path, mechanism: str) -> dict:
    report = _criteo(days, tmp_path / mechanism, "--mechanism", mechanism, "--epsilon", "4", "--audit-canaries", "200")
    audit = report["audit"]
    assert report["released"] is False and os.listdir(tmp_path / mechanism) == ["report.json"]
    assert audit["claimed_epsilon"] == 4.0 and 0.0 <= audit["epsilon_lb"] <= audit["claimed_epsilon"], audit
    return report


def test_criteo_audits_adafest_plus_with_its_selection_and_two_noises(days, tmp_path):
    """DP-AdaFEST+ (a DP top-k on the counts the run trains on, canaries included, then sigma1 and sigma2 as the
    pipeline calibrated them) at epsilon 4, 200 canaries: the bound stays at or below the claim (observed 0.0, 1 of
    2 guesses right; DP-FEST and DP-AdaFEST the same, the slow test below)."""
    _criteo_dp_audit(days, tmp_path, "adafest+")


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", ["fest", "adafest"])
def test_criteo_audits_the_other_selecting_and_two_noise_mechanisms(days, tmp_path, mechanism):
    """DP-FEST (selection, one sigma) and DP-AdaFEST (sigma1, sigma2, no selection) at epsilon 4 (observed 0.0)."""
    _criteo_dp_audit(days, tmp_path, mechanism)


def test_criteo_audit_selection_counts_the_included_canaries():
    """The counts DP-FEST / AdaFEST+ select from are those of the rows trained on: an included canary's C1 row
    counts 1, an excluded one's 0, and each included canary adds 1 to bucket 0 of every other feature."""
    import numpy as np

    from pipelines.criteo import audit as criteo_audit
    from pipelines.criteo.data import Period
    from tfdp_embed.data.criteo import CAT_FEATURES
    from tfdp_embed.keras2.models import CTRModelConfig

    vocab = {name: 4 for name in CAT_FEATURES}  # ids 0..4: 5 buckets each
    real = {name: np.arange(5, dtype=np.int64) + 1 for name in CAT_FEATURES}
    period = Period(files=[], vocab_sizes=vocab, skip_bad_rows=False, stats=None, size=15, counts=real)
    included = np.array([True, False, True])
    config = CTRModelConfig(vocab_sizes=(4 + 3, *[4] * 25), hidden_units=(2,), stack_tables=False)
    counts = criteo_audit.training_counts(period, config, included)
    assert counts["embedding_C1"].tolist() == [1, 2, 3, 4, 5, 1, 0, 1]
    assert counts["embedding_C2"].tolist() == [1 + 2, 2, 3, 4, 5]


@pytest.mark.parametrize(
    "flags, match",
    [
        (["--mechanism", "dense", "--streaming", "on"], "rows held in memory"),
        (["--mechanism", "none"], None),
    ],
)
def test_criteo_refuses_audits_it_cannot_run(days, tmp_path, capsys, flags, match):
    from pipelines import criteo

    count = "8" if match is None else "200"
    with pytest.raises(SystemExit) as exit_:
        criteo.parse_args(
            ["--train", days[0], "--eval", days[2], "--out", str(tmp_path), *flags, "--audit-canaries", count]
        )
    assert exit_.value.code == 2 and (match or "at least 16 canaries") in capsys.readouterr().err
