"""One-pass exact Poisson batches of data too large to hold: map, spill to disk, read back by step.

An epoch of T = round(1/q) Poisson steps over N examples is the N x T grid
of independent Bernoulli(q) cells "example i joins step t". The grid is
sampled row block by row block while the source is read once (Chua et al.
2024, §5: map each example to the steps it joins, group by step):

    cells of a block of m examples: 0 .. m T - 1, cell c = (example c // T, step c % T)
    joined cells: c_k = g_1 + ... + g_k - 1,  g_j ~ Geometric(q) i.i.d.   (skips between successes)

The gaps of a Bernoulli(q) sequence are i.i.d. Geometric(q), so every cell
is joined independently with probability q (numpy's geometric sampler, by
inversion of a float64 uniform); each block starts a fresh sequence, which
the memorylessness of the Bernoulli sequence allows.

Each joined (step, example) record is appended to a spill file on local
disk, fixed-width binary (numpy records, step-major within each read
chunk), one file per bucket of `steps_per_bucket` consecutive steps. After
the pass the buckets are read back in step order, one at a time, grouped
by step (one stable argsort) and yielded as batches: round(1/q) batches
per epoch, every batch exactly Poisson, the source read once per epoch.
Each batch leaves Python as one uint8 `[batch, record bytes]` array; the
tf.data graph (built once) splits it into the source's components.

Memory: one read chunk plus one bucket, held once as its records (about
steps_per_bucket x qN records = `bucket_rows`), independent of N. Disk: about N records per
epoch (T q N), removed as each bucket is consumed.

Oversized batches (`max_batch_size`) are cut to a uniformly random subset
and counted, as in `tfdp_embed.data.poisson`; `fixed_shape_batches` then
pads them to a static shape.

Example:
    >>> batches, info = one_pass_poisson_batches(reader, sampling_probability=q, num_examples=n,
    ...     source_batched=True, spill_dir="/local/ssd")
    >>> model.fit(batches, epochs=3)     # reads the files 3 times in all

References: Chua et al., "Scalable DP-SGD: Shuffling vs. Poisson
Subsampling", NeurIPS 2024 (massively parallel Poisson batch
construction); Abadi et al. 2016 §3.1 (Poisson lots); DP-FEST §4.3
(streaming periods: one call per period).
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf

from tfdp_embed.data.poisson import BatchingInfo, _check_cap, _check_q, _poisson_info
from tfdp_embed.data.provenance import register
from tfdp_embed_beam.sampling import joined_cells

ONE_PASS = "one_pass_spill"
"""`BatchingInfo.sampler` of `one_pass_poisson_batches`."""
DEFAULT_BUCKET_ROWS = 1 << 19
_WRITE_BUFFERS_BYTES = 32 << 20  # all buckets' write buffers together: pieces coalesce into larger writes


@dataclasses.dataclass
class SpillStats:
    """What the spill cost, summed over the epochs run so far (Python counters, updated while iterating).

    Attributes:
      epochs: epochs whose pass finished.
      rows_read: examples read from the source.
      records_written: (step, example) records spilled.
      bytes_written: bytes written to the spill files.
      largest_bucket_records: most records held in memory at once from one bucket.
      buckets: spill files per epoch.
    """

    epochs: int = 0
    rows_read: int = 0
    records_written: int = 0
    bytes_written: int = 0
    largest_bucket_records: int = 0
    buckets: int = 0


def one_pass_poisson_batches(
    dataset: tf.data.Dataset,
    *,
    sampling_probability: float,
    num_examples: int,
    seed: int | None = None,
    max_batch_size: int | None = None,
    spill_dir: str | None = None,
    bucket_rows: int = DEFAULT_BUCKET_ROWS,
    source_batched: bool = False,
    read_chunk_size: int = 8192,
) -> tuple[tf.data.Dataset, BatchingInfo]:
    """Exact Poisson batches, reading `dataset` once per epoch; memory independent of N.

    P[example i in batch t] = q independently over i and t; round(1/q) batches per epoch.

    Args:
      dataset: examples with fully defined per-example shapes (numeric
        dtypes); unbatched, or (`source_batched=True`) batches of
        consecutive examples of any sizes. Each iteration must yield all
        `num_examples` examples exactly once (checked at the end of the pass).
      sampling_probability: q in (0, 1].
      num_examples: N (> 0).
      seed: int for reproducible batches, None for OS entropy (per epoch).
      max_batch_size: optional cap: larger batches are cut to a uniform random subset and counted.
      spill_dir: directory for the spill files (a fresh subdirectory per
        epoch, removed when the epoch ends); None: the system temp directory.
      bucket_rows: expected records per spill file (memory of the read-back).
      source_batched: the source yields batches of examples.
      read_chunk_size: examples per block while reading an unbatched source.

    Returns:
      `(batches, info)`; `info.sampler` is "one_pass_spill" and
      `info.spill` (a `SpillStats`) counts what was spilled.

    Raises:
      ValueError: bad arguments, or per-example shapes not fully defined / non-numeric.
      tf.errors.OpError (while iterating; `UnknownError` wrapping an
        `InvalidArgumentError`): the source did not yield exactly
        `num_examples` examples.

    References: Chua et al. 2024 (map, group by step, truncate).
    """
    q, cap = _check_q(sampling_probability), _check_cap(max_batch_size)
    _check_count("num_examples", num_examples)
    _check_count("bucket_rows", bucket_rows)
    specs = _example_specs(dataset, source_batched)
    info = _poisson_info(num_examples, q, cap, seed, streaming=True, batches_per_pass=None)
    info.sampler = ONE_PASS
    chunks = dataset if source_batched else dataset.batch(read_chunk_size)
    layout = _Layout(specs, info.batches_per_epoch, max(1, bucket_rows // max(1, round(q * num_examples))))
    _check_open_files(layout.buckets, bucket_rows)
    stats = info.spill = SpillStats(buckets=layout.buckets)
    epochs = _EpochSeeds(seed)

    def generate():
        rng = np.random.Generator(np.random.PCG64(epochs.next()))
        yield from _epoch(chunks, layout, num_examples, q, cap, rng, spill_dir, stats)

    return register(_decoded_batches(generate, layout, specs, info, cap), info), info


def _check_count(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be an int >= 1; received {value!r}.")


def _decoded_batches(generate, layout: _Layout, specs, info: BatchingInfo, cap: int | None) -> tf.data.Dataset:
    """The batches of `generate`'s `(records, cut)` pairs, decoded to `specs`; truncations counted in `info`."""
    # One uint8 [batch, record bytes] tensor per step crosses from Python; the graph splits it into columns.
    raw = tf.TensorSpec([None, layout.dtype.itemsize], tf.uint8)
    flat = tf.data.Dataset.from_generator(generate, output_signature=(raw, tf.TensorSpec([], tf.int64)))

    def unflatten(records, cut):
        components = layout.decode(records)
        if cap is not None:
            counted = [
                info.truncated_batches.assign_add(tf.cast(cut > 0, tf.int64)),
                info.truncated_examples.assign_add(cut),
            ]
            with tf.control_dependencies(counted):
                components = [tf.identity(c) for c in components]
        return tf.nest.pack_sequence_as(specs, components)

    return flat.map(unflatten)


# -- one epoch ----------------------------------------------------------------------


@dataclasses.dataclass
class _Layout:
    """How records are laid out: the numpy record type (step, then one field per component) and the buckets."""

    specs: object
    steps: int
    steps_per_bucket: int

    def __post_init__(self):
        fields = [("step", np.int64)]
        fields += [(f"c{i}", s.dtype.as_numpy_dtype, tuple(s.shape)) for i, s in enumerate(tf.nest.flatten(self.specs))]
        self.dtype = np.dtype(fields)
        self.buckets = math.ceil(self.steps / self.steps_per_bucket)

    def decode(self, records: tf.Tensor) -> list[tf.Tensor]:
        """The flat components of a uint8 `[batch, itemsize]` tensor of records (in-graph, no copy in Python)."""
        components = []
        for i, spec in enumerate(tf.nest.flatten(self.specs)):
            field, offset = self.dtype.fields[f"c{i}"][:2]
            size, width = field.base.itemsize, math.prod(spec.shape)
            part = records[:, offset : offset + width * size]
            if spec.dtype == tf.bool:
                values = tf.cast(part, tf.bool)  # numpy stores bool as one byte, 0 or 1
            elif size == 1:
                values = tf.bitcast(part, spec.dtype)
            else:
                values = tf.bitcast(tf.reshape(part, [-1, width, size]), spec.dtype)
            components.append(tf.reshape(values, [-1, *spec.shape]))
        return components


def _open_file_limit() -> int:
    """The soft limit on open files of this process (RLIMIT_NOFILE)."""
    import resource

    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _check_open_files(buckets: int, bucket_rows: int) -> None:
    """The pass keeps one file open per bucket: refuse early when that exceeds the open-file limit."""
    limit = _open_file_limit()
    if limit != -1 and buckets > limit - 64:  # leave room for the source's and TensorFlow's own files
        raise ValueError(
            f"`bucket_rows`={bucket_rows} gives {buckets} spill buckets, each an open file during the pass, but the "
            f"open-file limit is {limit}: raise `bucket_rows` (memory of the read-back) or the limit (`ulimit -n`)."
        )


class _EpochSeeds:
    """Per-epoch numpy seeds: from (seed, epoch) when seeded, else OS entropy."""

    def __init__(self, seed: int | None):
        self.seed, self.epoch = seed, 0

    def next(self) -> np.random.SeedSequence:
        self.epoch += 1
        if self.seed is None:
            return np.random.SeedSequence()
        return np.random.SeedSequence([int(self.seed) & (2**63 - 1), self.epoch])


def _epoch(chunks, layout: _Layout, n: int, q: float, cap, rng, spill_dir, stats: SpillStats):
    """Generator of one epoch: the pass that spills, then the batches in step order."""
    directory = tempfile.mkdtemp(prefix="poisson_spill_", dir=spill_dir)
    try:
        paths = [os.path.join(directory, f"bucket_{b:06d}.bin") for b in range(layout.buckets)]
        _spill(chunks, layout, n, q, rng, paths, stats)
        for b, path in enumerate(paths):
            yield from _read_bucket(path, b, layout, cap, rng, stats)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _spill(chunks, layout: _Layout, n: int, q: float, rng, paths: list, stats: SpillStats) -> None:
    """Reads the source once; appends every joined (step, example) record to its bucket's file."""
    buffering = min(4 << 20, max(1 << 16, _WRITE_BUFFERS_BYTES // len(paths)))
    files = [open(path, "wb", buffering=buffering) for path in paths]
    seen = 0
    try:
        for chunk in chunks.prefetch(2).as_numpy_iterator():
            components = tf.nest.flatten(chunk)
            m = int(components[0].shape[0])
            cells = joined_cells(rng, m * layout.steps, q)
            example, step = np.divmod(cells, layout.steps)
            # Step-major order (stable: examples stay in source order within a step); buckets are step ranges.
            order = np.argsort(step, kind="stable")
            records = np.empty(cells.size, layout.dtype)
            records["step"] = step[order]
            rows = example[order]
            for i, component in enumerate(components):
                records[f"c{i}"] = component[rows]
            bounds = np.searchsorted(records["step"], np.arange(layout.buckets + 1) * layout.steps_per_bucket)
            for b in np.flatnonzero(np.diff(bounds)):
                files[b].write(records[bounds[b] : bounds[b + 1]].view(np.uint8).data)
            seen += m
            stats.rows_read += m
            stats.records_written += int(cells.size)
            stats.bytes_written += int(records.nbytes)
    finally:
        for f in files:
            f.close()
    if seen != n:
        raise tf.errors.InvalidArgumentError(
            None,
            None,
            f"one_pass_poisson_batches: the source yielded {seen} examples in a pass, not `num_examples`={n}.",
        )
    stats.epochs += 1


def _read_bucket(path: str, b: int, layout: _Layout, cap, rng, stats: SpillStats):
    """The batches of bucket `b`'s steps, in step order (empty ones too): raw records and the cut count.

    The bucket is held once, as its fixed-width records; each batch gathers
    its records (a stable sort by step keeps the spill's order within a
    step) and goes out as one uint8 `[batch, itemsize]` array.
    """
    records = np.fromfile(path, dtype=layout.dtype)
    os.remove(path)
    stats.largest_bucket_records = max(stats.largest_bucket_records, int(records.size))
    first = b * layout.steps_per_bucket
    count = min(layout.steps_per_bucket, layout.steps - first)
    order = np.argsort(records["step"], kind="stable")
    bounds = np.searchsorted(records["step"][order], first + np.arange(count + 1))
    for t in range(count):
        rows = order[bounds[t] : bounds[t + 1]]
        cut = 0
        if cap is not None and rows.size > cap:
            cut = rows.size - cap
            rows = rows[np.sort(rng.choice(rows.size, size=cap, replace=False))]
        yield records[rows].view(np.uint8).reshape(rows.size, layout.dtype.itemsize), np.int64(cut)


def _example_specs(dataset, source_batched: bool):
    """Per-example `TensorSpec`s of the source; fully defined numeric shapes required."""
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"`dataset` must be a `tf.data.Dataset`; received {type(dataset).__name__}.")
    specs = dataset.element_spec
    for spec in tf.nest.flatten(specs):
        dense = isinstance(spec, tf.TensorSpec)
        shape = (spec.shape[1:] if source_batched else spec.shape) if dense else None
        if shape is None or not shape.is_fully_defined() or spec.dtype == tf.string:
            raise ValueError(
                "`one_pass_poisson_batches` needs numeric examples with fully defined shapes (pad variable-length "
                f"features, hash strings first); received element spec {specs}"
                + (" (batches: the first dimension may vary)." if source_batched else ".")
            )
    if source_batched:
        return tf.nest.map_structure(lambda s: tf.TensorSpec(s.shape[1:], s.dtype), specs)
    return specs


__all__ = ["DEFAULT_BUCKET_ROWS", "ONE_PASS", "SpillStats", "one_pass_poisson_batches"]
