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
    "bad_header",
    "no_valid_rows",
)
"""File-level faults; they always raise."""

OPTION_HINTS: dict[str, tuple[str, str]] = {
    "skip_bad_rows": ("skip_bad_rows=True", "--skip-bad-rows"),
    "format_csv": ("format='csv'", "--format csv"),
    "format_tsv": ("format='tsv'", "--format tsv"),
}
"""Placeholder in a hint -> (how a Python caller passes the option, the CLI flag)."""


def render(text: str, *, cli: bool = False) -> str:
    """`text` with each `{option}` placeholder of `OPTION_HINTS` replaced by its CLI flag or Python option."""
    for name, (python, flag) in OPTION_HINTS.items():
        text = text.replace("{" + name + "}", flag if cli else python)
    return text


class CriteoFormatError(ValueError):
    """A Criteo file or row is malformed.

    The message reads `<path>, line <n>: <what is wrong; what is allowed> [<reason>]`,
    then a hint on what to pass, if any. `str(error)` names the reader's Python
    options (`skip_bad_rows=True`); `error.message(cli=True)` names the
    command-line flags (`--skip-bad-rows`) instead, for the pipelines' CLIs.

    Attributes:
      path: the file.
      line: 1-based line number, or None for a whole-file fault.
      reason: one of `SKIP_REASONS` (row fault) or `FILE_FAULTS`.
      detail: the message without the location and hint; it may hold
        `{option}` placeholders of `OPTION_HINTS` (see `render`).
      hint: what to pass (placeholders too), or None.
    """

    def __init__(self, path: str, line: int | None, reason: str, detail: str, hint: str | None = None):
        self.path = str(path)
        self.line = line
        self.reason = reason
        self.detail = detail
        self.hint = hint
        super().__init__(self.message())

    def message(self, *, cli: bool = False) -> str:
        """The message, its hint naming the CLI flags (`cli=True`) or the Python options."""
        where = f"{self.path}, line {self.line}" if self.line is not None else self.path
        text = f"{where}: {self.detail} [{self.reason}]" + (f" ({self.hint})" if self.hint else "")
        return render(text, cli=cli)

    def __reduce__(self):  # picklable with its attributes
        return (type(self), (self.path, self.line, self.reason, self.detail, self.hint))


__all__ = ["FILE_FAULTS", "OPTION_HINTS", "SKIP_REASONS", "CriteoFormatError", "render"]
