"""Issue 35's remaining user requests, as a user types them: `--epochs 100000` and a stray item id of 2,000,000.

* `--epochs 100000` on MovieLens (the audit: noise calibrated for 31.8M steps) and on Criteo with
  `--mechanism none` (the audit: "keeps going"), where the steps the data implies exceed the 10 million
  step limit (here: small batches), is refused in one line before the noise is calibrated and before
  anything is trained or written to `--out` (test_safe_release.py covers the sequential pipeline and
  `--epochs` above the limit at parse time). These tiny models' steps are fast: the refusal is the step
  limit's (test_run_time_limit.py covers a run under 10 million steps refused for its estimated time).
* One sequence with an item id of 2,000,000 (the audit: ~99 GB, out of memory) is mapped densely: the run
  fits a machine of 0.1 GB (the memory check counts 2,000,000 rows if the ids are not remapped) and the
  model knows the 30 items plus the stray one.
"""

from __future__ import annotations

import fcntl
import json
import os

import pytest
from test_run_faults import READ, _one_line

from pipelines import criteo, movielens, run_limits, sequential
from tfdp_embed.data.criteo.synthetic import write_synthetic_criteo
from tfdp_embed.data.sequences import write_synthetic_sequences

SEQ = ["--batch", "40", "--max-len", "6", "--dim", "8", "--blocks", "1", "--accountant", "rdp", "--verbose", "0"]
SEQ += ["--seed", "3", "--epochs", "1", "--epsilon", "inf"]
REFUSED = "training steps; at most 10,000,000 are allowed:"
MAIN = {"sequential": sequential.main, "movielens": movielens.main, "criteo": criteo.main}


def _left(out) -> list:
    return sorted(name for name in os.listdir(out.parent) if name.startswith(out.name))


def test_movielens_epochs_100000_is_refused_before_calibration(tmp_path, capsys, monkeypatch):
    ml = tmp_path / "ml"
    ml.mkdir()
    rows = [f"{u},{(u + t) % 30 + 1},3.5,{1000 + t}" for u in range(1, 41) for t in range(8)]
    (ml / "ratings.csv").write_text("userId,movieId,rating,timestamp\n" + "\n".join(rows) + "\n")
    (ml / "movies.csv").write_text("movieId,title,genres\n" + "".join(f"{i},M{i},Drama\n" for i in range(1, 31)))

    def calibrated(*args, **kwargs):
        raise AssertionError("the noise was calibrated")

    monkeypatch.setattr("pipelines.movielens.privacy.plan", calibrated)
    out = tmp_path / "run"
    argv = ["--data", str(ml), "--out", str(out), "--mechanism", "dense", "--epsilon", "3", "--epochs", "100000"]
    argv += ["--batch-size", "1", "--embedding-dim", "8", "--context-length", "3", "--quiet"]
    argv += ["--privacy-unit", "example"]
    # N~ ~ 220 +- 20 examples (the released N, z = 20; 182-256 seen): ~22 million steps, 10 million only at
    # N~ = 100 (6 sd). With --batch-size 2 it was ~11 million, under the limit when N~ < 200: 1 run in 6 failed.
    assert movielens.main(argv) == 1
    line = _one_line(capsys, "movielens")
    assert "`--epochs` 100,000 x " in line and REFUSED in line and "lower --epochs or raise --batch-size" in line
    assert not out.exists() and not [name for name in _left(out) if ".partial-" in name]


def test_criteo_none_epochs_100000_is_refused_before_training(tmp_path, capsys, monkeypatch):
    days = write_synthetic_criteo(str(tmp_path / "criteo"), num_rows=800, seed=0, days=2, vocab_scale=0.01)

    def built(*args, **kwargs):
        raise AssertionError("a model was built")

    monkeypatch.setattr("pipelines.criteo.pipeline.build_ctr_model", built)
    out = tmp_path / "run"
    argv = ["--train", days[0], "--eval", days[1], "--out", str(out), "--mechanism", "none", "--epochs", "100000"]
    argv += ["--batch", "2", "--hash-size", "20", "--embedding-dim", "2", "--hidden-units", "8", "--verbose", "0"]
    assert criteo.main(argv) == 1  # ~400 batches an epoch: ~40 million steps
    line = _one_line(capsys, "criteo")
    assert "`--epochs` 100,000 x " in line and REFUSED in line
    assert not out.exists() and not [name for name in _left(out) if ".partial-" in name]


def test_a_stray_sequence_item_id_of_two_million_is_mapped_densely(tmp_path, capsys, monkeypatch):
    data = write_synthetic_sequences(
        str(tmp_path / "s.txt"), num_users=200, num_items=30, min_length=4, max_length=9, seed=0
    )
    with open(data, "a") as f:
        f.write("".join(f"9999 {item}\n" for item in (1, 2, 2_000_000, 3, 4)))
    # 2,000,001 rows would need [40, 6, 2,000,001] float32 logits a step (1.9 GB): refused on this "machine"
    monkeypatch.setattr(run_limits, "machine_memory", lambda: 10**8)
    out = tmp_path / "run"
    assert sequential.main(["--data", data, "--out", str(out), *SEQ]) == 0, capsys.readouterr().err[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["extra"]["item_vocabulary"]["items"] == 31  # 30 items and the stray id, numbered densely


@pytest.mark.parametrize("pipeline", ["sequential", "movielens", "criteo"])
def test_every_pipeline_refuses_a_second_writer_before_reading(pipeline, tmp_path, capsys, monkeypatch):
    # test_safe_release.py runs two sequential CLIs; here each pipeline meets a lock another run holds
    def never(*args, **kwargs):
        raise AssertionError("the data was read")

    monkeypatch.setattr(READ[pipeline], never)
    out = tmp_path / "run"
    (tmp_path / "run.lock").write_text("4242\n")
    with open(tmp_path / "run.lock") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another open file description: as another process
        argv = {
            "sequential": ["--data", str(tmp_path / "s.txt"), "--out", str(out), *SEQ],
            "movielens": ["--mechanism", "none", "--epochs", "1", "--data", str(tmp_path), "--out", str(out)],
            "criteo": ["--out", str(out), "--mechanism", "none", "--epochs", "1", "--verbose", "0"],
        }[pipeline]
        if pipeline == "sequential":
            (tmp_path / "s.txt").write_text("1 2\n1 3\n")
        assert MAIN[pipeline](argv) == 1
    line = _one_line(capsys, pipeline)
    assert f"{out} is being written by another run (pid 4242, lock {out}.lock)" in line
    assert _left(out) == ["run.lock"] and (tmp_path / "run.lock").read_text() == "4242\n"
