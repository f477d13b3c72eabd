"""Criteo display-ads schema: field names, vocabulary sizes, table sizes.

A Criteo row (Kaggle `train.txt`, Criteo-1TB `day_N`) has 40 tab-separated
fields: the 0/1 click label, 13 integer features `I1..I13` and 26 categorical
features `C1..C26` (32-bit hashes written as 8 hex digits). Any field but the
label may be empty (missing).

Categorical values are hashed into per-feature buckets. The vocabulary size
`V` of feature `Ck` defaults to DP-FEST Table 3; bucket 0 is reserved for a
missing value and a present value `s` goes to `1 + Fingerprint64(s) mod V`, so
the embedding table of `Ck` has `V + 1` rows (`table_sizes`).

Example:
    >>> table_sizes()["C9"]
    4
    >>> embedding_dim(CRITEO_VOCAB_SIZES["C3"])  # int(2 * 82741 ** 0.25)
    33

References: DP-FEST (Ghazi et al., NeurIPS 2023) App. D.1, Table 3.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

LABEL = "label"
INT_FEATURES: tuple[str, ...] = tuple(f"I{i}" for i in range(1, 14))
CAT_FEATURES: tuple[str, ...] = tuple(f"C{i}" for i in range(1, 27))
NUM_FIELDS = 1 + len(INT_FEATURES) + len(CAT_FEATURES)  # 40
INT_MISSING = "int_missing"
"""Key of the float32 `[13]` missing-indicator feature (1.0 = `Ik` was empty)."""

MISSING_BUCKET = 0
"""Bucket id of a missing (empty) categorical value, in every feature."""

# DP-FEST Table 3: "categorical-feature-14" .. "-39" are C1 .. C26 (features
# 1..13 are the integers). Cross-checked against the Kaggle sample: C9 and C20
# have 3 values, C17 has ~10, C14 ~27.
CRITEO_VOCAB_SIZES: Mapping[str, int] = dict(
    zip(
        CAT_FEATURES,
        (
            1472,
            577,
            82741,
            18940,
            305,
            23,
            1172,
            633,
            3,
            9090,
            5918,
            64300,
            3207,
            27,
            1550,
            44262,
            10,
            5485,
            2161,
            3,
            56473,
            17,
            15,
            27360,
            104,
            12934,
        ),
    )
)


def embedding_dim(vocab_size: int) -> int:
    """Embedding width for a feature with `vocab_size` values: `int(2 * V ** 0.25)`.

    Args:
      vocab_size: number of distinct values V (>= 1).

    Returns:
      The embedding dimension (e.g. 33 for V = 82,741; 2 for V = 3).

    Raises:
      ValueError: if `vocab_size` < 1.

    References: DP-FEST App. D.1.1 ("heuristic rule int(2V^0.25)").
    """
    if int(vocab_size) < 1:
        raise ValueError(f"`vocab_size` must be >= 1, got {vocab_size!r}.")
    return int(2 * int(vocab_size) ** 0.25)


def resolve_vocab_sizes(
    vocab_sizes: Mapping[str, int] | Sequence[int] | None = None,
    hash_size: int | None = None,
) -> dict[str, int]:
    """Per-feature hash vocabulary sizes `{"C1": V1, ..., "C26": V26}`.

    Args:
      vocab_sizes: a mapping `Ck -> V` naming all 26 features, a sequence of 26
        sizes in `C1..C26` order, or None for DP-FEST Table 3.
      hash_size: one size for every feature instead (exclusive with
        `vocab_sizes`).

    Returns:
      A new dict with one positive int per categorical feature.

    Raises:
      ValueError: both arguments given, missing/extra feature names, wrong
        length, or a size < 1.
    """
    if vocab_sizes is not None and hash_size is not None:
        raise ValueError(
            "Pass either `vocab_sizes` or `hash_size`, not both "
            f"(got vocab_sizes={type(vocab_sizes).__name__}, hash_size={hash_size!r})."
        )
    if hash_size is not None:
        sizes = {name: hash_size for name in CAT_FEATURES}
    elif vocab_sizes is None:
        sizes = dict(CRITEO_VOCAB_SIZES)
    elif isinstance(vocab_sizes, Mapping):
        if set(vocab_sizes) != set(CAT_FEATURES):
            missing = sorted(set(CAT_FEATURES) - set(vocab_sizes), key=CAT_FEATURES.index)
            extra = sorted(set(vocab_sizes) - set(CAT_FEATURES))
            raise ValueError(
                "`vocab_sizes` must name exactly the 26 categorical features C1..C26; "
                f"missing {missing}, unexpected {extra}."
            )
        sizes = {name: vocab_sizes[name] for name in CAT_FEATURES}
    else:
        values = list(vocab_sizes)
        if len(values) != len(CAT_FEATURES):
            raise ValueError(f"`vocab_sizes` as a sequence must have 26 entries (C1..C26), got {len(values)}.")
        sizes = dict(zip(CAT_FEATURES, values))
    for name, size in sizes.items():
        if isinstance(size, bool) or int(size) != size or int(size) < 1:
            raise ValueError(f"Vocabulary size of {name} must be a positive integer, got {size!r}.")
        sizes[name] = int(size)
    return sizes


def table_sizes(
    vocab_sizes: Mapping[str, int] | Sequence[int] | None = None,
    hash_size: int | None = None,
) -> dict[str, int]:
    """Embedding-table rows per categorical feature: `V + 1` (row 0 = missing).

    Args:
      vocab_sizes: as in `resolve_vocab_sizes`.
      hash_size: as in `resolve_vocab_sizes`.

    Returns:
      `{"C1": V1 + 1, ...}`; bucket ids of `Ck` lie in `[0, V_k]`.
    """
    return {k: v + 1 for k, v in resolve_vocab_sizes(vocab_sizes, hash_size).items()}


__all__ = [
    "CAT_FEATURES",
    "CRITEO_VOCAB_SIZES",
    "INT_FEATURES",
    "INT_MISSING",
    "LABEL",
    "MISSING_BUCKET",
    "NUM_FIELDS",
    "embedding_dim",
    "resolve_vocab_sizes",
    "table_sizes",
]
