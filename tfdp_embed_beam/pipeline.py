"""The Beam job: text lines -> exact Poisson steps -> TFRecord shards in step ranges, plus a manifest.

    read lines (file f, line l)  ->  example_steps(seed, f, l)      map: the steps each example joins
    group by step                ->  cut_step(seed, step, members)  truncate to max_batch_size, random order
    key by shard = step // S     ->  shards/{shard:06d}-*.tfrecord  S = steps per shard (~records_per_shard records)

One job samples E epochs of T = round(1/q) steps (global steps 0 .. E T - 1);
every draw is a pure function of (seed, example or step), so the output
does not depend on how the runner splits or retries bundles. After the job,
`manifest.json` records what was sampled (q, N, epochs, cap, truncations,
records per shard) for the trainer (`tfdp_embed.data.beam_poisson_batches`)
and the privacy report.

Files are read whole by one worker each (lines are numbered within their
file), so the read parallelises across files: split very large inputs into
many files. On a distributed runner the workers need this package
(`pip install --no-deps tfdp_embed`, e.g. in a custom container, or
`--setup_file`), numpy and apache-beam; not TensorFlow.

Example:
    python -m tfdp_embed_beam --input 'days/day_*.tsv' --output /data/poisson \\
        --sampling_probability 0.001 --epochs 3 --max_batch_size 2400 --runner DataflowRunner ...

References: Chua et al., "Scalable DP-SGD: Shuffling vs. Poisson
Subsampling", NeurIPS 2024 §5.
"""

from __future__ import annotations

import argparse
import json
import math
import posixpath
import secrets
from collections.abc import Sequence

import apache_beam as beam
from apache_beam.io import fileio, tfrecordio
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.options.value_provider import StaticValueProvider

from tfdp_embed_beam import record_format as fmt
from tfdp_embed_beam.sampling import check_seed, cut_step, example_steps

_SUMMARY = "_summary.json"
_TEMP = "_beam_temp"


def run(
    *,
    inputs: Sequence[str],
    output: str,
    sampling_probability: float,
    epochs: int = 1,
    seed: int | None = None,
    max_batch_size: int | None = None,
    records_per_shard: int = fmt.DEFAULT_RECORDS_PER_SHARD,
    options: PipelineOptions | None = None,
) -> dict:
    """Runs the job to completion and writes `output`/manifest.json; returns the manifest.

    Args:
      inputs: file patterns of text files, one example per line (any
        file system Beam knows; .gz etc. decompressed by extension).
      output: directory for `shards/` and `manifest.json`; must hold no shards yet.
      sampling_probability: q in (0, 1].
      epochs: E >= 1 (E round(1/q) steps in all, each a fresh Poisson draw).
      seed: int in [0, 2^64) for reproducible shards (recorded in the
        manifest); None draws one from OS entropy (not recorded).
      max_batch_size: cap on a step's examples (uniform random subset, counted), or None.
      records_per_shard: about how many records one shard holds (the reader's memory).
      options: Beam pipeline options (runner, ...); None: DirectRunner.

    Returns:
      The manifest (a dict, also written as JSON).

    Raises:
      ValueError: bad arguments, no input files, or shards already in `output`.
    """
    q = _check_q(sampling_probability)
    epochs = _check_int("epochs", epochs)
    cap = None if max_batch_size is None else _check_int("max_batch_size", max_batch_size)
    records_per_shard = _check_int("records_per_shard", records_per_shard)
    files = _match(inputs)
    shards = posixpath.join(output, fmt.SHARD_DIR)
    if FileSystems.exists(shards) and FileSystems.match([posixpath.join(shards, "*")])[0].metadata_list:
        raise ValueError(f"`output`={output!r} already holds shards; give an empty or new directory.")
    run_seed = check_seed(seed) if seed is not None else secrets.randbits(64)
    steps = max(1, round(1.0 / q)) * epochs
    with beam.Pipeline(options=options or PipelineOptions()) as pipeline:
        _build(pipeline, files, output, q=q, steps=steps, seed=run_seed, cap=cap, records_per_shard=records_per_shard)
    return _write_manifest(output, files, q=q, epochs=epochs, seed=seed, cap=cap)


def _build(pipeline, files: list, output: str, *, q: float, steps: int, seed: int, cap, records_per_shard: int):
    """The transforms: read, draw, group by step, cut, encode, write shards and the summary."""
    lines = (
        pipeline
        | "Files" >> beam.Create(list(enumerate(files)))
        | "SpreadFiles" >> beam.Reshuffle()
        | "ReadLines" >> beam.FlatMap(_read_lines)
    )
    count = lines | "CountExamples" >> beam.combiners.Count.Globally()
    batches = (
        lines
        | "DrawSteps" >> beam.FlatMap(_draw, seed=seed, q=q, steps=steps)
        | "GroupByStep" >> beam.GroupByKey()
        | "Cut" >> beam.Map(_cut, seed=seed, cap=cap)
    )
    per_shard = beam.pvalue.AsSingleton(
        count | "StepsPerShard" >> beam.Map(fmt.steps_per_shard_of, records_per_shard, q)
    )
    records = batches | "Encode" >> beam.FlatMap(_encode, steps_per_shard=per_shard)
    _ = records | "WriteShards" >> fileio.WriteToFiles(
        path=posixpath.join(output, fmt.SHARD_DIR),
        destination=lambda record: record[0],
        sink=_TFRecordSink,
        file_naming=fileio.destination_prefix_naming(fmt.SHARD_SUFFIX),
        temp_directory=StaticValueProvider(str, posixpath.join(output, _TEMP)),  # a str fails in Beam 2.77
    )
    totals = (
        batches
        | "CutCounts" >> beam.Map(lambda b: (int(b[2] > 0), b[2], len(b[1])))
        | "SumCuts" >> beam.CombineGlobally(beam.combiners.TupleCombineFn(sum, sum, sum)).without_defaults()
    )
    shard_records = (
        records
        | "ShardOfRecord" >> beam.Map(lambda record: (record[0], 1))
        | "RecordsPerShard" >> beam.CombinePerKey(sum)
        | "ShardTable" >> beam.combiners.ToDict()
    )
    _ = (
        count
        | "Summary"
        >> beam.Map(
            _summary,
            totals=beam.pvalue.AsList(totals),
            shard_records=beam.pvalue.AsSingleton(shard_records),
            q=q,
            steps=steps,
            records_per_shard=records_per_shard,
        )
        | "WriteSummary" >> beam.io.WriteToText(posixpath.join(output, _SUMMARY), shard_name_template="")
    )


# -- the steps of the pipeline ----------------------------------------------------------


def _read_lines(indexed_file):
    """((file index, line number), line without its newline) for every line of one file."""
    file_index, path = indexed_file
    with FileSystems.open(path) as handle:
        for line_number, line in enumerate(iter(handle.readline, b"")):
            yield (file_index, line_number), line[:-1] if line.endswith(b"\n") else line


def _draw(keyed_line, *, seed: int, q: float, steps: int):
    """(step, (key, line)) for every step the example joins."""
    (file_index, line_number), line = keyed_line
    for step in example_steps(seed, file_index, line_number, sampling_probability=q, total_steps=steps):
        yield int(step), ((file_index, line_number), line)


def _cut(grouped, *, seed: int, cap):
    """(step, kept (key, line) pairs in batch order, examples cut)."""
    step, members = grouped
    kept, cut = cut_step(seed, step, list(members), cap)
    return step, kept, cut


def _encode(batch, *, steps_per_shard: int):
    """(shard prefix, record) for every kept example of a step."""
    step, kept, _ = batch
    prefix = fmt.shard_prefix(step // steps_per_shard)
    for position, (_, line) in enumerate(kept):
        yield prefix, fmt.encode_record(step, position, line)


def _summary(num_examples: int, *, totals, shard_records: dict, q: float, steps: int, records_per_shard: int) -> str:
    """What the job counted, as one JSON line (merged into the manifest by `run`)."""
    truncated_batches, truncated_examples, records = totals[0] if totals else (0, 0, 0)
    per_shard = fmt.steps_per_shard_of(num_examples, records_per_shard, q)
    shards = math.ceil(steps / per_shard)
    return json.dumps(
        {
            "num_examples": num_examples,
            "truncated_batches": truncated_batches,
            "truncated_examples": truncated_examples,
            "records": records,
            "steps_per_shard": per_shard,
            "shards": shards,
            "shard_records": [shard_records.get(fmt.shard_prefix(k), 0) for k in range(shards)],
        }
    )


class _TFRecordSink(fileio.FileSink):
    """Writes each (shard prefix, record) element's record as one TFRecord (length, CRC32C framing)."""

    def open(self, fh):
        self._handle = fh

    def write(self, record):
        tfrecordio._TFRecordUtil.write_record(self._handle, record[1])  # noqa: SLF001 - Beam's TFRecord framing

    def flush(self):
        self._handle.flush()


# -- after the job ------------------------------------------------------------------------


def _write_manifest(output: str, files: list, *, q: float, epochs: int, seed, cap) -> dict:
    """Merges the job's summary with the run's settings into manifest.json; returns it."""
    summary_path = posixpath.join(output, _SUMMARY)
    with FileSystems.open(summary_path) as handle:
        summary = json.loads(handle.read().decode())
    FileSystems.delete([summary_path])
    if summary["num_examples"] == 0:
        raise ValueError(f"`inputs` {files} hold no lines: there is nothing to sample.")
    temp = posixpath.join(output, _TEMP)
    if FileSystems.exists(temp):  # WriteToFiles leaves its (empty) temporary directory
        FileSystems.delete([temp])
    batches_per_epoch = max(1, round(1.0 / q))
    manifest = {
        "format_version": fmt.FORMAT_VERSION,
        "sampler": fmt.SAMPLER,
        "sampling_probability": q,
        "epochs": epochs,
        "batches_per_epoch": batches_per_epoch,
        "steps": batches_per_epoch * epochs,
        "max_batch_size": cap,
        "seeded": seed is not None,  # never the seed: whoever knows it recomputes every batch
        "shard_pattern": f"{fmt.SHARD_DIR}/{{shard:06d}}-*{fmt.SHARD_SUFFIX}",
        "record_format": "int64 LE step, int64 LE position in the step's batch, the example's line",
        "inputs": files,
        **summary,
    }
    with FileSystems.create(posixpath.join(output, fmt.MANIFEST)) as handle:
        handle.write(fmt.dump_manifest(manifest).encode())
    return manifest


def _match(patterns: Sequence[str]) -> list:
    """The sorted paths matching `patterns` (the order numbers the files)."""
    if isinstance(patterns, str) or not patterns:
        raise ValueError(f"`inputs` must be a non-empty list of file patterns; received {patterns!r}.")
    paths = sorted({m.path for result in FileSystems.match(list(patterns)) for m in result.metadata_list})
    if not paths:
        raise ValueError(f"`inputs`={list(patterns)!r} matches no file.")
    return paths


def _check_q(q) -> float:
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 < q <= 1:
        raise ValueError(f"`sampling_probability` must be a number in (0, 1]; received {q!r}.")
    return float(q)


def _check_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be an int >= 1; received {value!r}.")
    return value


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: the arguments of `run`; anything else goes to Beam's `PipelineOptions` (e.g. --runner)."""
    parser = argparse.ArgumentParser(prog="python -m tfdp_embed_beam", description=__doc__.split("\n")[0])
    parser.add_argument("--input", action="append", required=True, help="file pattern (repeatable)")
    parser.add_argument("--output", required=True, help="directory for shards/ and manifest.json")
    parser.add_argument("--sampling_probability", type=float, required=True, help="q in (0, 1]")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=None, help="reproducible shards (default: OS entropy)")
    parser.add_argument("--max_batch_size", type=int, default=None)
    parser.add_argument("--records_per_shard", type=int, default=fmt.DEFAULT_RECORDS_PER_SHARD)
    args, beam_args = parser.parse_known_args(argv)
    manifest = run(
        inputs=args.input,
        output=args.output,
        sampling_probability=args.sampling_probability,
        epochs=args.epochs,
        seed=args.seed,
        max_batch_size=args.max_batch_size,
        records_per_shard=args.records_per_shard,
        options=PipelineOptions(beam_args),
    )
    shown = ("steps", "records", "shards", "truncated_batches", "truncated_examples")  # N stays in the manifest
    print(json.dumps({key: manifest[key] for key in shown}))


__all__ = ["main", "run"]
