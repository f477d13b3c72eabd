"""One MovieLens run's settings (`MovieLensConfig`) and the defaults the CLI shows."""

from __future__ import annotations

import dataclasses
import math
import os

from pipelines.movielens import privacy as movielens_privacy
from pipelines.movielens import units as movielens_units
from pipelines.movielens import vocabulary as movielens_vocabulary

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_DATA_PATH = os.path.join(ROOT, "..", "shared", "data", "movielens", "ml-100k", "u.data")
# SGD step sizes (momentum 0.9, batch 256, dim 32), from 2-epoch runs on ml-100k (seed 0):
# none: lr 0.2 / 1.0 / 3.0 gave recall@10 0.080 / 0.087 / 0.032; EANA at sigma 0.01: lr 0.5 / 2.0 /
# 5.0 gave 0.047 / 0.095 / 0.037. A DP step divides the clipped sum by the expected batch, so clipped
# runs take a larger rate. DP-SGD, LazyDP and DP-AdaFEST use EANA's rate (not tuned separately). These
# rates suit small sigma only: DP-SGD at sigma 0.6723 (epsilon 3, 5 epochs) gave recall@10
# 0.074 / 0.082 / 0.022 at lr 0.25 / 0.5 / 2.0: calibrated runs default to 0.5.
DEFAULT_LEARNING_RATES = {"none": 1.0, "dense": 2.0, "eana": 2.0, "lazy": 2.0, "adafest": 2.0}
LARGE_NOISE_LEARNING_RATE = 0.5
"""Default SGD rate of noised runs with `epsilon` set or sigma >= SMALL_SIGMA_FOR_PLD (see the comment above)."""
SMALL_SIGMA_FOR_PLD = 0.3
"""Below this noise multiplier epsilon is reported with the RDP accountant (PLD needs too much memory)."""
PRIVACY_UNIT = (
    "one (context, label) example: a position of a training user's timeline (example-level, as in EANA "
    "§4.1). A user contributes one example per rated movie after the first, so a user's whole history "
    "is protected only by group privacy over all of them; this is not user-level DP."
)


@dataclasses.dataclass(frozen=True)
class MovieLensConfig:
    """One run's settings (CLI flags map onto these).

    Attributes:
      data_path: the ratings file (u.data, ratings.csv, ratings.dat) or a dataset directory.
      item_catalogue: how movies are numbered: "auto" (the catalogue beside the ratings if any),
        a catalogue file (movies.csv, u.item), or None (the ratings' movies: a DP release for dense / lazy).
      vocabulary_epsilon_share, vocabulary_noise_multiplier, vocabulary_max_items: the DP release of the
        movie ids without a catalogue (`pipelines.movielens.vocabulary`): its share of `epsilon` (or its z
        with sigma given) and D0.
      privacy_unit: "example" (one (context, label) example; this config's default, kept for the
        programmatic callers such as the secret-sharer audit) or "user" (a training user's whole timeline;
        the command line's default): see `pipelines.movielens.units`.
      max_examples_per_user: k at user level, a public choice (None: k released with DP and charged to
        the run's budget, `pipelines.movielens.units.choose_k`).
      mechanism: "none", "dense" (DP-SGD), "eana" (not DP), "lazy" (LazyDP) or "adafest" (DP-AdaFEST).
      noise_multiplier: sigma; or None with `epsilon` set (calibrated).
      epsilon: target epsilon for dense/lazy (sigma calibrated; a nominal sigma for eana).
      delta: delta; None = 1 / N (N training examples including extra ones; at user level N training users).
      l2_norm_clip: per-example clip norm C.
      epochs: passes (each round(1/q) Poisson batches).
      batch_size: expected Poisson batch size q N (at user level: expected users per batch).
      learning_rate: SGD rate; None = `LARGE_NOISE_LEARNING_RATE` for noised runs with
        `epsilon` set or sigma >= `SMALL_SIGMA_FOR_PLD`, else `DEFAULT_LEARNING_RATES[mechanism]`.
      momentum: SGD momentum (legacy SGD; LazyDP defers it exactly).
      embedding_dim: d of both towers.
      hidden_units: ReLU widths of the context tower after pooling.
      context_length: L, previous movies in a context.
      test_fraction: share of users held out.
      split_seed: seed of the user split (part of the dataset definition).
      seed: seed of initialisation, batches and noise (None: OS entropy; tests and
        benchmarks set it).
      accountant: "pld" or "rdp".
      max_test_examples: evaluate on the first N test examples only (None: all).
      k: top-k of the exported retrieval signature.
      eana_bound_examples: training examples to compute EANA's per-instance bound for.
      verbose: Keras progress bar (1) or silent (0).
      audit_canaries: M for an audit run (`pipelines.audit_canaries`): trains with M rare-id canaries,
        reports the empirical epsilon lower bound, exports no model; None: a normal run.
      fail_on_warnings: the command line exits with status 3 when the report has warnings.
      max_hours: refuse (ValueError, before the noise is calibrated) a run whose training is estimated to take
        longer (`pipelines.run_limits.check_time`); None: no check (the command line's default is 24).
    """

    data_path: str = DEFAULT_DATA_PATH
    item_catalogue: str | None = "auto"
    vocabulary_epsilon_share: float | None = None
    vocabulary_noise_multiplier: float | None = None
    vocabulary_max_items: int = movielens_vocabulary.DEFAULT_MAX_ITEMS_PER_USER
    privacy_unit: str = movielens_units.EXAMPLE
    max_examples_per_user: int | None = None
    mechanism: str = "eana"
    noise_multiplier: float | None = None
    epsilon: float | None = None
    delta: float | None = None
    l2_norm_clip: float = 1.0
    epochs: int = 5
    batch_size: int = 256
    learning_rate: float | None = None
    momentum: float = 0.9
    embedding_dim: int = 32
    hidden_units: tuple = (64,)
    context_length: int = 20
    test_fraction: float = 0.2
    split_seed: int = 0
    seed: int | None = None
    accountant: str = "pld"
    max_test_examples: int | None = None
    k: int = 10
    eana_bound_examples: int = 3
    verbose: int = 1
    audit_canaries: int | None = None
    fail_on_warnings: bool = False
    max_hours: float | None = None

    def __post_init__(self):
        if self.mechanism in movielens_privacy.REFUSED_MECHANISMS:
            raise ValueError(f"`mechanism` {self.mechanism!r}: {movielens_privacy.REFUSED_MECHANISMS[self.mechanism]}.")
        if self.mechanism not in movielens_privacy.MECHANISM_NAMES:
            raise ValueError(
                f"`mechanism` must be one of {movielens_privacy.MECHANISM_NAMES}; received {self.mechanism!r}."
            )
        if self.privacy_unit not in movielens_units.PRIVACY_UNITS:
            raise ValueError(
                f"`privacy_unit` must be one of {movielens_units.PRIVACY_UNITS}; received {self.privacy_unit!r}."
            )
        k = self.max_examples_per_user
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(f"`max_examples_per_user` must be an int >= 1 or None; received {k!r}.")
        if k is not None and self.privacy_unit != movielens_units.USER:
            raise ValueError("`max_examples_per_user` bounds a user's examples: it needs privacy_unit 'user'.")
        for name in ("epochs", "batch_size", "embedding_dim", "context_length", "k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be an int >= 1; received {value!r}.")
        for name in ("l2_norm_clip",) + (("learning_rate",) if self.learning_rate is not None else ()):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0 or not math.isfinite(value):
                raise ValueError(f"`{name}` must be a finite number > 0; received {value!r}.")
        if self.delta is not None and not 0 < self.delta < 1:
            raise ValueError(f"`delta` must lie in (0, 1); received {self.delta!r}.")

    @property
    def resolved_learning_rate(self) -> float:
        if self.learning_rate is not None:
            return self.learning_rate
        large_noise = self.epsilon is not None or (self.noise_multiplier or 0.0) >= SMALL_SIGMA_FOR_PLD
        if self.mechanism != "none" and large_noise:
            return LARGE_NOISE_LEARNING_RATE
        return DEFAULT_LEARNING_RATES[self.mechanism]
