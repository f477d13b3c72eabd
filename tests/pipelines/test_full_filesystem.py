"""A real full file system under `--out` (issue 35): one line, no partial release, the spending on record.

test_run_faults.py and test_output_dir.py raise ENOSPC from a patched writer. Here the sequential CLI
writes into a 200 KB tmpfs mounted in a private user and mount namespace (`unshare -rm`; skipped where
the kernel or the sandbox refuses one), so the SavedModel's own writes in TensorFlow fill the disk. The
child reports what the run returned, printed and left on the tmpfs before the namespace goes away.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tfdp_embed.data.sequences import write_synthetic_sequences

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CATALOGUE = os.path.join(ROOT, "tests", "pipelines", "items_1_to_30.txt")
TINY = ["--epochs", "1", "--batch", "40", "--max-len", "6", "--dim", "8", "--blocks", "1", "--epsilon", "inf"]
TINY += ["--accountant", "rdp", "--verbose", "0", "--seed", "3", "--item-catalogue", CATALOGUE]

IN_NAMESPACE = """
import contextlib, io, json, os, subprocess, sys
mount, data, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", mount], check=True)
from pipelines import sequential
err = io.StringIO()
with contextlib.redirect_stderr(err):
    status = sequential.main(["--data", data, "--out", os.path.join(mount, "run"), *argv])
with open(os.path.join(mount, "run.budget.jsonl")) as f:
    events = [json.loads(line)["event"] for line in f]
lines = [line for line in err.getvalue().splitlines() if line.strip()]
print(json.dumps({"status": status, "left": sorted(os.listdir(mount)), "err": lines, "events": events}))
"""


def _namespaces_work(directory) -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = ["unshare", "-rm", "mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(directory)]
    return subprocess.run(probe, capture_output=True).returncode == 0


def test_a_full_tmpfs_leaves_the_lock_and_the_budget_record_only(tmp_path):
    mount = tmp_path / "mnt"
    mount.mkdir()
    if not _namespaces_work(mount):
        pytest.skip("no user and mount namespace here (`unshare -rm` refused)")
    data = write_synthetic_sequences(
        str(tmp_path / "s.txt"), num_users=200, num_items=30, min_length=4, max_length=9, seed=0
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    child = subprocess.run(
        ["unshare", "-rm", sys.executable, "-c", IN_NAMESPACE, str(mount), data, *TINY],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    result = json.loads(child.stdout.strip().splitlines()[-1])
    assert result["status"] == 1
    (line,) = result["err"]
    assert line.startswith(f"python -m pipelines.sequential: error: `--out` {mount / 'run'}: no space left on device")
    assert f"the partial release was removed and {mount / 'run'} left as it was" in line
    assert result["left"] == ["run.budget.jsonl", "run.lock"]  # no `run`, no `run.partial-PID`
    assert result["events"] == ["started", "interrupted"]  # training ran: its spending is on record
    assert os.listdir(mount) == []  # the tmpfs lived in the child's namespace only
