"""Data side of the Criteo pipeline: default synthetic data, reading, batching.

A training period's files are read once with `tfdp_embed.data.criteo_dataset`
(which validates every row: bad rows raise a `CriteoFormatError` naming file
and line, or are skipped and counted with `--skip-bad-rows`) into numpy
arrays of model features; batches come from `tfdp_embed.data`:

* `poisson_batches` (default): at every step each of the N rows is included
  independently with probability q = B / N, so batch sizes vary around B;
  round(N / B) batches per epoch. This is the sampling the accounting assumes.
* `fixed_size_batches` (only with `--fixed-size-batches`): shuffled batches of
  exactly B; the privacy report then says the Poisson accounting does not
  describe them.
* `with_lookahead` (LazyDP): every batch carries, per embedding table, the
  distinct rows the *next* batch reads.

A period must fit in memory (~320 bytes per row); split huge days into
several periods (or use `tfdp_embed.data.streaming_poisson_batches`).

References: Abadi et al. 2016 (Poisson sampling in DP-SGD accounting);
LazyDP §5 (one-batch lookahead); DP-FEST §4.3 (day files as streaming periods).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence

import numpy as np

from tfdp_embed import tf
from tfdp_embed.data import (
    BatchingInfo,
    fixed_size_batches,
    poisson_batches,
    with_lookahead,
    write_synthetic_criteo,
)
from tfdp_embed.data.criteo import (
    CAT_FEATURES,
    CriteoReadStats,
    criteo_dataset,
)

_READ_BATCH = 8192


@dataclasses.dataclass(frozen=True)
class SyntheticSpec:
    """Size of the default synthetic data (`python -m pipelines.criteo` with no `--train`)."""

    train_rows: int = 200_000
    eval_rows: int = 20_000
    days: int = 1  # training days (more than one: streaming periods)
    vocab_scale: float = 0.1
    daily_drift: float = 0.05
    seed: int = 0


def write_default_data(directory: str, spec: SyntheticSpec) -> tuple[list[str], list[str]]:
    """Writes synthetic Criteo data: `spec.days` training days, then one evaluation day.

    The evaluation day is day `spec.days` of the same generator (same tokens,
    same click model, the drift of one more day), with `spec.eval_rows` rows.

    Returns:
      (training files in day order, [evaluation file]).
    """
    common = dict(seed=spec.seed, vocab_scale=spec.vocab_scale, daily_drift=spec.daily_drift)
    train = write_synthetic_criteo(
        os.path.join(directory, "train"),
        num_rows=spec.train_rows - spec.train_rows % spec.days,
        days=spec.days,
        **common,
    )
    evaluation = write_synthetic_criteo(
        os.path.join(directory, "eval"),
        num_rows=spec.eval_rows * (spec.days + 1),
        days=spec.days + 1,
        **common,
    )
    for path in evaluation[:-1]:
        os.remove(path)  # only the day after the training days is kept
    return train, evaluation[-1:]


@dataclasses.dataclass
class Period:
    """One training or evaluation stream, read into memory.

    Attributes:
      files: the files, in order.
      features: `{name: numpy array}` as `criteo_dataset` yields them, stacked.
      labels: float32 `[n]`.
      stats: the reader's `CriteoReadStats` (rows, skipped per reason).
    """

    files: list
    features: dict
    labels: np.ndarray
    stats: CriteoReadStats

    @property
    def size(self) -> int:
        return int(self.labels.size)


def read_period(
    files: Sequence[str],
    *,
    vocab_sizes: Mapping[str, int],
    skip_bad_rows: bool,
) -> Period:
    """Reads and validates `files` into a `Period`.

    Raises:
      CriteoFormatError: a file or (without `skip_bad_rows`) row fault, naming file and line.
    """
    stats = CriteoReadStats()
    dataset = criteo_dataset(
        list(files), vocab_sizes=dict(vocab_sizes), skip_bad_rows=skip_bad_rows, stats=stats
    ).batch(_READ_BATCH)
    parts: dict[str, list] = {}
    labels = []
    with stats.python_errors():
        for features, label in dataset.as_numpy_iterator():
            for name, value in features.items():
                parts.setdefault(name, []).append(value)
            labels.append(label)
    stats.raise_if_failed()
    features = {name: np.concatenate(values) for name, values in parts.items()}
    return Period(files=list(files), features=features, labels=np.concatenate(labels), stats=stats)


def examples(period: Period) -> tf.data.Dataset:
    """Unbatched `(features, label[1])` examples of an in-memory period."""
    return tf.data.Dataset.from_tensor_slices((period.features, period.labels[:, None]))


def table_ids(features) -> dict:
    """`{DPEmbedding layer name: bucket ids}` of a batch (what LazyDP's lookahead needs)."""
    return {f"embedding_{name}": features[name] for name in CAT_FEATURES}


def train_batches(
    period: Period,
    *,
    batch_size: int,
    poisson: bool,
    lookahead: bool,
    seed: int | None,
) -> tuple[tf.data.Dataset, BatchingInfo]:
    """Training batches of one period: Poisson (q = B / N) or, on request, fixed-size shuffled.

    One iteration of the returned dataset is one epoch: round(N / B) Poisson
    batches (fresh ones on every iteration), or floor(N / B) shuffled ones.

    Args:
      period: the in-memory training data.
      batch_size: B, the expected (Poisson) or exact (fixed) batch size.
      poisson: Poisson sampling; False for fixed-size shuffled batches.
      lookahead: append `{layer name: next batch's distinct rows}` (LazyDP).
      seed: sampling seed (None: OS entropy).

    Returns:
      `(dataset, BatchingInfo)` from `tfdp_embed.data`.

    Raises:
      ValueError: `batch_size` larger than the period.
    """
    if batch_size > period.size:
        raise ValueError(
            f"`--batch` {batch_size} is larger than the {period.size} training rows of "
            f"{period.files}; allowed: 1..{period.size}."
        )
    if poisson:
        batches, info = poisson_batches(
            examples(period), sampling_probability=batch_size / period.size, seed=seed, num_examples=period.size
        )
    else:
        batches, info = fixed_size_batches(examples(period), batch_size=batch_size, seed=seed, num_examples=period.size)
    if lookahead:
        batches = with_lookahead(batches, table_ids)
    return batches.prefetch(2), info


def touched_rows(batches: tf.data.Dataset, dims: Mapping[str, int], *, max_batches: int = 20) -> float:
    """Mean dim-weighted count of distinct rows a batch reads: sum_f |unique(ids_f)| dim_f.

    Measured on up to `max_batches` batches of a fresh iteration of `batches`.
    """
    totals = []
    for element in batches.take(max_batches):
        features = element[0]
        totals.append(sum(int(tf.size(tf.unique(features[f]).y)) * int(dims[f]) for f in CAT_FEATURES))
    return float(np.mean(totals)) if totals else float("nan")


def eval_dataset(period: Period, batch_size: int = 4096) -> tf.data.Dataset:
    """Batched `(features, labels)` of an in-memory evaluation period."""
    return tf.data.Dataset.from_tensor_slices((period.features, period.labels)).batch(batch_size)


def period_dataset(period: Period, batch_size: int = 4096) -> tf.data.Dataset:
    """Batched features only (for bucket counting)."""
    return tf.data.Dataset.from_tensor_slices(period.features).batch(batch_size)


__all__ = [
    "Period",
    "SyntheticSpec",
    "eval_dataset",
    "examples",
    "period_dataset",
    "read_period",
    "table_ids",
    "touched_rows",
    "train_batches",
    "write_default_data",
]
