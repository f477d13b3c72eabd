"""TFDS builder for Criteo display-ads click logs (Kaggle / Criteo-1TB).

`CriteoDisplayAds` (TFDS name `criteo_display_ads`; TFDS's own `criteo` is
the unrelated uplift-modelling set) turns Criteo TSV files placed in
`manual_dir` into a TFDS dataset. It stores the *raw* fields, so the hash
vocabulary stays a model choice; `to_model_inputs` applies the same
transform as the streaming reader (`transform.parse_raw_fields`).

Splits are named after the files found in `manual_dir`:
`train` / `dev` / `validation` / `test` (`.tsv` or `.txt`, optionally `.gz`)
and Criteo-1TB `day_0 .. day_23` (optionally `.gz`). Rows are checked with
the reader's rules; a bad row stops preparation with a `CriteoFormatError`
naming the file and line.

Example:
    >>> import tensorflow_datasets as tfds
    >>> ds = tfds.load(
    ...     "criteo_display_ads", split="train", data_dir="/tmp/tfds",
    ...     download_and_prepare_kwargs={"download_config": tfds.download.DownloadConfig(
    ...         manual_dir="/data/criteo")})
    >>> ds = ds.map(to_model_inputs)  # (features, label) as criteo_dataset yields

References: DP-FEST (Ghazi et al., NeurIPS 2023) §4.1.1 (Criteo-Kaggle,
Criteo-time-series).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds
from etils import epath

from tfdp_embed.data.criteo.schema import CAT_FEATURES, INT_FEATURES
from tfdp_embed.data.criteo.text import iter_chunks
from tfdp_embed.data.criteo.transform import parse_raw_fields

_SPLIT_FILES = (
    re.compile(r"^(train|dev|validation|test)\.(?:tsv|txt)(?:\.gz)?$"),
    re.compile(r"^(day_\d+)(?:\.tsv|\.txt)?(?:\.gz)?$"),
)


class CriteoDisplayAds(tfds.core.GeneratorBasedBuilder):
    """Criteo display-ads click logs: 0/1 label, 13 integer and 26 hashed categorical fields."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Raw fields: int_features, int_missing, cat_features, label."}
    MANUAL_DOWNLOAD_INSTRUCTIONS = """
    Criteo data needs accepting Criteo's licence, so it is not downloaded for you.
    Put the TSV files in `manual_dir` (plain or gzip), named after the split they
    become:
      * Criteo Kaggle ("Display Advertising Challenge",
        https://ailab.criteo.com/ressources/): `train.txt` (45.8M labelled rows)
        as is, or carved into `train.tsv`, `dev.tsv`, `test.tsv`. Kaggle's own
        `test.txt` has no labels: leave it out (it fails with bad_label);
      * Criteo-1TB click logs (https://ailab.criteo.com/download-criteo-1tb-click-logs-dataset/):
        `day_0.gz` .. `day_23.gz` as downloaded; each becomes split `day_N`.
    Each line: label, I1..I13, C1..C26, tab-separated; empty = missing.
    """

    # TFDS's default `code_path` needs `importlib_resources` (etils[epath]),
    # which tensorflow-datasets does not install; the path is only used to
    # look for a (non-existent) checksums file next to this module.
    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls) -> epath.Path:
        return epath.Path(__file__)

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description=(
                "Criteo display-ads click logs. label: 1 = click. int_features: I1..I13 "
                "(0 where missing), int_missing: True where Ik was empty, cat_features: "
                "C1..C26 as written (8 hex digits, '' where missing)."
            ),
            features=tfds.features.FeaturesDict(
                {
                    "label": tfds.features.ClassLabel(names=["no_click", "click"]),
                    "int_features": tfds.features.Tensor(shape=(len(INT_FEATURES),), dtype=np.int64),
                    "int_missing": tfds.features.Tensor(shape=(len(INT_FEATURES),), dtype=np.bool_),
                    "cat_features": tfds.features.Tensor(shape=(len(CAT_FEATURES),), dtype=tf.string),
                }
            ),
            homepage="https://ailab.criteo.com/ressources/",
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        manual_dir = os.fspath(dl_manager.manual_dir)
        return {split: self._generate_examples(path) for split, path in find_split_files(manual_dir).items()}

    def _generate_examples(self, path: str):
        name = os.path.basename(path)
        row = 0
        for chunk in iter_chunks([path]):
            cats = chunk.cats.tolist()
            for i in range(len(chunk)):
                yield (
                    f"{name}:{row}",
                    {
                        "label": int(chunk.labels[i]),
                        "int_features": chunk.ints[i],
                        "int_missing": chunk.ints_missing[i],
                        "cat_features": cats[i],
                    },
                )
                row += 1


def find_split_files(manual_dir: str | os.PathLike) -> dict[str, str]:
    """`split name -> file` of the Criteo files in `manual_dir`.

    Raises:
      ValueError: no recognised file, or two files for one split.
    """
    manual_dir = os.fspath(manual_dir)
    if not os.path.isdir(manual_dir):
        raise ValueError(
            f"`manual_dir` {manual_dir!r} is not a directory. " + CriteoDisplayAds.MANUAL_DOWNLOAD_INSTRUCTIONS
        )
    splits: dict[str, str] = {}
    for name in sorted(os.listdir(manual_dir)):
        match = _SPLIT_FILES[0].match(name) or _SPLIT_FILES[1].match(name)
        if not match:
            continue
        split = match.group(1)
        if split in splits:
            raise ValueError(
                f"Two files for split {split!r} in {manual_dir}: "
                f"{os.path.basename(splits[split])} and {name}; keep one."
            )
        splits[split] = os.path.join(manual_dir, name)
    if not splits:
        raise ValueError(
            f"No Criteo files in {manual_dir} (found {sorted(os.listdir(manual_dir))[:10]}). "
            + CriteoDisplayAds.MANUAL_DOWNLOAD_INSTRUCTIONS
        )
    return splits


def to_model_inputs(
    example: Mapping[str, tf.Tensor],
    *,
    vocab_sizes: Mapping[str, int] | Sequence[int] | None = None,
    hash_size: int | None = None,
) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
    """`(features, label)` of a TFDS example, exactly as `criteo_dataset` yields.

    Works on single or batched examples (`ds.map(to_model_inputs)`).

    Args:
      example: a `criteo_display_ads` example.
      vocab_sizes: per-feature vocabulary sizes; default DP-FEST Table 3.
      hash_size: one vocabulary size for all features instead.
    """
    features = parse_raw_fields(
        example["int_features"],
        example["cat_features"],
        ints_missing=example["int_missing"],
        vocab_sizes=vocab_sizes,
        hash_size=hash_size,
    )
    return features, tf.cast(example["label"], tf.float32)


__all__ = ["CriteoDisplayAds", "find_split_files", "to_model_inputs"]
