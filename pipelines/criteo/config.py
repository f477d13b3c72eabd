"""The Criteo pipeline's settings: one frozen `PipelineConfig` per run, and its defaults."""

from __future__ import annotations

import dataclasses

from pipelines.criteo import data as criteo_data
from pipelines.criteo import privacy as criteo_privacy
from tfdp_embed.mechanisms import capabilities_of, mechanism_class

DEFAULT_MECHANISM = "adafest"
DEFAULT_EPSILON = 3.0
DEFAULT_CALIBRATION_FRACTION = 0.05
# Batch, tower widths, learning rate and hash size default to None: the
# pipeline chooses them from the data size (`defaults.py`).


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """Everything one run needs (the CLI flags, validated; None: chosen from the data by `defaults.py`)."""

    out: str
    train: tuple = ()
    beam_shards: str | None = None  # the Beam job's output: train from its shards (q, epochs, steps from its manifest)
    eval: tuple = ()
    mechanism: str = DEFAULT_MECHANISM
    epsilon: float = DEFAULT_EPSILON
    delta: float | None = None
    epochs: int = 2
    batch: int | None = None
    streaming_periods: bool = False
    streaming: str = "auto"
    stream_buffer_rows: int = criteo_data.DEFAULT_STREAM_BUFFER_ROWS
    spill_dir: str | None = None
    max_steps: int | None = None
    model: str = "mlp"
    seed: int | None = None
    skip_bad_rows: bool = False
    format: str = "auto"
    calibration_auto: bool = (
        True  # skip the output calibration when it cannot help (False: --calibration-fraction given)
    )
    fixed_size_batches: bool = False
    lookahead: bool = False  # LazyDP: catch up the next batch's rows after each step
    hash_size: int | None = None
    table3_vocabulary: bool = False  # Table 3's sizes uncapped (no data-scaled cap); exclusive with hash_size
    hidden_units: tuple | None = None
    embedding_dim: int | None = None
    stack_tables: bool = True  # one table variable per width group (`--no-stack-tables`: one per feature)
    learning_rate: float | None = None
    momentum: float = 0.9
    privacy: criteo_privacy.PrivacySettings | None = None
    synthetic: criteo_data.SyntheticSpec = criteo_data.SyntheticSpec()
    verbose: int = 1
    audit_canaries: int | None = None  # M: an audit run (`criteo/audit.py`), no export
    fail_on_warnings: bool = False  # the command line exits 3 when the report warns (`quality.exit_status`)
    max_hours: float | None = None  # refuse a longer estimated training (`run_limits.check_time`); None: no check

    @property
    def lazy_lookahead(self) -> bool:
        """True when the run is LazyDP's with the one-batch lookahead (`--lookahead`)."""
        return self.lookahead and capabilities_of(mechanism_class(self.mechanism)).lookahead

    @property
    def fixed_vocabulary(self) -> bool:
        """True when the flags fix the vocabulary (`--hash-size` or `--vocabulary table3`): no row-scaled cap."""
        return bool(self.hash_size) or self.table3_vocabulary


__all__ = [
    "DEFAULT_CALIBRATION_FRACTION",
    "DEFAULT_EPSILON",
    "DEFAULT_MECHANISM",
    "PipelineConfig",
]
