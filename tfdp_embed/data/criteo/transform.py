"""Raw Criteo fields -> model features, in pure TF (shared by training and serving).

* `I_k -> sign(x) * log(1 + |x|)`, 0 when missing (for x >= 0 the usual
  `log(1 + x)`; Criteo's few negatives, I2 in -1..-3, keep their sign
  instead of being clamped), plus `int_missing` (1.0 where `I_k` was empty)
  so a model can tell "missing" from "0".
* `C_k -> 0` when missing, else `1 + Fingerprint64(value) mod V_k`, the
  value `tf.strings.to_hash_bucket_fast(value, V_k) + 1`.

`parse_raw_fields` takes categorical values as strings (a serving request,
TSV fields) or as fixed-width bytes `uint8 [..., 26, 8]` (the streaming
reader's fast path: no string tensors; all-zero bytes = missing). Both give
the same bucket ids, since `tf.fingerprint` of the 8 bytes is the same
Fingerprint64.

References: DP-FEST (Ghazi et al., NeurIPS 2023) App. D.1 (log-transformed
integers, hashed categorical features).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import tensorflow as tf

from tfdp_embed.data.criteo.schema import (
    CAT_FEATURES,
    INT_FEATURES,
    INT_MISSING,
    MISSING_BUCKET,
    resolve_vocab_sizes,
)

CAT_BYTES = 8
"""Width of a Criteo categorical value (8 hex digits) in the bytes form."""


def parse_raw_fields(
    ints: tf.Tensor,
    cats: tf.Tensor,
    *,
    ints_missing: tf.Tensor | None = None,
    vocab_sizes: Mapping[str, int] | Sequence[int] | None = None,
    hash_size: int | None = None,
) -> dict[str, tf.Tensor]:
    """Model features from raw Criteo fields, in pure TF (training and serving).

    Args:
      ints: `[..., 13]` integer fields: strings exactly as in the TSV (`""` =
        missing), floats (NaN = missing) or ints.
      cats: `[..., 26]` tf.string categorical fields (`""` = missing), or
        `uint8 [..., 26, 8]` bytes of 8-byte values (all zero = missing).
      ints_missing: optional bool `[..., 13]`, True where an integer is
        missing (or-ed with the missing values found in `ints`).
      vocab_sizes: per-feature vocabulary sizes (see `resolve_vocab_sizes`);
        default DP-FEST Table 3.
      hash_size: one vocabulary size for all features instead.

    Returns:
      `{"I1".."I13": float32 [...], "int_missing": float32 [..., 13],
      "C1".."C26": int64 [...]}` with bucket ids in `[0, V_k]`.

    Raises:
      ValueError: wrong shape or dtype, or bad vocabulary sizes.
      tf.errors.InvalidArgumentError: a string integer that is not a number.

    Example:
        >>> features = parse_raw_fields(tf.constant([["3", "", "-1"] + ["0"] * 10]),
        ...                             tf.constant([["68fd1e64"] + [""] * 25]))
        >>> features["I1"]  # log(1 + 3) = 1.3862944
        >>> features["C2"]  # missing -> 0
    """
    sizes = resolve_vocab_sizes(vocab_sizes, hash_size)
    ints = tf.convert_to_tensor(ints)
    cats = tf.convert_to_tensor(cats)
    _check_shape("ints", ints, [len(INT_FEATURES)])
    features = _int_features(ints, ints_missing)
    if cats.dtype == tf.string:
        _check_shape("cats", cats, [len(CAT_FEATURES)])
        for k, name in enumerate(CAT_FEATURES):
            value = cats[..., k]
            bucket = tf.strings.to_hash_bucket_fast(value, sizes[name]) + 1
            features[name] = tf.where(tf.equal(value, ""), _missing_bucket(), bucket)
    elif cats.dtype == tf.uint8:
        _check_shape("cats", cats, [len(CAT_FEATURES), CAT_BYTES])
        buckets = _hash_cat_bytes(cats, [sizes[name] for name in CAT_FEATURES])
        for k, name in enumerate(CAT_FEATURES):
            features[name] = buckets[..., k]
    else:
        raise ValueError(
            f"`cats` must be tf.string [..., 26] or uint8 [..., 26, 8] (raw Criteo values), got {cats.dtype.name}."
        )
    return features


def _int_features(ints: tf.Tensor, ints_missing: tf.Tensor | None) -> dict[str, tf.Tensor]:
    if ints.dtype == tf.string:
        missing = tf.equal(ints, "")
        values = tf.strings.to_number(tf.where(missing, "0", ints), out_type=tf.float64)
    elif ints.dtype.is_floating:
        values = tf.cast(ints, tf.float64)
        missing = tf.math.is_nan(values)
    elif ints.dtype.is_integer:
        values = tf.cast(ints, tf.float64)
        missing = tf.zeros_like(values, dtype=tf.bool)
    else:
        raise ValueError(f"`ints` must be tf.string, a float or an integer dtype, got {ints.dtype.name}.")
    if ints_missing is not None:
        missing = tf.logical_or(missing, tf.cast(ints_missing, tf.bool))
    values = tf.where(missing, tf.zeros_like(values), values)
    logged = tf.cast(tf.sign(values) * tf.math.log1p(tf.abs(values)), tf.float32)
    features = {name: logged[..., k] for k, name in enumerate(INT_FEATURES)}
    features[INT_MISSING] = tf.cast(missing, tf.float32)
    return features


def _hash_cat_bytes(cats: tf.Tensor, sizes: list[int]) -> tf.Tensor:
    """`1 + Fingerprint64(bytes) mod V` per value of `uint8 [..., 26, 8]`; 0 if all zero."""
    leading = tf.shape(cats)[:-1]
    rows = tf.reshape(cats, [-1, CAT_BYTES])
    # tf.fingerprint writes Fingerprint64 of each row as 8 little-endian bytes.
    fingerprint = tf.bitcast(tf.fingerprint(rows, method="farmhash64"), tf.uint64)
    fingerprint = tf.reshape(fingerprint, leading)
    bucket = tf.math.floormod(fingerprint, tf.constant(sizes, tf.uint64))
    bucket = tf.cast(bucket, tf.int64) + 1
    missing = tf.logical_not(tf.reduce_any(tf.not_equal(cats, 0), axis=-1))
    return tf.where(missing, _missing_bucket(), bucket)


def cat_bytes_to_strings(cats: tf.Tensor) -> tf.Tensor:
    """tf.string `[..., 26]` of `uint8 [..., 26, 8]` categorical bytes (all zero -> "")."""
    leading = tf.shape(cats)[:-1]
    rows = tf.cast(tf.reshape(cats, [-1, CAT_BYTES]), tf.int32)
    lengths = tf.where(tf.reduce_any(rows != 0, axis=-1), CAT_BYTES, 0)
    ragged = tf.RaggedTensor.from_tensor(rows, lengths=lengths)
    return tf.reshape(tf.strings.unicode_encode(ragged, "UTF-8"), leading)


def _missing_bucket() -> tf.Tensor:
    return tf.constant(MISSING_BUCKET, tf.int64)


def _check_shape(arg: str, tensor: tf.Tensor, trailing: list[int]) -> None:
    rank = tensor.shape.rank
    dims = tensor.shape.as_list()[-len(trailing) :] if rank and rank >= len(trailing) else None
    if dims != trailing:
        want = ", ".join(["..."] + [str(d) for d in trailing])
        raise ValueError(f"`{arg}` must have shape [{want}] (one column per Criteo field), got shape {tensor.shape}.")


__all__ = ["CAT_BYTES", "cat_bytes_to_strings", "parse_raw_fields"]
