"""`criteo_lines`: lines without their files (the Beam job's shards) parse exactly as `criteo_dataset` reads them."""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed.data.criteo import CriteoFormatError, criteo_dataset, criteo_lines
from tfdp_embed.data.criteo.synthetic import write_synthetic_criteo
from tfdp_embed.keras2._keras import tf


def test_lines_parse_as_the_files_reader_reads_them(tmp_path):
    (path,) = write_synthetic_criteo(str(tmp_path), num_rows=300, seed=3)
    with open(path, "rb") as handle:
        lines = handle.read().splitlines()
    odd = {5: (1, b"260.0"), 7: (14, b"not-eight-bytes")}  # an integral float, a token that is not 8 bytes
    for row, (field, value) in odd.items():
        fields = lines[row].split(b"\t")
        fields[field] = value
        lines[row] = b"\t".join(fields)
    with open(path, "wb") as handle:
        handle.write(b"\n".join(lines) + b"\n")
    expected, labels = next(iter(criteo_dataset(path, batch_size=1000, hash_size=1000)))
    for start, stop in ((0, len(lines)), (8, 20)):  # the string path (the odd token in it) and the byte path
        batch = lines[start:stop]
        features, got = criteo_lines(tf.constant(batch), hash_size=1000)
        assert sorted(features) == sorted(expected)
        for name in expected:
            np.testing.assert_array_equal(features[name].numpy(), expected[name].numpy()[start : start + len(batch)])
        np.testing.assert_array_equal(got.numpy(), labels.numpy()[start : start + len(batch)])


def test_an_empty_batch_and_a_bad_line():
    features, labels = criteo_lines(tf.zeros([0], tf.string), hash_size=10)
    assert labels.shape == [0] and features["C1"].shape == [0] and features["int_missing"].shape == [0, 13]
    with pytest.raises(CriteoFormatError, match="Beam shards x, line 1: looks like a header line"):
        criteo_lines(tf.constant([b"label\t1"]), hash_size=10, source="Beam shards x")
