"""The error a malformed Criteo file or row raises, and the row-fault names."""

from __future__ import annotations

SKIP_REASONS: tuple[str, ...] = (
    "header",
    "empty_line",
    "too_many_fields",
    "bad_label",
    "bad_integer",
    "bad_categorical",
)
"""Row-level faults that `skip_bad_rows=True` drops and counts."""

FILE_FAULTS: tuple[str, ...] = (
    "missing_file",
    "empty_file",
    "binary_file",
    "truncated_gzip",
    "corrupt_gzip",
    "no_valid_rows",
)
"""File-level faults; they always raise."""


class CriteoFormatError(ValueError):
    """A Criteo file or row is malformed.

    The message reads `<path>, line <n>: <what is wrong; what is allowed> [<reason>]`.

    Attributes:
      path: the file.
      line: 1-based line number, or None for a whole-file fault.
      reason: one of `SKIP_REASONS` (row fault) or `FILE_FAULTS`.
      detail: the message without the location.
    """

    def __init__(self, path: str, line: int | None, reason: str, detail: str):
        self.path = str(path)
        self.line = line
        self.reason = reason
        self.detail = detail
        where = f"{self.path}, line {line}" if line is not None else self.path
        super().__init__(f"{where}: {detail} [{reason}]")

    def __reduce__(self):  # picklable with its attributes
        return (type(self), (self.path, self.line, self.reason, self.detail))
