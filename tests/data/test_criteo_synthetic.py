"""Tests of the synthetic Criteo generator: format, determinism, shape, signal."""

from __future__ import annotations

import gzip
import os

import numpy as np
import pytest

from tfdp_embed.data.criteo.schema import CAT_FEATURES, CRITEO_VOCAB_SIZES
from tfdp_embed.data.criteo.synthetic import main, write_synthetic_criteo
from tfdp_embed.data.criteo.text import iter_chunks, scan_files


def load(paths):
    """(labels, ints, ints_missing, cats) of files, via the validating reader."""
    chunks = list(iter_chunks(list(paths)))
    return (
        np.concatenate([c.labels for c in chunks]),
        np.concatenate([c.ints for c in chunks]),
        np.concatenate([c.ints_missing for c in chunks]),
        np.concatenate([c.cats.astype("S8") for c in chunks]),
    )


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    """30k rows with full Table 3 vocabularies, read back."""
    out = tmp_path_factory.mktemp("synthetic")
    paths = write_synthetic_criteo(out, num_rows=30_000, seed=7)
    return load(paths)


def test_deterministic_given_seed(tmp_path):
    kwargs = dict(num_rows=3000, vocab_scale=0.05, days=2)
    a = write_synthetic_criteo(tmp_path / "a", seed=1, gzip=True, **kwargs)
    b = write_synthetic_criteo(tmp_path / "b", seed=1, gzip=True, **kwargs)
    c = write_synthetic_criteo(tmp_path / "c", seed=2, gzip=True, **kwargs)
    assert [os.path.basename(p) for p in a] == ["day_0.gz", "day_1.gz"]
    for x, y, z in zip(a, b, c):
        assert open(x, "rb").read() == open(y, "rb").read()  # byte-identical gzip
        assert open(x, "rb").read() != open(z, "rb").read()
    plain = write_synthetic_criteo(tmp_path / "p", seed=1, **kwargs)
    assert gzip.decompress(open(a[0], "rb").read()) == open(plain[0], "rb").read()


def test_rows_are_valid_criteo_and_split_over_days(tmp_path):
    paths = write_synthetic_criteo(tmp_path, num_rows=1001, seed=0, days=3, vocab_scale=0.01)
    stats = scan_files(paths)
    assert [stats.rows_by_file[p] for p in paths] == [334, 334, 333]
    with open(paths[0], "rb") as f:
        lines = f.read().splitlines()
    assert {line.count(b"\t") for line in lines} == {39}
    stripped = write_synthetic_criteo(
        tmp_path / "s", num_rows=1001, seed=0, days=3, vocab_scale=0.01, strip_trailing_empty=True
    )
    with open(stripped[0], "rb") as f:
        assert any(line.count(b"\t") < 39 for line in f.read().splitlines())
    for x, y in zip(load(paths[:1]), load(stripped[:1])):
        np.testing.assert_array_equal(x, y)


def test_click_rate_missing_rates_and_integers(sample):
    labels, ints, ints_missing, cats = sample
    assert abs(labels.mean() - 0.25) < 0.02
    missing = cats == b""
    c = {name: missing[:, i] for i, name in enumerate(CAT_FEATURES)}
    # Kaggle: C19, C20, C25, C26 missing together in ~45% of rows; C22 in ~80%.
    assert abs(c["C19"].mean() - 0.45) < 0.02
    assert (c["C19"] == c["C26"]).all()
    assert abs(c["C22"].mean() - 0.80) < 0.02
    assert c["C1"].sum() == 0
    # Kaggle: I12 missing in ~77% of rows; I2 never, with a few negatives.
    assert abs(ints_missing[:, 11].mean() - 0.77) < 0.02
    assert ints_missing[:, 1].sum() == 0 and (ints[:, 1] < 0).mean() > 0.01
    assert (ints[:, [0] + list(range(2, 13))] >= 0).all()
    assert np.median(ints[~ints_missing[:, 4], 4]) > 1000  # I5 is large, as in Kaggle


def test_categorical_frequencies_follow_zipf(sample):
    _, _, _, cats = sample
    column = cats[:, CAT_FEATURES.index("C3")]  # V = 82,741
    _, counts = np.unique(column[column != b""], return_counts=True)
    counts = np.sort(counts)[::-1]
    ranks = np.arange(1, 51)
    slope = np.polyfit(np.log(ranks), np.log(counts[:50]), 1)[0]
    assert -1.3 < slope < -0.9  # zipf_exponent = 1.1
    # A small vocabulary is (almost) fully used; token format is 8 hex digits.
    small = cats[:, CAT_FEATURES.index("C6")]
    assert len(set(small[small != b""].tolist())) == CRITEO_VOCAB_SIZES["C6"]
    int(column[0], 16)
    assert len(column[0]) == 8


def _auc(scores: np.ndarray, labels: np.ndarray) -> float:
    order = np.argsort(scores)
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    pos = labels == 1
    return (ranks[pos].sum() - pos.sum() * (pos.sum() + 1) / 2) / (pos.sum() * (~pos).sum())


def test_label_is_learnable_by_logistic_regression(sample):
    labels, ints, ints_missing, cats = sample
    # One-hot features: every (feature, token) seen, plus log integers.
    columns, offset = [], 0
    for i in range(len(CAT_FEATURES)):
        _, index = np.unique(cats[:, i], return_inverse=True)
        columns.append(index + offset)
        offset += index.max() + 1
    ids = np.stack(columns, axis=1)
    dense = np.where(ints_missing, 0, np.sign(ints) * np.log1p(np.abs(ints)))
    dense = (dense - dense.mean(0)) / (dense.std(0) + 1e-9)
    train, test = slice(0, 20_000), slice(20_000, None)
    w, v, b = np.zeros(offset), np.zeros(13), np.log(0.25 / 0.75)
    for _ in range(150):  # full-batch gradient descent with L2
        logit = w[ids[train]].sum(1) + dense[train] @ v + b
        g = 1 / (1 + np.exp(-logit)) - labels[train]
        grad_w = np.bincount(ids[train].ravel(), np.repeat(g, 26), offset) / 20_000
        w -= 10.0 * (grad_w + 1e-4 * w)
        v -= 0.5 * dense[train].T @ g / 20_000
        b -= 0.5 * g.mean()
    auc = _auc(w[ids[test]].sum(1) + dense[test] @ v + b, labels[test])
    print(f"synthetic logistic-regression test AUC: {auc:.3f}")
    assert auc > 0.65, auc


def test_daily_drift_moves_popular_tokens(tmp_path):
    kwargs = dict(num_rows=4000, seed=3, days=2, vocab_scale=0.1)
    drift = write_synthetic_criteo(tmp_path / "d", daily_drift=1.0, **kwargs)
    still = write_synthetic_criteo(tmp_path / "s", daily_drift=0.0, **kwargs)
    column = CAT_FEATURES.index("C3")

    def top_tokens(path):
        column_values = load([path])[3][:, column]
        values, counts = np.unique(column_values[column_values != b""], return_counts=True)
        return set(values[np.argsort(counts)[::-1][:20]].tolist())

    assert len(top_tokens(still[0]) & top_tokens(still[1])) >= 15
    assert len(top_tokens(drift[0]) & top_tokens(drift[1])) <= 5


def test_cli_writes_day_files(tmp_path, capsys):
    args = ["--out", str(tmp_path), "--rows", "500", "--days", "2", "--vocab-scale", "0.01"]
    assert main(args) == 0
    assert sorted(os.listdir(tmp_path)) == ["day_0", "day_1"]
    assert "rows/s" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), "--rows", "0"])


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="`num_rows` must be a positive integer"):
        write_synthetic_criteo(tmp_path, num_rows=0, seed=0)
    with pytest.raises(ValueError, match=r"`days` must be an integer in \[1, num_rows=5\]"):
        write_synthetic_criteo(tmp_path, num_rows=5, seed=0, days=6)
    with pytest.raises(ValueError, match=r"`ctr` must be in \(0, 1\)"):
        write_synthetic_criteo(tmp_path, num_rows=5, seed=0, ctr=1.0)
    with pytest.raises(ValueError, match="`zipf_exponent` must be > 0"):
        write_synthetic_criteo(tmp_path, num_rows=5, seed=0, zipf_exponent=0)
