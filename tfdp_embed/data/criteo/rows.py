"""Vectorised parsing and validation of a block of Criteo TSV lines.

`parse_block` takes raw bytes holding whole lines and finds every field with
numpy (positions of tabs and newlines), so no Python code runs per row unless
a row is bad. Row rules:

* up to 40 tab-separated fields (label, I1..I13, C1..C26); fewer is fine
  (trailing empty fields stripped) and means missing; more is
  `too_many_fields`;
* the label is exactly `0` or `1` (else `bad_label`; a non-numeric label on
  line 1 is `header`: Criteo files have none);
* an integer field is empty (missing) or an optional `-` and 1 to 18 decimal
  digits (else `bad_integer`);
* a categorical field is empty (missing) or 1 to 64 bytes (Criteo writes 8
  hex digits; else `bad_categorical`);
* an empty line is `empty_line`.

References: Criteo Kaggle / 1TB click-log format.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tfdp_embed.data.criteo.errors import SKIP_REASONS, CriteoFormatError
from tfdp_embed.data.criteo.schema import CAT_FEATURES, INT_FEATURES, NUM_FIELDS

MAX_INT_DIGITS = 18
MAX_CAT_BYTES = 64

_NUM_INTS = len(INT_FEATURES)
_TAB, _NEWLINE, _MINUS, _ZERO = 9, 10, ord("-"), ord("0")
_POW10 = 10 ** np.arange(MAX_INT_DIGITS + 1, dtype=np.int64)  # 10**18 < 2**63
_CODE = {reason: 1 + i for i, reason in enumerate(SKIP_REASONS)}
_PAD = MAX_CAT_BYTES  # bytes around a block so fixed-width windows at any field fit


@dataclasses.dataclass
class CriteoChunk:
    """Valid rows of one block, as numpy arrays.

    Attributes:
      labels: float32 `[n]`, 0 or 1.
      ints: int64 `[n, 13]`, 0 where missing.
      ints_missing: bool `[n, 13]`.
      cats: bytes (`S`) `[n, 26]`, `b""` where missing.
    """

    labels: np.ndarray
    ints: np.ndarray
    ints_missing: np.ndarray
    cats: np.ndarray

    def __len__(self) -> int:
        return int(self.labels.size)


def parse_block(
    path: str, first_line: int, data: bytes, *, skip_bad_rows: bool
) -> tuple[CriteoChunk, dict[str, tuple[int, str]]]:
    """Parses and validates whole lines of Criteo text.

    Args:
      path: the file, for messages.
      first_line: 1-based line number of the first line of `data` in the file.
      data: complete lines, each ending in `\\n` (no `\\r`).
      skip_bad_rows: drop bad rows (counted) instead of raising.

    Returns:
      The valid rows, and `reason -> (count, first message)` of dropped rows.

    Raises:
      CriteoFormatError: the first bad row, when not `skip_bad_rows`.
    """
    padded = np.frombuffer(b"\t" * _PAD + data + b"\t" * _PAD, dtype=np.uint8)
    a = padded[_PAD : _PAD + len(data)]
    ends = np.flatnonzero((a == _TAB) | (a == _NEWLINE))  # where each field ends
    is_newline = a[ends] == _NEWLINE
    line_of_field = np.cumsum(is_newline) - is_newline
    n = int(is_newline.sum())
    starts = np.empty_like(ends)
    starts[:1] = 0
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts
    fields_per_line = np.bincount(line_of_field, minlength=n)
    if n and (fields_per_line == NUM_FIELDS).all():
        start = starts.reshape(n, NUM_FIELDS)
        length = lengths.reshape(n, NUM_FIELDS)
    else:
        first_field = np.cumsum(fields_per_line) - fields_per_line
        column = np.arange(ends.size) - np.repeat(first_field, fields_per_line)
        keep = column < NUM_FIELDS
        start = np.zeros((n, NUM_FIELDS), np.int64)
        length = np.zeros((n, NUM_FIELDS), np.int64)
        start[line_of_field[keep], column[keep]] = starts[keep]
        length[line_of_field[keep], column[keep]] = lengths[keep]

    reason = np.zeros(n, np.int8)

    def mark(mask: np.ndarray | np.bool_, name: str) -> None:
        reason[mask & (reason == 0)] = _CODE[name]

    mark((fields_per_line == 1) & (length[:, 0] == 0), "empty_line")
    mark(fields_per_line > NUM_FIELDS, "too_many_fields")
    label_byte = padded[start[:, 0] + _PAD]
    label_ok = (length[:, 0] == 1) & ((label_byte == _ZERO) | (label_byte == _ZERO + 1))
    if first_line == 1 and n and not label_ok[0] and reason[0] == 0:
        if not _is_number(data[start[0, 0] : start[0, 0] + length[0, 0]]):
            reason[0] = _CODE["header"]
    mark(~label_ok, "bad_label")
    ints, ints_missing, ints_ok = _parse_ints(padded, start[:, 1 : 1 + _NUM_INTS], length[:, 1 : 1 + _NUM_INTS])
    mark(~ints_ok.all(axis=1), "bad_integer")
    cat_length = length[:, 1 + _NUM_INTS :]
    cats_ok = cat_length <= MAX_CAT_BYTES
    mark(~cats_ok.all(axis=1), "bad_categorical")

    skipped: dict[str, tuple[int, str]] = {}
    bad = np.flatnonzero(reason)
    if bad.size:
        line_start = np.concatenate([[0], ends[is_newline][:-1] + 1])

        def describe(i: int) -> str:
            line = data[line_start[i] : ends[is_newline][i]]
            return _describe(SKIP_REASONS[reason[i] - 1], line, ints_ok[i], cats_ok[i])

        if not skip_bad_rows:
            i = int(bad[0])
            raise CriteoFormatError(
                path,
                first_line + i,
                SKIP_REASONS[reason[i] - 1],
                describe(i) + " (pass skip_bad_rows=True to drop and count such rows)",
            )
        for code in np.unique(reason[bad]):
            rows = np.flatnonzero(reason == code)
            first = int(rows[0])
            skipped[SKIP_REASONS[code - 1]] = (
                int(rows.size),
                f"{path}, line {first_line + first}: {describe(first)}",
            )

    good = np.flatnonzero(reason == 0)
    chunk = CriteoChunk(
        labels=(label_byte[good] == _ZERO + 1).astype(np.float32),
        ints=ints[good],
        ints_missing=ints_missing[good],
        cats=_gather_cats(padded, start[good, 1 + _NUM_INTS :], cat_length[good]),
    )
    return chunk, skipped


def _windows(a: np.ndarray, width: int) -> np.ndarray:
    """Read-only `[a.size - width + 1, width]` view: row i is `a[i : i + width]`."""
    return np.lib.stride_tricks.as_strided(a, shape=(a.size - width + 1, width), strides=(1, 1), writeable=False)


def _parse_ints(a: np.ndarray, start: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Values (0 if missing or bad), missing mask and validity of `[n, 13]` fields.

    `a` is the block with `_PAD` bytes around it; `start` is unpadded. Each
    field is read right-aligned in a `width`-byte window ending at its end, so
    slot k always weighs `10 ** (width - 1 - k)`.
    """
    missing = length == 0
    negative = (a[start + _PAD] == _MINUS) & ~missing
    digits = length - negative
    ok = missing | ((digits >= 1) & (digits <= MAX_INT_DIGITS))
    width = int(min(length.max(initial=0), MAX_INT_DIGITS + 1))
    if width == 0:
        return np.zeros(length.shape, np.int64), missing, ok
    chars = _windows(a, width)[start + length + _PAD - width]  # [n, 13, width]
    first_slot = width - np.minimum(length, width)
    slot = np.arange(width)
    is_digit_slot = slot >= (first_slot + negative)[..., None]
    digit = chars - np.uint8(_ZERO)  # non-digits wrap to > 9
    ok &= ~(is_digit_slot & (digit > 9)).any(axis=-1)
    digit = np.where(is_digit_slot & (digit <= 9), digit, np.uint8(0))
    value = digit.reshape(-1, width).astype(np.int64) @ _POW10[width - 1 :: -1]
    value = value.reshape(length.shape)
    value = np.where(ok, np.where(negative, -value, value), 0)
    return value, missing, ok


def _gather_cats(a: np.ndarray, start: np.ndarray, length: np.ndarray) -> np.ndarray:
    """`[n, 26]` bytes array of the categorical fields (`b""` where missing)."""
    width = int(max(length.max(initial=0), 1))
    if ((length == width) | (length == 0)).all():  # Criteo: all 8 bytes or empty
        view: np.ndarray = np.ndarray((a.size - width + 1,), dtype=f"S{width}", buffer=a, strides=(1,))
        cats = view[start + _PAD]
        cats[length == 0] = b""
        return cats
    chars = _windows(a, width)[start + _PAD]
    chars = np.where(np.arange(width) < length[..., None], chars, np.uint8(0))
    return np.ascontiguousarray(chars).view(f"S{width}").reshape(start.shape)


def _is_number(value: bytes) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def _show(value: bytes) -> str:
    text = value[:40].decode("utf-8", errors="replace")
    return repr(text + ("..." if len(value) > 40 else ""))


def _describe(reason: str, line: bytes, ints_ok: np.ndarray, cats_ok: np.ndarray) -> str:
    """What is wrong with a bad row, and what is allowed."""
    fields = line.split(b"\t")
    if reason == "empty_line":
        return "empty line; every line must be a Criteo row (0/1 label first)"
    if reason == "too_many_fields":
        return (
            f"{len(fields)} tab-separated fields; a Criteo row has at most {NUM_FIELDS} "
            "(label, I1..I13, C1..C26; trailing empty fields may be left out)"
        )
    if reason == "header":
        return (
            f"looks like a header line (first field is {_show(fields[0])}); Criteo files "
            "have no header, the first field of every line is the 0/1 click label"
        )
    if reason == "bad_label":
        return f"label (field 1) is {_show(fields[0])}; allowed labels are 0 and 1"
    if reason == "bad_integer":
        j = int(np.flatnonzero(~ints_ok)[0])
        return (
            f"integer feature {INT_FEATURES[j]} (field {j + 2}) is {_show(fields[j + 1])}; "
            f"allowed: empty (missing) or an optional '-' and 1 to {MAX_INT_DIGITS} decimal "
            "digits, such as 0, 17 or -2"
        )
    j = int(np.flatnonzero(~cats_ok)[0])
    value = fields[j + 1 + _NUM_INTS]
    return (
        f"categorical feature {CAT_FEATURES[j]} (field {j + 2 + _NUM_INTS}) is {len(value)} "
        f"bytes long ({_show(value)}); allowed: empty (missing) or at most {MAX_CAT_BYTES} "
        "bytes (Criteo writes 8 hex digits)"
    )
