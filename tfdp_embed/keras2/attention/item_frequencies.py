"""Item frequencies p_i for Re-Attention: released with DP, or supplied public ones.

DPFormer (Remark A.2) assumes the frequencies are public (purchase counts
are shown on many platforms). Frequencies computed from the training data
are not public: they are released once with a Gaussian or Laplace mechanism
and the release is one more `dp_accounting` event composed with training:

    count_i = |{u : item i in u's training input}|           (each user: at most L distinct items)
    Gaussian: count_i + N(0, (z sqrt(L))^2)                  L2 sensitivity sqrt(L)
    Laplace:  count_i + Lap(z L)                             L1 sensitivity L
    p_i = min(max(noisy count_i, 0), N) / N

under add/remove-one-user adjacency (N, the number of users, is treated as
public, as everywhere in the privacy report). The event is
`GaussianDpEvent(z)` or `LaplaceDpEvent(z)`.

Public frequencies come from outside the training data, e.g. a file read by
`read_item_frequencies`; they cost nothing only if they are independent of
the training data, which the privacy report then states as a condition.

Example:
    >>> freq = private_item_frequencies(counts, num_users=31013, max_items_per_user=50,
    ...                                 noise_multiplier=20.0, seed=None)
    >>> ledger.record_setup(freq.event)

References: DPFormer Remark A.2, Claim 4.4; Dwork & Roth 2014 §3.3, §3.5.
"""

from __future__ import annotations

import dataclasses
import math
import os

import dp_accounting
import numpy as np

from tfdp_embed._checks import check_int

MECHANISMS = ("gaussian", "laplace")


@dataclasses.dataclass(frozen=True)
class ItemFrequencies:
    """p_i and how they were obtained.

    Attributes:
      frequencies: float64 `[V + 1]` p_i in [0, 1] (index 0: padding, 0).
      source: "public", "public-file", "exact (not private)" or
        "private-gaussian" / "private-laplace".
      event: the `dp_accounting.DpEvent` of the release (None unless private).
      noise_multiplier: z (None unless private).
      noise_std: the noise std added to each count (None unless private).
      sensitivity: the count vector's sensitivity, sqrt(L) (L2) or L (L1) (None unless private).
      path: the file public frequencies were read from (None otherwise).
    """

    frequencies: np.ndarray
    source: str
    event: dp_accounting.DpEvent | None = None
    noise_multiplier: float | None = None
    noise_std: float | None = None
    sensitivity: float | None = None
    path: str | None = None

    def report(self) -> dict:
        out = {
            "source": self.source,
            "noise_multiplier": self.noise_multiplier,
            "noise_std": self.noise_std,
            "sensitivity": self.sensitivity,
            "dp_event": None if self.event is None else repr(self.event),
        }
        if self.path is not None:
            out["file"] = self.path
        return out


def _check_counts(counts, num_users) -> np.ndarray:
    counts = np.asarray(counts)
    if counts.ndim != 1 or counts.size < 2 or np.any(counts < 0):
        raise ValueError(f"`counts` must be a 1-D array [items + 1] of counts >= 0; received shape {counts.shape}.")
    num_users = check_int("num_users", num_users)
    if counts.max() > num_users:
        raise ValueError(f"A count ({counts.max()}) exceeds `num_users`={num_users}: counts must count users.")
    return counts.astype(np.float64)


def public_item_frequencies(counts, *, num_users: int) -> ItemFrequencies:
    """p_i = count_i / N from counts that are public (DPFormer Remark A.2): no privacy cost is accounted.

    Only for counts independent of the training data (e.g. another
    platform's purchase counts). Counts of the training data are not public:
    release them with `private_item_frequencies`.
    """
    counts = _check_counts(counts, num_users)
    freq = counts / num_users
    freq[0] = 0.0
    return ItemFrequencies(frequencies=freq, source="public")


def exact_item_frequencies(counts, *, num_users: int) -> ItemFrequencies:
    """p_i = count_i / N of the training data itself, for NON-private runs only (labelled as such)."""
    return dataclasses.replace(public_item_frequencies(counts, num_users=num_users), source="exact (not private)")


def private_item_frequencies(
    counts,
    *,
    num_users: int,
    max_items_per_user: int,
    noise_multiplier: float,
    mechanism: str = "gaussian",
    seed: int | None = None,
) -> ItemFrequencies:
    """Releases p_i with the Gaussian (or Laplace) mechanism; returns them with their DP event.

    Args:
      counts: `[V + 1]` users per item (each user counted once per item).
      num_users: N.
      max_items_per_user: L, the most distinct items one user adds to (the
        training input length): the sensitivity is sqrt(L) (L2) or L (L1).
      noise_multiplier: z > 0, noise std (Gaussian) or scale (Laplace) per unit sensitivity.
      mechanism: "gaussian" or "laplace".
      seed: int for tests; None draws from OS entropy.

    Returns:
      `ItemFrequencies` with `event` = `GaussianDpEvent(z)` / `LaplaceDpEvent(z)`.

    Raises:
      ValueError: bad counts, a non-positive multiplier or L, an unknown mechanism.
    """
    counts = _check_counts(counts, num_users)
    max_items_per_user = check_int("max_items_per_user", max_items_per_user)
    if not (noise_multiplier > 0 and math.isfinite(noise_multiplier)):
        raise ValueError(f"`noise_multiplier` must be a finite number > 0; received {noise_multiplier!r}.")
    if mechanism not in MECHANISMS:
        raise ValueError(f"`mechanism` must be one of {MECHANISMS}; received {mechanism!r}.")
    rng = np.random.default_rng(seed)
    if mechanism == "gaussian":
        std = noise_multiplier * math.sqrt(max_items_per_user)
        noisy = counts + rng.normal(0.0, std, size=counts.shape)
        event = dp_accounting.GaussianDpEvent(float(noise_multiplier))
    else:
        scale = noise_multiplier * max_items_per_user
        noisy = counts + rng.laplace(0.0, scale, size=counts.shape)
        std = scale * math.sqrt(2.0)
        event = dp_accounting.LaplaceDpEvent(float(noise_multiplier))
    freq = np.clip(noisy, 0.0, num_users) / num_users
    freq[0] = 0.0
    sensitivity = math.sqrt(max_items_per_user) if mechanism == "gaussian" else float(max_items_per_user)
    return ItemFrequencies(
        frequencies=freq,
        source=f"private-{mechanism}",
        event=event,
        noise_multiplier=float(noise_multiplier),
        noise_std=float(std),
        sensitivity=sensitivity,
    )


class ItemFrequencyFileError(ValueError):
    """A malformed item-frequency file; the message names the file and line."""


def read_item_frequencies(path: str, *, num_items: int) -> ItemFrequencies:
    """Reads public item frequencies p_i from a text file.

    Format: one `item_id frequency` pair per line, whitespace separated;
    `item_id` an integer in [1, num_items], `frequency` a number in [0, 1]:
    the share of users whose sequence contains the item (DPFormer's p_i;
    divide public counts by their population's size). Blank lines and lines
    starting with `#` are ignored; each item appears at most once; items not
    listed get frequency 0 (the pipeline floors them).

        # item_id frequency
        1 0.0123
        7 0.5

    The frequencies must be independent of the training data for the run
    to be private as reported: the caller states that as a condition.

    Args:
      path: the file.
      num_items: V, the largest item id of the data.

    Returns:
      `ItemFrequencies` with source "public-file", `path` set and no event.

    Raises:
      FileNotFoundError: `path` does not exist.
      ItemFrequencyFileError: a malformed line (names file and line), a
        duplicate or out-of-range item, or a file with no items.
    """
    num_items = check_int("num_items", num_items)
    if not os.path.exists(path):
        raise FileNotFoundError(f"Item-frequency file not found: {path!r}.")
    freq = np.zeros(num_items + 1, np.float64)
    seen: dict[int, int] = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            item, value = _parse_frequency_line(path, number, text, num_items)
            if item in seen:
                raise ItemFrequencyFileError(f"{path}:{number}: item {item} already given on line {seen[item]}.")
            seen[item] = number
            freq[item] = value
    if not seen:
        raise ItemFrequencyFileError(f"{path}: the file lists no items (expected lines 'item_id frequency').")
    return ItemFrequencies(frequencies=freq, source="public-file", path=os.fspath(path))


def _parse_frequency_line(path: str, number: int, text: str, num_items: int) -> tuple[int, float]:
    fields = text.split()
    if len(fields) != 2:
        raise ItemFrequencyFileError(
            f"{path}:{number}: expected 2 fields 'item_id frequency', found {len(fields)}: {text!r}."
        )
    try:
        item = int(fields[0])
    except ValueError:
        raise ItemFrequencyFileError(f"{path}:{number}: item_id must be an integer; received {fields[0]!r}.") from None
    try:
        value = float(fields[1])
    except ValueError:
        raise ItemFrequencyFileError(f"{path}:{number}: frequency must be a number; received {fields[1]!r}.") from None
    if not 1 <= item <= num_items:
        raise ItemFrequencyFileError(
            f"{path}:{number}: item_id must lie in [1, {num_items}] (the data's items); received {item}."
        )
    if not 0 <= value <= 1:  # also rejects nan
        raise ItemFrequencyFileError(
            f"{path}:{number}: frequency must lie in [0, 1] (a share of users); received {fields[1]!r}."
        )
    return item, value


__all__ = [
    "MECHANISMS",
    "ItemFrequencies",
    "ItemFrequencyFileError",
    "exact_item_frequencies",
    "private_item_frequencies",
    "public_item_frequencies",
    "read_item_frequencies",
]
