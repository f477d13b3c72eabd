"""Vectorised parsing and validation of a block of Criteo text lines.

`parse_block` takes raw bytes holding whole lines and finds every field with
numpy (positions of separators and newlines), so no Python code runs per row
unless a row is bad. The layout (`layout.py`: tab or comma separator, a
leading Id column) comes from the file. Row rules:

* up to 40 separated fields (label, I1..I13, C1..C26; 41 with an Id
  column); fewer is fine (trailing empty fields stripped) and means missing;
  more is `too_many_fields`;
* the label is exactly `0` or `1` (else `bad_label`; a non-numeric label on
  line 1 is `header`: Criteo TSV files have none);
* an integer field is empty (missing) or matches `INT_FIELD_PATTERN`: an
  optional `-`, 1 to 18 decimal digits, and optionally a `.` followed by
  zeros only (an integral float such as `260.0`, as CSV exports write
  integers); anything else, `2.5` included, is `bad_integer`. The serving
  signature checks its integer fields against the same pattern, so training
  and serving accept the same strings and read the same values;
* a categorical field is empty (missing) or 1 to 64 bytes (Criteo writes 8
  hex digits; else `bad_categorical`);
* an empty line is `empty_line`.

References: Criteo Kaggle / 1TB click-log format.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from tfdp_embed.data.criteo.errors import SKIP_REASONS, CriteoFormatError, render
from tfdp_embed.data.criteo.layout import TSV, CriteoLayout, is_comma_separated
from tfdp_embed.data.criteo.schema import CAT_FEATURES, INT_FEATURES, NUM_FIELDS

MAX_INT_DIGITS = 18
MAX_FRACTION_ZEROS = 20
MAX_CAT_BYTES = 64
INT_FIELD_PATTERN = rf"|-?[0-9]{{1,{MAX_INT_DIGITS}}}(\.0{{0,{MAX_FRACTION_ZEROS}}})?"
"""An integer field, as a regular expression (full match): empty, or e.g. `17`, `-2`, `260.0`, `3.`."""

_NUM_INTS = len(INT_FEATURES)
_MAX_INT_BYTES = 1 + MAX_INT_DIGITS + 1 + MAX_FRACTION_ZEROS
_NEWLINE, _MINUS, _ZERO, _DOT = 10, ord("-"), ord("0"), ord(".")
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
    path: str, first_line: int, data: bytes, *, skip_bad_rows: bool, layout: CriteoLayout = TSV
) -> tuple[CriteoChunk, dict[str, tuple[int, str]]]:
    """Parses and validates whole lines of Criteo text.

    Args:
      path: the file, for messages.
      first_line: 1-based line number of the first line of `data` in the file.
      data: complete lines, each ending in `\\n` (no `\\r`).
      skip_bad_rows: drop bad rows (counted) instead of raising.
      layout: the file's separator and Id column (its header line is not in `data`).

    Returns:
      The valid rows, and `reason -> (count, first message)` of dropped rows.

    Raises:
      CriteoFormatError: the first bad row, when not `skip_bad_rows`.
    """
    sep, lead = layout.separator, int(layout.id_column)
    width = NUM_FIELDS + lead
    padded = np.frombuffer(b"\t" * _PAD + data + b"\t" * _PAD, dtype=np.uint8)
    ends, is_newline, fields_per_line, start, length = _locate_fields(padded[_PAD : _PAD + len(data)], sep, width)
    n = int(is_newline.sum())
    empty = (fields_per_line == 1) & (length[:, 0] == 0)
    start, length = start[:, lead:], length[:, lead:]

    reason = np.zeros(n, np.int8)

    def mark(mask: np.ndarray | np.bool_, name: str) -> None:
        reason[mask & (reason == 0)] = _CODE[name]

    mark(empty, "empty_line")
    mark(fields_per_line > width, "too_many_fields")
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
    if reason.any():
        rows = _BadRows(path, first_line, data, ends[is_newline], reason, ints_ok, cats_ok, layout)
        skipped = _skipped(rows, skip_bad_rows=skip_bad_rows)

    good = np.flatnonzero(reason == 0)
    chunk = CriteoChunk(
        labels=(label_byte[good] == _ZERO + 1).astype(np.float32),
        ints=ints[good],
        ints_missing=ints_missing[good],
        cats=_gather_cats(padded, start[good, 1 + _NUM_INTS :], cat_length[good]),
    )
    return chunk, skipped


def _locate_fields(a: np.ndarray, sep: int, width: int) -> tuple[np.ndarray, ...]:
    """`(ends, is_newline, fields_per_line, start, length)` of the block `a`: `[n, width]` field starts and lengths."""
    ends = np.flatnonzero((a == sep) | (a == _NEWLINE))  # where each field ends
    is_newline = a[ends] == _NEWLINE
    line_of_field = np.cumsum(is_newline) - is_newline
    n = int(is_newline.sum())
    starts = np.empty_like(ends)
    starts[:1] = 0
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts
    fields_per_line = np.bincount(line_of_field, minlength=n)
    if n and (fields_per_line == width).all():
        return ends, is_newline, fields_per_line, starts.reshape(n, width), lengths.reshape(n, width)
    first_field = np.cumsum(fields_per_line) - fields_per_line
    column = np.arange(ends.size) - np.repeat(first_field, fields_per_line)
    keep = column < width
    start = np.zeros((n, width), np.int64)
    length = np.zeros((n, width), np.int64)
    start[line_of_field[keep], column[keep]] = starts[keep]
    length[line_of_field[keep], column[keep]] = lengths[keep]
    return ends, is_newline, fields_per_line, start, length


class _BadRows(NamedTuple):
    """A block's rows with a skip reason (`reason` > 0), and what is needed to describe them."""

    path: str
    first_line: int
    data: bytes
    line_ends: np.ndarray
    reason: np.ndarray
    ints_ok: np.ndarray
    cats_ok: np.ndarray
    layout: CriteoLayout

    def describe(self, i: int) -> str:
        start = self.line_ends[i - 1] + 1 if i else 0
        line = self.data[start : self.line_ends[i]]
        return _describe(SKIP_REASONS[self.reason[i] - 1], line, self.ints_ok[i], self.cats_ok[i], self.layout)


def _skipped(rows: _BadRows, *, skip_bad_rows: bool) -> dict[str, tuple[int, str]]:
    """`reason -> (count, first message)` of the bad rows; raises for the first one unless `skip_bad_rows`."""
    bad = np.flatnonzero(rows.reason)
    if not skip_bad_rows:
        i = int(bad[0])
        raise CriteoFormatError(
            rows.path,
            rows.first_line + i,
            SKIP_REASONS[rows.reason[i] - 1],
            rows.describe(i),
            hint="pass {skip_bad_rows} to drop and count such rows",
        )
    skipped: dict[str, tuple[int, str]] = {}
    for code in np.unique(rows.reason[bad]):
        found = np.flatnonzero(rows.reason == code)
        first = int(found[0])
        skipped[SKIP_REASONS[code - 1]] = (
            int(found.size),
            f"{rows.path}, line {rows.first_line + first}: {render(rows.describe(first))}",
        )
    return skipped


def _windows(a: np.ndarray, width: int) -> np.ndarray:
    """Read-only `[a.size - width + 1, width]` view: row i is `a[i : i + width]`."""
    return np.lib.stride_tricks.as_strided(a, shape=(a.size - width + 1, width), strides=(1, 1), writeable=False)


def _parse_ints(a: np.ndarray, start: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Values (0 if missing or bad), missing mask and validity of `[n, 13]` fields.

    `a` is the block with `_PAD` bytes around it; `start` is unpadded. Each
    field is read right-aligned in a `width`-byte window ending at its end.
    An integer digit in slot k weighs `10 ** (point - 1 - k)`, `point` being
    the slot of the field's `.` (`width` when it has none: plain integers);
    slots after the point must hold `0`.
    """
    missing = length == 0
    negative = (a[start + _PAD] == _MINUS) & ~missing
    ok = missing | (length <= _MAX_INT_BYTES)
    width = int(min(length.max(initial=0), _MAX_INT_BYTES))
    if width == 0:
        return np.zeros(length.shape, np.int64), missing, ok
    chars = _windows(a, width)[start + length + _PAD - width]  # [n, 13, width]
    slot = np.arange(width)
    in_number = slot >= (width - np.minimum(length, width) + negative)[..., None]  # the field after its sign
    is_dot = in_number & (chars == _DOT)
    has_dot = is_dot.any(axis=-1)
    point = np.where(has_dot, np.argmax(is_dot, axis=-1), width) if has_dot.any() else np.full(length.shape, width)
    is_int_slot = in_number & (slot < point[..., None])
    digit = chars - np.uint8(_ZERO)  # non-digits wrap to > 9
    int_digits = is_int_slot.sum(axis=-1)
    ok &= missing | ((int_digits >= 1) & (int_digits <= MAX_INT_DIGITS))
    ok &= ~(is_int_slot & (digit > 9)).any(axis=-1)
    ok &= ~(in_number & (slot > point[..., None]) & (chars != _ZERO)).any(axis=-1)
    ok &= length - negative - int_digits - has_dot <= MAX_FRACTION_ZEROS
    digit = np.where(is_int_slot & (digit <= 9), digit, np.uint8(0)).astype(np.int64)
    if has_dot.any():
        exponent = np.clip(point[..., None] - 1 - slot, 0, MAX_INT_DIGITS)
        value = (digit * _POW10[exponent]).sum(axis=-1)
    else:  # plain integers: one weight vector for every field
        value = (digit.reshape(-1, width) @ _POW10[np.clip(width - 1 - slot, 0, MAX_INT_DIGITS)]).reshape(length.shape)
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


def _describe(reason: str, line: bytes, ints_ok: np.ndarray, cats_ok: np.ndarray, layout: CriteoLayout) -> str:
    """What is wrong with a bad row, and what is allowed."""
    lead = int(layout.id_column)
    fields = line.split(bytes([layout.separator]))[lead:]
    kind = "tab-separated" if layout.name == "tsv" else "comma-separated"
    if reason == "empty_line":
        return "empty line; every line must be a Criteo row (0/1 label first)"
    if reason == "too_many_fields":
        return (
            f"{len(fields) + lead} {kind} fields; a Criteo row has at most {NUM_FIELDS + lead} "
            f"({'Id, ' if lead else ''}label, I1..I13, C1..C26; trailing empty fields may be left out)"
        )
    if reason in ("header", "bad_label") and layout.name == "tsv" and is_comma_separated(line):
        return (
            f"the line is comma-separated, not tab-separated (first field {_show(fields[0])}); this file was read "
            "as Criteo TSV: read it as CSV ({format_csv}, or auto-detect the layout)"
        )
    if reason == "header":
        return (
            f"looks like a header line (first field is {_show(fields[0])}); Criteo TSV files "
            "have no header, the first field of every line is the 0/1 click label"
        )
    if reason == "bad_label":
        return f"label (field {1 + lead}) is {_show(fields[0])}; allowed labels are 0 and 1"
    if reason == "bad_integer":
        j = int(np.flatnonzero(~ints_ok)[0])
        return (
            f"integer feature {INT_FEATURES[j]} (field {j + 2 + lead}) is {_show(fields[j + 1])}; "
            f"allowed: empty (missing) or an optional '-' and 1 to {MAX_INT_DIGITS} decimal "
            "digits, such as 0, 17 or -2, optionally as an integral float such as 260.0 (not 2.5)"
        )
    j = int(np.flatnonzero(~cats_ok)[0])
    value = fields[j + 1 + _NUM_INTS]
    return (
        f"categorical feature {CAT_FEATURES[j]} (field {j + 2 + _NUM_INTS + lead}) is {len(value)} "
        f"bytes long ({_show(value)}); allowed: empty (missing) or at most {MAX_CAT_BYTES} "
        "bytes (Criteo writes 8 hex digits)"
    )


__all__ = ["INT_FIELD_PATTERN", "MAX_CAT_BYTES", "MAX_FRACTION_ZEROS", "MAX_INT_DIGITS", "CriteoChunk", "parse_block"]
