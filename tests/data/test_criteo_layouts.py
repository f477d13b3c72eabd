"""Criteo files in the layouts users have: CSV with a header (DeepCTR), a leading Id column, integral floats, CRLF.

Every layout is generated here from one synthetic TSV day (no outside file):
the oracle is that each layout reads to exactly the features and labels of
the TSV it was written from. Then the pipeline trains on several layouts at
once (auto-detected per file), serves the CSV's own strings, and refuses a
CSV read as TSV, or a non-integral float, with a one-line error naming file,
line, field and the CLI flag to pass.
"""

from __future__ import annotations

import gzip
import re

import numpy as np
import pytest

from pipelines import criteo
from tfdp_embed.data.criteo import (
    CAT_FEATURES,
    INT_FEATURES,
    CriteoFormatError,
    CriteoReadStats,
    criteo_dataset,
    parse_raw_fields,
    scan_files,
)
from tfdp_embed.data.criteo.layout import detect_layout
from tfdp_embed.data.criteo.rows import INT_FIELD_PATTERN, parse_block
from tfdp_embed.data.criteo.synthetic import write_synthetic_criteo
from tfdp_embed.keras2._keras import tf
from tfdp_embed.keras2.models import CTRModelConfig, CTRServingModule, build_ctr_model
from tfdp_embed.keras2.models.ctr_serving import RAW_FIELDS, check_request

ROWS = 300
NAMES = ["label", *INT_FEATURES, *CAT_FEATURES]


@pytest.fixture(scope="module")
def tsv(tmp_path_factory):
    directory = tmp_path_factory.mktemp("layouts")
    return write_synthetic_criteo(str(directory), num_rows=2 * ROWS, seed=3, days=2, vocab_scale=0.01)


def _rows(path) -> list[list[str]]:
    with open(path) as f:
        return [(line.rstrip("\n").split("\t") + [""] * 40)[:40] for line in f]


def _as_float(value: str) -> str:
    return f"{int(value)}.0" if value.lstrip("-").isdigit() else value  # "" (missing) and bad values as they are


def write_layout(rows, path, *, sep=",", header=False, id_column=False, floats=False, crlf=False, gz=False) -> str:
    """Writes `rows` (40 raw fields each) in one layout."""
    lines = []
    if header:
        lines.append(sep.join((["Id", "Label"] if id_column else ["label"]) + NAMES[1:]))
    for i, row in enumerate(rows):
        ints = [_as_float(v) for v in row[1:14]] if floats else row[1:14]
        lines.append(sep.join(([str(10_000 + i)] if id_column else []) + [row[0], *ints, *row[14:]]))
    data = (("\r\n" if crlf else "\n").join(lines) + "\n").encode()
    with open(path, "wb") as f:
        f.write(gzip.compress(data) if gz else data)
    return str(path)


LAYOUTS = {  # name -> (write_layout options, the layout auto-detection must find)
    "deepctr_criteo_sample": (dict(header=True, floats=True), ("csv", True, False)),
    "kaggle_id_crlf": (dict(header=True, id_column=True, crlf=True), ("csv", True, True)),
    "csv_no_header_floats_crlf": (dict(floats=True, crlf=True), ("csv", False, False)),
    "csv_no_header_id": (dict(id_column=True), ("csv", False, True)),
    "deepctr_gzip": (dict(header=True, floats=True, gz=True), ("csv", True, False)),
    "tsv_floats_crlf": (dict(sep="\t", floats=True, crlf=True), ("tsv", False, False)),
}


def _read(path, **kwargs):
    features, labels = next(iter(criteo_dataset(path, hash_size=50, batch_size=10_000, **kwargs)))
    return {k: v.numpy() for k, v in features.items()}, labels.numpy()


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_each_layout_reads_to_the_rows_of_its_tsv(name, tsv, tmp_path):
    options, (kind, header, id_column) = LAYOUTS[name]
    path = write_layout(_rows(tsv[0]), tmp_path / f"{name}.txt", **options)
    with open(path, "rb") as f:
        head = f.read()
    layout = detect_layout(path, gzip.decompress(head) if options.get("gz") else head)
    assert (layout.name, layout.header, layout.id_column) == (kind, header, id_column)
    expected, expected_labels = _read(tsv[0])
    stats = CriteoReadStats()
    features, labels = _read(path, stats=stats)
    np.testing.assert_array_equal(labels, expected_labels)
    for key in expected:
        np.testing.assert_array_equal(features[key], expected[key], err_msg=key)
    assert stats.rows == ROWS and stats.lines == ROWS  # a header is not a row
    forced = _read(path, format=kind)[1]  # --format naming the layout reads the same
    np.testing.assert_array_equal(forced, expected_labels)


def test_csv_read_as_tsv_says_it_is_comma_separated(tsv, tmp_path):
    path = write_layout(_rows(tsv[0]), tmp_path / "sample.csv", header=True, floats=True)
    with pytest.raises(CriteoFormatError) as error:
        scan_files(path, format="tsv")
    assert error.value.line == 1 and "comma-separated" in str(error.value) and "format='csv'" in str(error.value)
    with pytest.raises(CriteoFormatError) as error:
        scan_files(path, format="tsv", skip_bad_rows=True)
    assert error.value.reason == "no_valid_rows" and "the file is comma-separated" in str(error.value)
    assert "--format csv" in error.value.message(cli=True) and "format='csv'" not in error.value.message(cli=True)


def test_a_csv_header_of_the_wrong_width_is_refused(tmp_path):
    path = tmp_path / "short.csv"
    path.write_text("label,I1,I2\n0,1,2\n")
    with pytest.raises(CriteoFormatError, match=r"short.csv, line 1: CSV header has 3 columns; .* 40 .* 41"):
        scan_files(str(path))


# -- one integer rule for training and serving --------------------------------------------
FIELDS = [
    "",
    "0",
    "17",
    "-2",
    "260.0",
    "260.",
    "260.000",
    "-3.0",
    "2.5",
    "1e3",
    "+5",
    ".5",
    "abc",
    "1.0.0",
    " 3",
    "-",
    "123456789012345678",
    "1234567890123456789",
    "999999999999999999.0",
    "1." + "0" * 20,
    "1." + "0" * 21,
]


def test_training_and_serving_accept_the_same_integer_strings_and_values():
    for value in FIELDS:
        line = ("1\t" + "\t".join([value] * 13) + "\t" + "\t".join(["68fd1e64"] * 26) + "\n").encode()
        try:
            chunk, _ = parse_block("f.tsv", 1, line, skip_bad_rows=False)
            training = int(chunk.ints[0, 0])
        except CriteoFormatError:
            training = None
        serving_accepts = re.fullmatch(INT_FIELD_PATTERN, value) is not None
        assert (training is not None) == serving_accepts, value
        if serving_accepts:  # serving's features of the string are training's of the parsed integer
            cats = tf.constant([[""] * 26])
            served = parse_raw_fields(tf.constant([[value] * 13]), cats, hash_size=5)
            trained = parse_raw_fields(
                tf.constant([[training] * 13], tf.int64),
                cats,
                hash_size=5,
                ints_missing=tf.constant([[value == ""] * 13]),
            )
            for key in ("I1", "int_missing"):
                np.testing.assert_array_equal(served[key].numpy(), trained[key].numpy(), err_msg=value)


def test_the_serving_signature_applies_the_rule(tmp_path):
    config = CTRModelConfig.from_vocab_sizes(hash_size=20, hidden_units=(4,), embedding_dims=(2,) * 26)
    serving = CTRServingModule(build_ctr_model(config), config)
    request = {name: ["1"] for name in RAW_FIELDS}
    plain = serving.serve(check_request({**request, "I2": ["260"]}))["logit"].numpy()
    as_float = serving.serve(check_request({**request, "I2": ["260.0"]}))["logit"].numpy()
    np.testing.assert_array_equal(plain, as_float)
    with pytest.raises(tf.errors.InvalidArgumentError, match="I2"):
        serving.serve(check_request({**request, "I2": ["2.5"]}))


# -- the pipeline on these layouts ----------------------------------------------------------
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
    "--seed",
    "0",
    "--verbose",
    "0",
    "--accountant",
    "rdp",
]


def test_pipeline_trains_on_mixed_layouts_and_serves_their_strings(tsv, tmp_path):
    rows = _rows(tsv[0])
    train = [
        write_layout(rows[:150], tmp_path / "criteo_sample.txt", header=True, floats=True),
        write_layout(rows[150:], tmp_path / "kaggle.csv", header=True, id_column=True, crlf=True),
    ]
    evaluation = write_layout(_rows(tsv[1]), tmp_path / "eval.csv", floats=True, crlf=True)
    argv = ["--train", *train, "--eval", evaluation, "--out", str(tmp_path / "o"), *TINY, "--mechanism", "none"]
    result = criteo.run(criteo.parse_args(argv))  # the mechanism does not matter here; none is the fastest
    report = result.report
    # Every training row of both layouts is read (the same auto-detecting reader the pipeline uses); the report
    # states only N~, the DP-released count (noise sd 20), never the exact 300.
    assert scan_files(train).rows == ROWS
    assert report["rows_read"] == report["dataset_size"] and abs(report["rows_read"] - ROWS) < 100
    assert report["eval_rows_read"] == ROWS and sum(report["rows_skipped"].values()) == 0
    # Serving takes the CSV's own strings ("260.0") and gives what the model gives on the rows training read.
    eval_rows = _rows(tsv[1])[:5]
    request = {
        name: [_as_float(r[1 + i]) if i < 13 else r[1 + i] for r in eval_rows] for i, name in enumerate(RAW_FIELDS)
    }
    served = result.serving.serve(check_request(request))["logit"].numpy()
    features, _ = next(iter(criteo_dataset(evaluation, hash_size=20, batch_size=5)))
    np.testing.assert_allclose(served, np.reshape(result.model(features), [-1]), rtol=1e-5, atol=1e-6)


def _error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("python -m pipelines.criteo: error:")]
    assert len(lines) == 1, err[-2000:]
    return lines[0]


def test_cli_errors_name_the_layout_and_the_flags(tsv, tmp_path, capsys):
    rows = _rows(tsv[0])
    csv = write_layout(rows, tmp_path / "sample.csv", header=True, floats=True)
    evaluation = write_layout(_rows(tsv[1]), tmp_path / "eval.csv", header=True)
    common = ["--eval", evaluation, "--out", str(tmp_path / "o"), *TINY]
    assert criteo.main(["--train", csv, "--format", "tsv", *common]) == 1
    line = _error_line(capsys.readouterr().err)
    assert f"{csv}, line 1: the line is comma-separated" in line and "--format csv" in line
    assert "format='csv'" not in line and "skip_bad_rows=True" not in line

    rows[1][2] = "2.5"  # I2 of the row on line 3 (after the header)
    bad = write_layout(rows, tmp_path / "bad.csv", header=True, floats=True)
    assert criteo.main(["--train", bad, *common]) == 1
    line = _error_line(capsys.readouterr().err)
    assert f"{bad}, line 3: integer feature I2 (field 3) is '2.5'" in line and "[bad_integer]" in line
    assert "--skip-bad-rows" in line and "skip_bad_rows=True" not in line
    assert not (tmp_path / "o").exists()  # a failed run leaves no --out behind
