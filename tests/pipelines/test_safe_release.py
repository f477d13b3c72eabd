"""Runs that fail safely: killed, terminated, concurrent or absurd runs never leave a half release at `--out`.

The sequential pipeline (the smallest) runs in a child process that pauses at a stage: the child
wraps one function (test-only, in `PAUSED_RUN` below: `load_sequences`, `tf.saved_model.save` inside
the export, or the whole `export_saved_model`) to create `DIR/paused` after it returns and wait for
`DIR/go`, so the test can SIGKILL or SIGTERM it there. What each fault leaves
behind is asserted file by file.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from pipelines import criteo, movielens, run_limits, sequential
from pipelines.sequential import privacy as sequential_privacy
from tfdp_embed.data.sequences import write_synthetic_sequences

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CATALOGUE = os.path.join(ROOT, "tests", "pipelines", "items_1_to_30.txt")
TINY = ["--epochs", "1", "--batch", "40", "--max-len", "6", "--dim", "8", "--blocks", "1", "--epsilon", "inf"]
TINY += ["--accountant", "rdp", "--verbose", "0", "--seed", "3", "--item-catalogue", CATALOGUE]
RELEASE = ["report.json", "saved_model"]

PAUSED_RUN = """
import os, sys, time
import pipelines.sequential.pipeline as pipeline
import pipelines.sequential.report as report
from tfdp_embed import tf
from pipelines import sequential

stage, control, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
stages = {"read": (pipeline, "load_sequences"), "save": (tf.saved_model, "save"), "export": (report, "export_saved_model")}
module, name = stages[stage]
original = getattr(module, name)

def paused(*args, **kwargs):
    result = original(*args, **kwargs)  # the stage is done
    open(os.path.join(control, "paused"), "w").close()
    while not os.path.exists(os.path.join(control, "go")):
        time.sleep(0.02)
    return result

setattr(module, name, paused)
sys.exit(sequential.main(argv))
"""


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("seq") / "s.txt"
    return write_synthetic_sequences(str(path), num_users=200, num_items=30, min_length=4, max_length=9, seed=0)


def _start_paused(stage, control, argv):
    """The sequential CLI in a child process that stops after `stage` until `control/go` exists."""
    control.mkdir()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    with open(control / "log.txt", "w") as log:  # the child keeps its own copy of the descriptor
        child = subprocess.Popen(
            [sys.executable, "-c", PAUSED_RUN, stage, str(control), *argv], cwd=ROOT, env=env, stdout=log, stderr=log
        )
    deadline = time.monotonic() + 120
    while not (control / "paused").exists():
        assert child.poll() is None, f"the child exited early:\n{(control / 'log.txt').read_text()[-3000:]}"
        assert time.monotonic() < deadline, "the child never reached its pause"
        time.sleep(0.05)
    return child


def _siblings(out):
    return sorted(name for name in os.listdir(out.parent) if name.startswith(out.name))


def _lock_is_free(out):
    with open(f"{out}.lock") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError if a run still held it
        return True


def test_sigkill_during_export_leaves_only_a_partial_that_the_next_run_removes(data_file, tmp_path, capsys):
    out = tmp_path / "run"
    child = _start_paused("save", tmp_path / "control", ["--data", data_file, "--out", str(out), *TINY])
    child.kill()  # SIGKILL mid-export: the SavedModel is written, its privacy_report.json and report.json are not
    assert child.wait(timeout=60) == -signal.SIGKILL
    partial = tmp_path / f"run.partial-{child.pid}"
    assert not out.exists() and _siblings(out) == ["run.budget.jsonl", "run.lock", partial.name]
    assert sorted(os.listdir(partial)) == ["saved_model"]  # no report.json: never published
    assert (partial / "saved_model" / "saved_model.pb").exists() and _lock_is_free(out)
    assert not (partial / "saved_model" / "privacy_report.json").exists()
    # the next run on `--out` removes it (here a run refused after reading the data: nothing else is left)
    assert sequential.main(["--data", data_file, "--out", str(out), *TINY, "--batch", "999"]) == 1
    assert "`batch` must lie in [1, " in capsys.readouterr().err
    assert _siblings(out) == ["run.budget.jsonl", "run.lock"]
    # the killed run trained: its `started` line stays in the budget record, never followed by `finished`
    (line,) = (out.parent / "run.budget.jsonl").read_text().splitlines()
    assert json.loads(line)["event"] == "started" and f"-{child.pid}-" in json.loads(line)["run"]


def test_a_second_writer_is_refused_and_sigterm_or_ctrl_c_leave_the_first_release(
    data_file, tmp_path, capsys, monkeypatch
):
    out = tmp_path / "run"
    argv = ["--data", data_file, "--out", str(out), *TINY]
    first = _start_paused("export", tmp_path / "first", argv)
    assert sequential.main(argv) == 1  # refused before reading anything
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"is being written by another run (pid {first.pid}, lock {out}.lock)" in err
    assert not out.exists() and (tmp_path / f"run.partial-{first.pid}" / "saved_model").is_dir()
    (tmp_path / "first" / "go").touch()
    assert first.wait(timeout=120) == 0, (tmp_path / "first" / "log.txt").read_text()[-3000:]
    assert sorted(os.listdir(out)) == RELEASE and _siblings(out) == ["run", "run.budget.jsonl", "run.lock"]
    report = (out / "report.json").read_text()
    assert json.loads(report)["saved_model"] == str(out / "saved_model")  # the published path, not the staging one

    # SIGTERM a later run on the same `--out`: it cleans up its staging directory and exits 143
    later = _start_paused("read", tmp_path / "later", argv)
    assert (tmp_path / f"run.partial-{later.pid}").is_dir()
    later.terminate()
    assert later.wait(timeout=60) == 143, (tmp_path / "later" / "log.txt").read_text()[-3000:]
    assert (out / "report.json").read_text() == report and _siblings(out) == ["run", "run.budget.jsonl", "run.lock"]

    # Ctrl-C of a later run in this process: the same
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("pipelines.sequential.pipeline.load_sequences", interrupted)
    with pytest.raises(KeyboardInterrupt):
        sequential.main(argv)
    assert (out / "report.json").read_text() == report and sorted(os.listdir(out)) == RELEASE
    assert _siblings(out) == ["run", "run.budget.jsonl", "run.lock"] and _lock_is_free(out)


def test_absurd_epochs_are_refused_in_one_line_before_any_work(data_file, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    # more epochs than the step limit: refused with the flags, nothing created
    with pytest.raises(SystemExit) as exit_:
        sequential.parse_args(["--data", data_file, "--out", str(out), "--epochs", "20000000"])
    assert exit_.value.code == 2
    assert "--epochs 20,000,000 means at least 20,000,000 training steps" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        criteo.parse_args(["--out", str(out), "--epochs", "10000001"])
    assert "at most 10,000,000 are allowed: lower --epochs or give --max-steps." in capsys.readouterr().err
    with pytest.raises(SystemExit):
        movielens.parse_args(["--mechanism", "none", "--out", str(out), "--epochs", "10000001"])
    capsys.readouterr()

    # 10 million epochs x 5 batches: refused after reading the data, before the noise is calibrated
    def calibrated(**kwargs):
        raise AssertionError("calibrated")

    monkeypatch.setattr(sequential_privacy, "plan_run", calibrated)
    argv = ["--data", data_file, "--out", str(out), *TINY, "--epochs", str(run_limits.MAX_STEPS)]
    assert sequential.main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "`--epochs` 10,000,000 x " in err
    assert "training steps; at most 10,000,000 are allowed: lower --epochs, raise --batch or give --max-steps" in err
    assert _siblings(out) == ["run.lock"]


def test_tables_beyond_the_machine_are_refused_before_reading(data_file, tmp_path, capsys, monkeypatch):
    # Criteo: 26 tables of 10^12 buckets, on any machine (before the synthetic data is even written)
    out = tmp_path / "criteo"
    assert criteo.main(["--hash-size", str(10**12), "--out", str(out), "--verbose", "0"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "The 26 embedding tables (26,000,000,000,000 rows from --hash-size" in err
    assert "GB of memory: lower --hash-size or --embedding-dim." in err and _siblings(out) == ["criteo.lock"]
    # Sequential: a catalogue of 100,000 ids -> [40, 6, 100,001] float32 logits a step, on a machine of 0.1 GB
    catalogue = tmp_path / "items.txt"
    catalogue.write_text("".join(f"{i}\n" for i in range(1, 100_001)))
    monkeypatch.setattr(run_limits, "machine_memory", lambda: 10**8)
    out = tmp_path / "seq"
    assert sequential.main(["--data", data_file, "--out", str(out), *TINY, "--item-catalogue", str(catalogue)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "item logits (--batch 40 x --max-len 6 x 100,001 item rows" in err
    assert "more than this machine's 0.1 GB of memory: lower --batch, --max-len or --eval-batch" in err
    assert _siblings(out) == ["seq.lock"]


def test_ids_beyond_int32_name_the_file_and_line(tmp_path, capsys):
    for line, field in (("2 3 2147483648", "field 3 (item)"), ("1" + "0" * 30 + " 4 5", "field 1 (user)")):
        path = tmp_path / "s.txt"
        path.write_text(f"1 2 3\n{line}\n")
        assert sequential.main(["--data", str(path), "--out", str(tmp_path / "o"), *TINY]) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"s.txt:2: {field} must be at most 2147483647 (int32)" in err
    ratings = tmp_path / "ml"
    ratings.mkdir()
    for row, field in (("1,2147483648,4.0,11", "'item'"), (f"{2**64},5,4.0,11", "'user'")):
        (ratings / "ratings.csv").write_text(f"userId,movieId,rating,timestamp\n1,2,3.5,10\n{row}\n")
        argv = ["--mechanism", "none", "--epochs", "1", "--data", str(ratings), "--out", str(tmp_path / "o")]
        assert movielens.main(argv) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"ratings.csv:3: field {field} must be at most" in err
    assert not (tmp_path / "o").exists()
