"""`pipelines.output_dir.staged_release`: publish whole or not at all, one writer, leftovers of killed runs removed."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import types

import pytest

from pipelines.output_dir import OutputBusyError, OutputDirError, staged_release

REQUIRED = ("model/weights.bin", "report.json")


def _write_release(directory, text):
    os.makedirs(os.path.join(directory, "model"))
    with open(os.path.join(directory, "model", "weights.bin"), "w") as f:
        f.write(text)
    with open(os.path.join(directory, "report.json"), "w") as f:
        f.write(f'{{"run": "{text}", "saved_model": "{os.path.join(directory, "model")}"}}')


def _read(path):
    with open(path) as f:
        return f.read()


def test_a_new_out_appears_only_when_the_body_returns(tmp_path):
    out = tmp_path / "runs" / "a"
    with staged_release(str(out), required=REQUIRED) as staging:
        assert staging.path == f"{out}.partial-{os.getpid()}" and staging.out == str(out)
        _write_release(staging.path, "first")
        assert not out.exists()  # nothing at `out` while the run writes
        # paths into the staging directory are reported where they will be
        assert staging.published({"m": [os.path.join(staging.path, "model")]}) == {"m": [str(out / "model")]}
    assert _read(out / "model" / "weights.bin") == "first" and (out / "report.json").exists()
    assert sorted(os.listdir(out.parent)) == ["a", "a.lock"]  # no partial left; the lock file stays, empty
    assert _read(tmp_path / "runs" / "a.lock") == ""


def test_a_failure_or_an_incomplete_release_leaves_out_as_it_was(tmp_path):
    out = tmp_path / "a"
    with staged_release(str(out), required=REQUIRED) as staging:
        _write_release(staging.path, "first")
    before = _read(out / "report.json")
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C half-way through writing the next release
        with staged_release(str(out), required=REQUIRED) as staging:
            os.makedirs(os.path.join(staging.path, "model"))
            raise KeyboardInterrupt
    with pytest.raises(RuntimeError, match=r"incomplete \(missing report.json\); not published"):
        with staged_release(str(out), required=REQUIRED) as staging:
            os.makedirs(os.path.join(staging.path, "model"))
            open(os.path.join(staging.path, "model", "weights.bin"), "w").close()
    assert _read(out / "report.json") == before and _read(out / "model" / "weights.bin") == "first"
    assert sorted(os.listdir(tmp_path)) == ["a", "a.lock"]
    with pytest.raises(ValueError, match="never-created"):  # a failure on a new `out` leaves nothing
        with staged_release(str(tmp_path / "b"), required=REQUIRED):
            raise ValueError("never-created")
    assert sorted(os.listdir(tmp_path)) == ["a", "a.lock", "b.lock"]


def test_an_existing_directory_keeps_its_other_files_and_gets_the_new_release(tmp_path):
    out = tmp_path / "a"
    out.mkdir()
    (out / "log.txt").write_text("the caller's log")
    for text in ("first", "second"):
        with staged_release(str(out), required=REQUIRED) as staging:
            _write_release(staging.path, text)
    assert sorted(os.listdir(out)) == ["log.txt", "model", "report.json"]
    assert _read(out / "model" / "weights.bin") == "second" and '"run": "second"' in _read(out / "report.json")
    assert sorted(os.listdir(tmp_path)) == ["a", "a.lock"]  # OUT.replaced-PID removed too


def test_a_second_writer_is_refused_naming_the_pid_and_the_first_release_is_intact(tmp_path):
    out = tmp_path / "a"
    with staged_release(str(out), required=REQUIRED) as first:
        with pytest.raises(OutputBusyError) as refused:
            with staged_release(str(out), required=REQUIRED):
                raise AssertionError("the second writer's body must not run")
        _write_release(first.path, "first")  # the refusal did not touch the first run's staging directory
    message = str(refused.value)
    assert f"(pid {os.getpid()}, lock {out}.lock)" in message and "\n" not in message
    assert "being written by another run" in message
    assert _read(out / "model" / "weights.bin") == "first"


def test_leftovers_of_killed_runs_are_removed_by_the_next_run(tmp_path):
    out = tmp_path / "a"
    for name in ("a.partial-999999", "a.replaced-999998"):  # a SIGKILLed writer's (it held no lock now)
        os.makedirs(tmp_path / name / "model")
    (tmp_path / "a.partial-notes").mkdir()  # not one of ours: kept
    with open(tmp_path / "a.lock", "w") as f:  # a killed writer's lock file: its flock died with it
        f.write("999999\n")
    with staged_release(str(out), required=REQUIRED) as staging:
        assert sorted(os.listdir(tmp_path)) == sorted(["a.lock", "a.partial-notes", os.path.basename(staging.path)])
        _write_release(staging.path, "fresh")
    assert sorted(os.listdir(tmp_path)) == ["a", "a.lock", "a.partial-notes"]


def test_an_out_that_cannot_be_published_is_refused_in_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    for out, expected in ((str(tmp_path / "file"), "exists and is not a directory"), (".", "must name a directory")):
        with pytest.raises(ValueError, match=expected):
            with staged_release(out, flag="--out"):
                raise AssertionError("not reached")
    with staged_release(None) as staging:  # a run that writes nothing
        assert staging is None


def test_the_lock_is_released_when_the_run_ends(tmp_path):
    out = tmp_path / "a"
    with pytest.raises(ValueError):
        with staged_release(str(out)):
            raise ValueError("failed run")
    with open(f"{out}.lock") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises BlockingIOError if still held


def test_every_file_and_directory_is_fsynced_before_the_rename_and_the_parent_after(tmp_path, monkeypatch):
    events = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def rename(source, target):
        events.append(("rename", str(target)))
        real_rename(source, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    out = tmp_path / "a"
    with staged_release(str(out), required=REQUIRED) as staging:
        _write_release(staging.path, "first")
    synced = [path for kind, path in events if kind == "fsync"]
    renamed = events.index(("rename", str(out)))
    for path in ("report.json", "model/weights.bin", "model", ""):  # files, then directories, the release last
        assert events.index(("fsync", os.path.join(staging.path, path).rstrip("/"))) < renamed
    assert events[renamed + 1 :] == [("fsync", str(tmp_path))]  # the rename made durable
    assert len(synced) == 5


def test_a_full_disk_removes_the_staging_directory_and_says_so_in_one_line(tmp_path):
    out = tmp_path / "a"
    with pytest.raises(OutputDirError) as full:
        with staged_release(str(out), required=REQUIRED) as staging:
            _write_release(staging.path, "first")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.path.join(staging.path, "model", "big.bin"))
    message = str(full.value)
    assert message == (
        f"`--out` {out}: no space left on device while writing {staging.path}/model/big.bin; the partial release "
        f"was removed and {out} left as it was: free some space or give another --out."
    )
    assert sorted(os.listdir(tmp_path)) == ["a.lock"]
    with pytest.raises(OutputDirError, match="no space left on device while writing"):  # TensorFlow's own words
        with staged_release(str(out), required=REQUIRED):
            raise RuntimeError("WriteFile failed: No space left on device")
    assert sorted(os.listdir(tmp_path)) == ["a.lock"]


def test_an_out_whose_parent_cannot_be_written_is_refused_before_the_body(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputDirError) as refused:
        with staged_release(str(tmp_path / "file" / "a")):
            raise AssertionError("not reached")
    assert str(refused.value) == (
        f"`--out` {tmp_path}/file/a cannot be written ({tmp_path}/file: a file is in the way, not a directory); "
        "nothing was read or trained: give a --out in a directory you can write to."
    )

    def read_only(path, *args, **kwargs):
        raise PermissionError(errno.EROFS, os.strerror(errno.EROFS), path)

    monkeypatch.setattr(os, "open", read_only)  # e.g. a read-only file system
    with pytest.raises(OutputDirError, match=rf"\({tmp_path}/b.lock: Read-only file system\); nothing was read"):
        with staged_release(str(tmp_path / "b")):
            raise AssertionError("not reached")


def test_a_run_stopped_after_training_started_stays_in_the_budget_record(tmp_path):
    out = tmp_path / "a"
    plan = types.SimpleNamespace(mechanism_name="dense", is_dp=True, target_epsilon=1.5, target_delta=1e-5, steps=10)
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C (or SIGTERM's SystemExit) during training
        with staged_release(str(out), required=REQUIRED) as staging:
            staging.budget.start(plan)
            raise KeyboardInterrupt
    lines = [json.loads(line) for line in (tmp_path / "a.budget.jsonl").read_text().splitlines()]
    assert [(x["event"], x["finished"], x["epsilon"], x["steps"]) for x in lines] == [
        ("started", False, 1.5, 10),
        ("interrupted", False, 1.5, 10),
    ]
    assert not out.exists()
    with staged_release(str(out), required=REQUIRED) as staging:  # the next run sees it
        summary = staging.budget.summary()
        _write_release(staging.path, "next")
    assert (summary["count"], summary["finished"], summary["epsilon"], summary["delta"]) == (1, 0, 1.5, 1e-5)
    assert summary["epsilon_total"] is None  # this run (never started training here) has no epsilon yet
