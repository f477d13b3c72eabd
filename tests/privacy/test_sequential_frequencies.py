"""Attack (issue 16, leak 3): read each item's exact user count out of the sequential pipeline's release.

The SavedModel ships Re-Attention's errors e_i = w / max(p_i, 1/N) (w, the
weight error, ships too), the popularity prior log max(p_i, 0.5/N) and the
head rows; the privacy report ships N. So

    count_i = N w / e_i            (every run)
    count_i = N exp(prior_i)       (--popularity-prior)

recovers N p_i exactly. When p_i were the training data's own counts
(the old default, `--frequencies public`), that is every item's exact user
count, including which items exactly one user had. The frequencies must be
a DP release charged to the budget, or supplied public ones (and the
guarantee then says it depends on them).

The attack itself is checked on a run with a public file: it must recover
exactly the file's frequencies.
"""

from __future__ import annotations

import json

import dp_accounting
import numpy as np
import pytest

from pipelines import sequential
from pipelines.sequential import privacy as sequential_privacy
from tfdp_embed import tf
from tfdp_embed.accounting import PrivacyLedger, compute_epsilon
from tfdp_embed.data.sequences import load_sequences, write_synthetic_sequences

MAX_LEN = 6
TINY = [
    "--epochs",
    "1",
    "--batch",
    "40",
    "--max-len",
    str(MAX_LEN),
    "--dim",
    "8",
    "--blocks",
    "1",
    "--dropout",
    "0.1",
    "--verbose",
    "0",
    "--seed",
    "5",
    "--epsilon",
    "5",
]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    # 200 users walking 120 Zipf-popular items: a long tail with many items only one user had.
    return write_synthetic_sequences(
        str(tmp_path_factory.mktemp("seq") / "s.txt"), num_users=200, num_items=120, min_length=4, max_length=9, seed=1
    )


@pytest.fixture(scope="module")
def true_counts(data_file):
    counts = load_sequences(data_file, max_len=MAX_LEN).item_user_counts()
    assert (counts[1:] == 1).sum() >= 5 and (counts[1:] >= 10).sum() >= 5  # singletons and popular items
    return counts


FAST = ["--accountant", "rdp"]  # the runs beside the all-defaults one: RDP calibrates in seconds


def _run(data_file, out, *flags):
    # The item ids come from a public catalogue 1..120 (nothing spent), so that every item has its count to attack.
    catalogue = out.parent / "catalogue.txt"
    catalogue.write_text("".join(f"{i}\n" for i in range(1, 121)))
    args = ["--data", data_file, "--out", str(out), *TINY, "--item-catalogue", str(catalogue), *flags]
    assert sequential.main(args) == 0
    report = json.loads((out / "report.json").read_text())
    shipped = json.loads((out / "saved_model" / "privacy_report.json").read_text())
    return tf.saved_model.load(str(out / "saved_model")), report, shipped


def _counts_from_errors(loaded, report) -> np.ndarray:
    """N p_i from Re-Attention's errors: e_i = w / max(p_i, 1/N), so N p_i = N w / e_i (>= 1)."""
    errors = loaded.model.item_errors.numpy().astype(np.float64)
    weight = float(loaded.model.weight_error.numpy())
    return report["dataset_size"] * weight / errors[1:]


def _counts_from_prior(loaded, report) -> np.ndarray:
    """N p_i from the popularity prior log max(p_i, 0.5/N)."""
    return report["dataset_size"] * np.exp(loaded.model.item_log_prior.numpy().astype(np.float64)[1:])


def _assert_not_exact(recovered, true_counts):
    seen = true_counts[1:] >= 1
    exact = np.round(recovered[seen]) == true_counts[1:][seen]
    # Under the old default every item came back exactly (exact.mean() == 1). The release adds Gaussian
    # noise of std z sqrt(L) (about 15 users here): an exact hit is a ~3% coincidence per item.
    assert exact.mean() < 0.3, f"{exact.sum()} of {seen.sum()} items' user counts recovered exactly"
    singles = set(np.flatnonzero(true_counts[1:] == 1))
    assert set(np.flatnonzero(np.round(recovered) == 1)) != singles, "the items exactly one user had are identified"


def _assert_release_accounted(report, shipped):
    for r in (report, shipped):
        frequencies = r["extra"]["item_frequencies"]
        assert frequencies["source"] == "private-gaussian" and frequencies["epsilon_share"] == 0.1
        assert [a for a in r["assumptions"] if "item catalogue" not in a] == []  # nothing assumed of the counts
        ledger = PrivacyLedger.from_json(json.dumps(r["ledger"]))
        size, setup = ledger.entries[:2]  # N~ (the number of users, released with DP), then the counts
        assert size.kind == "setup" and size.event == dp_accounting.GaussianDpEvent(
            r["dataset_size_release"]["noise_multiplier"]
        )
        assert setup.kind == "setup" and setup.event == dp_accounting.GaussianDpEvent(frequencies["noise_multiplier"])
        assert frequencies["release_epsilon"] == pytest.approx(0.5, rel=1e-3)  # 10% of epsilon 5
        assert compute_epsilon(ledger, target_delta=r["delta"], accountant=r["accountant"]) == pytest.approx(
            r["epsilon"], rel=1e-9
        )
        assert 5.0 * (1 - 1e-3) <= r["epsilon"] <= 5.0


def test_default_run_does_not_ship_exact_item_counts(data_file, true_counts, tmp_path):
    loaded, report, shipped = _run(data_file, tmp_path / "default")
    _assert_not_exact(_counts_from_errors(loaded, report), true_counts)
    _assert_release_accounted(report, shipped)


def test_prior_and_head_rows_come_from_the_release(data_file, true_counts, tmp_path):
    loaded, report, shipped = _run(data_file, tmp_path / "prior", "--popularity-prior", "--head-items", "20", *FAST)
    released = _counts_from_prior(loaded, report)
    _assert_not_exact(released, true_counts)
    # the head rows are the top 20 of the released frequencies (post-processing), not of the true counts
    rows = loaded.model.item_rows.numpy()[1:]
    head = set(np.flatnonzero(rows <= 20))
    assert head == set(np.argsort(-released, kind="stable")[:20])
    _assert_release_accounted(report, shipped)


def test_public_frequencies_without_a_file_are_refused(data_file, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        sequential.main(["--data", data_file, "--out", str(tmp_path / "o"), *TINY, "--frequencies", "public"])
    assert exit_info.value.code == 2
    assert "computed from the training data are not public" in capsys.readouterr().err
    data = load_sequences(data_file, max_len=MAX_LEN)
    with pytest.raises(ValueError, match="needs a frequencies file"):
        sequential_privacy.plan(
            data, epsilon=5.0, delta=None, batch=40, epochs=1, mechanism="dense", frequencies="public"
        )


def test_public_file_is_shipped_exactly_and_the_guarantee_is_conditional(data_file, tmp_path):
    num_items = 120
    rng = np.random.default_rng(0)  # frequencies independent of the training data
    public = np.round(rng.uniform(0.0, 0.6, num_items + 1), 4)
    public[0] = 0.0
    path = tmp_path / "public_frequencies.txt"
    path.write_text("# item_id frequency\n" + "".join(f"{i} {public[i]}\n" for i in range(1, num_items + 1)))
    loaded, report, shipped = _run(
        data_file,
        tmp_path / "public",
        "--frequencies",
        "public",
        "--frequencies-file",
        str(path),
        "--popularity-prior",
        "--head-items",
        "20",
        *FAST,
    )
    # the attack recovers exactly what was supplied (so it is an attack that works), nothing of the data
    n = report["dataset_size"]  # N~: the prior's floor is 0.5 / N~ (the exact 200 users are not released)
    prior = _counts_from_prior(loaded, report) / n
    np.testing.assert_allclose(prior, np.maximum(public[1:], 0.5 / n), rtol=1e-5)
    rows = loaded.model.item_rows.numpy()[1:]
    assert set(np.flatnonzero(rows <= 20)) == set(np.argsort(-public[1:], kind="stable")[:20])
    for r in (report, shipped):
        assert f"CONDITIONAL on: the item frequencies supplied in {str(path)!r} are independent" in r["guarantee"]
        assert r["extra"]["item_frequencies"]["source"] == "public-file"
        assert [e["kind"] for e in r["ledger"]["entries"]] == ["setup", "step"]  # N~ only: nothing for the file
