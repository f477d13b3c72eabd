"""The text layouts a Criteo file comes in, and how a file's layout is found.

* `tsv`: Criteo's own files (Kaggle `train.txt`, Criteo-1TB `day_N`):
  tab-separated `label, I1..I13, C1..C26`, no header (a header line is a
  `header` row fault);
* `csv`: comma-separated, as DeepCTR's `criteo_sample.txt` and Kaggle
  re-exports write them: an optional header line (`label,I1,...,C26`, any
  names; it is skipped) and an optional leading `Id` column (ignored): 41
  columns in the header, or on line 1 without one. Values are not quoted.

Both may end lines in CRLF and write integers as integral floats (`260.0`,
see `rows.py`). `format="auto"` reads line 1: a tab makes it `tsv`, else a
comma makes it `csv`, else `tsv` (a one-field line).

References: Criteo Kaggle / 1TB click-log format; DeepCTR
`examples/criteo_sample.txt`.
"""

from __future__ import annotations

import dataclasses

from tfdp_embed.data.criteo.errors import CriteoFormatError
from tfdp_embed.data.criteo.schema import NUM_FIELDS

FORMATS: tuple[str, ...] = ("auto", "tsv", "csv")


@dataclasses.dataclass(frozen=True)
class CriteoLayout:
    """How one file's lines are laid out.

    Attributes:
      name: "tsv" or "csv".
      separator: the field separator byte (9 = tab, 44 = comma).
      header: line 1 is a header (skipped, not counted as a row).
      id_column: every line starts with an Id field (ignored).
    """

    name: str
    separator: int
    header: bool = False
    id_column: bool = False

    def describe(self) -> str:
        extras = [x for x, on in (("header", self.header), ("leading Id column", self.id_column)) if on]
        return self.name.upper() + (" with " + " and ".join(extras) if extras else "")


TSV = CriteoLayout("tsv", ord("\t"))


def check_format(format: str) -> str:
    """`format` if it is one of `FORMATS`; else ValueError naming it."""
    if format not in FORMATS:
        raise ValueError(f"`format` must be one of {FORMATS} (the Criteo text layout); received {format!r}.")
    return format


def first_line(head: bytes) -> bytes:
    """Line 1 of a file's first bytes, without its line end."""
    return head.split(b"\n", 1)[0].rstrip(b"\r")


def is_comma_separated(line: bytes) -> bool:
    """True for a line with commas and no tab (a CSV line read as TSV)."""
    return b"\t" not in line and b"," in line


def detect_layout(path: str, head: bytes, format: str = "auto") -> CriteoLayout:
    """The layout of the file whose first bytes are `head`, for `format` ("auto", "tsv" or "csv").

    Raises:
      CriteoFormatError: `bad_header`, a CSV header with neither 40 nor 41 columns.
      ValueError: an unknown `format`.
    """
    check_format(format)
    line = first_line(head)
    if format == "tsv" or (format == "auto" and not is_comma_separated(line)):
        return TSV
    fields = line.split(b",")
    header = not _is_number(fields[0])
    if header and len(fields) not in (NUM_FIELDS, NUM_FIELDS + 1):
        raise CriteoFormatError(
            path,
            1,
            "bad_header",
            f"CSV header has {len(fields)} columns; a Criteo CSV has {NUM_FIELDS} (label,I1..I13,C1..C26), or "
            f"{NUM_FIELDS + 1} with a leading Id column",
        )
    return CriteoLayout("csv", ord(","), header=header, id_column=len(fields) == NUM_FIELDS + 1)


def _is_number(value: bytes) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


__all__ = ["FORMATS", "TSV", "CriteoLayout", "check_format", "detect_layout", "first_line", "is_comma_separated"]
