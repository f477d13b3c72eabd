"""One sequential run's settings (`SequentialConfig`), the models and mechanisms it offers."""

from __future__ import annotations

import dataclasses

from pipelines.sequential import vocabulary as sequential_vocabulary

MODELS = ("transformer", "dpformer")
MECHANISM_NAMES = ("dense", "none")
REQUIRED_KEYS = ("ndcg@10", "hit@10", "epsilon", "delta", "noise_multiplier", "steps", "wall_seconds")


@dataclasses.dataclass(frozen=True)
class SequentialConfig:
    """One run's settings (the CLI flags, validated)."""

    data: str
    out: str
    layout: str = "auto"
    model: str = "dpformer"
    mechanism: str = "dense"
    epsilon: float = 8.0
    delta: float | None = None
    epochs: int = 5
    max_steps: int | None = None
    batch: int = 256
    learning_rate: float = 3e-3
    weight_decay: float = 1e-5
    adam_epsilon: float = 1e-7
    warmup_fraction: float = 0.2
    max_len: int = 50
    dim: int = 64
    blocks: int = 2
    dropout: float = 0.5
    clip: float = 1.0
    accountant: str = "pld"
    frequencies: str = "private"
    frequencies_file: str | None = None
    frequency_epsilon_share: float | None = None
    frequency_noise_multiplier: float | None = None
    frequency_mechanism: str = "gaussian"
    error_scale: float = 1.0
    popularity_prior: bool = False
    head_items: int | None = None
    item_catalogue: str | None = None
    vocabulary_epsilon_share: float | None = None
    vocabulary_max_items: int = sequential_vocabulary.DEFAULT_MAX_ITEMS_PER_USER
    eval_batch: int = 512
    max_eval_users: int | None = None
    top_k: int = 10
    seed: int | None = None
    verbose: int = 1
    fail_on_warnings: bool = False  # exit 3 when the report warns (`quality.exit_status`)
    max_hours: float | None = None  # refuse a longer estimated training (`run_limits.check_time`); None: no check
