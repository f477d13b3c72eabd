"""SIGKILL and SIGTERM at each stage of a run into a fresh `--out` (issue 35): nothing that looks like a release.

test_safe_release.py kills the sequential CLI mid-export (SIGKILL) and terminates it after reading
(SIGTERM) with a release already at `--out`. Here a first run into a new `--out` is stopped after each
stage: its data read (`load_sequences`), training (`fit_model`), the SavedModel written
(`tf.saved_model.save`), the export with its privacy report (`export_saved_model`) and `report.json`
written (the pipeline's last `write_privacy_report`, just before the publishing rename). The audit saw a
SIGTERM leave an empty `--out` in 3 of 4 cases. After SIGTERM (exit 143) only the lock and the budget
record may remain; after SIGKILL also `OUT.partial-PID`, which the next run removes before it publishes
its own release. A run stopped once training may have started stays in the budget record.
The default run keeps SIGTERM after training and SIGKILL after the last write; the other eight cases run
with `make test-slow` (test_safe_release.py stops a run after reading and during export by default).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from test_safe_release import ROOT, TINY, _lock_is_free, _siblings

from pipelines import sequential
from tfdp_embed.data.sequences import write_synthetic_sequences

PAUSED_RUN = """
import os, sys, time
import pipelines.sequential.pipeline as pipeline
import pipelines.sequential.report as report
from tfdp_embed import tf
from pipelines import sequential

stage, control, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
stages = {
    "read": (pipeline, "load_sequences"),
    "train": (pipeline, "fit_model"),
    "save": (tf.saved_model, "save"),
    "export": (report, "export_saved_model"),
    "report": (pipeline, "write_privacy_report"),
}
module, name = stages[stage]
original = getattr(module, name)

def paused(*args, **kwargs):
    result = original(*args, **kwargs)  # the stage is done
    open(os.path.join(control, "paused"), "w").close()
    while True:
        time.sleep(0.05)

setattr(module, name, paused)
sys.exit(sequential.main(argv))
"""


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("seq") / "s.txt"
    return write_synthetic_sequences(str(path), num_users=200, num_items=30, min_length=4, max_length=9, seed=0)


def _start_paused(stage, control, argv):
    control.mkdir()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    with open(control / "log.txt", "w") as log:
        child = subprocess.Popen(
            [sys.executable, "-c", PAUSED_RUN, stage, str(control), *argv], cwd=ROOT, env=env, stdout=log, stderr=log
        )
    deadline = time.monotonic() + 180
    while not (control / "paused").exists():
        assert child.poll() is None, f"the child exited early:\n{(control / 'log.txt').read_text()[-3000:]}"
        assert time.monotonic() < deadline, "the child never reached its pause"
        time.sleep(0.05)
    return child


SLOW = pytest.mark.slow  # one child process each (~20 s): the default run keeps SIGTERM after training, SIGKILL
DEFAULT = {("train", "SIGTERM"), ("report", "SIGKILL")}  # after the last write; the rest run with make test-slow
CASES = [
    pytest.param(stage, how, marks=() if (stage, how) in DEFAULT else SLOW)
    for stage in ("read", "train", "save", "export", "report")
    for how in ("SIGTERM", "SIGKILL")
]


@pytest.mark.parametrize("stage, how", CASES)
def test_a_first_run_stopped_after_a_stage_leaves_no_release(stage, how, data_file, tmp_path):
    out = tmp_path / "run"
    argv = ["--data", data_file, "--out", str(out), *TINY]
    child = _start_paused(stage, tmp_path / "control", argv)
    partial = f"run.partial-{child.pid}"
    assert (tmp_path / partial).is_dir() and not out.exists()
    os.kill(child.pid, getattr(signal, how))
    status = child.wait(timeout=60)
    log = (tmp_path / "control" / "log.txt").read_text()[-3000:]
    assert status == (143 if how == "SIGTERM" else -signal.SIGKILL), log
    assert not out.exists(), log  # never an `--out`, empty or whole
    left = _siblings(out)
    budget = ["run.budget.jsonl"] if stage != "read" else []  # the run's spending is recorded once planned
    assert left == sorted(["run.lock", *budget, *([partial] if how == "SIGKILL" else [])]), left
    assert _lock_is_free(out)
    if stage != "read":
        events = [json.loads(x) for x in (tmp_path / "run.budget.jsonl").read_text().splitlines()]
        assert events[0]["event"] == "started" and f"-{child.pid}-" in events[0]["run"]
        assert "finished" not in [x["event"] for x in events]
    if how == "SIGKILL":  # the next run removes the leftover and publishes its own release
        assert sequential.main(argv) == 0
        assert sorted(os.listdir(out)) == ["report.json", "saved_model"] and partial not in _siblings(out)
        assert (out / "saved_model" / "privacy_report.json").exists()
