"""`python -m pipelines.criteo --beam-shards DIR`: training from the Apache Beam job's Poisson shards.

The flag checks run on a hand-written manifest (no Beam needed); the test
marked `beam` runs the job itself (DirectRunner, in the Beam environment,
`beam_job` in tests/conftest.py) on synthetic Criteo rows, then the
pipeline's command line on its output, and checks the accounting against
the planner for the manifest's q, steps, N and cap.
"""

from __future__ import annotations

import dataclasses
import json
import os

import dp_accounting
import numpy as np
import pytest

from pipelines import criteo
from tfdp_embed import Release, plan_run
from tfdp_embed.accounting import AccountingPeriod, compute_epsilon
from tfdp_embed.data.criteo.synthetic import write_synthetic_criteo
from tfdp_embed.keras2._keras import tf
from tfdp_embed.keras2.models.ctr_serving import RAW_FIELDS
from tfdp_embed_beam import record_format as fmt

TINY = [
    "--hash-size",
    "20",
    "--embedding-dim",
    "2",
    "--hidden-units",
    "8",
    "--momentum",
    "0",
    "--seed",
    "0",
    "--verbose",
    "0",
    "--clip",
    "1.0",
]


def _manifest_dir(tmp_path, *, q=0.25, epochs=2, n=400, cap=None):
    """A directory holding only a consistent manifest (what the flag checks read)."""
    per_epoch = round(1 / q)
    manifest = {
        "format_version": fmt.FORMAT_VERSION,
        "sampler": fmt.SAMPLER,
        "sampling_probability": q,
        "num_examples": n,
        "epochs": epochs,
        "batches_per_epoch": per_epoch,
        "steps": per_epoch * epochs,
        "max_batch_size": cap,
        "seeded": False,
        "seed": None,
        "truncated_batches": 0,
        "truncated_examples": 0,
        "records": 0,
        "steps_per_shard": 1,
        "shards": 0,
        "shard_records": [],
    }
    (tmp_path / fmt.MANIFEST).write_text(fmt.dump_manifest(manifest))
    return str(tmp_path)


def test_beam_shards_take_epochs_and_batch_from_the_manifest(tmp_path):
    directory = _manifest_dir(tmp_path, q=0.25, epochs=3, n=400)
    config = criteo.parse_args(["--beam-shards", directory, "--out", str(tmp_path / "out"), "--mechanism", "lazy"])
    assert (config.epochs, config.batch, config.beam_shards) == (3, 100, directory)
    assert config.privacy.calibration_fraction == 0.0  # it would read the training files
    same = ["--epochs", "3", "--batch", "100"]
    assert criteo.parse_args(["--beam-shards", directory, "--out", "o", "--mechanism", "lazy", *same]).epochs == 3


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--epochs", "2"], "--epochs 2 disagrees with the Beam manifest's epochs 3"),
        (["--batch", "64"], "--batch 64 disagrees with the Beam manifest's expected batch size round(q N) = 100"),
        (["--fixed-size-batches"], "--fixed-size-batches cannot be used with --beam-shards"),
        (["--streaming-periods"], "--streaming-periods cannot be used with --beam-shards"),
        (["--mechanism", "fest"], "--mechanism fest cannot be used with --beam-shards: its DP selection"),
        (["--mechanism", "adafest+"], "--mechanism adafest+ cannot be used with --beam-shards"),
        (["--skip-bad-rows"], "--skip-bad-rows cannot be used with --beam-shards"),
        (["--format", "csv"], "--format csv cannot be used with --beam-shards"),
        (["--calibration-fraction", "0.05"], "--calibration-fraction 0.05 cannot be used with --beam-shards"),
        (["--train", "MANIFEST", "--eval", "MANIFEST"], "--beam-shards and --train exclude each other"),
    ],
)
def test_beam_shards_refuse_flags_that_contradict_or_cannot_work(tmp_path, capsys, flags, message):
    directory = _manifest_dir(tmp_path, q=0.25, epochs=3, n=400)
    flags = [os.path.join(directory, fmt.MANIFEST) if f == "MANIFEST" else f for f in flags]
    argv = ["--beam-shards", directory, "--out", str(tmp_path / "out"), "--mechanism", "lazy", *flags]
    with pytest.raises(SystemExit) as exit_info:
        criteo.parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_beam_shards_without_a_manifest_fail_naming_the_flag(tmp_path, capsys):
    with pytest.raises(SystemExit):
        criteo.parse_args(["--beam-shards", str(tmp_path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert "--beam-shards:" in err and "has no manifest.json" in err


def test_a_config_that_contradicts_the_manifest_is_refused_by_run(tmp_path):
    directory = _manifest_dir(tmp_path, q=0.25, epochs=3, n=400)
    config = criteo.parse_args(["--beam-shards", directory, "--out", str(tmp_path / "out"), "--mechanism", "lazy"])
    with pytest.raises(ValueError, match="--epochs 1 disagrees with the Beam manifest's epochs 3"):
        criteo.run(dataclasses.replace(config, epochs=1))


@pytest.mark.beam
def test_pipeline_trains_from_beam_shards_and_accounts_the_manifest(tmp_path, beam_job):
    n, q, epochs, cap = 400, 0.2, 3, 95  # not the pipeline's defaults (2 epochs, B = 32)
    train, evaluation = write_synthetic_criteo(str(tmp_path / "data"), num_rows=2 * n, days=2, seed=0, vocab_scale=0.01)
    shards = tmp_path / "poisson"
    done = beam_job(
        [
            "--input",
            train,
            "--output",
            shards,
            "--sampling_probability",
            q,
            "--epochs",
            epochs,
            "--seed",
            5,
            "--max_batch_size",
            cap,
            "--records_per_shard",
            150,
        ]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = json.loads((shards / fmt.MANIFEST).read_text())
    assert manifest["num_examples"] == n and manifest["steps"] == 15

    out = tmp_path / "run"
    argv = ["--beam-shards", str(shards), "--eval", evaluation, "--mechanism", "lazy", "--out", str(out), *TINY]
    assert criteo.main(argv) == 0
    report = json.loads((out / "report.json").read_text())

    # Steps trained and q are the manifest's; the sampler is the Beam job's.
    assert report["steps"] == manifest["steps"] and report["sampling_probability"] == q
    assert report["batching_details"]["sampler"] == "beam_poisson"
    assert report["data"]["beam_shards"]["manifest"] == str(shards / fmt.MANIFEST)
    beam = report["data"]["beam_shards"]  # seeded, so the guarantee says whom it excludes; no seed, no N
    assert "seed" not in beam and beam["seeded"] is True and "knows the seed" in report["guarantee"]
    assert beam["num_examples"] != n and report["data"]["train_files"] == [train]
    assert "seed" not in manifest and manifest["seeded"] is True
    assert "Apache Beam" in report["sampler"]
    # epsilon is the planner's for (q, T, N, cap): truncated Poisson steps (PLD) and the release of N~ (delta 1/N~).
    delta, size_event = (
        report["delta"],
        dp_accounting.GaussianDpEvent(report["dataset_size_release"]["noise_multiplier"]),
    )
    assert delta == 1 / report["dataset_size"]
    planned = plan_run(
        "lazy",
        target_epsilon=3.0,
        target_delta=delta,
        periods=[AccountingPeriod(q, manifest["steps"], n, cap)],
        releases=[Release("dataset_size", event=size_event)],
    )
    assert report["noise_multiplier"] == pytest.approx(planned.noise_multiplier, rel=1e-9)
    assert report["step_accounting"] == "truncated_poisson"
    step = planned.step_source.step_event(q)
    assert step == dp_accounting.TruncatedSubsampledGaussianDpEvent(n, q, cap, report["noise_multiplier"])
    events = [
        size_event,
        dp_accounting.SelfComposedDpEvent(step, manifest["steps"]),
        *planned.step_source.one_off_events(),
    ]
    assert report["epsilon"] == pytest.approx(compute_epsilon(events, target_delta=delta), rel=1e-9)
    assert report["output_calibration"]["skipped"] is True

    serve = tf.saved_model.load(report["saved_model"]).signatures["serving_default"]
    rows = [line.rstrip("\n").split("\t") for line in open(evaluation).readlines()[:5]]
    request = {name: tf.constant([row[1 + i] for row in rows]) for i, name in enumerate(RAW_FIELDS)}
    probabilities = serve(**request)["click_probability"].numpy()
    assert probabilities.shape[0] == 5 and np.all((probabilities > 0) & (probabilities < 1))
