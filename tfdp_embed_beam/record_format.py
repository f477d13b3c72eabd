"""What the Beam pipeline writes and the trainer reads: shard names, the record layout, the manifest.

Output directory of one run:

    manifest.json                        what was sampled (q, N, epochs, steps, cap, truncations, shards)
    shards/{shard:06d}-NNNNN-of-MMMMM.tfrecord

Shard k holds the records of global steps [k S, (k + 1) S) (S =
`steps_per_shard`), possibly split over several files by the runner, in no
particular order; the reader loads one shard at a time (about S q N
records) and sorts it by (step, position). Step ranges rather than one file
per step: a run has E round(1/q) steps (thousands of tiny files, one open
and one read request each on a distributed file system), while a shard is a
few large sequential reads that `tf.data.TFRecordDataset` streams at disk
speed, with memory bounded by S.

A record (one TFRecord) is one example of one step:

    int64 little-endian step | int64 little-endian position | the example's line (bytes, no newline)

`position` is the example's place in its step's uniformly random order
(0 .. batch size - 1), so a step's batch is the same whatever order the
runner wrote the records in.
"""

from __future__ import annotations

import json
import struct

SAMPLER = "beam_poisson"
"""`BatchingInfo.sampler` of batches read from the pipeline's shards."""
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SHARD_DIR = "shards"
SHARD_SUFFIX = ".tfrecord"
DEFAULT_RECORDS_PER_SHARD = 1 << 19
_HEADER = struct.Struct("<qq")
HEADER_BYTES = _HEADER.size


def encode_record(step: int, position: int, line: bytes) -> bytes:
    """One record: the header (step, position) followed by the line."""
    return _HEADER.pack(step, position) + line


def decode_record(record: bytes) -> tuple[int, int, bytes]:
    """(step, position, line) of a record written by `encode_record`."""
    step, position = _HEADER.unpack_from(record)
    return step, position, record[HEADER_BYTES:]


def shard_prefix(shard: int) -> str:
    """The file-name prefix of shard `shard` (the runner appends -NNNNN-of-MMMMM.tfrecord)."""
    return f"{shard:06d}"


def shard_of_file(name: str) -> int:
    """The shard index of a shard file's base name.

    Raises:
      ValueError: the name is not a shard file's.
    """
    prefix = name.split("-", 1)[0]
    if not (name.endswith(SHARD_SUFFIX) and prefix.isdigit()):
        raise ValueError(f"{name!r} is not a shard file (expected {{shard:06d}}-...{SHARD_SUFFIX}).")
    return int(prefix)


def steps_per_shard_of(num_examples: int, records_per_shard: int, sampling_probability: float) -> int:
    """S: steps per shard so that a shard holds about `records_per_shard` records (S q N)."""
    return max(1, records_per_shard // max(1, round(sampling_probability * num_examples)))


def dump_manifest(manifest: dict) -> str:
    """The manifest as JSON text (sorted keys, one field per line)."""
    return json.dumps(manifest, indent=1, sort_keys=True) + "\n"


__all__ = [
    "DEFAULT_RECORDS_PER_SHARD",
    "FORMAT_VERSION",
    "HEADER_BYTES",
    "MANIFEST",
    "SAMPLER",
    "SHARD_DIR",
    "SHARD_SUFFIX",
    "decode_record",
    "dump_manifest",
    "encode_record",
    "shard_of_file",
    "shard_prefix",
    "steps_per_shard_of",
]
