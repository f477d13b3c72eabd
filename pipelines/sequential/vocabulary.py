"""The sequential pipeline's item ids: a DP vocabulary of the data's items, or a public catalogue.

The model's item table, its serving map and `known_ids` name the items it
knows. Numbered 1..(largest id in the file) they told whether the one user
holding the largest id was in the data (issue 33, N4). Now:

    private run, no catalogue:  the item set released by `dp_vocabulary` (one unit = one user, each user's
                                D0 most recent distinct items, Gaussian thresholding), noise sized for a share
                                of epsilon (a `Release` composed with the steps); the threshold's
                                delta_thr = share x delta is reported beside delta (`delta_with_vocabulary`)
    --item-catalogue FILE:      the file's ids (public, independent of the training data): nothing is spent
    non-private run:            the items of the data (nothing is guaranteed anyway)

Items outside the vocabulary are unknown (id 0): masked in training inputs,
no loss as targets, dropped from histories, a miss as evaluation targets.

References: Gopi et al., "Differentially private set union", ICML 2020;
Desfontaines et al., "Differentially private partition selection", PoPETs 2022.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from pipelines import run_limits
from tfdp_embed import Release, RunPlan
from tfdp_embed.data import vocabulary as vocabulary_lib
from tfdp_embed.data.item_ids import ItemIdMap
from tfdp_embed.data.sequence_files import MAX_ID
from tfdp_embed.data.sequences import SequenceData, remap_items, user_item_keys
from tfdp_embed.data.vocabulary import DPVocabulary, dp_vocabulary, public_vocabulary

if TYPE_CHECKING:  # config.py imports this module
    from pipelines.sequential.config import SequentialConfig

ITEM_VOCABULARY = "item_vocabulary"
DEFAULT_EPSILON_SHARE = 0.1
DEFAULT_MAX_ITEMS_PER_USER = 5
"""D0: on Amazon Games (median 6 items per user) D0 = 5 kept the most items at a 0.1 share of epsilon 8."""
THRESHOLD_DELTA_SHARE = 0.1
"""delta_thr = this share of the run's delta, reported on top of it (`delta_with_vocabulary`)."""


@dataclasses.dataclass(frozen=True)
class ItemVocabulary:
    """The run's item ids: the map the model and serving use, and how it was obtained."""

    ids: ItemIdMap
    vocabulary: DPVocabulary | None
    source: str

    def report(self) -> dict:
        out = {"source": self.source, "items": self.ids.num_items}
        if self.vocabulary is not None and not self.vocabulary.is_public:
            out.update(self.vocabulary.summary(), privacy_unit="user (each user's most recent distinct items)")
        return out


def vocabulary_release(epsilon_share: float | None, *, seeded: bool = False) -> Release:
    """The planned release of the item set: Gaussian, sized for its share of epsilon (`seeded`: from `--seed`)."""
    share = DEFAULT_EPSILON_SHARE if epsilon_share is None else float(epsilon_share)
    return Release(ITEM_VOCABULARY, epsilon_share=share, noise="gaussian", seeded=seeded)


def read_catalogue(path: str) -> np.ndarray:
    """Item ids of a public catalogue: one integer id >= 1 per line ('#' comments, blank lines skipped).

    Raises:
      ValueError: a line that is not one positive integer (file and line named), or no id.
    """
    ids = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            text = line.split("#", 1)[0].strip()
            if not text:
                continue
            if not text.isdigit() or not 1 <= int(text) <= MAX_ID:
                raise ValueError(
                    f"{path}:{number}: an item catalogue line must be one item id in [1, {MAX_ID}] (int32); "
                    f"read {text[:40]!r}."
                )
            ids.append(int(text))
    if not ids:
        raise ValueError(f"{path}: the item catalogue holds no item id.")
    return np.asarray(ids, np.int64)


def item_vocabulary(
    data: SequenceData,
    *,
    run: RunPlan | None,
    catalogue: str | None,
    max_items_per_user: int = DEFAULT_MAX_ITEMS_PER_USER,
    seed: int | None = None,
) -> ItemVocabulary:
    """The item ids of a run: a catalogue, the DP release planned in `run`, or (non-private) the data's.

    Raises:
      ValueError: a private run whose release selected no item (a larger share of epsilon or a catalogue).
    """
    if catalogue is not None:
        vocab = public_vocabulary(read_catalogue(catalogue), name=ITEM_VOCABULARY)
        return ItemVocabulary(ItemIdMap(vocab.keys, source=f"catalogue {catalogue}"), vocab, f"catalogue {catalogue}")
    keys = user_item_keys(data)
    if run is None or ITEM_VOCABULARY not in [r.name for r in run.releases]:
        ids = ItemIdMap.from_ids(np.concatenate([np.asarray(k, np.int64) for k in keys]), source="the data's items")
        return ItemVocabulary(ids, None, "the data's items (non-private run)")
    planned = run.release(ITEM_VOCABULARY)
    threshold_delta = THRESHOLD_DELTA_SHARE * run.target_delta
    vocab = dp_vocabulary(
        keys,
        max_keys_per_unit=max_items_per_user,
        noise_multiplier=planned.noise_multiplier,
        delta=run.target_delta + threshold_delta,
        threshold_delta=threshold_delta,
        seed=seed,
        name=ITEM_VOCABULARY,
    )
    if vocab.event not in planned.events or vocab.keys.size == 0:
        raise ValueError(
            f"The item vocabulary release selected {vocab.keys.size} items (event {vocab.event}, planned "
            f"{planned.events}). Allowed: a larger `vocabulary_epsilon_share`, a smaller `max_items_per_user`, "
            "or a public item catalogue (`--item-catalogue`)."
        )
    source = "DP vocabulary (Gaussian thresholding)"
    return ItemVocabulary(ItemIdMap(vocab.keys.astype(np.int64), source=source), vocab, source)


def check_item_memory(config: SequentialConfig, data: SequenceData) -> None:
    """Refuses (ValueError) item tables whose per-step logits cannot fit in this machine's memory.

    Training scores every position against every item row: `[B, L, rows]` float32 logits a step
    (rows = V + 1, or K + 2 with `--head-items K`); evaluation `[eval batch, V + 1]`. V is at most the
    catalogue's ids or the data's distinct items (a DP vocabulary keeps some of them).
    """
    if config.item_catalogue is not None:
        items, source = len(read_catalogue(config.item_catalogue)), "--item-catalogue's ids"
    else:
        items, source = int(data.distinct_items or data.num_items), "the data's distinct items"
    rows = items + 1 if config.head_items is None else min(items + 1, config.head_items + 2)
    train = 4 * config.batch * config.max_len * rows
    needed = max(train, 4 * config.eval_batch * (items + 1)) + 4 * config.dim * (items + 1)
    run_limits.check_memory(
        needed,
        what=f"The float32 item logits (--batch {config.batch} x --max-len {config.max_len} x {rows:,} item rows "
        f"({source}) a training step, --eval-batch {config.eval_batch} x {items + 1:,} in evaluation) and the table",
        fix="lower --batch, --max-len or --eval-batch, give --head-items, or an --item-catalogue of fewer ids",
    )


def apply(data: SequenceData, vocabulary: ItemVocabulary) -> SequenceData:
    """`data` in the vocabulary's dense ids (unknown items 0)."""
    return remap_items(data, vocabulary.ids)


def add_to_report(report: dict, vocabulary: ItemVocabulary) -> dict:
    """The vocabulary block and, for a DP release, the threshold's delta on top of the report's delta."""
    report.setdefault("extra", {})["item_vocabulary"] = vocabulary.report()
    return vocabulary_lib.add_threshold_delta(report, vocabulary.vocabulary, what="item vocabulary")


__all__ = [
    "DEFAULT_EPSILON_SHARE",
    "DEFAULT_MAX_ITEMS_PER_USER",
    "ITEM_VOCABULARY",
    "ItemVocabulary",
    "add_to_report",
    "apply",
    "check_item_memory",
    "item_vocabulary",
    "read_catalogue",
    "vocabulary_release",
]
