"""Tests of the `criteo_display_ads` TFDS builder on tiny generated files."""

from __future__ import annotations

import os

import numpy as np
import pytest

tfds = pytest.importorskip("tensorflow_datasets")

from tfdp_embed.data.criteo import CriteoFormatError, criteo_dataset  # noqa: E402
from tfdp_embed.data.criteo.synthetic import write_synthetic_criteo  # noqa: E402
from tfdp_embed.data.criteo.tfds import (  # noqa: E402
    CriteoDisplayAds,
    find_split_files,
    to_model_inputs,
)


@pytest.fixture(scope="module")
def manual_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("criteo_manual")
    paths = write_synthetic_criteo(root, num_rows=240, seed=5, days=3, vocab_scale=0.01)
    for path, name in zip(paths, ["train.tsv", "dev.tsv", "test.tsv"]):
        os.rename(path, root / name)
    return root


def _by_key(features: dict, labels) -> dict:
    """Rows keyed by their raw categorical values, for order-free comparison."""
    keys = [tuple(row) for row in features["raw_cats"].numpy().tolist()]
    return {k: (i, labels[i]) for i, k in enumerate(keys)}


def test_download_and_prepare_from_manual_dir(manual_dir, tmp_path):
    builder = CriteoDisplayAds(data_dir=str(tmp_path / "tfds"))
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=str(manual_dir)))
    assert builder.info.name == "criteo_display_ads"
    assert {s: builder.info.splits[s].num_examples for s in ["train", "dev", "test"]} == {
        "train": 80,
        "dev": 80,
        "test": 80,
    }
    # Same rows, labels and model features as the streaming reader (TFDS reorders rows).
    reader = criteo_dataset(str(manual_dir / "dev.tsv"), include_raw=True, batch_size=1000)
    ours, our_labels = next(iter(reader))
    theirs = builder.as_dataset(split="dev", batch_size=1000)
    example = next(iter(theirs))
    features, labels = to_model_inputs(example)
    index = _by_key(ours, our_labels.numpy())
    order = [index[tuple(row)][0] for row in example["cat_features"].numpy().tolist()]
    np.testing.assert_array_equal(labels.numpy(), our_labels.numpy()[order])
    for name, value in features.items():
        np.testing.assert_array_equal(value.numpy(), ours[name].numpy()[order], err_msg=name)
    np.testing.assert_array_equal(example["int_features"].numpy(), ours["raw_ints"].numpy()[order])

    # tfds.load finds the registered builder by name and reuses the prepared data.
    loaded = tfds.load("criteo_display_ads", split="train", data_dir=str(tmp_path / "tfds"))
    assert sum(1 for _ in loaded) == 80
    one = next(iter(loaded.map(lambda ex: to_model_inputs(ex, hash_size=10))))
    assert one[0]["C1"].shape == () and 0 <= int(one[0]["C1"]) <= 10


def test_split_file_discovery(tmp_path):
    for name in ["train.txt.gz", "day_3.gz", "day_10", "README", "dev.tsv"]:
        (tmp_path / name).write_text("0\n")
    assert sorted(find_split_files(tmp_path)) == ["day_10", "day_3", "dev", "train"]
    (tmp_path / "train.tsv").write_text("0\n")
    with pytest.raises(ValueError, match="Two files for split 'train'"):
        find_split_files(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"(?s)No Criteo files.*manual_dir"):
        find_split_files(tmp_path / "empty")


def test_bad_row_stops_preparation_with_file_and_line(tmp_path):
    manual = tmp_path / "manual"
    manual.mkdir()
    good = "\t".join(["0"] + ["1"] * 13 + ["68fd1e64"] * 26)
    (manual / "train.tsv").write_text(f"{good}\n{good}\n2\t1\n")
    builder = CriteoDisplayAds(data_dir=str(tmp_path / "tfds"))
    with pytest.raises(CriteoFormatError, match=r"train.tsv, line 3: label"):
        builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=str(manual)))
