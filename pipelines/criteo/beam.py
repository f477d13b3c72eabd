"""Training from the Apache Beam job's Poisson shards (`--beam-shards DIR`).

The Beam job (`python -m tfdp_embed_beam`) has already drawn every step's
batch: q, the epochs, round(1/q) steps per epoch, N and the cap are the
manifest's, not the pipeline's to choose. So a run with `--beam-shards`
takes them from the manifest, refuses flags that say otherwise, and refuses
what the shards cannot give:

* `--train` (the shards are the training data), `--streaming-periods` (one
  manifest is one period), `--fixed-size-batches` (the batches are Poisson);
* fest and adafest+: their DP top-k selection needs each training row's
  bucket counts once (sensitivity 1 per row). The shards hold a row once per
  step it joined (a random number of times, E on average), so counting their
  lines would break that sensitivity, and counting the job's input files is
  the pass over the training rows the Beam job exists to avoid;
* `--skip-bad-rows`: N counts every input line; a dropped line would shrink
  batches unnoticed. Clean the files before the job;
* `--format csv`: the lines are parsed as Criteo TSV;
* the DP output calibration: it reads a random subset of the training rows
  from their files, which this run does not read.

Lines are parsed by `tfdp_embed.data.criteo.criteo_lines`, the same row
rules and transform as the files' reader.
"""

from __future__ import annotations

import posixpath

from pipelines.criteo import data as criteo_data
from pipelines.criteo import privacy as criteo_privacy
from tfdp_embed.accounting import AccountingPeriod
from tfdp_embed.data import beam_poisson_batches, read_manifest, with_lookahead
from tfdp_embed.data.criteo import CriteoReadStats, criteo_lines
from tfdp_embed_beam import record_format as fmt

SAMPLER = fmt.SAMPLER
"""`BatchingInfo.sampler` of the shards' batches ("beam_poisson")."""
CALIBRATION_REASON = (
    "--beam-shards: the output calibration reads training rows from their files; this run reads only the Beam "
    "job's shards"
)
SAMPLER_DESCRIPTION = "exact Poisson from the Apache Beam job's shards (tfdp_embed.data.beam_poisson_batches)"


def manifest_path(directory: str) -> str:
    return posixpath.join(directory, fmt.MANIFEST)


def expected_batch(manifest: dict) -> int:
    """B = round(q N), the expected batch size the manifest's q stands for."""
    return max(1, round(manifest["sampling_probability"] * manifest["num_examples"]))


def conflicts(
    manifest: dict,
    *,
    train,
    epochs,
    batch,
    fixed_size_batches: bool,
    streaming_periods: bool,
    mechanism: str,
    skip_bad_rows: bool,
    format: str,
    calibration_fraction: float | None,
) -> list[str]:
    """What the run's settings say against the manifest or the shards (empty: none); None: not given."""
    problems = []
    if train:
        problems.append("--beam-shards and --train exclude each other (the shards are the training data).")
    if streaming_periods:
        problems.append("--streaming-periods cannot be used with --beam-shards (one Beam job's output is one period).")
    if fixed_size_batches:
        problems.append("--fixed-size-batches cannot be used with --beam-shards (the job's batches are Poisson).")
    if criteo_privacy.selects_rows(mechanism):
        problems.append(
            f"--mechanism {mechanism} cannot be used with --beam-shards: its DP selection needs each training row's "
            "bucket counts once, the shards hold a row once per step it joined (counting them breaks the "
            "selection's sensitivity), and counting the job's input files is the pass the Beam job avoids. "
            "Use --train for it."
        )
    if epochs is not None and epochs != manifest["epochs"]:
        problems.append(f"--epochs {epochs} disagrees with the Beam manifest's epochs {manifest['epochs']}.")
    if batch is not None and batch != expected_batch(manifest):
        problems.append(
            f"--batch {batch} disagrees with the Beam manifest's expected batch size round(q N) = "
            f"{expected_batch(manifest)} (q {manifest['sampling_probability']}, N {manifest['num_examples']})."
        )
    if skip_bad_rows:
        problems.append(
            "--skip-bad-rows cannot be used with --beam-shards (N counts every input line of the job; drop bad "
            "rows before running it)."
        )
    if format == "csv":
        problems.append("--format csv cannot be used with --beam-shards (the shards' lines are parsed as TSV).")
    if calibration_fraction:
        problems.append(
            f"--calibration-fraction {calibration_fraction} cannot be used with --beam-shards ({CALIBRATION_REASON})."
        )
    return problems


def check(config, manifest: dict) -> None:
    """Raises ValueError when a `PipelineConfig` disagrees with the manifest (`conflicts`)."""
    settings = config.privacy
    problems = conflicts(
        manifest,
        train=config.train,
        epochs=config.epochs,
        batch=config.batch,
        fixed_size_batches=config.fixed_size_batches,
        streaming_periods=config.streaming_periods,
        mechanism=config.mechanism,
        skip_bad_rows=config.skip_bad_rows,
        format=config.format,
        calibration_fraction=settings.calibration_fraction if settings is not None else None,
    )
    if problems:
        raise ValueError(" ".join(problems))


def training_period(directory: str, manifest: dict, vocab_sizes: dict) -> criteo_data.Period:
    """The shards as the run's one (streamed) period: N from the manifest, no rows in memory."""
    return criteo_data.Period(
        [directory], dict(vocab_sizes), False, CriteoReadStats(), int(manifest["num_examples"]), format="tsv"
    )


def accounting_period(manifest: dict, *, max_steps: int | None, accountant: str) -> AccountingPeriod:
    """q and T of the manifest (T at most `max_steps`); with a cap and the PLD accountant, the truncated event.

    The RDP accountant has no truncated event: its report adds the coupling
    delta of the cut batches (`delta_with_truncation`), as for any sampler's cap.
    """
    steps = manifest["steps"] if max_steps is None else min(manifest["steps"], max_steps)
    cap = manifest["max_batch_size"]
    if cap is None or accountant != "pld":
        return AccountingPeriod(manifest["sampling_probability"], steps)
    return AccountingPeriod(manifest["sampling_probability"], steps, int(manifest["num_examples"]), int(cap))


def train_batches(directory: str, vocab_sizes: dict, *, lookahead: bool, table_ids=None):
    """`(batches, info)`: the shards' steps parsed to `(features, labels [n, 1])`, in step order, once.

    `table_ids`: features -> `{layer name: ids}` for the lookahead (default: one table per feature).
    """
    lines, info = beam_poisson_batches(directory)
    source = f"Beam shards {directory}"

    def parse(batch):
        features, labels = criteo_lines(batch, vocab_sizes=dict(vocab_sizes), source=source)
        return features, labels[:, None]

    batches = lines.map(parse)
    if lookahead:
        batches = with_lookahead(batches, table_ids or criteo_data.table_ids)
    return batches.prefetch(2), info


def report_entry(directory: str, manifest: dict) -> dict:
    """The report's `data.beam_shards`: where the batches came from (whether seeded, never the seed or N)."""
    entry = {
        "sampler": SAMPLER,
        "manifest": manifest_path(directory),
        "inputs": manifest.get("inputs"),
        "num_examples": "not released (see dataset_size: N~)",
        "sampling_probability": manifest["sampling_probability"],
        "epochs": manifest["epochs"],
        "steps": manifest["steps"],
        "max_batch_size": manifest["max_batch_size"],
        "truncated_batches": manifest.get("truncated_batches"),
        "truncated_examples": manifest.get("truncated_examples"),
    }
    entry["seeded"] = bool(manifest.get("seeded"))
    return entry


__all__ = [
    "CALIBRATION_REASON",
    "SAMPLER",
    "SAMPLER_DESCRIPTION",
    "accounting_period",
    "check",
    "conflicts",
    "expected_batch",
    "manifest_path",
    "read_manifest",
    "report_entry",
    "train_batches",
    "training_period",
]
