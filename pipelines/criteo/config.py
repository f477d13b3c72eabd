"""The Criteo pipeline's settings: one frozen `PipelineConfig` per run, and its defaults."""

from __future__ import annotations

import dataclasses

from pipelines.criteo import data as criteo_data
from pipelines.criteo import privacy as criteo_privacy

DEFAULT_MECHANISM = "adafest"
DEFAULT_EPSILON = 3.0
# SGD step sizes that train the default model on the default data (momentum
# 0.9, batch 2048): a DP step moves by (sum of clipped gradients + noise) / B,
# smaller than the non-private mean gradient, and takes a larger learning
# rate; 1.0 makes the non-private run diverge, 0.3 leaves DP runs undertrained.
DEFAULT_LEARNING_RATE = {"none": 0.3}
DEFAULT_DP_LEARNING_RATE = 1.0
DEFAULT_CALIBRATION_FRACTION = 0.05


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """Everything one run needs (the CLI flags, validated)."""

    out: str
    train: tuple = ()
    eval: tuple = ()
    mechanism: str = DEFAULT_MECHANISM
    epsilon: float = DEFAULT_EPSILON
    delta: float | None = None
    epochs: int = 2
    batch: int = 2048
    streaming_periods: bool = False
    streaming: str = "auto"
    stream_buffer_rows: int = criteo_data.DEFAULT_STREAM_BUFFER_ROWS
    max_steps: int | None = None
    model: str = "mlp"
    seed: int | None = None
    skip_bad_rows: bool = False
    fixed_size_batches: bool = False
    hash_size: int | None = None
    hidden_units: tuple = (598, 598, 598, 598)
    embedding_dim: int | None = None
    learning_rate: float = DEFAULT_DP_LEARNING_RATE
    momentum: float = 0.9
    privacy: criteo_privacy.PrivacySettings | None = None
    synthetic: criteo_data.SyntheticSpec = criteo_data.SyntheticSpec()
    verbose: int = 1


__all__ = [
    "DEFAULT_CALIBRATION_FRACTION",
    "DEFAULT_DP_LEARNING_RATE",
    "DEFAULT_EPSILON",
    "DEFAULT_LEARNING_RATE",
    "DEFAULT_MECHANISM",
    "PipelineConfig",
]
