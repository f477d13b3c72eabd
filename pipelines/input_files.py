"""Input files checked before a run reads them, shared by the pipelines: one line naming the file and line.

* `check_path` (command line, exit status 2): the path given to a flag exists,
  is a file (or, where the flag takes one, a directory) and can be read;
* `check_text` (a run, a `ValueError` the pipelines report in one line, exit 1):
  the first `SNIFF_BYTES` of a plain text file are text: a NUL byte or bytes
  that are not UTF-8 (binary garbage, a file of another encoding) are refused
  naming the file, line and column; gzip files are left to their reader.
  Returns whether the file starts with a UTF-8 byte-order mark (BOM);
* `without_bom`: a BOM-less copy of a file that starts with one, for readers
  that do not accept it (the sequential pipeline); errors raised while it is
  read name the original file.

Example:
    >>> if check_text("s.txt", what="'user item' lines"):   # a BOM: read a copy without it
    ...     with without_bom("s.txt") as path:
    ...         data = load_sequences(path)
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import os
import shutil
import tempfile

SNIFF_BYTES = 1 << 16
"""How much of a file `check_text` reads (cheap on any file size)."""
BOM = codecs.BOM_UTF8
GZIP_MAGIC = b"\x1f\x8b"


class InputFileError(ValueError):
    """An input file that is not text; the message names the file, the line and the column."""


def check_path(parser: argparse.ArgumentParser, path: str, flag: str, *, directory_ok: bool = False) -> None:
    """Exits (status 2, argparse) when `path`, given to `flag`, is missing, a directory (unless `directory_ok`) or unreadable."""
    if not os.path.exists(path):
        parser.error(f"file not found: {path!r} (given to {flag}).")
    if os.path.isdir(path) and not directory_ok:
        parser.error(f"{path!r} (given to {flag}) is a directory; give the file itself.")
    if not os.access(path, os.R_OK):
        parser.error(f"{path!r} (given to {flag}) cannot be read (permission denied).")


def check_text(path: str, *, what: str) -> bool:
    """Refuses a plain file whose first `SNIFF_BYTES` are not UTF-8 text; True when it starts with a BOM.

    Args:
      path: the file (gzip files pass unread: their reader checks them).
      what: what the file should hold, for the message (e.g. "'user item' lines").

    Raises:
      InputFileError: a NUL byte or invalid UTF-8, named by line and column.
      OSError: the file cannot be opened.
    """
    with open(path, "rb") as f:
        head = f.read(SNIFF_BYTES)
    if head.startswith(GZIP_MAGIC):
        return False
    decoder = codecs.getincrementaldecoder("utf-8")()
    bad, reason = head.find(b"\x00"), "a NUL byte"
    try:
        decoder.decode(head[: bad if bad >= 0 else len(head)], final=False)  # a cut last character is fine
    except UnicodeDecodeError as error:
        bad, reason = error.start, f"byte 0x{head[error.start]:02x}, which is not UTF-8"
    if bad >= 0:
        line = head.count(b"\n", 0, bad) + 1
        column = bad - (head.rfind(b"\n", 0, bad) + 1) + 1
        raise InputFileError(
            f"{path}:{line}: not a text file (column {column}: {reason}); expected {what}. Is it the right file?"
        )
    return head.startswith(BOM)


@contextlib.contextmanager
def without_bom(path: str):
    """Yields the path of a copy of `path` without its leading BOM (removed on exit); errors name `path`."""
    with tempfile.TemporaryDirectory(prefix="tfdp-bom-") as directory:
        copy = os.path.join(directory, os.path.basename(path))
        with open(path, "rb") as source, open(copy, "wb") as target:
            if source.read(len(BOM)) != BOM:
                source.seek(0)
            shutil.copyfileobj(source, target)
        try:
            yield copy
        except ValueError as error:  # a reader's message names the copy: name the file the user gave
            message = str(error).replace(copy, path)
            try:
                renamed = type(error)(message)
            except TypeError:  # an error class that takes other arguments: raised as it was
                raise error from None
            raise renamed from None


__all__ = ["BOM", "InputFileError", "SNIFF_BYTES", "check_path", "check_text", "without_bom"]
