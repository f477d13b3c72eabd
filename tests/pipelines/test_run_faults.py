"""Faults users and operators meet, each refused in one line naming the file, line or flag (issue 35).

An `--out` that cannot be written (a regular file, a read-only parent, a parent that is a file) is
refused before any data is read; a directory given as the data file, binary garbage and a UTF-8
byte-order mark are handled: the first two named by file and line, the BOM read past by every
reader); a full disk while the release is written removes the partial release and
says so. The spent budget is recorded across runs of one `--out` (`OUT.budget.jsonl`),
`--fail-on-warnings` turns a report's warnings into exit status 3, and a run prints its estimated run time.

Read-only directories are simulated (`os.open` / `os.makedirs` refused with EACCES below them): the
tests may run as root, whom permissions do not stop.
"""

from __future__ import annotations

import errno
import json
import os

import pytest

from pipelines import criteo, movielens, quality, sequential, step_timer
from pipelines.budget_record import BudgetRecord
from tfdp_embed.data.criteo.synthetic import write_synthetic_criteo
from tfdp_embed.data.sequences import write_synthetic_sequences

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CATALOGUE = os.path.join(ROOT, "tests", "pipelines", "items_1_to_30.txt")
SEQ = ["--batch", "40", "--max-len", "6", "--dim", "8", "--blocks", "1", "--accountant", "rdp", "--verbose", "0"]
SEQ += ["--seed", "3", "--item-catalogue", CATALOGUE, "--epochs", "1"]
ML = ["--mechanism", "none", "--epochs", "1", "--batch-size", "32", "--embedding-dim", "8", "--context-length", "3"]
ML += ["--quiet", "--privacy-unit", "example"]  # 40 users: a noisy user count (seed None) may fall below 32
CRITEO = ["--hash-size", "20", "--embedding-dim", "2", "--hidden-units", "8", "--batch", "100", "--seed", "0"]
CRITEO += ["--verbose", "0", "--accountant", "rdp", "--mechanism", "none", "--epochs", "1"]
GARBAGE = bytes(range(128, 256)) * 8  # no NUL byte, no newline, not UTF-8


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A sequence file, two Criteo days and a MovieLens directory (ratings.csv and movies.csv), all tiny."""
    directory = tmp_path_factory.mktemp("data")
    seq = write_synthetic_sequences(
        str(directory / "s.txt"), num_users=200, num_items=30, min_length=4, max_length=9, seed=0
    )
    days = write_synthetic_criteo(str(directory / "criteo"), num_rows=800, seed=0, days=2, vocab_scale=0.01)
    ml = directory / "ml"
    ml.mkdir()
    rows = [f"{u},{(u + t) % 30 + 1},3.5,{1000 + t}" for u in range(1, 41) for t in range(8)]
    (ml / "ratings.csv").write_text("userId,movieId,rating,timestamp\n" + "\n".join(rows) + "\n")
    (ml / "movies.csv").write_text("movieId,title,genres\n" + "".join(f"{i},M{i},Drama\n" for i in range(1, 31)))
    return {"seq": seq, "days": days, "ml": str(ml)}


def _argv(pipeline: str, files: dict, out, data=None) -> list:
    if pipeline == "sequential":
        return ["--data", data or files["seq"], "--out", str(out), "--epsilon", "inf", *SEQ]
    if pipeline == "movielens":
        return ["--data", data or files["ml"], "--out", str(out), *ML]
    return ["--train", data or files["days"][0], "--eval", files["days"][1], "--out", str(out), *CRITEO]


MAIN = {"sequential": sequential.main, "movielens": movielens.main, "criteo": criteo.main}
READ = {  # what each pipeline calls first to read its data: must not run when `--out` is refused
    "sequential": "pipelines.sequential.pipeline.load_sequences",
    "movielens": "pipelines.movielens.pipeline.load_movielens",
    "criteo": "pipelines.criteo.pipeline._read",
}


def _one_line(capsys, program: str) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith(f"python -m pipelines.{program}: error: "), err
    return err[0]


def _read_only(monkeypatch, directory) -> None:
    """`directory` as a non-root user sees a read-only one: creating anything below it fails with EACCES."""
    directory.chmod(0o555)
    inside = str(directory) + os.sep
    real_open, real_makedirs = os.open, os.makedirs

    def refuse(path):
        if os.path.abspath(os.fspath(path)).startswith(inside):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))

    def fake_open(path, flags, *args, **kwargs):
        if flags & (os.O_CREAT | os.O_WRONLY | os.O_RDWR):
            refuse(path)
        return real_open(path, flags, *args, **kwargs)

    def fake_makedirs(path, *args, **kwargs):
        if not os.path.isdir(path):
            refuse(path)
        return real_makedirs(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(os, "makedirs", fake_makedirs)


@pytest.mark.parametrize("pipeline", ["sequential", "movielens", "criteo"])
def test_an_out_that_cannot_be_written_is_refused_before_reading(pipeline, files, tmp_path, capsys, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("the data was read")

    monkeypatch.setattr(READ[pipeline], never)
    (tmp_path / "file").write_text("x")
    assert MAIN[pipeline](_argv(pipeline, files, tmp_path / "file")) == 1  # an existing regular file
    line = _one_line(capsys, pipeline)
    assert f"`--out` '{tmp_path / 'file'}' exists and is not a directory" in line
    assert (tmp_path / "file").read_text() == "x"
    assert MAIN[pipeline](_argv(pipeline, files, tmp_path / "file" / "run")) == 1  # its parent is a file
    line = _one_line(capsys, pipeline)
    assert f"`--out` {tmp_path / 'file' / 'run'} cannot be written (" in line and "not a directory" in line
    read_only = tmp_path / "ro"
    read_only.mkdir()
    _read_only(monkeypatch, read_only)
    assert MAIN[pipeline](_argv(pipeline, files, read_only / "run")) == 1
    line = _one_line(capsys, pipeline)
    assert f"`--out` {read_only / 'run'} cannot be written ({read_only / 'run'}.lock: Permission denied)" in line
    assert "nothing was read or trained" in line and os.listdir(read_only) == []


def test_a_directory_as_the_data_file_is_named(files, tmp_path, capsys):
    for pipeline, flag in (("sequential", "--data"), ("criteo", "--train/--eval")):
        with pytest.raises(SystemExit) as exit_:
            MAIN[pipeline](_argv(pipeline, files, tmp_path / "o", data=str(tmp_path)))
        assert exit_.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert f"'{tmp_path}' (given to {flag}) is a directory; give the file itself." in err
    with pytest.raises(SystemExit):  # the sequential pipeline's other input files too
        sequential.main([*_argv("sequential", files, tmp_path / "o"), "--item-catalogue", str(tmp_path)])
    assert f"'{tmp_path}' (given to --item-catalogue) is a directory" in capsys.readouterr().err
    # MovieLens takes a dataset directory: one without a ratings file is named in one line
    assert movielens.main(_argv("movielens", files, tmp_path / "o", data=str(tmp_path))) == 1
    assert f"MovieLens dataset directory '{tmp_path}' holds none of" in _one_line(capsys, "movielens")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("pipeline", ["sequential", "movielens", "criteo"])
def test_binary_garbage_is_named_by_file_and_line(pipeline, files, tmp_path, capsys):
    garbage = tmp_path / ("ratings.csv" if pipeline == "movielens" else "data.txt")
    garbage.write_bytes(b"1 2\n3 4\n" + GARBAGE if pipeline == "sequential" else GARBAGE)
    assert MAIN[pipeline](_argv(pipeline, files, tmp_path / "o", data=str(garbage))) == 1
    line = _one_line(capsys, pipeline)
    where = f"{garbage}:3: not a text file (column 1: byte 0x80" if pipeline == "sequential" else f"{garbage}:1:"
    assert where in line and "which is not UTF-8" in line
    assert not (tmp_path / "o").exists()


def test_a_bom_is_read_past_or_refused_in_one_line(files, tmp_path, capsys):
    bom = b"\xef\xbb\xbf"
    # MovieLens: ratings.csv (and its header) after a BOM read as usual
    ml = tmp_path / "ml"
    ml.mkdir()
    for name in ("ratings.csv", "movies.csv"):
        (ml / name).write_bytes(bom + open(os.path.join(files["ml"], name), "rb").read())
    assert movielens.main(_argv("movielens", files, tmp_path / "m", data=str(ml))) == 0
    assert json.loads((tmp_path / "m" / "report.json").read_text())["data_quality"]["ratings"] == 320
    capsys.readouterr()
    # Criteo: the reader reads past it; every row counts, none skipped (the sequential pipeline's: below)
    day = tmp_path / "day.tsv"
    day.write_bytes(bom + open(files["days"][0], "rb").read())
    assert criteo.main(_argv("criteo", files, tmp_path / "c", data=str(day))) == 0
    report = json.loads((tmp_path / "c" / "report.json").read_text())
    assert sum(report["rows_skipped"].values()) == 0


def test_a_full_disk_removes_the_partial_release_and_says_so(files, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"

    def full(path, report):  # report.json half written, then the disk is full
        with open(path, "w") as f:
            f.write("{")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    monkeypatch.setattr("pipelines.sequential.pipeline.write_privacy_report", full)
    assert sequential.main(_argv("sequential", files, out)) == 1
    line = _one_line(capsys, "sequential")
    assert f"`--out` {out}: no space left on device while writing {out}.partial-{os.getpid()}/report.json" in line
    assert f"the partial release was removed and {out} left as it was" in line
    assert sorted(os.listdir(tmp_path)) == ["run.budget.jsonl", "run.lock"]
    events = [json.loads(x)["event"] for x in (tmp_path / "run.budget.jsonl").read_text().splitlines()]
    assert events == ["started", "interrupted"]  # training had started: its spending is on record


def test_the_budget_spent_by_earlier_runs_on_an_out_is_reported(files, tmp_path, capsys):
    out = tmp_path / "run"
    dp = ["--data", files["seq"], "--out", str(out), *SEQ, "--mechanism", "dense", "--epsilon", "2"]
    bom = tmp_path / "bom.txt"  # the first run also reads its data after a BOM, and prints its run-time estimate
    bom.write_bytes(b"\xef\xbb\xbf" + open(files["seq"], "rb").read())
    assert sequential.main([*dp, "--data", str(bom), "--epochs", "2", "--verbose", "1"]) == 0
    first = json.loads((out / "report.json").read_text())
    err = capsys.readouterr().err
    assert first["data"]["byte_order_mark"] == "stripped" and first["earlier_runs"]["count"] == 0
    assert "python -m pipelines.sequential: estimated " in err and f" min for {first['steps']:,} steps (" in err
    # the second run learns nothing (--lr 1e-9): with --fail-on-warnings it exits 3, its release written all the same
    assert sequential.main([*dp, "--lr", "1e-9", "--fail-on-warnings"]) == quality.FAIL_ON_WARNINGS_STATUS == 3
    second = json.loads((out / "report.json").read_text())
    assert second["warnings"] and (out / "saved_model" / "saved_model.pb").exists()
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if ": error: " in line] == [
        f"python -m pipelines.sequential: error: --fail-on-warnings: the report has {len(second['warnings'])} "
        f"warning(s) (above; its `warnings` in {out / 'report.json'}); the release was written, exit status 3."
    ]
    earlier = second["earlier_runs"]
    assert (earlier["count"], earlier["finished"], earlier["without_epsilon"]) == (1, 1, 0)
    assert earlier["epsilon"] == pytest.approx(first["epsilon"])
    assert earlier["epsilon_total"] == pytest.approx(first["epsilon"] + second["epsilon"])
    spent = f"python -m pipelines.sequential: 1 earlier run(s) into {out} (1 finished) spent epsilon "
    assert any(line.startswith(spent + f"{first['epsilon']:.4g}") for line in err)
    lines = [json.loads(x) for x in (tmp_path / "run.budget.jsonl").read_text().splitlines()]
    assert [x["event"] for x in lines] == ["started", "finished"] * 2
    assert {"date", "mechanism", "epsilon", "delta", "steps", "finished"} <= set(lines[-1])
    assert "run.budget.jsonl" not in os.listdir(out)  # beside the release, not in it


def test_a_killed_run_counts_at_its_planned_epsilon_and_a_non_dp_run_unbounds_the_total(tmp_path):
    lines = [
        {"run": "a", "event": "started", "is_dp": True, "epsilon": 3.0, "delta": 1e-5, "finished": False},
        {"run": "b", "event": "started", "is_dp": True, "epsilon": 1.0, "delta": 1e-5, "finished": False},
        {"run": "b", "event": "finished", "is_dp": True, "epsilon": 0.9, "delta": 1e-5, "finished": True},
    ]
    (tmp_path / "o.budget.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + "not json\n")
    summary = BudgetRecord.read(str(tmp_path / "o")).summary()  # a (SIGKILLed) left only its started line
    assert (summary["count"], summary["finished"], summary["epsilon"]) == (2, 1, pytest.approx(3.9))
    with open(tmp_path / "o.budget.jsonl", "a") as f:
        f.write(json.dumps({"run": "c", "is_dp": False, "epsilon": None, "finished": True}) + "\n")
    summary = BudgetRecord.read(str(tmp_path / "o")).summary()
    assert summary["without_epsilon"] == 1 and summary["epsilon_total"] is None


def test_fail_on_warnings_reaches_each_pipeline_and_fails_only_a_report_with_warnings(files, capsys):
    # a run that exits 3: the second run of the budget test above
    assert criteo.parse_args(["--out", "o", "--fail-on-warnings"]).fail_on_warnings
    config, _ = movielens.parse_args(["--mechanism", "none", "--epochs", "1", "--out", "o", "--fail-on-warnings"])
    assert config.fail_on_warnings
    assert not sequential.parse_args(["--data", files["seq"], "--out", "o"]).fail_on_warnings
    assert quality.exit_status([], fail_on_warnings=True, program="p", report="r") == 0
    assert quality.exit_status(["bad"], fail_on_warnings=False, program="p", report="r") == 0
    assert capsys.readouterr().err == ""
    assert quality.exit_status(["bad"], fail_on_warnings=True, program="p", report="r") == 3


def test_the_run_time_estimate_is_printed_once_from_the_steps_after_the_warm_up(capsys, monkeypatch):
    # 3 warm-up steps of 2 s (tracing), then steps of 60 ms: 1,000 steps ~ 1.0 min
    durations = iter([2.0] * step_timer.WARMUP_STEPS + [0.06] * 20)
    now = [0.0]

    def clock():
        return now[0]

    monkeypatch.setattr(step_timer.time, "perf_counter", clock)
    timer, quiet = step_timer.StepTimer(1000, program="python -m pipelines.x"), step_timer.StepTimer()
    for step in range(10):
        for callback in (timer, quiet):
            callback.on_train_batch_begin(step)
        now[0] += next(durations)
        for callback in (timer, quiet):
            callback.on_train_batch_end(step)
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "python -m pipelines.x: estimated 1.0 min for 1,000 steps (60 ms a step, median of 3 steps after 3 "
        "warm-up steps)"
    ]
    assert quiet.estimate is None and len(quiet.durations) == 10
