"""The Criteo pipeline end to end: every mechanism, reports, SavedModel serving raw fields, bad input.

One tiny generated dataset is shared by the whole file (3 days x 400 rows,
hash size 20, embedding width 2, one hidden layer of 8, batch 100, so 4
Poisson steps per run). Day 0 carries a header line, a bad label and a bad
integer: every run uses --skip-bad-rows and must count exactly those three.
Runs use the RDP accountant (PLD calibration at q = 0.25 takes tens of
seconds; the PLD path has its own tests in tests/accounting).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from pipelines import criteo
from pipelines.criteo_report import REQUIRED_KEYS
from tfdp_embed._keras import tf
from tfdp_embed.data.criteo import criteo_dataset
from tfdp_embed.data.criteo_synthetic import write_synthetic_criteo
from tfdp_embed.export import REPORT_FILENAME
from tfdp_embed.models.ctr_serving import RAW_FIELDS, check_request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROWS_PER_DAY = 400
BAD_ROWS = {"header": 1, "bad_label": 1, "bad_integer": 1}
TINY = [
    "--hash-size", "20", "--embedding-dim", "2", "--hidden-units", "8", "--batch", "100",
    "--epochs", "1", "--momentum", "0", "--seed", "0", "--verbose", "0", "--accountant", "rdp", "--skip-bad-rows",
]  # fmt: skip
EXTRA = {  # cheap variety: each mechanism also exercises one option
    "none": [],
    "dense": ["--fixed-size-batches"],
    "eana": ["--model", "dcn"],
    "lazy": ["--momentum", "0.5"],
    "fest": ["--streaming-periods"],
    "adafest": [],
    "adafest+": [],
}
_RESULTS: dict = {}


@pytest.fixture(scope="module")
def days(tmp_path_factory):
    """Three synthetic day files; day 0 gets three malformed rows."""
    directory = tmp_path_factory.mktemp("criteo")
    paths = write_synthetic_criteo(str(directory), num_rows=3 * ROWS_PER_DAY, seed=0, days=3, vocab_scale=0.01)
    with open(paths[0], "rb") as f:
        body = f.read()
    header = "\t".join(["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)])
    good = body.splitlines()[0].split(b"\t")
    bad_label = b"\t".join([b"2"] + good[1:])
    bad_integer = b"\t".join(good[:2] + [b"abc"] + good[3:])
    with open(paths[0], "wb") as f:
        f.write(header.encode() + b"\n" + body + bad_label + b"\n" + bad_integer + b"\n")
    return paths


def _argv(mechanism, days, out):
    streaming = "--streaming-periods" in EXTRA[mechanism]
    train = days[:2] if streaming else days[:1]
    return ["--train", *train, "--eval", days[2], "--mechanism", mechanism, "--out", str(out), *TINY, *EXTRA[mechanism]]


def _run(mechanism, days, tmp_path_factory):
    """Runs (once per worker) and caches the `PipelineResult` of one mechanism."""
    if mechanism not in _RESULTS:
        out = tmp_path_factory.mktemp(f"run_{mechanism.replace('+', '_plus')}")
        _RESULTS[mechanism] = criteo.run(criteo.parse_args(_argv(mechanism, days, out)))
    return _RESULTS[mechanism]


# -- end to end, every mechanism -------------------------------------------------------
@pytest.mark.parametrize("mechanism", list(EXTRA))
def test_end_to_end_report_and_saved_model(mechanism, days, tmp_path_factory, capsys):
    if mechanism == "none":  # through the CLI entry point: exit status and printed report
        out = tmp_path_factory.mktemp("run_none_cli")
        assert criteo.main(_argv(mechanism, days, out)) == 0
        printed = capsys.readouterr().out
        assert "== privacy report ==" in printed and "NOT differentially private" in printed
    else:
        out = os.path.dirname(_run(mechanism, days, tmp_path_factory).report["saved_model"])
    with open(os.path.join(out, "report.json")) as f:
        report = json.load(f)

    missing = [k for k in REQUIRED_KEYS if k not in report]
    assert not missing, f"report.json lacks {missing}"
    assert report["mechanism"] == mechanism
    assert 0.0 <= report["auc"] <= 1.0 and math.isfinite(report["logloss"])
    streaming = mechanism == "fest"
    assert report["rows_read"] == (2 if streaming else 1) * ROWS_PER_DAY
    assert report["eval_rows_read"] == ROWS_PER_DAY
    assert {k: v for k, v in report["rows_skipped"].items() if v} == BAD_ROWS
    assert report["steps"] == (8 if streaming else 4)  # round(N / B) per epoch per period
    assert report["sampling_probability"] == pytest.approx(100 / ROWS_PER_DAY)
    assert report["median_step_s"] > 0
    assert report["delta"] == pytest.approx(1 / report["rows_read"])  # default delta = 1/N

    saved = os.path.join(out, "saved_model")
    assert os.path.exists(os.path.join(saved, "saved_model.pb"))
    with open(os.path.join(saved, REPORT_FILENAME)) as f:
        beside = json.load(f)
    assert beside["mechanism"] == mechanism and beside["is_dp"] == report["is_dp"]

    if mechanism in ("dense", "lazy", "fest", "adafest", "adafest+"):
        assert report["is_dp"] is True
        assert 0 < report["epsilon"] <= 3.0 + 1e-6  # spent (ledger) within the target
        assert report["noise_multiplier"] > 0
        assert report["gradient_size_reduction"] >= 1.0
    elif mechanism == "eana":
        assert report["is_dp"] is False and report["epsilon"] is None
        assert "NOT" in report["guarantee"]
        assert report["gradient_size_reduction"] > 1.0
        assert report["model"]["architecture"] == "dcn"
    else:
        assert report["is_dp"] is False and report["noise_multiplier"] == 0.0
        assert report["gradient_size_reduction"] is None

    if mechanism == "dense":
        assert report["batching"] == "fixed_shuffled" and report["gradient_size_reduction"] == 1.0
        assert any("Poisson" in c for c in report["caveats"])
    elif mechanism != "none":
        assert report["batching"] == "poisson"
    if mechanism in ("adafest", "adafest+"):
        assert report["noise_multipliers"]["contribution_noise_multiplier"] > 0
        assert report["gradient_size_reduction"] > 1.0
    if streaming:  # one period per day, evaluated on the next day; one DP selection per period
        assert [p["period"] for p in report["periods"]] == [1, 2]
        assert report["periods"][0]["eval_files"] == [days[1]]
        assert len(report["mechanism_report"]["selections"]) == 2
        assert sum(e["kind"] == "setup" for e in report["ledger"]["entries"]) == 2


# -- serving -------------------------------------------------------------------------------
def _raw_rows(path, n):
    rows = []
    with open(path) as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            rows.append(fields + [""] * (40 - len(fields)))
            if len(rows) == n:
                break
    return {name: [row[1 + i] for row in rows] for i, name in enumerate(RAW_FIELDS)}


_FRESH_PROCESS = r"""
import json, sys
import tensorflow as tf
path, request = sys.argv[1], json.loads(sys.argv[2])
serve = tf.saved_model.load(path).signatures["serving_default"]
tensors = {k: tf.constant(v, tf.string) for k, v in request.items()}
out = {"probabilities": serve(**tensors)["click_probability"].numpy().tolist()}

def attempt(name, fn):
    try:
        fn()
        out[name] = ["no error", ""]
    except Exception as error:
        out[name] = [type(error).__name__, str(error)[:2000]]

missing = {k: v for k, v in tensors.items() if k != "C5"}
attempt("missing_field", lambda: serve(**missing))
attempt("wrong_dtype", lambda: serve(**{**tensors, "I3": tf.constant([1.0] * len(request["I3"]))}))
attempt("not_a_number", lambda: serve(**{**tensors, "I3": tf.constant(["abc"] * len(request["I3"]))}))
from tfdp_embed.models.ctr_serving import check_request
attempt("checked_missing_field", lambda: check_request({k: v for k, v in request.items() if k != "C5"}))
attempt("checked_wrong_dtype", lambda: check_request({**request, "I3": [1.0] * len(request["I3"])}))
print(json.dumps(out))
"""


def test_saved_model_serves_raw_fields_in_a_fresh_process(days, tmp_path_factory):
    result = _run("lazy", days, tmp_path_factory)  # LazyDP: the export had to flush owed noise
    path = result.report["saved_model"]
    request = _raw_rows(days[2], 8)
    in_process = result.serving.serve(check_request(request))["click_probability"].numpy()

    # Serving hashes and transforms exactly as training read the TSV.
    features, _ = next(iter(criteo_dataset(days[2], hash_size=20).batch(8)))
    trained_path = tf.sigmoid(tf.reshape(result.model(features), [-1])).numpy()
    np.testing.assert_allclose(in_process, trained_path, rtol=1e-5, atol=1e-6)

    env = dict(os.environ, PYTHONPATH=ROOT, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(
        [sys.executable, "-c", _FRESH_PROCESS, path, json.dumps(request)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(out["probabilities"], in_process, rtol=1e-5, atol=1e-6)

    kind, message = out["missing_field"]
    assert kind == "TypeError" and "C5" in message
    kind, message = out["wrong_dtype"]
    assert kind == "InvalidArgumentError" and "string" in message
    kind, message = out["not_a_number"]
    assert kind == "InvalidArgumentError" and "I3" in message and "abc" in message
    kind, message = out["checked_missing_field"]
    assert kind == "ValueError" and "C5" in message
    kind, message = out["checked_wrong_dtype"]
    assert kind == "TypeError" and "I3" in message and "tf.string" in message


def test_saved_model_holds_model_weights_only(days, tmp_path_factory):
    result = _run("lazy", days, tmp_path_factory)
    prefix = os.path.join(result.report["saved_model"], "variables", "variables")
    names = [name for name, _ in tf.train.list_variables(prefix) if not name.startswith("_CHECKPOINTABLE")]
    assert len(names) == len(result.model.variables)
    assert all(name.startswith("model_variables/") for name in names), names
    signature = tf.saved_model.load(result.report["saved_model"]).signatures["serving_default"]
    assert sorted(signature.structured_input_signature[1]) == sorted(RAW_FIELDS)
    assert all(spec.dtype == tf.string for spec in signature.structured_input_signature[1].values())


# -- bad input ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv, message",
    [
        (["--mechanism", "bogus"], "invalid choice: 'bogus'"),
        (["--epsilon", "-1"], "--epsilon: must be a finite number > 0"),
        (["--epsilon", "lots"], "--epsilon: expected a float"),
        (["--delta", "1.5"], "--delta must lie in (0, 1)"),
        (["--batch", "0"], "--batch: must be a finite number > 0"),
        (["--hidden-units", "a,b"], "--hidden-units: expected comma-separated ints"),
        (["--model", "transformer"], "invalid choice: 'transformer'"),
        (["--train", "{day0}"], "--eval is required with --train"),
        (["--train", "/no/such/file", "--eval", "{day2}"], "file not found: '/no/such/file'"),
        (["--streaming-periods", "--train", "{day0}", "--eval", "{day2}"], "needs at least 2 --train day files"),
        (["--top-fraction", "0"], "--top-fraction must lie in (0, 1]"),
    ],
)
def test_bad_flags_exit_2_with_a_message(argv, message, days, tmp_path, capsys):
    argv = [a.format(day0=days[0], day2=days[2]) for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        criteo.parse_args(argv + ["--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_missing_out_flag_is_named(capsys):
    with pytest.raises(SystemExit):
        criteo.parse_args([])
    assert "--out" in capsys.readouterr().err


def test_bad_row_without_skip_fails_naming_file_and_line(days, tmp_path, capsys):
    argv = ["--train", days[0], "--eval", days[2], "--out", str(tmp_path)]
    argv += [a for a in TINY if a != "--skip-bad-rows"]
    assert criteo.main(argv) == 1
    err = capsys.readouterr().err
    assert f"{days[0]}, line 1" in err and "[header]" in err


def test_batch_larger_than_the_data_is_refused(days, tmp_path, capsys):
    argv = ["--train", days[1], "--eval", days[2], "--out", str(tmp_path), "--batch", "5000", "--verbose", "0"]
    assert criteo.main(argv) == 1
    assert "`--batch` 5000 is larger than the 400 training rows" in capsys.readouterr().err
