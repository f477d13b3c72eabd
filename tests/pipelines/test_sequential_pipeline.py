"""The sequential CLI end to end at tiny size: report.json, accounting, SavedModel reloaded in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import dp_accounting
import numpy as np
import pytest

from pipelines import sequential
from pipelines.sequential import privacy as sequential_privacy
from pipelines.sequential import training as sequential_training
from tfdp_embed.accounting import calibrate_noise_multiplier, compute_epsilon, dpsgd_event
from tfdp_embed.data.sequences import load_sequences, write_synthetic_sequences

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The item ids of these runs come from a public catalogue 1..30 (nothing spent): 200 users are too few for a DP
# vocabulary to keep most items (tests/privacy/test_vocabulary_exit.py runs the default, the DP vocabulary).
CATALOGUE = os.path.join(ROOT, "tests", "pipelines", "items_1_to_30.txt")
TINY = [
    "--epochs",
    "1",
    "--batch",
    "40",
    "--max-len",
    "6",
    "--dim",
    "8",
    "--blocks",
    "1",
    "--dropout",
    "0.1",
    "--accountant",
    "rdp",
    "--verbose",
    "0",
    "--seed",
    "3",
    "--item-catalogue",
    CATALOGUE,
]

RELOAD = """
import sys, json, numpy as np, tensorflow as tf
loaded = tf.saved_model.load(sys.argv[1])
out = loaded.signatures["serving_default"](history=tf.constant(np.array(json.loads(sys.argv[2]), np.int32)))
print(json.dumps(out["items"].numpy().tolist()))
"""


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    return write_synthetic_sequences(
        str(tmp_path_factory.mktemp("seq") / "s.txt"), num_users=200, num_items=30, min_length=4, max_length=9, seed=0
    )


def test_dpformer_run_report_and_reloaded_saved_model(data_file, tmp_path):
    out = tmp_path / "run"
    assert (
        sequential.main(["--data", data_file, "--model", "dpformer", "--epsilon", "5", "--out", str(out), *TINY]) == 0
    )
    report = json.loads((out / "report.json").read_text())
    for key in sequential.REQUIRED_KEYS:
        assert key in report, key
    assert 0 <= report["ndcg@10"] <= report["hit@10"] <= 1
    assert "loss_per_epoch" in report["not_released"] and "NOT a release" in report["not_released"]
    n = report["dataset_size"]  # N~: the number of users (200) released with DP
    assert report["dataset_size_release"]["noise_multiplier"] == 20.0 and report["sampling_probability"] == 40 / n
    assert report["is_dp"] and report["epsilon"] <= 5.0 + 1e-6 and report["steps"] == round(n / 40)  # 1 epoch
    # epsilon is what dp_accounting says about the frequency release (default: 10% of epsilon) plus the
    # steps taken at the calibrated sigma
    frequencies = report["extra"]["item_frequencies"]
    assert frequencies["source"] == "private-gaussian" and frequencies["epsilon_share"] == 0.1
    release = dp_accounting.GaussianDpEvent(frequencies["noise_multiplier"])
    assert compute_epsilon(release, target_delta=report["delta"], accountant="rdp") == pytest.approx(0.5, rel=1e-3)
    size_event = dp_accounting.GaussianDpEvent(20.0)
    step = dpsgd_event(sampling_probability=40 / n, noise_multiplier=report["noise_multiplier"], steps=round(n / 40))
    eps = compute_epsilon([size_event, release, step], target_delta=report["delta"], accountant="rdp")
    assert report["epsilon"] == pytest.approx(eps, rel=1e-6) == pytest.approx(5.0, rel=1e-3)
    assert report["ledger"]["entries"][0]["kind"] == "setup" and all(
        "item catalogue" in a for a in report["assumptions"]
    )
    # user level, declared through the library's unit fields: one sequence per user, N~ users
    assert report["privacy_unit"] == "user" and report["max_examples_per_unit"] == 1
    assert report["adjacency"] == "add-or-remove-one-user" and report["num_units"] == report["dataset_size"]
    assert "add-or-remove-one-user" in report["guarantee"]
    # the exported model, reloaded in a fresh process, recommends what the trained model does
    history = [[0, 0, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6]]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run(
        [sys.executable, "-c", RELOAD, str(out / "saved_model"), json.dumps(history)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )
    items = np.array(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert items.shape == (2, 10) and items.min() >= 1 and items.max() <= 30
    assert os.path.exists(out / "saved_model" / "privacy_report.json")


def test_non_private_reference_and_private_frequencies(data_file, tmp_path):
    out = tmp_path / "ref"
    result = sequential.run(sequential.parse_args(["--data", data_file, "--epsilon", "inf", "--out", str(out), *TINY]))
    assert result.report["epsilon"] is None and not result.report["is_dp"] and result.report["noise_multiplier"] == 0
    assert result.report["extra"]["item_frequencies"]["source"] == "exact (not private)"
    # private frequencies: the count release is composed into the ledger, sigma grows to pay for it
    data = load_sequences(data_file, max_len=6)
    common = dict(
        epsilon=5.0,
        delta=1e-3,
        batch=40,
        epochs=2,
        mechanism="dense",
        accountant="rdp",
        seed=0,
        item_catalogue=CATALOGUE,
    )
    for private in (
        sequential_privacy.plan(data, **common),  # default: sized for 10% of epsilon
        sequential_privacy.plan(data, frequency_epsilon_share=0.3, **common),
        sequential_privacy.plan(data, frequency_noise_multiplier=5.0, **common),
    ):
        run, frequencies = private.run, private.frequency_report()
        q, steps = run.sampling_probability, run.steps  # from N~ (seed 0), not from the 200 users
        assert q == 40 / private.size.value and steps == 2 * round(private.size.value / 40)
        steps_only = calibrate_noise_multiplier(
            target_epsilon=5.0, target_delta=1e-3, sampling_probability=q, steps=steps, accountant="rdp"
        )
        assert run.noise_multiplier > steps_only
        assert run.ledger().entries[0].event == private.size.event  # N~ first, then the counts
        assert run.ledger().entries[1].event == private.frequencies.event
        release = compute_epsilon(private.frequencies.event, target_delta=1e-3, accountant="rdp")
        assert frequencies["release_epsilon"] == pytest.approx(release)
        assert release == pytest.approx(5.0 * frequencies["epsilon_share"], rel=1e-3)
        steps = dpsgd_event(sampling_probability=q, noise_multiplier=run.noise_multiplier, steps=steps)
        both = [private.size.event, private.frequencies.event, steps]
        assert compute_epsilon(both, target_delta=1e-3, accountant="rdp") == pytest.approx(5.0, rel=1e-3)
    assert frequencies["epsilon_share"] == pytest.approx(release / 5.0)


def test_bad_input(data_file, tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_text("1 2\n1 two\n")
    assert sequential.main(["--data", str(bad), "--out", str(tmp_path / "o"), *TINY]) == 1
    assert "bad.txt:2: user and item must be integers" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sequential.parse_args(["--data", str(tmp_path / "missing.txt"), "--out", "x"])
    with pytest.raises(SystemExit):
        sequential.parse_args(["--data", data_file, "--out", "x", "--delta", "2"])
    with pytest.raises(SystemExit):
        sequential.parse_args(["--data", data_file, "--out", "x", "--adam-epsilon", "0"])
    for flags in (
        ["--frequency-epsilon-share", "1"],
        ["--frequency-epsilon-share", "0.1", "--frequency-noise-multiplier", "3"],
        ["--frequencies-file", data_file],
        ["--frequencies", "public", "--frequencies-file", "missing.txt"],
    ):
        with pytest.raises(SystemExit):
            sequential.parse_args(["--data", data_file, "--out", "x", *flags])
    assert sequential.main(["--data", data_file, "--out", str(tmp_path / "o"), *TINY[:2], "--batch", "999"]) == 1
    err = capsys.readouterr().err
    assert "`batch` must lie in [1, " in err and "(the number of users, released with DP)" in err


def test_popularity_prior_uses_the_run_frequencies(data_file, tmp_path, monkeypatch):
    made = []
    adam = sequential_training.keras.optimizers.Adam
    monkeypatch.setattr(
        sequential_training.keras.optimizers, "Adam", lambda **kwargs: made.append(kwargs) or adam(**kwargs)
    )
    out = tmp_path / "prior"
    args = [
        "--data",
        data_file,
        "--model",
        "transformer",
        "--epsilon",
        "5",
        "--popularity-prior",
        "--adam-epsilon",
        "0.01",
        "--out",
        str(out),
        *TINY,
    ]
    result = sequential.run(sequential.parse_args(args))
    assert result.report["settings"]["popularity_prior"] is True
    assert result.report["settings"]["adam_epsilon"] == 0.01
    assert [kwargs["epsilon"] for kwargs in made] == [0.01]
    data = load_sequences(data_file, max_len=6)
    privacy = sequential_privacy.plan(
        data,
        epsilon=5.0,
        delta=None,
        batch=40,
        epochs=1,
        mechanism="dense",
        accountant="rdp",
        seed=3,
        item_catalogue=CATALOGUE,
    )
    freq = privacy.frequencies.frequencies
    expected = np.log(np.maximum(freq, 0.5 / privacy.size.value))[1:]  # the floor is 0.5 / N~
    np.testing.assert_allclose(result.model.item_log_prior.numpy()[1:], expected, rtol=1e-6)


def test_head_items_rows_errors_and_reloaded_saved_model(data_file, tmp_path, capsys):
    out = tmp_path / "head"
    args = [
        "--data",
        data_file,
        "--model",
        "dpformer",
        "--epsilon",
        "5",
        "--popularity-prior",
        "--head-items",
        "8",
        "--out",
        str(out),
        *TINY,
    ]
    result = sequential.run(sequential.parse_args(args))
    model, report = result.model, result.report
    assert report["settings"]["head_items"] == 8 and model.items.embeddings.shape == (10, 8)
    data = load_sequences(data_file, max_len=6)
    freq = sequential_privacy.plan(
        data,
        epsilon=5.0,
        delta=None,
        batch=40,
        epochs=1,
        mechanism="dense",
        accountant="rdp",
        seed=3,
        item_catalogue=CATALOGUE,
    ).frequencies.frequencies
    rows = model.item_rows.numpy()
    head = np.argsort(-freq[1:], kind="stable")[:8] + 1
    np.testing.assert_array_equal(rows[head], np.arange(1, 9))
    assert (rows[1:] == 9).sum() == data.num_items - 8
    # Re-Attention's errors are per table row: the tail row has the summed frequency, so the smallest error.
    errors = model.item_errors.numpy()
    assert errors.shape == (10,) and errors[9] == pytest.approx(errors[1:].min())
    # The SavedModel ranks every item (tail items by the shared row + their prior), reloaded in a fresh process.
    history = [[0, 0, 3, 4, 5, 6]]
    proc = subprocess.run(
        [sys.executable, "-c", RELOAD, str(out / "saved_model"), json.dumps(history)],
        capture_output=True,
        text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        timeout=300,
        check=True,
    )
    served = np.array(json.loads(proc.stdout.strip().splitlines()[-1]))
    expected = np.argsort(-model.scores(np.array(history, np.int32)).numpy()[:, 1:], axis=1, kind="stable")[:, :10] + 1
    np.testing.assert_array_equal(np.sort(served), np.sort(expected))
    assert sequential.main(["--data", data_file, "--out", str(tmp_path / "o"), "--head-items", "31", *TINY]) == 1
    assert "`head_items` must be None or an int in [1, num_items=30]" in capsys.readouterr().err
