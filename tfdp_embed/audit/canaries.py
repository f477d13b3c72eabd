"""Canaries for the secret sharer audit: random (context, label) examples and their candidates.

A canary is an out-of-distribution training example the model has no reason
to learn except by memorising it: here a random watch history of
`context_length` distinct items and a random label item not in that history,
all drawn uniformly from `item_ids`. Canaries are inserted into the training
data a fixed number of times each (EANA §4.1: 1, 2, 3, 4, 5, 10, 20, 50, 100;
50 canaries per count on MovieLens 20M). Their exposure is then measured
against *candidates*: sequences drawn from the same distribution that were
never inserted (EANA: 16,384 of them).

Two sequences are the same when they have the same label and the same
**set** of context items: the bag-of-words context tower of EANA's model
(§4.1.2) cannot tell orderings apart, so a candidate that is a permutation of
a canary would be an inserted sequence in disguise. Canaries are pairwise
distinct under this key and candidates never equal a canary (collisions are
re-drawn; with 1,682 items and 20-item contexts they essentially never
happen, but the guarantee does not rest on that).

Example:
    >>> canaries = generate_canaries(item_ids=np.arange(1, 1683), context_length=20,
    ...                              insertion_counts=(1, 10, 100), canaries_per_count=5, seed=0)
    >>> contexts, labels = canaries.training_examples()      # 5 * (1 + 10 + 100) rows
    >>> candidates = sample_candidates(item_ids=np.arange(1, 1683), context_length=20,
    ...                                num_candidates=16384, seed=1, exclude=canaries)

References: Carlini et al., "The Secret Sharer: Evaluating and Testing
Unintended Memorization in Neural Networks", USENIX Security 2019, §3
(canaries, randomness space); Berlowitz et al., "EANA", RecSys 2022, §2.3 and
§4.1.3 (canaries for the next-movie model, insertion counts, 16,384 candidates).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from tfdp_embed._checks import check_int

#: EANA §4.1.3: each canary is inserted this many times.
DEFAULT_INSERTION_COUNTS: tuple = (1, 2, 3, 4, 5, 10, 20, 50, 100)

#: EANA §4.1.3 used 50 canaries per insertion count and 16,384 candidates.
EANA_CANARIES_PER_COUNT = 50
EANA_NUM_CANDIDATES = 16384

_MAX_REDRAW_ROUNDS = 100


@dataclasses.dataclass(frozen=True)
class RandomSequences:
    """(context, label) sequences drawn uniformly at random: candidates, or the base of canaries.

    Attributes:
      contexts: int32 [n, context_length], distinct items per row, no padding.
      labels: int32 [n], never one of the row's context items.
    """

    contexts: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def keys(self) -> set:
        """The identity of each sequence as the model sees it: (sorted context, label)."""
        return {_key(c, lab) for c, lab in zip(self.contexts, self.labels)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class CanarySet(RandomSequences):
    """Canaries and how many times each is inserted into the training data.

    Attributes:
      contexts: int32 [k, context_length].
      labels: int32 [k].
      insertion_counts: int64 [k], how many copies of canary i go into training.
      seed: the seed they were drawn with.
    """

    insertion_counts: np.ndarray
    seed: int

    @property
    def num_inserted_examples(self) -> int:
        """Rows added to the training data: the sum of the insertion counts."""
        return int(self.insertion_counts.sum())

    def training_examples(self, *, shuffle_seed: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Every canary repeated `insertion_counts[i]` times, ready to add to a training pool.

        Args:
          shuffle_seed: None keeps the copies grouped canary by canary (the
            pipeline shuffles its pool anyway); an int shuffles the rows with it.

        Returns:
          (contexts int32 [sum counts, context_length], labels int32 [sum counts]).
        """
        contexts = np.repeat(self.contexts, self.insertion_counts, axis=0)
        labels = np.repeat(self.labels, self.insertion_counts, axis=0)
        if shuffle_seed is not None:
            order = np.random.default_rng(shuffle_seed).permutation(labels.shape[0])
            contexts, labels = contexts[order], labels[order]
        return contexts.astype(np.int32), labels.astype(np.int32)

    def as_dict(self) -> dict:
        """JSON-able description (the sequences themselves included, so an audit can be re-scored)."""
        return {
            "seed": int(self.seed),
            "num_canaries": len(self),
            "context_length": int(self.contexts.shape[1]),
            "insertion_counts": self.insertion_counts.tolist(),
            "num_inserted_examples": self.num_inserted_examples,
            "contexts": self.contexts.tolist(),
            "labels": self.labels.tolist(),
        }


def _key(context: np.ndarray, label) -> tuple:
    return (tuple(sorted(int(i) for i in context)), int(label))


def _check_item_ids(item_ids, context_length) -> np.ndarray:
    check_int("context_length", context_length)
    ids = np.asarray(item_ids)
    if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(
            f"`item_ids` must be a non-empty 1-D array of integer item ids; received dtype {ids.dtype}, "
            f"shape {ids.shape}."
        )
    ids = np.unique(ids)
    if ids.size < context_length + 1:
        raise ValueError(
            f"`item_ids` holds {ids.size} distinct ids; a sequence needs `context_length` + 1 = "
            f"{context_length + 1} distinct items (context without repeats, label not in the context)."
        )
    if ids.min() < np.iinfo(np.int32).min or ids.max() > np.iinfo(np.int32).max:
        raise ValueError("`item_ids` must fit in int32.")
    return ids


def _check_seed(seed) -> None:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"`seed` must be an int (audits are reproducible); received {seed!r}.")


def _draw(ids: np.ndarray, context_length: int, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """n rows of context_length + 1 distinct items drawn uniformly (the last one is the label)."""
    width = context_length + 1
    picks = np.empty((n, width), np.int64)
    todo = np.arange(n)
    if width * width <= ids.size:
        # Rejection: i.i.d. uniform positions, rows with a repeat redrawn whole. Conditioning
        # i.i.d. draws on "all distinct" is exactly uniform sampling without replacement;
        # a row is accepted with probability >= ~exp(-width^2 / (2 |ids|)) >= 0.6.
        for _ in range(_MAX_REDRAW_ROUNDS):
            picks[todo] = rng.integers(0, ids.size, size=(todo.size, width))
            ordered = np.sort(picks[todo], axis=1)
            todo = todo[np.any(ordered[:, 1:] == ordered[:, :-1], axis=1)]
            if todo.size == 0:
                break
    # Small vocabularies (or rows still unlucky): the first `width` positions of a uniform
    # random permutation (argsort of uniform keys), in chunks of ~2^22 keys.
    chunk = max(1, (1 << 22) // ids.size)
    for start in range(0, todo.size, chunk):
        rows = todo[start : start + chunk]
        picks[rows] = np.argsort(rng.random((rows.size, ids.size)), axis=1)[:, :width]
    items = ids[picks].astype(np.int32)
    return items[:, :context_length], items[:, context_length]


def _draw_distinct(
    ids: np.ndarray, context_length: int, n: int, rng: np.random.Generator, taken: set
) -> tuple[np.ndarray, np.ndarray]:
    """n sequences whose keys are pairwise distinct and not in `taken` (which is updated)."""
    contexts = np.empty((n, context_length), np.int32)
    labels = np.empty((n,), np.int32)
    filled = 0
    for _ in range(_MAX_REDRAW_ROUNDS):
        ctx, lab = _draw(ids, context_length, n - filled, rng)
        for c, label in zip(ctx, lab):
            key = _key(c, label)
            if key in taken:
                continue
            taken.add(key)
            contexts[filled], labels[filled] = c, label
            filled += 1
        if filled == n:
            return contexts, labels
    raise ValueError(
        f"could not draw {n} distinct sequences of {context_length} + 1 items from {ids.size} ids: "
        "the space of sequences is too small; use more items or a shorter context."
    )


def generate_canaries(
    *,
    item_ids,
    context_length: int,
    seed: int,
    insertion_counts: Sequence[int] = DEFAULT_INSERTION_COUNTS,
    canaries_per_count: int = 10,
) -> CanarySet:
    """Random, pairwise distinct (context, label) canaries with their insertion counts.

    Each canary: `context_length` distinct items drawn uniformly from
    `item_ids` (a watch history with no repeats), and a label drawn uniformly
    from the remaining items. Canary i is meant to be inserted
    `insertion_counts[i]` times (see `CanarySet.training_examples`).

    Args:
      item_ids: 1-D ints, the items a sequence may use (e.g. 1..num_items when
        id 0 is padding). Duplicates are ignored.
      context_length: items per context (EANA: 20).
      seed: explicit seed (an audit must be reproducible).
      insertion_counts: distinct ints >= 1 (default EANA's 1, 2, 3, 4, 5, 10, 20, 50, 100).
      canaries_per_count: canaries per insertion count (EANA: 50).

    Returns:
      A `CanarySet` of len(insertion_counts) * canaries_per_count canaries,
      grouped by count in the order given.

    Raises:
      ValueError: on a count < 1, repeated counts, non-integer or too few
        item ids, or a context_length < 1.
      TypeError: on a seed that is not an int.

    References: Carlini et al. 2019 §3; EANA (RecSys 2022) §4.1.3.
    """
    ids = _check_item_ids(item_ids, context_length)
    per_count = check_int("canaries_per_count", canaries_per_count)
    counts = [check_int("insertion_counts[i]", c) for c in insertion_counts]
    if not counts:
        raise ValueError("`insertion_counts` must hold at least one count >= 1; received an empty list.")
    if len(set(counts)) != len(counts):
        raise ValueError(f"`insertion_counts` must be distinct; received {list(insertion_counts)!r}.")
    _check_seed(seed)
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0xCA]))
    contexts, labels = _draw_distinct(ids, context_length, per_count * len(counts), rng, set())
    return CanarySet(
        contexts=contexts,
        labels=labels,
        insertion_counts=np.repeat(np.asarray(counts, np.int64), per_count),
        seed=int(seed),
    )


def sample_candidates(
    *,
    item_ids,
    context_length: int,
    num_candidates: int,
    seed: int,
    exclude: RandomSequences | None = None,
) -> RandomSequences:
    """Non-inserted sequences from the canaries' distribution, the reference population of exposure.

    Args:
      item_ids: the same item ids the canaries were drawn from.
      context_length: the canaries' context length.
      num_candidates: n (>= 1; EANA: 16,384). Exposure by rank is at most log2(n).
      seed: explicit seed; use a different one from the canaries'.
      exclude: sequences no candidate may equal (the canaries).

    Returns:
      `RandomSequences` with n pairwise distinct candidates, none equal to an
      excluded sequence.

    Raises:
      ValueError: on num_candidates < 1, a context length that does not match
        `exclude`, bad item ids, or a sequence space too small for n distinct candidates.
      TypeError: on a seed that is not an int.

    References: Carlini et al. 2019 §4 (exposure over the randomness space,
    estimated by sampling); EANA (RecSys 2022) §2.3.
    """
    ids = _check_item_ids(item_ids, context_length)
    n = check_int("num_candidates", num_candidates)
    _check_seed(seed)
    taken: set = set()
    if exclude is not None:
        if exclude.contexts.ndim != 2 or exclude.contexts.shape[1] != context_length:
            raise ValueError(f"`exclude` contexts have shape {exclude.contexts.shape}; expected [k, {context_length}].")
        taken = exclude.keys()
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0xCA0D]))
    contexts, labels = _draw_distinct(ids, context_length, n, rng, taken)
    return RandomSequences(contexts=contexts, labels=labels)


__all__ = [
    "DEFAULT_INSERTION_COUNTS",
    "EANA_CANARIES_PER_COUNT",
    "EANA_NUM_CANDIDATES",
    "CanarySet",
    "RandomSequences",
    "generate_canaries",
    "sample_candidates",
]
