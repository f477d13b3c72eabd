"""Tests of the streaming Criteo reader, its errors, and its helpers."""

from __future__ import annotations

import gzip
import math
import os

import numpy as np
import pytest

from tfdp_embed.data.criteo import (
    CAT_FEATURES,
    CRITEO_VOCAB_SIZES,
    INT_FEATURES,
    CriteoFormatError,
    CriteoReadStats,
    criteo_dataset,
    day_files,
    embedding_dim,
    parse_raw_fields,
    resolve_vocab_sizes,
    running_counts,
    scan_files,
    streaming_periods,
    table_sizes,
)
from tfdp_embed.data.criteo.synthetic import write_synthetic_criteo
from tfdp_embed.data.criteo.text import iter_chunks
from tfdp_embed.keras2._keras import tf

TOKEN = "68fd1e64"


def row(label="0", ints=None, cats=None, strip=False) -> str:
    """One Criteo line (no newline); ints/cats default to '1' / TOKEN."""
    ints = ["1"] * 13 if ints is None else ints
    cats = [TOKEN] * 26 if cats is None else cats
    line = "\t".join([label, *ints, *cats])
    return line.rstrip("\t") if strip else line


def write(path, lines, *, gz=False, newline="\n") -> str:
    data = (newline.join(lines) + newline).encode()
    if gz:
        data = gzip.compress(data)
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


def read_all(files, **kwargs):
    """All rows as (features dict of numpy arrays, labels)."""
    features, labels = next(iter(criteo_dataset(files, batch_size=100_000, **kwargs)))
    return {k: v.numpy() for k, v in features.items()}, labels.numpy()


def bucket(value: str, name: str) -> int:
    return 1 + int(tf.strings.to_hash_bucket_fast(value, CRITEO_VOCAB_SIZES[name]))


# ---------------------------------------------------------------------------
# Schema
# ---------------------------------------------------------------------------
def test_table3_vocabulary_and_embedding_dim():
    assert len(CRITEO_VOCAB_SIZES) == 26
    # DP-FEST Table 3: categorical-feature-14 (C1) = 1,472 ... -39 (C26) = 12,934.
    assert CRITEO_VOCAB_SIZES["C1"] == 1472
    assert CRITEO_VOCAB_SIZES["C3"] == 82741
    assert CRITEO_VOCAB_SIZES["C9"] == 3
    assert CRITEO_VOCAB_SIZES["C26"] == 12934
    assert sum(CRITEO_VOCAB_SIZES.values()) == 338_782
    assert embedding_dim(82741) == 33  # int(2 * 16.96)
    assert embedding_dim(3) == 2  # int(2 * 1.316)
    assert embedding_dim(10**6) == 63  # int(2 * 31.62)
    assert table_sizes()["C9"] == 4  # bucket 0 = missing
    assert table_sizes(hash_size=100)["C3"] == 101
    with pytest.raises(ValueError, match="embedding|vocab_size"):
        embedding_dim(0)


def test_resolve_vocab_sizes_errors():
    assert resolve_vocab_sizes([5] * 26)["C26"] == 5
    with pytest.raises(ValueError, match="not both"):
        resolve_vocab_sizes({"C1": 3}, hash_size=5)
    with pytest.raises(ValueError, match=r"missing \['C2'"):
        resolve_vocab_sizes({"C1": 3})
    with pytest.raises(ValueError, match="26 entries"):
        resolve_vocab_sizes([3, 4])
    with pytest.raises(ValueError, match="C1 must be a positive integer"):
        resolve_vocab_sizes(hash_size=0)


# ---------------------------------------------------------------------------
# Good rows
# ---------------------------------------------------------------------------
def test_parses_good_row_by_hand(tmp_path):
    ints = ["0", "-1", "5", "", "123456789012345678"] + ["2"] * 8
    cats = [TOKEN, ""] + ["a73ee510"] * 24
    path = write(tmp_path / "a.tsv", [row("1", ints, cats)])
    features, labels = read_all(path)
    assert labels.tolist() == [1.0]
    assert features["I1"][0] == 0.0
    np.testing.assert_allclose(features["I2"][0], -math.log(2), rtol=1e-6)  # sign-log of -1
    np.testing.assert_allclose(features["I3"][0], math.log(6), rtol=1e-6)  # log(1 + 5)
    assert features["I4"][0] == 0.0  # missing
    np.testing.assert_allclose(features["I5"][0], math.log1p(123456789012345678), rtol=1e-6)
    assert features["int_missing"][0].tolist() == [0, 0, 0, 1] + [0] * 9
    assert features["C1"][0] == bucket(TOKEN, "C1")
    assert features["C2"][0] == 0  # missing -> reserved bucket
    for name in CAT_FEATURES[2:]:
        assert 1 <= features[name][0] <= CRITEO_VOCAB_SIZES[name]
        assert features[name][0] == bucket("a73ee510", name)


def test_stripped_trailing_fields_and_crlf_match_full_rows(tmp_path):
    ints = ["3"] * 5 + [""] * 8
    cats = [TOKEN] * 4 + [""] * 22
    full = write(tmp_path / "full.tsv", [row("0", ints, cats)] * 2)
    stripped_row = row("0", ints, cats, strip=True)
    stripped = write(tmp_path / "stripped.tsv", [stripped_row] * 2, newline="\r\n")
    only_label = write(tmp_path / "label.tsv", ["1"])
    a, la = read_all(full)
    b, lb = read_all(stripped)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    np.testing.assert_array_equal(la, lb)
    c, lc = read_all(only_label)
    assert lc.tolist() == [1.0] and c["int_missing"].sum() == 13
    assert all(c[name][0] == 0 for name in CAT_FEATURES)


def test_unbatched_elements_and_raw_fields(tmp_path):
    path = write(tmp_path / "a.tsv", [row("1", ["7"] * 13), row("0")])
    elements = list(criteo_dataset(path, include_raw=True))
    assert len(elements) == 2
    features, label = elements[0]
    assert features["I1"].shape == () and features["int_missing"].shape == (13,)
    assert features["raw_ints"].numpy().tolist() == [7] * 13
    assert features["raw_cats"].numpy().tolist() == [TOKEN.encode()] * 26
    assert label.numpy() == 1.0 and elements[1][1].numpy() == 0.0


def test_gzip_and_multi_file_order(tmp_path):
    first = write(tmp_path / "day_0", [row("0", ["1"] * 13)] * 3)
    second = write(tmp_path / "day_1.gz", [row("1", ["2"] * 13)] * 2, gz=True)
    # A multi-member gzip (e.g. `cat a.gz b.gz`) is one stream of rows.
    third = str(tmp_path / "day_2.gz")
    with open(third, "wb") as f:
        f.write(gzip.compress((row("0", ["3"] * 13) + "\n").encode()))
        f.write(gzip.compress((row("1", ["4"] * 13) + "\n").encode()))
    stats = CriteoReadStats()
    features, labels = read_all([first, second, third], stats=stats)
    assert labels.tolist() == [0, 0, 0, 1, 1, 0, 1]
    raw = np.expm1(features["I1"]).round().astype(int).tolist()
    assert raw == [1, 1, 1, 2, 2, 3, 4]
    assert stats.rows_by_file == {first: 3, second: 2, third: 2}
    assert stats.files_completed == 3 and stats.total_skipped == 0
    # Reversed order streams reversed.
    _, labels = read_all([third, first])
    assert labels.tolist() == [0, 1, 0, 0, 0]


def test_hash_size_option(tmp_path):
    path = write(tmp_path / "a.tsv", [row()])
    features, _ = read_all(path, hash_size=10)
    assert features["C3"][0] == 1 + int(tf.strings.to_hash_bucket_fast(TOKEN, 10))


def test_blocks_split_rows_across_reads(tmp_path):
    write_synthetic_criteo(tmp_path, num_rows=600, seed=3, vocab_scale=0.01)
    path = str(tmp_path / "day_0")
    whole = iter_chunks([path])
    small = iter_chunks([path], block_bytes=1000)  # lines cut across blocks
    a = [np.concatenate(x) for x in zip(*[(c.ints, c.cats.astype("S8")) for c in whole])]
    b = [np.concatenate(x) for x in zip(*[(c.ints, c.cats.astype("S8")) for c in small])]
    assert a[0].shape == (600, 13)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


# ---------------------------------------------------------------------------
# parse_raw_fields: the serving transform equals the reader's
# ---------------------------------------------------------------------------
def test_unusual_categorical_values_take_the_string_path(tmp_path):
    cats = ["abc", "x" * 20, "é"] + [TOKEN] * 23  # not 8 ASCII bytes: hashed as strings
    path = write(tmp_path / "odd.tsv", [row("1", None, cats)])
    features, _ = read_all(path, include_raw=True)
    assert features["C1"][0] == bucket("abc", "C1")
    assert features["C2"][0] == bucket("x" * 20, "C2")
    assert features["C3"][0] == bucket("é", "C3")
    assert features["raw_cats"][0][2].decode() == "é"


def test_parse_raw_fields_equals_reader(tmp_path):
    (path,) = write_synthetic_criteo(tmp_path, num_rows=500, seed=1, vocab_scale=0.05)
    with open(path, "rb") as f:
        lines = [line.split(b"\t") for line in f.read().splitlines()]
    ints = tf.constant([fields[1:14] for fields in lines])
    cats = tf.constant([fields[14:40] for fields in lines])
    expected, labels = read_all(path)
    from_strings = parse_raw_fields(ints, cats)
    numeric = np.array([[float(v) if v else np.nan for v in fields[1:14]] for fields in lines])
    from_floats = parse_raw_fields(numeric, cats)
    for name, value in expected.items():
        np.testing.assert_array_equal(from_strings[name].numpy(), value, err_msg=name)
        np.testing.assert_array_equal(from_floats[name].numpy(), value, err_msg=name)
    assert expected["int_missing"].mean() > 0.1  # the file does have missing values
    assert labels.shape == (500,)


def test_parse_raw_fields_in_a_saved_model_signature(tmp_path):
    class Serving(tf.Module):
        @tf.function(
            input_signature=[
                tf.TensorSpec([None, 13], tf.string, name="int_fields"),
                tf.TensorSpec([None, 26], tf.string, name="cat_fields"),
            ]
        )
        def serve(self, int_fields, cat_fields):
            features = parse_raw_fields(int_fields, cat_fields)
            return {"C1": features["C1"], "I2": features["I2"]}

    export_dir = str(tmp_path / "serving")
    tf.saved_model.save(Serving(), export_dir)
    loaded = tf.saved_model.load(export_dir)
    out = loaded.serve(tf.constant([["1", "-3"] + [""] * 11]), tf.constant([[TOKEN] + [""] * 25]))
    assert out["C1"].numpy().tolist() == [bucket(TOKEN, "C1")]
    np.testing.assert_allclose(out["I2"].numpy(), [-math.log(4)], rtol=1e-6)


def test_parse_raw_fields_rejects_wrong_shapes():
    with pytest.raises(ValueError, match=r"`ints` must have shape \[\.\.\., 13\]"):
        parse_raw_fields(tf.zeros([2, 12]), tf.fill([2, 26], ""))
    with pytest.raises(ValueError, match=r"`cats` must have shape \[\.\.\., 26\]"):
        parse_raw_fields(tf.zeros([2, 13]), tf.fill([2, 25], ""))
    with pytest.raises(ValueError, match=r"`cats` must have shape \[\.\.\., 26, 8\]"):
        parse_raw_fields(tf.zeros([2, 13]), tf.zeros([2, 26, 9], tf.uint8))
    with pytest.raises(ValueError, match="`cats` must be tf.string"):
        parse_raw_fields(tf.zeros([2, 13]), tf.zeros([2, 26], tf.int64))


def test_string_and_byte_categoricals_hash_alike():
    values = np.array([[TOKEN, "", "a73ee510", "ffffffff"] * 6 + ["00000000", ""]], dtype="S8")
    as_bytes = values.view(np.uint8).reshape(1, 26, 8)
    ints = tf.zeros([1, 13], tf.int64)
    from_strings = parse_raw_fields(ints, tf.constant(values))
    from_bytes = parse_raw_fields(ints, tf.constant(as_bytes))
    for name in CAT_FEATURES:
        assert int(from_strings[name][0]) == int(from_bytes[name][0]), name
    assert int(from_bytes["C2"][0]) == 0 and int(from_bytes["C25"][0]) != 0


# ---------------------------------------------------------------------------
# Bad input: clear errors naming file and line; counted skips
# ---------------------------------------------------------------------------
BAD_ROWS = {
    # reason: (bad line, text the message must contain)
    "too_many_fields": (row() + "\textra", "41 tab-separated fields"),
    "bad_label": (row("2"), "label (field 1) is '2'; allowed labels are 0 and 1"),
    "bad_integer": (row("0", ["1", "x1"] + ["1"] * 11), "I2 (field 3) is 'x1'"),
    "empty_line": ("", "empty line"),
    "bad_categorical": (row("0", None, ["a" * 65] + [TOKEN] * 25), "C1 (field 15) is 65 bytes"),
}


@pytest.mark.parametrize("reason", sorted(BAD_ROWS))
def test_bad_row_raises_with_file_and_line(tmp_path, reason):
    bad, text = BAD_ROWS[reason]
    path = write(tmp_path / "bad.tsv", [row(), row(), bad, row()])
    with pytest.raises(CriteoFormatError) as info:
        scan_files(path)
    error = info.value
    assert (error.path, error.line, error.reason) == (path, 3, reason)
    assert f"{path}, line 3:" in str(error) and text in str(error)
    assert "skip_bad_rows=True" in str(error)


def test_non_integer_values_are_rejected(tmp_path):
    for value in ["1.5", "1e3", " 7", "-", "--2", "12345678901234567890"]:
        path = write(tmp_path / "v.tsv", [row("0", [value] + ["1"] * 12)])
        with pytest.raises(CriteoFormatError, match="bad_integer") as info:
            scan_files(path)
        assert info.value.line == 1 and "I1 (field 2)" in str(info.value), value


def test_header_line_is_named(tmp_path):
    header = "\t".join(["label", *INT_FEATURES, *CAT_FEATURES])
    path = write(tmp_path / "h.tsv", [header, row()])
    with pytest.raises(CriteoFormatError, match=r"h.tsv, line 1: looks like a header") as info:
        scan_files(path)
    assert info.value.reason == "header"


def test_error_during_iteration_names_file_and_line(tmp_path):
    path = write(tmp_path / "late.tsv", [row()] * 5 + [row("x")])
    stats = CriteoReadStats()
    dataset = criteo_dataset(path, stats=stats).batch(2)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"late.tsv, line 6: label"):
        list(dataset)
    assert stats.error is not None and stats.error.line == 6
    with pytest.raises(CriteoFormatError, match=r"late.tsv, line 6"):
        with stats.python_errors():
            list(dataset)


def test_skip_mode_counts_each_reason(tmp_path):
    header = "\t".join(["label", *INT_FEATURES, *CAT_FEATURES])
    bad_rows = [bad for bad, _ in BAD_ROWS.values()]
    lines = [header, row(), *bad_rows, row(), BAD_ROWS["bad_label"][0]]
    path = write(tmp_path / "mixed.tsv", lines)
    stats = CriteoReadStats()
    features, labels = read_all(path, skip_bad_rows=True, stats=stats)
    assert labels.shape == (2,)
    assert stats.skipped == {
        "header": 1,
        "empty_line": 1,
        "too_many_fields": 1,
        "bad_label": 2,
        "bad_integer": 1,
        "bad_categorical": 1,
    }
    assert stats.rows == 2 and stats.lines == 9 and stats.total_skipped == 7
    assert stats.first_skipped["bad_label"].startswith(f"{path}, line 4:")
    report = stats.as_dict()
    assert report["skipped"]["bad_label"] == 2 and report["error"] is None
    # The same through scan_files.
    assert scan_files(path, skip_bad_rows=True).skipped == stats.skipped


def test_skip_mode_needs_stats_and_never_accepts_a_file_of_junk(tmp_path):
    path = write(tmp_path / "junk.tsv", ["hello world", "foo\tbar"])
    with pytest.raises(ValueError, match="needs `stats=CriteoReadStats\\(\\)`"):
        criteo_dataset(path, skip_bad_rows=True)
    with pytest.raises(CriteoFormatError, match="none of its 2 lines is a valid") as info:
        scan_files(path, skip_bad_rows=True)
    assert info.value.reason == "no_valid_rows"


def test_file_level_faults(tmp_path):
    good = (row() + "\n").encode() * 50
    cases = {}
    cases["missing_file"] = str(tmp_path / "nope.tsv")
    cases["empty_file"] = str(tmp_path / "empty.tsv")
    open(cases["empty_file"], "wb").close()
    cases["binary_file"] = str(tmp_path / "model.bin")
    with open(cases["binary_file"], "wb") as f:
        f.write(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8).tobytes())
    cases["truncated_gzip"] = str(tmp_path / "cut.gz")
    with open(cases["truncated_gzip"], "wb") as f:
        f.write(gzip.compress(good)[:-30])
    cases["corrupt_gzip"] = str(tmp_path / "bad.gz")
    with open(cases["corrupt_gzip"], "wb") as f:
        blob = bytearray(gzip.compress(good))
        blob[20:40] = b"\xff" * 20
        f.write(bytes(blob))
    for reason, path in cases.items():
        with pytest.raises(CriteoFormatError) as info:
            criteo_dataset([path])  # raised at construction, in Python
        assert info.value.reason == reason and path in str(info.value), reason
    with pytest.raises(CriteoFormatError, match="is a directory"):
        criteo_dataset(str(tmp_path))
    with pytest.raises(ValueError, match="`files` is empty"):
        criteo_dataset([])


def test_truncated_gzip_names_the_cut_line_after_yielding_earlier_rows(tmp_path):
    # 4000 rows (> 64 KiB sniffed up front), cut near the end.
    data = "".join(row("0", [str(i)] + ["1"] * 12) + "\n" for i in range(4000)).encode()
    path = str(tmp_path / "day_5.gz")
    blob = gzip.compress(data)
    with open(path, "wb") as f:
        f.write(blob[: len(blob) - 200])
    stats = CriteoReadStats()
    chunks = []
    with pytest.raises(CriteoFormatError, match=r"day_5.gz, line \d+: gzip data stops") as info:
        for chunk in iter_chunks([path], stats=stats, block_bytes=1 << 14):
            chunks.append(chunk)
    delivered = sum(len(c) for c in chunks)
    assert info.value.reason == "truncated_gzip"
    assert info.value.line == delivered + 1 and 3000 < delivered < 4000
    assert np.concatenate([c.ints[:, 0] for c in chunks]).tolist() == list(range(delivered))


# ---------------------------------------------------------------------------
# Streaming periods, day files, running counts
# ---------------------------------------------------------------------------
def test_day_files_sorted_by_day_number(tmp_path):
    for name in ["day_10.gz", "day_2", "day_1.tsv", "notes.txt"]:
        (tmp_path / name).write_text("0\n")
    assert [os.path.basename(p) for p in day_files(tmp_path)] == ["day_1.tsv", "day_2", "day_10.gz"]
    (tmp_path / "day_2.gz").write_text("0\n")
    with pytest.raises(ValueError, match="Two files for day 2"):
        day_files(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="No day files"):
        day_files(tmp_path / "empty")


def test_streaming_periods_follow_dp_fest_protocol():
    days = [f"day_{d}" for d in range(24)]
    periods = list(streaming_periods(days))
    # 18 training days, one per period; evaluation on days 19-24 (day_18..day_23).
    assert len(periods) == 18
    assert periods[0] == (["day_0"], days[18:])
    assert periods[-1][0] == ["day_17"]
    four = list(streaming_periods(days, period_days=4))
    assert [len(train) for train, _ in four] == [4, 4, 4, 4, 2]
    assert [p for train, _ in four for p in train] == days[:18]
    whole = list(streaming_periods(days, period_days=18))
    assert whole == [(days[:18], days[18:])]
    sharded = list(streaming_periods([["a0", "a1"], ["b0"], ["c0"]], num_train_days=2))
    assert sharded == [(["a0", "a1"], ["c0"]), (["b0"], ["c0"])]
    with pytest.raises(ValueError, match="at least 2 days"):
        list(streaming_periods(["day_0"]))
    with pytest.raises(ValueError, match="num_train_days"):
        list(streaming_periods(days, num_train_days=24))
    with pytest.raises(ValueError, match="period_days"):
        list(streaming_periods(days, period_days=0))


def test_running_counts_by_hand(tmp_path):
    a, b = "aaaaaaaa", "bbbbbbbb"
    path = write(
        tmp_path / "c.tsv",
        [row(cats=[a] * 26), row(cats=[a] * 26), row(cats=[b] + [""] * 25)],
    )
    sizes = {name: 7 for name in CAT_FEATURES}
    dataset = criteo_dataset(path, vocab_sizes=sizes)
    counts = running_counts(dataset, vocab_sizes=sizes)
    bucket_a = 1 + int(tf.strings.to_hash_bucket_fast(a, 7))
    bucket_b = 1 + int(tf.strings.to_hash_bucket_fast(b, 7))
    expected_c1 = np.zeros(8, np.int64)
    expected_c1[bucket_a] += 2
    expected_c1[bucket_b] += 1
    np.testing.assert_array_equal(counts["C1"], expected_c1)
    expected_c2 = np.zeros(8, np.int64)
    expected_c2[0] = 1  # the missing value
    expected_c2[bucket_a] += 2
    np.testing.assert_array_equal(counts["C2"], expected_c2)
    # Running sum over a second period; batched input gives the same counts.
    twice = running_counts(dataset.batch(2), vocab_sizes=sizes, counts=counts)
    np.testing.assert_array_equal(twice["C1"], 2 * expected_c1)
    with pytest.raises(ValueError, match=r"`counts\['C1'\]` has shape \(3,\)"):
        running_counts(dataset, vocab_sizes=sizes, counts={n: np.zeros(3) for n in CAT_FEATURES})
    with pytest.raises(ValueError, match="unknown"):
        running_counts(dataset, vocab_sizes=sizes, features=["C99"])
    with pytest.raises(ValueError, match=r"C1 bucket id \d+ is outside \[0, 1\]"):
        running_counts(criteo_dataset(path), hash_size=1)


def test_criteo_dataset_runs_without_autotuning(tmp_path):
    """Nothing in the reader is autotuned; its model thread made deleting the iterator wait ~1 s in half the reads."""
    from tfdp_embed.data import criteo_dataset

    path = tmp_path / "day_0.tsv"
    path.write_text("1\t" + "\t".join(["1"] * 13) + "\t" + "\t".join(["68fd1e64"] * 26) + "\n")
    assert criteo_dataset([str(path)]).options().autotune.enabled is False
