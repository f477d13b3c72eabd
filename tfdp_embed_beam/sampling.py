"""The per-example step draw and the per-step cut, as pure functions of (seed, key): numpy only.

A Beam runner may split the input into bundles any way it likes and re-run
a bundle after a failure, so no draw may depend on what else a worker
processed before. Each draw has its own counter-based generator (Philox,
Salmon et al. 2011), keyed by the run's seed and addressed by the example
or step:

    example (file f, line l):  Philox(key = (seed, 0), counter = (0, 0, l, f))
    cut of step t:             Philox(key = (seed, 1), counter = (0, 0, t, 0))

so a retried or re-split bundle draws exactly the same steps.

Example (f, l) joins step t of the E T cells 0 .. E T - 1 (E epochs of T =
round(1/q) steps) independently with probability q: the gaps between its
joined cells are i.i.d. Geometric(q) (numpy's geometric sampler), as in
`tfdp_embed.data.one_pass` (whose block stream this is, one example long).
A step with more than `max_batch_size` examples keeps a uniformly random
subset: its members are put in a canonical order (by key), permuted with the
step's generator, and the first `max_batch_size` kept; the permutation also
fixes each kept example's position in the batch.

Example:
    >>> example_steps(7, 0, 41, sampling_probability=0.01, total_steps=300)
    array([139, 189, 280])

References: Chua et al., "Scalable DP-SGD: Shuffling vs. Poisson
Subsampling", NeurIPS 2024 §5 (map each example to its steps, group by
step, truncate); Salmon et al., "Parallel random numbers: as easy as
1, 2, 3", SC 2011 (Philox).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

_EXAMPLE_DOMAIN, _CUT_DOMAIN = 0, 1
_MAX_WORD = 2**64


def check_seed(seed) -> int:
    """`seed` as an int in [0, 2^64).

    Raises:
      ValueError: not such an int.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < _MAX_WORD:
        raise ValueError(f"`seed` must be an int in [0, 2**64); received {seed!r}.")
    return int(seed)


def example_steps(
    seed: int, file_index: int, line_number: int, *, sampling_probability: float, total_steps: int
) -> np.ndarray:
    """The sorted int64 steps in [0, total_steps) that example (file_index, line_number) joins.

    P[step t drawn] = q, independently over steps and examples.

    Args:
      seed: the run's seed, in [0, 2^64).
      file_index: the example's file, its index in the run's sorted input list.
      line_number: the example's line in that file (0-based).
      sampling_probability: q in (0, 1].
      total_steps: epochs x steps per epoch.

    Returns:
      The joined steps, ascending.
    """
    return joined_cells(_generator(seed, _EXAMPLE_DOMAIN, line_number, file_index), total_steps, sampling_probability)


def joined_cells(rng: np.random.Generator, cells: int, q: float) -> np.ndarray:
    """Sorted indices of the joined cells of `cells` independent Bernoulli(q) trials (geometric skips).

    The gaps between successes of a Bernoulli(q) sequence are i.i.d.
    Geometric(q); draws go in blocks sized to cover the rest with high
    probability. Shared with `tfdp_embed.data.one_pass` (which imports it
    from here: this module needs numpy only).
    """
    if q >= 1.0:
        return np.arange(cells, dtype=np.int64)
    found, end = [], -1
    while True:
        expected = (cells - 1 - end) * q
        gaps = rng.geometric(q, size=int(expected + 6 * math.sqrt(expected) + 16))
        positions = end + np.cumsum(gaps, dtype=np.int64)
        found.append(positions[positions < cells])
        if positions[-1] >= cells:
            return np.concatenate(found)
        end = int(positions[-1])


def cut_step(seed: int, step: int, members: Sequence, max_batch_size: int | None) -> tuple[list, int]:
    """A step's batch in uniformly random order, cut to `max_batch_size`; the same for any order of `members`.

    Args:
      seed: the run's seed, in [0, 2^64).
      step: the global step.
      members: `(key, value)` pairs of the examples that drew this step;
        keys (e.g. (file, line)) are distinct and sortable.
      max_batch_size: cap, or None.

    Returns:
      `(kept, cut)`: the kept `(key, value)` pairs in batch order, and how many were cut.
    """
    canonical = sorted(members, key=lambda member: member[0])
    order = _generator(seed, _CUT_DOMAIN, step, 0).permutation(len(canonical))
    kept = [canonical[i] for i in order[: max_batch_size if max_batch_size is not None else len(order)]]
    return kept, len(canonical) - len(kept)


def _generator(seed: int, domain: int, word2: int, word3: int) -> np.random.Generator:
    """The Philox generator keyed by (seed, domain), its counter starting at (0, 0, word2, word3)."""
    for word in (word2, word3):
        if not 0 <= word < _MAX_WORD:
            raise ValueError(f"Example keys and steps must be ints in [0, 2**64); received {word!r}.")
    key = np.array([check_seed(seed), domain], dtype=np.uint64)
    counter = np.array([0, 0, word2, word3], dtype=np.uint64)
    return np.random.Generator(np.random.Philox(counter=counter, key=key))


__all__ = ["check_seed", "cut_step", "example_steps"]
