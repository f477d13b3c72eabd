"""Data side of the Criteo pipeline: default synthetic data, reading, batching.

Every file of a period is read and validated with
`tfdp_embed.data.criteo_dataset` (bad rows raise a `CriteoFormatError`
naming file and line, or are skipped and counted with `--skip-bad-rows`).
A period then lives in one of two forms (`--streaming {auto,on,off}`):

* **in memory** (`read_period`): its rows as numpy arrays of model
  features, so memory grows with N (the read, TensorFlow's copy for
  sampling and the evaluation pass add to the peak); fastest, one read of
  the files in all.
* **streaming** (`scan_period`): one pass counts the valid rows (N, needed
  for q = B / N and for the pass check) and, when a mechanism selects rows,
  the per-bucket counts; no row is kept. Training batches are then drawn by
  `tfdp_embed.data.one_pass_poisson_batches` (default): each epoch reads the
  files once, every row draws the steps it joins, the sampled rows are
  spilled to local disk (`spill_dir`, about N rows per epoch, removed as
  they are read back) and read back in step order one bucket of
  `stream_buffer_rows` rows at a time, so memory is independent of N.
  `sampler="multi_pass"` uses `streaming_poisson_batches` instead (no
  disk; the files are read ceil(round(N / B) / G) times per epoch, G =
  `stream_buffer_rows` // B; the report says `passes_per_epoch`).
  Evaluation data is streamed in batches.

`--streaming auto` (default) keeps a period in memory up to
`STREAMING_ROW_THRESHOLD` rows and streams larger ones: the in-memory read
stops at the threshold and the period is scanned instead. The threshold
bounds the extra peak memory of the in-memory form (measured in
`benchmarks/RESULTS.md`, "Criteo pipeline: peak RSS vs training rows").

Batches (both forms) come from `tfdp_embed.data`:

* Poisson (default): at every step each of the N rows is included
  independently with probability q = B / N, so batch sizes vary around B;
  round(N / B) batches per epoch. This is the sampling the accounting
  assumes; both samplers are exact.
* fixed-size shuffled batches (only with `--fixed-size-batches`): batches of
  exactly B, each row once per epoch (in memory: a full shuffle; streaming:
  a shuffle buffer of `stream_buffer_rows` rows); the privacy report then
  says the Poisson accounting does not describe them.
* `with_lookahead` (LazyDP): every batch carries, per embedding table, the
  distinct rows the *next* batch reads.

References: Abadi et al. 2016 (Poisson sampling in DP-SGD accounting);
Chua et al., NeurIPS 2024 (Poisson batches at scale); LazyDP §5 (one-batch
lookahead); DP-FEST §4.3 (day files as streaming periods, running counts).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tfdp_embed import tf
from tfdp_embed.data import (
    BatchingInfo,
    fixed_size_batches,
    one_pass_poisson_batches,
    poisson_batches,
    streaming_poisson_batches,
    with_lookahead,
    write_synthetic_criteo,
)
from tfdp_embed.data.criteo import (
    CAT_FEATURES,
    CriteoReadStats,
    criteo_dataset,
    table_sizes,
)

_READ_BATCH = 8192
STREAMING_MODES = ("auto", "on", "off")
STREAMING_ROW_THRESHOLD = 1_000_000
"""`--streaming auto`: periods with more valid rows than this are streamed."""
DEFAULT_STREAM_BUFFER_ROWS = 1 << 19
"""Streaming: rows of training batches held at once (one spill bucket; multi-pass: G = this // B batches per pass)."""
STREAM_SAMPLERS = ("one_pass", "multi_pass")


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
    common: dict[str, Any] = dict(seed=spec.seed, vocab_scale=spec.vocab_scale, daily_drift=spec.daily_drift)
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
    """One training or evaluation stream: its files, how to read them, and (in memory) its rows.

    Attributes:
      files: the files, in order.
      vocab_sizes: per-feature vocabulary sizes the ids are hashed with.
      skip_bad_rows: skip and count malformed rows (else they raise).
      stats: the reader's `CriteoReadStats` of the validating read (rows,
        skipped per reason); later streaming passes do not add to it.
      size: valid rows N.
      features: `{name: numpy array}` as `criteo_dataset` yields them,
        stacked; None for a streaming period.
      labels: float32 `[n]`; None for a streaming period.
      counts: `{Ck: int64 [V + 1]}` bucket counts of this period's rows when
        the scan was asked for them (streaming), else None. NON-private:
        only for a DP selection.
      format: the files' text layout ("auto", "tsv", "csv"; `--format`).
    """

    files: list
    vocab_sizes: dict
    skip_bad_rows: bool
    stats: CriteoReadStats
    size: int
    features: dict | None = None
    labels: np.ndarray | None = None
    counts: dict | None = None
    format: str = "auto"

    @property
    def streaming(self) -> bool:
        """True when the rows are not held in memory (read from the files on every pass)."""
        return self.features is None

    def source(self, batch_size: int = _READ_BATCH) -> tf.data.Dataset:
        """A fresh read of the files: batches of consecutive `(features, labels)`.

        Rows were validated by the first read; a later read uses its own
        `CriteoReadStats`, so the period's counts are not inflated by passes.
        """
        return criteo_dataset(
            list(self.files),
            vocab_sizes=dict(self.vocab_sizes),
            skip_bad_rows=self.skip_bad_rows,
            stats=CriteoReadStats(),
            batch_size=batch_size,
            format=self.format,
        )


def _reader(files, vocab_sizes, skip_bad_rows, stats, format="auto") -> tf.data.Dataset:
    return criteo_dataset(
        list(files),
        vocab_sizes=dict(vocab_sizes),
        skip_bad_rows=skip_bad_rows,
        stats=stats,
        batch_size=_READ_BATCH,
        format=format,
    )


def read_period(
    files: Sequence[str],
    *,
    vocab_sizes: Mapping[str, int],
    skip_bad_rows: bool,
    max_rows: int | None = None,
    format: str = "auto",
) -> Period | None:
    """Reads and validates `files` into an in-memory `Period`.

    Args:
      files: the period's files, in order.
      vocab_sizes: per-feature vocabulary sizes.
      skip_bad_rows: skip and count malformed rows.
      max_rows: stop and return None as soon as more than this many valid
        rows were read (`--streaming auto`); None reads everything.

    Raises:
      CriteoFormatError: a file or (without `skip_bad_rows`) row fault, naming file and line.
    """
    stats = CriteoReadStats()
    parts: dict[str, list] = {}
    label_parts, rows = [], 0
    with stats.python_errors():
        for features, label in _reader(files, vocab_sizes, skip_bad_rows, stats, format).as_numpy_iterator():
            rows += label.size
            if max_rows is not None and rows > max_rows:
                return None
            for name, value in features.items():
                parts.setdefault(name, []).append(value)
            label_parts.append(label)
    stats.raise_if_failed()
    features = {name: np.concatenate(values) for name, values in parts.items()}
    labels = np.concatenate(label_parts) if label_parts else np.zeros([0], np.float32)
    return Period(
        list(files), dict(vocab_sizes), skip_bad_rows, stats, int(labels.size), features, labels, format=format
    )


def scan_period(
    files: Sequence[str],
    *,
    vocab_sizes: Mapping[str, int],
    skip_bad_rows: bool,
    count_buckets: bool = False,
    format: str = "auto",
) -> Period:
    """One validating pass over `files` that keeps no row: a streaming `Period`.

    Counts the valid rows (N) and, with `count_buckets`, the per-bucket
    counts of every categorical feature (memory: the count vectors, i.e. the
    vocabulary; independent of N).

    Raises:
      CriteoFormatError: a file or (without `skip_bad_rows`) row fault, naming file and line.
    """
    stats = CriteoReadStats()
    sizes = table_sizes(dict(vocab_sizes))
    counts = {name: np.zeros(sizes[name], np.int64) for name in CAT_FEATURES} if count_buckets else None
    rows = 0
    with stats.python_errors():
        for features, label in _reader(files, vocab_sizes, skip_bad_rows, stats, format).as_numpy_iterator():
            rows += label.size
            if counts is not None:
                for name in CAT_FEATURES:
                    counts[name] += np.bincount(features[name], minlength=sizes[name])
    stats.raise_if_failed()
    return Period(list(files), dict(vocab_sizes), skip_bad_rows, stats, rows, counts=counts, format=format)


def open_period(
    files: Sequence[str],
    *,
    streaming: str,
    vocab_sizes: Mapping[str, int],
    skip_bad_rows: bool,
    count_buckets: bool = False,
    threshold: int = STREAMING_ROW_THRESHOLD,
    format: str = "auto",
) -> Period:
    """Reads a period in memory (`streaming="off"`), scans it (`"on"`), or picks by size (`"auto"`).

    `"auto"` reads into memory and falls back to a scan as soon as the
    period has more than `threshold` valid rows.

    Raises:
      ValueError: an unknown `streaming` mode.
      CriteoFormatError: bad input (names file and line).
    """
    if streaming not in STREAMING_MODES:
        raise ValueError(f"`streaming` must be one of {STREAMING_MODES}; received {streaming!r}.")
    read: dict[str, Any] = dict(vocab_sizes=vocab_sizes, skip_bad_rows=skip_bad_rows, format=format)
    if streaming != "on":
        period = read_period(files, **read, max_rows=threshold if streaming == "auto" else None)
        if period is not None:
            return period
    return scan_period(files, **read, count_buckets=count_buckets)


def bucket_counts(period: Period, *, counts: Mapping[str, np.ndarray] | None = None) -> dict:
    """`{Ck: int64 [V + 1]}` bucket counts of the period's rows, added to `counts` (running sums).

    In memory: counted from the arrays; streaming: the scan's counts (or one
    more pass over the files if the scan did not count). NON-private: only
    for a DP selection (DP-FEST §4.3: running sum per streaming period).
    """
    sizes = table_sizes(dict(period.vocab_sizes))
    if period.features is not None:
        own: dict | None = {name: np.bincount(period.features[name], minlength=sizes[name]) for name in CAT_FEATURES}
    elif period.counts is not None:
        own = period.counts
    else:
        own = scan_period(
            period.files,
            vocab_sizes=period.vocab_sizes,
            skip_bad_rows=period.skip_bad_rows,
            count_buckets=True,
            format=period.format,
        ).counts
    assert own is not None  # the scan counted buckets (count_buckets=True)
    result = {name: own[name].astype(np.int64) for name in CAT_FEATURES}
    if counts is not None:
        for name in CAT_FEATURES:
            result[name] = result[name] + np.asarray(counts[name], np.int64)
    return result


def examples(period: Period) -> tuple:
    """`(features, labels [n, 1])` arrays of an in-memory period (what `poisson_batches` samples from).

    Passed as arrays, not as a `tf.data.Dataset` of examples: loading 40
    per-example tensors per row through `tf.data` takes many times the
    memory of the arrays.
    """
    if period.features is None or period.labels is None:
        raise ValueError(f"Period {period.files} is streamed: its rows are not in memory; use `period.source()`.")
    return period.features, period.labels[:, None]


def table_ids(features) -> dict:
    """`{DPEmbedding layer name: bucket ids}` of a batch for unstacked tables (what LazyDP's lookahead needs).

    A model with stacked tables takes `tfdp_embed.keras2.models.ctr.table_ids_fn(model_config)` instead.
    """
    return {f"embedding_{name}": features[name] for name in CAT_FEATURES}


def batches_per_pass(batch_size: int, buffer_rows: int) -> int:
    """G for streaming: how many batches of expected size B fit `buffer_rows` rows (at least 1)."""
    return max(1, int(buffer_rows) // int(batch_size))


def train_batches(
    period: Period,
    *,
    batch_size: int,
    poisson: bool,
    lookahead: bool,
    seed: int | None,
    table_ids=table_ids,
    stream_buffer_rows: int = DEFAULT_STREAM_BUFFER_ROWS,
    sampler: str = "one_pass",
    spill_dir: str | None = None,
    sampling_probability: float | None = None,
) -> tuple[tf.data.Dataset, BatchingInfo]:
    """Training batches of one period: Poisson (q = B / N) or, on request, fixed-size shuffled.

    One iteration of the returned dataset is one epoch: round(N / B) Poisson
    batches (fresh ones on every iteration), or floor(N / B) shuffled ones.
    In memory: `poisson_batches`; streaming: `one_pass_poisson_batches`
    (files read once per epoch, sampled rows spilled to `spill_dir`), or
    with `sampler="multi_pass"` `streaming_poisson_batches` with
    G = `stream_buffer_rows` // B batches per pass over the files.

    Args:
      period: the training data (in memory or streaming).
      batch_size: B, the expected (Poisson) or exact (fixed) batch size.
      poisson: Poisson sampling; False for fixed-size shuffled batches.
      lookahead: append `{layer name: next batch's distinct rows}` (LazyDP).
      seed: sampling seed (None: OS entropy).
      table_ids: features -> `{layer name: ids}` for the lookahead: the model's
        (`ctr.table_ids_fn(model_config)` for stacked tables); default one table per feature.
      stream_buffer_rows: streaming only: rows of batches held at once.
      sampler: streaming Poisson only: "one_pass" (default) or "multi_pass".
      spill_dir: one-pass only: directory for the spill (None: the system temp directory).
      sampling_probability: Poisson q (default B / N); the pipeline passes B / N~, N released with DP.

    Returns:
      `(dataset, BatchingInfo)` from `tfdp_embed.data`.

    Raises:
      ValueError: `batch_size` larger than the period, or an unknown `sampler`.
    """
    if batch_size > period.size:
        raise ValueError(f"`--batch` {batch_size} is larger than the training rows of {period.files}.")
    if sampler not in STREAM_SAMPLERS:
        raise ValueError(f"`sampler` must be one of {STREAM_SAMPLERS}; received {sampler!r}.")
    q = batch_size / period.size if sampling_probability is None else float(sampling_probability)
    if period.streaming and poisson:
        batches, info = _streaming_poisson_batches(
            period, q, batch_size, sampler=sampler, seed=seed, buffer_rows=stream_buffer_rows, spill_dir=spill_dir
        )
    elif period.streaming:
        batches, info = _streaming_shuffled_batches(period, batch_size, seed=seed, buffer_rows=stream_buffer_rows)
    elif poisson:
        batches, info = poisson_batches(examples(period), sampling_probability=q, seed=seed, num_examples=period.size)
    else:
        batches, info = fixed_size_batches(examples(period), batch_size=batch_size, seed=seed, num_examples=period.size)
    if lookahead:
        batches = with_lookahead(batches, table_ids)
    return batches.prefetch(2), info


def _streaming_poisson_batches(
    period: Period, q: float, batch_size: int, *, sampler: str, seed: int | None, buffer_rows: int, spill_dir
) -> tuple[tf.data.Dataset, BatchingInfo]:
    """Poisson batches of a streaming period: one pass per epoch with a spill, or `sampler="multi_pass"`."""
    if sampler == "one_pass":
        return one_pass_poisson_batches(
            period.source().map(lambda features, labels: (features, labels[:, None])),
            sampling_probability=q,
            num_examples=period.size,
            seed=seed,
            spill_dir=spill_dir,
            bucket_rows=buffer_rows,
            source_batched=True,
        )
    source = period.source().map(lambda features, labels: (features, labels[:, None]))
    return streaming_poisson_batches(
        source,
        sampling_probability=q,
        num_examples=period.size,
        batches_per_pass=batches_per_pass(batch_size, buffer_rows),
        seed=seed,
        source_batched=True,
    )


def _streaming_shuffled_batches(
    period: Period, batch_size: int, *, seed: int | None, buffer_rows: int
) -> tuple[tf.data.Dataset, BatchingInfo]:
    """Fixed-size batches of a streaming period, shuffled through a buffer of `buffer_rows` rows (NOT Poisson)."""
    buffer = max(int(buffer_rows), batch_size)
    batches = (
        period.source()
        .unbatch()
        .shuffle(buffer, seed=seed, reshuffle_each_iteration=True)
        .batch(batch_size, drop_remainder=True)
        .map(lambda features, labels: (features, labels[:, None]))
    )
    info = BatchingInfo(
        batching="fixed_shuffled",
        num_examples=period.size,
        sampling_probability=batch_size / period.size,
        expected_batch_size=float(batch_size),
        batches_per_epoch=period.size // batch_size,
        streaming=True,
        seeded=seed is not None,
    )
    return batches, info


def passes_per_epoch(info: BatchingInfo) -> int:
    """Reads of the training files per epoch: 0 in memory (read once, before training); streaming:
    ceil(batches / G) for multi-pass Poisson batches, 1 for one-pass and shuffled ones."""
    if not info.streaming:
        return 0
    if not info.batches_per_pass:  # one-pass (spill) or shuffled
        return 1
    return math.ceil(info.batches_per_epoch / min(info.batches_per_pass, info.batches_per_epoch))


class TouchedRows:
    """Mean dim-weighted count of distinct rows a training batch reads: sum_f |unique(ids_f)| dim_f.

    `wrap(batches)` measures every batch the training pipeline produces (no
    extra pass over the data; prefetched batches count too).
    """

    def __init__(self, dims: Mapping[str, int]):
        self.dims = dict(dims)
        self.total = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        self.batches = tf.Variable(0, dtype=tf.int64, trainable=False)

    def wrap(self, batches: tf.data.Dataset) -> tf.data.Dataset:
        def measure(*element):
            features = element[0]
            rows = tf.add_n(
                [tf.cast(tf.size(tf.unique(features[f]).y) * int(self.dims[f]), tf.float64) for f in CAT_FEATURES]
            )
            with tf.control_dependencies([self.total.assign_add(rows), self.batches.assign_add(1)]):
                return tf.nest.map_structure(tf.identity, element)

        return batches.map(measure)

    def mean(self) -> float:
        batches = int(self.batches.numpy())
        return float(self.total.numpy()) / batches if batches else float("nan")


def row_batches(period: Period, batch_size: int = _READ_BATCH):
    """Consecutive `(features, labels)` numpy batches of a period, every row once, in file order.

    In memory the batches are views of the period's arrays (nothing is
    copied); streaming, each iteration reads the files again. A pass in
    numpy is what the pipeline's evaluation and output calibration iterate:
    slicing a `tf.data.Dataset.from_tensor_slices` of the arrays row by row
    costs many times the forward pass.

    Returns:
      A re-iterable of `(dict[str, np.ndarray], float32 np.ndarray [n])`.
    """
    if period.streaming:
        return _Reread(lambda: period.source(batch_size).as_numpy_iterator())

    def views():
        for start in range(0, period.size, batch_size):
            stop = start + batch_size
            yield {name: value[start:stop] for name, value in period.features.items()}, period.labels[start:stop]

    return _Reread(views)


class _Reread:
    """An iterable that starts `make()` afresh on every iteration (a generator function made re-iterable)."""

    def __init__(self, make):
        self._make = make

    def __iter__(self):
        return iter(self._make())


def eval_dataset(period: Period, batch_size: int = 4096) -> tf.data.Dataset:
    """Batched `(features, labels)` of an evaluation period (from memory, or streamed from the files)."""
    if period.streaming:
        return period.source(batch_size)
    assert period.features is not None and period.labels is not None  # not streamed: in memory
    signature = (
        {name: tf.TensorSpec([None, *value.shape[1:]], value.dtype) for name, value in period.features.items()},
        tf.TensorSpec([None], period.labels.dtype),
    )
    batches = row_batches(period, batch_size)
    return tf.data.Dataset.from_generator(lambda: iter(batches), output_signature=signature)


__all__ = [
    "DEFAULT_STREAM_BUFFER_ROWS",
    "STREAMING_MODES",
    "STREAMING_ROW_THRESHOLD",
    "STREAM_SAMPLERS",
    "Period",
    "SyntheticSpec",
    "TouchedRows",
    "batches_per_pass",
    "bucket_counts",
    "eval_dataset",
    "examples",
    "open_period",
    "passes_per_epoch",
    "read_period",
    "row_batches",
    "scan_period",
    "table_ids",
    "train_batches",
    "write_default_data",
]
