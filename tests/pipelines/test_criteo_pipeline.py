"""The Criteo pipeline end to end: every mechanism, reports, SavedModel serving raw fields, bad input.

One tiny generated dataset is shared by the whole file (3 days x 400 rows,
hash size 20, embedding width 2, one hidden layer of 8, batch 100, so 4
Poisson steps per run). Day 0 carries a header line, a bad label and a bad
integer: every run uses --skip-bad-rows and must count exactly those three.
Runs use the RDP accountant (PLD calibration at q = 0.25 takes tens of
seconds; the PLD path has its own tests in tests/accounting).

fest (two streaming periods) and adafest run with `--streaming on` (exact
Poisson batches streamed from the files; adafest with 2 batches per pass),
the others in memory (`--streaming auto` on 400 rows), so both samplers and
parallel composition over periods run end to end. Smaller unit tests below
cover the period reader, parallel-composition accounting and the DP output
calibration without training.
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
from pipelines.criteo import calibration as criteo_calibration
from pipelines.criteo import data as criteo_data
from pipelines.criteo import evaluation as criteo_eval
from pipelines.criteo.report import REQUIRED_KEYS
from tfdp_embed.accounting import PrivacyLedger
from tfdp_embed.data.criteo import CAT_FEATURES, criteo_dataset, resolve_vocab_sizes
from tfdp_embed.data.criteo.synthetic import write_synthetic_criteo
from tfdp_embed.keras2._keras import tf
from tfdp_embed.keras2.export import REPORT_FILENAME
from tfdp_embed.keras2.models.ctr_serving import RAW_FIELDS, check_request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROWS_PER_DAY = 400
BAD_ROWS = {"header": 1, "bad_label": 1, "bad_integer": 1}
TINY = [
    "--hash-size",
    "20",
    "--embedding-dim",
    "2",
    "--hidden-units",
    "8",
    "--batch",
    "100",
    "--epochs",
    "1",
    "--momentum",
    "0",
    "--seed",
    "0",
    "--verbose",
    "0",
    "--accountant",
    "rdp",
    "--skip-bad-rows",
    "--calibration-fraction",
    "0.05",  # given: runs on 400 rows, where the default would skip it as too noisy
]
EXTRA = {  # cheap variety: each mechanism also exercises one option
    "none": [],
    "dense": ["--fixed-size-batches"],
    "eana": ["--model", "dcn"],
    "lazy": ["--momentum", "0.5"],
    "fest": ["--streaming-periods", "--streaming", "on"],
    "adafest": ["--streaming", "on", "--stream-buffer-rows", "200"],
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
# dense (fixed-size batches) and eana (DCN) are `slow` (`make test-slow`): their mechanisms and options are
# covered by the mechanism, data and DCN tests; the default run keeps the five others end to end.
SLOW_END_TO_END = ("dense", "eana")


@pytest.mark.parametrize(
    "mechanism", [pytest.param(m, marks=pytest.mark.slow) if m in SLOW_END_TO_END else m for m in EXTRA]
)
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
    # N is released with DP (N~, noise std 20 per period): rows read, q, T and delta come from N~.
    rows = (2 if streaming else 1) * ROWS_PER_DAY
    assert report["rows_read"] == report["dataset_size"] and abs(report["rows_read"] - rows) < 150
    parts = (report.get("dataset_size_release") or {}).get("parts") or [report["dataset_size"]]
    assert report["eval_rows_read"] == ROWS_PER_DAY
    assert {k: v for k, v in report["rows_skipped"].items() if v} == BAD_ROWS
    assert report["steps"] == sum(round(n / 100) for n in parts)  # round(N~_p / B) per epoch per period
    assert report["sampling_probability"] == pytest.approx(100 / min(parts))
    assert report["median_step_s"] > 0
    assert report["delta"] == pytest.approx(1 / report["rows_read"])  # default delta = 1/N~

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

    # example level, said so (issue 30): no user id in the files, so a person is protected by group privacy only
    assert report["privacy_unit"].startswith("example") and report["adjacency"] == "add-or-remove-one-example"
    assert any("carry no user id" in c and "group privacy" in c for c in report["caveats"])
    if mechanism == "dense":
        assert report["batching"] == "fixed_shuffled" and report["gradient_size_reduction"] == 1.0
        assert any("Poisson" in c for c in report["caveats"])
    elif mechanism != "none":
        assert report["batching"] == "poisson"
    if mechanism in ("adafest", "adafest+"):
        assert report["noise_multipliers"]["contribution_noise_multiplier"] > 0
        assert report["gradient_size_reduction"] > 1.0
    # Which sampler ran: streaming where asked for, in memory otherwise (auto on 400 rows).
    streamed = "--streaming" in EXTRA[mechanism]
    assert report["data"]["streaming"] == [streamed] * (2 if streaming else 1)
    assert report["data"]["streaming_mode"] == ("on" if streamed else "auto")
    if mechanism not in ("none", "dense"):
        assert report["sampler"].startswith("streaming exact Poisson" if streamed else "in-memory exact Poisson")
    if streamed and mechanism != "dense":  # one-pass sampler: the files are read once per epoch, rows spilled
        assert "one pass + disk spill" in report["sampler"]
        assert set(report["data"]["passes_per_epoch"]) == {1}
    if mechanism == "adafest":  # one streaming period: the sampler's own info is in the report
        assert report["batching_details"]["sampler"] == "one_pass_spill"
        assert report["batching_details"]["streaming"] and report["batching_details"]["batches_per_pass"] is None

    # DP output calibration: 5% of epsilon, a Laplace event in the ledger; none skips it.
    if mechanism == "none":
        assert report["output_calibration"] is None
    else:
        assert report["output_calibration"]["epsilon"] == pytest.approx(0.05 * 3.0)
        assert abs(report["output_calibration"]["shift"]) < criteo_calibration.MAX_SHIFT
        # On a few hundred rows the calibration's subset is all of them (sampling would cost more than it saves).
        calibration = report["output_calibration"]
        assert calibration["subset_rows"] == calibration["rows"] == report["rows_read"]  # N~
        assert calibration["rows_read"].startswith("not released")
        assert calibration["sampling_probability"] == 1.0
    if report["is_dp"]:
        laplace = [e for e in report["ledger"]["entries"] if "Laplace" in json.dumps(e)]
        assert len(laplace) == 1 and laplace[0]["kind"] == "setup"

    if streaming:  # one period per day, evaluated on the next day; one DP selection per period
        assert [p["period"] for p in report["periods"]] == [1, 2]
        assert report["periods"][0]["eval_files"] == [days[1]]
        assert len(report["mechanism_report"]["selections"]) == 2
        # Parallel composition: every period carries both selections and the calibration, then its own steps.
        assert report["composition"] == "parallel over streaming periods"
        accounts = report["period_accounting"]
        assert [a["steps"] for a in accounts] == [round(n / 100) for n in parts]
        assert report["epsilon"] == pytest.approx(max(a["epsilon"] for a in accounts))
        for account in accounts:
            assert sum(e["kind"] == "setup" for e in account["ledger"]["entries"]) == 4  # N~, 2 selections, calibration
        # Tight but honest: below the sequential composition of everything, within the target.
        sequential = PrivacyLedger.from_json(json.dumps(accounts[0]["ledger"]))
        second = PrivacyLedger.from_json(json.dumps(accounts[1]["ledger"]))
        for entry in second.entries:
            if entry.kind == "step":
                sequential.record_steps(entry.event, entry.count)
        assert report["epsilon"] < sequential.epsilon(report["delta"], "rdp")


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
from tfdp_embed.keras2.models.ctr_serving import check_request
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
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
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
        (["--streaming", "sometimes"], "invalid choice: 'sometimes'"),
        (["--calibration-fraction", "0.7"], "--calibration-fraction must lie in [0, 0.5)"),
        (["--mechanism", "fest", "--selection-fraction", "0.6", "--calibration-fraction", "0.45"], "must be < 1"),
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
    assert "--skip-bad-rows" in err and "skip_bad_rows=True" not in err  # the CLI names its flag


def test_batch_larger_than_the_data_is_refused(days, tmp_path, capsys):
    argv = ["--train", days[1], "--eval", days[2], "--out", str(tmp_path), "--batch", "5000", "--verbose", "0"]
    assert criteo.main(argv) == 1
    err = capsys.readouterr().err  # the rows are N~ (released with DP), never the exact 400
    assert "`--batch` 5000 is larger than the " in err and "training rows (released with DP)" in err
    assert "400" not in err


# -- periods: in memory vs streaming -----------------------------------------------------------
def _row_keys(features, labels):
    ids = np.stack([np.asarray(features[f]) for f in CAT_FEATURES], 1)
    ints = np.round(np.asarray(features["I1"]), 5)[:, None]
    return {tuple(r) for r in np.concatenate([ids, ints, np.asarray(labels).reshape(-1, 1)], 1).tolist()}


def test_streaming_and_in_memory_periods_hold_the_same_rows(days):
    vocab = resolve_vocab_sizes(None, 20)
    read = dict(vocab_sizes=vocab, skip_bad_rows=False)
    memory = criteo_data.open_period([days[1]], streaming="off", **read)
    stream = criteo_data.open_period([days[1]], streaming="on", count_buckets=True, **read)
    auto_small = criteo_data.open_period([days[1]], streaming="auto", **read)
    auto_large = criteo_data.open_period([days[1]], streaming="auto", threshold=100, **read)
    assert not memory.streaming and stream.streaming and not auto_small.streaming and auto_large.streaming
    assert memory.size == stream.size == auto_large.size == ROWS_PER_DAY
    assert stream.features is None and auto_large.counts is None  # nothing per row is held
    # Bucket counts: from the scan, from the arrays, and from a fresh pass agree; running sums add.
    counts = criteo_data.bucket_counts(stream)
    from_arrays, fresh_pass = criteo_data.bucket_counts(memory), criteo_data.bucket_counts(auto_large)  # once each
    for name in CAT_FEATURES:
        np.testing.assert_array_equal(counts[name], from_arrays[name])
        np.testing.assert_array_equal(counts[name], fresh_pass[name])
    running = criteo_data.bucket_counts(memory, counts=counts)
    assert int(running["C1"].sum()) == 2 * ROWS_PER_DAY
    # Evaluation data: identical rows, streamed or not.
    streamed_eval = [(f, y) for f, y in criteo_data.eval_dataset(stream, 128)]
    memory_eval = [(f, y) for f, y in criteo_data.eval_dataset(memory, 128)]
    for (fs, ys), (fm, ym) in zip(streamed_eval, memory_eval):
        np.testing.assert_array_equal(ys, ym)
        for name in fm:
            np.testing.assert_array_equal(fs[name], fm[name])
    # Streaming Poisson batches: round(N / B) per epoch, G per pass, real rows, none twice in a batch.
    all_rows = _row_keys(memory.features, memory.labels)
    for sampler in ("multi_pass", "one_pass"):
        batches, info = criteo_data.train_batches(
            stream, batch_size=50, poisson=True, lookahead=False, seed=1, stream_buffer_rows=150, sampler=sampler
        )
        assert info.streaming and info.batches_per_epoch == 8
        if sampler == "multi_pass":
            assert info.batches_per_pass == 3 and criteo_data.passes_per_epoch(info) == 3
        else:
            assert info.sampler == "one_pass_spill" and criteo_data.passes_per_epoch(info) == 1
        epoch = list(batches)
        assert len(epoch) == 8
        sizes = [int(y.shape[0]) for _, y in epoch]
        assert 0 < sum(sizes) and len(set(sizes)) > 1  # Poisson: sizes vary
        for features, labels in epoch:
            keys = _row_keys(features, labels.numpy()[:, 0])
            assert len(keys) == int(labels.shape[0]) and keys <= all_rows
    assert info.spill.epochs == 1 and info.spill.records_written == sum(sizes)
    with pytest.raises(ValueError, match="`streaming` must be one of"):
        criteo_data.open_period([days[1]], streaming="sometimes", **read)
    with pytest.raises(ValueError, match="is streamed"):
        criteo_data.examples(stream)


# -- DP output calibration ------------------------------------------------------------------------
def test_output_calibration_solves_the_shift_and_adds_laplace_noise_of_the_stated_scale():
    counts = np.zeros(criteo_calibration.BINS)
    counts[criteo_calibration.BINS // 2] = 1000  # logits in [0, 0.5): centre 0.25
    shift = criteo_calibration.solve_shift(counts, 200.0)  # sigmoid(0.25 + s) = 0.2
    assert 0.25 + shift == pytest.approx(math.log(0.2 / 0.8), abs=1e-9)
    # Noise: Laplace(2 / eps) on every count: sd sqrt(2) x 2 / eps (5 sd tolerance on the sample sd).
    rng = np.random.default_rng(0)
    draws = np.array([criteo_calibration.noisy_release(counts, 200.0, epsilon=0.5, rng=rng)[1] for _ in range(4000)])
    sd = math.sqrt(2) * 2 / 0.5
    assert abs(draws.mean() - 200.0) < 5 * sd / math.sqrt(4000)
    assert abs(draws.std() / sd - 1) < 5 * math.sqrt(1.25 / 4000)  # Laplace: var of sample var ~ 5 sd^4 / n
    assert criteo_calibration.calibration_event(0.5).noise_multiplier == pytest.approx(2.0)
    with pytest.raises(ValueError, match="must be > 0"):
        criteo_calibration.calibration_event(0.0)


def test_output_calibration_moves_the_mean_prediction_to_the_click_rate(days):
    from tfdp_embed.keras2.models import CTRModelConfig, build_ctr_model

    vocab = resolve_vocab_sizes(None, 20)
    period = criteo_data.read_period([days[1]], vocab_sizes=vocab, skip_bad_rows=False)
    model = build_ctr_model(CTRModelConfig.from_vocab_sizes(vocab, hidden_units=(8,), embedding_dims=(2,) * 26))
    bias = model.get_layer("click_logit").bias
    bias.assign([-4.0])  # a clipping-biased model: predicts ~2% clicks
    before = criteo_eval.evaluate(model, criteo_data.eval_dataset(period))
    # Huge eps: (almost) no noise, so only the histogram's binning limits the match.
    result = criteo_calibration.calibrate_output(model, [criteo_data.eval_dataset(period)], epsilon=1e9, seed=0)
    labels, logits = criteo_eval.predict_logits(model, criteo_data.eval_dataset(period))
    mean_p = float(np.mean(1 / (1 + np.exp(-logits))))
    assert mean_p == pytest.approx(labels.mean(), abs=0.01)
    assert float(bias.numpy()[0]) == pytest.approx(-4.0 + result.shift)
    after = criteo_eval.evaluate(model, criteo_data.eval_dataset(period))
    assert after["auc"] == pytest.approx(before["auc"], abs=1e-12) and after["logloss"] < before["logloss"]


@pytest.mark.slow  # lookahead's step is tested in tests/mechanisms/test_lazy.py
def test_lazy_lookahead_is_an_option(days, tmp_path, tmp_path_factory):
    # LazyDP trains without the one-batch lookahead unless `--lookahead` is given; with it, the run completes.
    # The run without it is the end-to-end `lazy` run above (shared, not run twice).
    plain = _run("lazy", days, tmp_path_factory).report
    out = tmp_path / "lookahead"
    assert criteo.main(_argv("lazy", days, out) + ["--lookahead"]) == 0
    with open(out / "report.json") as f:
        ahead = json.load(f)
    assert ahead["steps"] == plain["steps"] == 4 and 0.0 <= ahead["auc"] <= 1.0
    assert criteo.parse_args(_argv("lazy", days, tmp_path / "x")).lazy_lookahead is False
    assert criteo.parse_args(_argv("lazy", days, tmp_path / "x") + ["--lookahead"]).lazy_lookahead is True
    assert criteo.parse_args(_argv("adafest", days, tmp_path / "x") + ["--lookahead"]).lazy_lookahead is False
