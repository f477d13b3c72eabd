"""Poisson batches sampled by the Apache Beam job (`tfdp_embed_beam`), streamed from its shards in step order.

The job (`python -m tfdp_embed_beam`, run in an environment with the `beam`
extra) maps every example to the steps it joins, groups by step, cuts
oversized steps and writes TFRecord shards of step ranges plus a manifest
(`tfdp_embed_beam.record_format`). This reader yields one batch per step,
in step order, for all E epochs the job sampled:

    batch t = the lines of the examples that drew step t, in the job's random order,  t = 0 .. E T - 1

One shard (about `records_per_shard` records) is read at a time, sorted by
(step, position) and sliced into its steps, empty steps included; its
record count is checked against the manifest, so a missing or partial shard
file fails loudly instead of shrinking batches.

The shards hold each step's draw once: the dataset can be iterated once
(one pass over its E T steps; Keras `fit(..., epochs=E,
steps_per_epoch=T)` keeps one iterator). A second iteration would replay the
same Poisson draws, which the accounting does not describe, and fails.
`DPModel`'s look at the first batches (`prepare`, and `fit` before training:
it builds the model and checks the per-example contract, takes no step and
releases nothing) reads inside `uncounted_reads`, so it does not use up the
pass: `fit` then trains on every step from the first.

The returned `BatchingInfo` has the number of steps E T (`info.steps`); its
truncation counters hold the whole run's totals (the job made the cuts).

Example:
    >>> lines, info = beam_poisson_batches("/data/poisson")
    >>> batches = lines.map(parse_tsv_lines)            # (features, labels): still verified Poisson
    >>> fixed, info = fixed_shape_batches(batches, info)
    >>> epochs = info.steps // info.batches_per_epoch   # the E the job sampled
    >>> dp_model.fit(fixed.prefetch(2), epochs=epochs, steps_per_epoch=info.batches_per_epoch)

References: Chua et al., "Scalable DP-SGD: Shuffling vs. Poisson
Subsampling", NeurIPS 2024 §5 (map, group by step, truncate).
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import weakref

import tensorflow as tf

from tfdp_embed.data.poisson import BatchingInfo, _poisson_info
from tfdp_embed.data.provenance import register
from tfdp_embed_beam import record_format as fmt

BEAM_POISSON = fmt.SAMPLER
"""`BatchingInfo.sampler` of `beam_poisson_batches`."""
_TO_END = 2**31 - 1  # substr length: up to the end of the record
_ALL = 2**62  # "every record of the shard" as a batch size (tf.data reserves memory only for what arrives)
_STEPS_SERVED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # returned dataset -> its guard's counter


def read_manifest(directory: str) -> dict:
    """The manifest of the Beam job's output `directory`.

    Raises:
      ValueError: no manifest, or one of another sampler or format version.
    """
    path = posixpath.join(directory, fmt.MANIFEST)
    if not tf.io.gfile.exists(path):
        raise ValueError(
            f"`directory`={directory!r} has no {fmt.MANIFEST}: give the --output of `python -m tfdp_embed_beam`."
        )
    with tf.io.gfile.GFile(path) as handle:
        manifest = json.load(handle)
    if manifest.get("sampler") != fmt.SAMPLER or manifest.get("format_version") != fmt.FORMAT_VERSION:
        raise ValueError(
            f"{path} is not a manifest this reader knows: sampler {manifest.get('sampler')!r}, format "
            f"{manifest.get('format_version')!r} (expected {fmt.SAMPLER!r}, {fmt.FORMAT_VERSION})."
        )
    per_epoch = max(1, round(1.0 / manifest["sampling_probability"]))
    if manifest["steps"] != per_epoch * manifest["epochs"] or manifest["shards"] != len(manifest["shard_records"]):
        raise ValueError(
            f"{path} contradicts itself: {manifest['steps']} steps, q and epochs give {per_epoch} x {manifest['epochs']}."
        )
    return manifest


def beam_poisson_batches(directory: str) -> tuple[tf.data.Dataset, BatchingInfo]:
    """The Beam job's Poisson batches of example lines, one per step, in step order.

    P[example i in batch t] = q independently over i and t (before the cut
    at `max_batch_size`); round(1/q) batches per epoch, E epochs.

    Args:
      directory: the job's `--output` (holds manifest.json and shards/); any
        path `tf.io.gfile` reads.

    Returns:
      `(batches, info)`: a `tf.data.Dataset` of E round(1/q) 1-D `tf.string`
      tensors (the lines of one step's examples) that can be iterated once,
      and its `BatchingInfo` (sampler "beam_poisson"; `info.steps` = E round(1/q)).

    Raises:
      ValueError: no manifest, shard files that do not match it.
      tf.errors.InvalidArgumentError (while iterating): a shard holds
        other records than the manifest says, or the dataset is iterated a second time.
    """
    manifest = read_manifest(directory)
    files = _shard_files(directory, manifest)
    cap = manifest["max_batch_size"]
    info = _poisson_info(
        manifest["num_examples"], manifest["sampling_probability"], cap, None, streaming=True, batches_per_pass=None
    )
    info.sampler, info.seeded, info.steps = BEAM_POISSON, bool(manifest["seeded"]), int(manifest["steps"])
    if info.truncated_batches is not None and info.truncated_examples is not None:  # a cap was given
        info.truncated_batches.assign(manifest["truncated_batches"])
        info.truncated_examples.assign(manifest["truncated_examples"])
    served = tf.Variable(0, dtype=tf.int64, trainable=False, name="beam_poisson_steps_served")
    batches = _step_batches(files, manifest, served)
    _STEPS_SERVED[batches] = served
    return register(batches, info), info


@contextlib.contextmanager
def uncounted_reads(data):
    """Reads of `data` inside the block do not count as the one pass over the Beam shards it reads.

    For `DPModel`'s look at a dataset's first batches (it builds the model
    and checks the per-example contract: no step is taken, nothing is
    released), so that training then reads every step from the first. The
    guard still runs inside the block: shards a pass has already read are
    refused at the first read. Iterators made inside the block must be gone
    when it ends (one still prefetching would count). A no-op for data that
    reads no Beam shards.
    """
    counters = _steps_served_counters(data)
    starts = [counter.read_value() for counter in counters]
    try:
        yield
    finally:
        for counter, start in zip(counters, starts):
            counter.assign(start)


def _steps_served_counters(data) -> list:
    """The guards' counters of the `beam_poisson_batches` datasets that `data` reads (its inputs, walked back)."""
    found, pending, seen = [], [data], set()
    while pending:
        dataset = pending.pop()
        if not isinstance(dataset, tf.data.Dataset) or id(dataset) in seen:
            continue
        seen.add(id(dataset))
        counter = _STEPS_SERVED.get(dataset)
        if counter is not None:
            found.append(counter)
            continue
        try:
            pending.extend(dataset._inputs())  # noqa: SLF001 - tf.data's only way to walk a pipeline back
        except (AttributeError, NotImplementedError):
            continue
    return found


def _shard_files(directory: str, manifest: dict) -> list:
    """The files of each shard 0 .. K - 1 (sorted); every shard with records must have some."""
    shards = manifest["shards"]
    found: list[list[str]] = [[] for _ in range(shards)]
    for path in sorted(tf.io.gfile.glob(posixpath.join(directory, fmt.SHARD_DIR, "*" + fmt.SHARD_SUFFIX))):
        shard = fmt.shard_of_file(posixpath.basename(path))
        if shard >= shards:
            raise ValueError(f"{path} is shard {shard}, but the manifest of {directory!r} has {shards} shards.")
        found[shard].append(path)
    missing = [k for k in range(shards) if manifest["shard_records"][k] and not found[k]]
    if missing:
        raise ValueError(f"Shards {missing[:10]} of {directory!r} hold records per the manifest but have no files.")
    return found


def _step_batches(files: list, manifest: dict, served: tf.Variable) -> tf.data.Dataset:
    """Shard by shard: read, sort by (step, position), slice into steps; a guard against replay (`served`)."""
    per_shard, steps = manifest["steps_per_shard"], manifest["steps"]
    paths = tf.ragged.constant(files, dtype=tf.string, ragged_rank=1)
    expected = tf.constant(manifest["shard_records"], tf.int64)

    def shard_batches(k):
        # All the shard's records as one batch; an empty shard (no file) gives the empty vector after it.
        empty = tf.data.Dataset.from_tensors(tf.zeros([0], tf.string))
        records = tf.data.TFRecordDataset(paths[k]).batch(_ALL).concatenate(empty).take(1).get_single_element()
        first = k * per_shard
        count = tf.minimum(tf.constant(per_shard, tf.int64), steps - first)
        header = tf.io.decode_raw(
            tf.strings.substr(records, 0, fmt.HEADER_BYTES), tf.int64, fixed_length=fmt.HEADER_BYTES
        )
        local, position = header[:, 0] - first, header[:, 1]
        checks = [
            tf.debugging.assert_equal(
                tf.size(records, out_type=tf.int64), expected[k], message="beam_poisson_batches: shard record count"
            ),
            tf.debugging.assert_non_negative(local, message="beam_poisson_batches: a record of another shard"),
            tf.debugging.assert_less(local, count, message="beam_poisson_batches: a record of another shard"),
        ]
        with tf.control_dependencies(checks):
            order = tf.argsort(local * 2**31 + position)  # positions < 2^31 (batch sizes)
        bounds = tf.searchsorted(tf.gather(local, order), tf.range(count + 1))

        def step_lines(t):  # the copy of a step's lines is made per step, overlapping training
            return first + t, tf.strings.substr(
                tf.gather(records, order[bounds[t] : bounds[t + 1]]), fmt.HEADER_BYTES, _TO_END
            )

        return tf.data.Dataset.range(count).map(step_lines)

    def once(step, lines):
        check = tf.debugging.assert_equal(
            step,
            served.read_value(),
            message="beam_poisson_batches: these shards were already read; a second pass would replay the same "
            "Poisson draws (not what the accounting assumes). Sample more epochs with the Beam job instead",
        )
        with tf.control_dependencies([check]):
            with tf.control_dependencies([served.assign_add(1)]):
                return tf.identity(lines)

    return tf.data.Dataset.range(len(files)).flat_map(shard_batches).map(once)


__all__ = ["BEAM_POISSON", "beam_poisson_batches", "read_manifest", "uncounted_reads"]
