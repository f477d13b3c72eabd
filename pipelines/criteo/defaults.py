"""Settings the Criteo pipeline chooses from the data size when the flags leave them out.

One fixed model (DP-FEST's 4 x 598 tower, Table 3 vocabularies, learning
rate 1.0 at batch 2048) cannot train both a 1,000-row sample and a 10^8-row
log: on small files it diverges (too many weights, too large a step for the
small batch the file allows) or leaves most hash buckets unseen. These rules
scale each setting with N, the training rows (public, as for delta = 1/N and
q = B / N):

* hash buckets per categorical feature: Table 3's V_k capped at
  max(1000, 10^(floor(log10 N) - 1)), i.e. about one bucket per 10 rows, in
  whole decades so that the cap does not depend on a few rows more or less
  (N is estimated from the files' sizes here, before reading, because rows
  are hashed as they are read); `--vocabulary table3` keeps Table 3's sizes
  uncapped (a benchmark at Table 3's sizes must not depend on an estimate
  that lands just under a decade);
* ReLU tower: 64,32 below 10^5 rows, 256,128 below 10^6, 512,256,128 below
  10^7, DP-FEST App. D.1's 598 x 4 from 10^7 on;
* expected batch B: N_min / 16 rounded to a power of two, within [32, 2048]
  (N_min: the smallest streaming period), so that an epoch has about 16
  steps or more and B always fits the file;
* learning rate: DP mechanisms use the linear scaling rule
  eta = min(1.0, B x 0.3 / 512) / C: a DP-SGD step moves by
  eta (sum of clipped gradients + N(0, sigma^2 C^2)) / B, so a fixed
  eta C / B keeps each step's noise, and an epoch's largest move, the same
  at every batch size and clip norm; eta C = 0.3 at B = 512 and 1.0 at
  B = 2048 are the settings that train the Kaggle sample
  (`benchmarks/criteo_realdata.py`) and the default synthetic data at C = 1.
  The non-private run (`none`) takes the same rule at the default clip norm
  (C = 10, whatever `--clip` says, since it does not clip): at C = 10 a DP
  step is eta x (mean of the clipped gradients + N(0, sigma^2 C^2) / B), so
  the non-private step, eta x (mean gradient), is the DP run's step without
  its noise, and `none` is never run hotter than the DP default it is
  compared with. The former fixed 0.3 was 80 times the DP step at B = 64
  (0.3 against 0.00375; with momentum 0.9 an effective step of 3 on the mean
  gradient): on six 1,000-row slices of the real Criteo sample (16 steps an
  epoch, evaluated on its dev file) it gave AUC 0.53-0.64 and log loss above
  the base rate on 3 of 6 (one diverged to 0.580 against 0.536), worse than
  DP at epsilon 3; the rule gives AUC 0.63-0.65 and beats the base rate on
  all six, as DP does (AUC 0.63-0.66);
* clip norm C (`DEFAULT_CLIP`, not data-dependent): 10. With eta C fixed, a
  larger C adds no noise per step and leaves a clipped example's move as it
  was, but clips fewer examples: at C = 1 every example is clipped and each
  pushes the click logit with the same force whatever its error, so the
  majority of non-clicks drive the mean prediction far below the click
  rate (clipping bias; Chen, Wu & Hong 2020), which on a small file the
  output calibration is too noisy to undo.

Every setting the user gave is kept as given; `resolve` says which were chosen.

References: DP-FEST (Ghazi et al., NeurIPS 2023) App. D.1 (model, Table 3);
Goyal et al. 2017 (linear scaling rule); Sander et al., ICML 2023 ("TAN
without a burn": DP-SGD noise per step sigma / B).
"""

from __future__ import annotations

import dataclasses
import math

from tfdp_embed.data.criteo import CRITEO_VOCAB_SIZES

MIN_HASH_SIZE = 1000
TOWERS: tuple[tuple[float, tuple[int, ...]], ...] = (
    (1e5, (64, 32)),
    (1e6, (256, 128)),
    (1e7, (512, 256, 128)),
    (math.inf, (598, 598, 598, 598)),
)
"""(rows below, tower widths): the first entry whose bound exceeds N."""
MIN_BATCH, MAX_BATCH, ROWS_PER_BATCH = 32, 2048, 16
DP_LEARNING_RATE_PER_EXAMPLE = 0.3 / 512
MAX_DP_LEARNING_RATE = 1.0
DEFAULT_CLIP = 10.0


def hash_size_cap(rows: float) -> int:
    """Bucket cap per categorical feature for about `rows` rows: max(1000, 10^(floor(log10 rows) - 1))."""
    decade = 10 ** max(0, math.floor(math.log10(max(rows, 1.0))) - 1)
    return max(MIN_HASH_SIZE, int(decade))


def vocabulary(rows: float) -> dict:
    """`{Ck: min(V_k of Table 3, hash_size_cap(rows))}`."""
    cap = hash_size_cap(rows)
    return {name: min(int(size), cap) for name, size in CRITEO_VOCAB_SIZES.items()}


def hidden_units(rows: int) -> tuple[int, ...]:
    """ReLU tower widths for N training rows (`TOWERS`)."""
    return next(units for bound, units in TOWERS if rows < bound)


def batch_size(rows: int) -> int:
    """Expected batch B for a period of N rows: N / 16 rounded to a power of two, in [32, 2048], at most N."""
    power = 2 ** round(math.log2(max(rows / ROWS_PER_BATCH, 1.0)))
    return int(min(rows, max(MIN_BATCH, min(MAX_BATCH, power))))


def learning_rate(mechanism: str, batch: int, clip: float) -> float:
    """SGD learning rate min(1.0, B x 0.3 / 512) / C (linear scaling in B, fixed eta C).

    `none` uses C = `DEFAULT_CLIP` whatever `clip` is: its step is then the
    default DP step without the noise (module docstring), never a larger one.
    """
    if mechanism == "none":
        clip = DEFAULT_CLIP
    return min(MAX_DP_LEARNING_RATE, batch * DP_LEARNING_RATE_PER_EXAMPLE) / float(clip)


@dataclasses.dataclass(frozen=True)
class Chosen:
    """The run's model and optimizer settings, and which of them the rules chose.

    Attributes:
      batch, hidden_units, learning_rate: the values the run uses.
      vocabulary: "hash size H", or "DP-FEST Table 3 capped at H buckets" (chosen).
      rows: N, the training rows the rules read (None when every value was given).
      rows_estimate: the estimate the hash cap was chosen from (None if `--hash-size` was given).
      chosen: the names of the settings the rules chose (the others were flags).
    """

    batch: int
    hidden_units: tuple
    learning_rate: float
    vocabulary: str
    rows: int | None
    rows_estimate: int | None
    chosen: tuple

    def report(self) -> dict:
        """The report's `defaults` entry: each setting, its value, and whether a rule chose it."""
        values = {
            "batch": self.batch,
            "hidden_units": list(self.hidden_units),
            "learning_rate": self.learning_rate,
            "vocabulary": self.vocabulary,
        }
        return {
            "chosen_from_data": list(self.chosen),
            "values": values,
            "training_rows": self.rows,
            "training_rows_estimate": self.rows_estimate,
            "rules": "pipelines/criteo/defaults.py (README: Criteo pipeline, defaults)",
        }

    def describe(self) -> str:
        """One line for the run's start: every setting, chosen ones marked."""
        parts = []
        for name, value in (
            ("batch", self.batch),
            ("hidden units", ",".join(str(u) for u in self.hidden_units)),
            ("learning rate", f"{self.learning_rate:.4g}"),
            ("vocabulary", self.vocabulary),
        ):
            key = name.replace(" units", "_units").replace(" rate", "_rate")
            parts.append(f"{name} {value}" + (" (chosen)" if key in self.chosen else ""))
        source = f" for {self.rows:,} training rows" if self.rows is not None else ""
        return f"settings{source}: " + "; ".join(parts)


def resolve(
    *,
    mechanism: str,
    clip: float,
    rows: int,
    smallest_period: int,
    batch: int | None,
    hidden: tuple | None,
    lr: float | None,
    hash_size: int | None,
    rows_estimate: int | None,
    table3_vocabulary: bool = False,
) -> Chosen:
    """Fills the settings left unset (None) by the rules above.

    Args:
      mechanism: the mechanism's name ("none" is non-private).
      clip: the per-example clip norm C.
      rows: N, the training rows read.
      smallest_period: rows of the smallest streaming period (N with one period).
      batch, hidden, lr, hash_size: the flags (None: choose).
      table3_vocabulary: True when `--vocabulary table3` fixed Table 3's sizes (no cap chosen).
      rows_estimate: the row estimate the vocabulary cap was chosen from.
    """
    chosen: list[str] = []
    if batch is None:
        batch, chosen = batch_size(smallest_period), [*chosen, "batch"]
    if hidden is None:
        hidden, chosen = hidden_units(rows), [*chosen, "hidden_units"]
    if lr is None:
        lr, chosen = learning_rate(mechanism, batch, clip), [*chosen, "learning_rate"]
    if table3_vocabulary:
        vocab = "DP-FEST Table 3 (uncapped)"
    elif hash_size is None:
        vocab = f"DP-FEST Table 3 capped at {hash_size_cap(rows_estimate or rows)} buckets"
        chosen.append("vocabulary")
    else:
        vocab = f"hash size {hash_size}"
    return Chosen(
        batch=int(batch),
        hidden_units=tuple(hidden),
        learning_rate=float(lr),
        vocabulary=vocab,
        rows=int(rows),
        rows_estimate=rows_estimate,
        chosen=tuple(chosen),
    )


__all__ = [
    "DEFAULT_CLIP",
    "Chosen",
    "batch_size",
    "hash_size_cap",
    "hidden_units",
    "learning_rate",
    "resolve",
    "vocabulary",
]
