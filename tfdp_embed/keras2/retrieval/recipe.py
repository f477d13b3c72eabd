"""`RetrievalRecipe`: the loss, negatives, optimizer and schedule that the retrieval benchmark measured.

    recipe = RetrievalRecipe()                  # full softmax, SGD 2.0 cosine-decayed over 12 epochs
    task = Retrieval(item_tower, catalogue, identifiers=ids, negatives=recipe.make_negatives(seed=0))
    dp.compile(optimizer=recipe.optimizer(steps=recipe.epochs * round(1 / q)))

The defaults are the ones whose non-private control (the same model through
`DPModel` with `NonPrivate`) is at least as good as a tuned plain TFRS
two-tower (in-batch negatives with TFRS' log-Q correction, Adagrad) on
ml-100k recall@10, so that the gap between a DP run and that control
measures the noise (`python -m benchmarks.retrieval`; the numbers are in
benchmarks/RESULTS.md). They were picked on a validation split carved from
the training ratings, never on the test split:

* the loss: the full softmax over the catalogue (`FullSoftmax`), exact; a
  sampled softmax (`negatives="sampled"`, uniform proposal, K = 256) is for
  catalogues whose full softmax does not fit a step;
* the optimizer: plain SGD, which LazyDP and every sparse mechanism step
  exactly (`tfdp_embed.mechanisms.lazy.closed_form`: Adagrad and Adam have no
  lazy closed form), at learning rate 2.0 on the mean loss (the DP step
  divides the noised sum by the expected batch size), cosine-decayed to 0
  over the run: the decay settles the last epochs, where a constant rate
  left recall@10 swinging by 0.005 from epoch to epoch (rate 3 is faster
  but the sampled softmax diverged there; 5 diverged with either);
* 12 epochs of Poisson batches of expected size 512 (validation recall@10
  of the non-private full softmax: 0.052 after 8 epochs, 0.058 after 12,
  0.057 after 16, against 0.060 for the best TFRS setting, a difference
  within the validation split's standard error of about 0.003).

References: Yi et al., RecSys 2019 (sampled softmax, log-Q correction);
Loshchilov & Hutter, ICLR 2017 (cosine decay).
"""

from __future__ import annotations

import dataclasses

from tfdp_embed._checks import check_int
from tfdp_embed.keras2._keras import keras
from tfdp_embed.keras2.retrieval.negatives import FullSoftmax, SampledSoftmax

NEGATIVES = ("full", "sampled")


@dataclasses.dataclass(frozen=True)
class RetrievalRecipe:
    """Defaults for training a `Retrieval` task with DP (and its non-private control).

    Args:
      negatives: "full" (every catalogue item) or "sampled" (a shared uniform sample per step).
      num_negatives: K of the sampled softmax.
      learning_rate: SGD learning rate at the first step (mean loss).
      momentum: SGD momentum in [0, 1) (LazyDP has a closed form for it).
      cosine_decay: decay the learning rate to 0 over the run (`keras.optimizers.schedules.CosineDecay`).
      epochs: passes over the data (Poisson batches: round(1 / q) steps each).
      batch_size: expected batch size q N.

    Raises:
      ValueError: a value outside its range (named).
    """

    negatives: str = "full"
    num_negatives: int = 256
    learning_rate: float = 2.0
    momentum: float = 0.0
    cosine_decay: bool = True
    epochs: int = 12
    batch_size: int = 512

    def __post_init__(self):
        if self.negatives not in NEGATIVES:
            raise ValueError(f"`negatives` must be one of {NEGATIVES}; received {self.negatives!r}.")
        for name in ("num_negatives", "epochs", "batch_size"):
            check_int(name, getattr(self, name))
        if not self.learning_rate > 0:
            raise ValueError(f"`learning_rate` must be > 0; received {self.learning_rate!r}.")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"`momentum` must be in [0, 1); received {self.momentum!r}.")

    def make_negatives(self, *, seed: int | None = None) -> FullSoftmax | SampledSoftmax:
        """`FullSoftmax()` or `SampledSoftmax(num_negatives, seed=seed)` (uniform, log-Q corrected)."""
        return FullSoftmax() if self.negatives == "full" else SampledSoftmax(self.num_negatives, seed=seed)

    def optimizer(self, *, steps: int) -> keras.optimizers.legacy.SGD:
        """Legacy SGD at `learning_rate` (cosine-decayed to 0 over `steps` steps if `cosine_decay`)."""
        steps = check_int("steps", steps)
        rate = keras.optimizers.schedules.CosineDecay(self.learning_rate, steps) if self.cosine_decay else None
        return keras.optimizers.legacy.SGD(rate or self.learning_rate, momentum=self.momentum)

    def get_config(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_config(cls, config: dict) -> RetrievalRecipe:
        return cls(**config)


__all__ = ["NEGATIVES", "RetrievalRecipe"]
