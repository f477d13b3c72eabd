"""Streaming Criteo TSV files in Python: files, blocks of lines, counts.

This is the part of the Criteo reader that can name a file and a line: it
streams plain or gzip files block by block (never loading one whole), hands
blocks of whole lines to the vectorised row parser
(`tfdp_embed.data.criteo.rows`, which states the row rules) and keeps
`CriteoReadStats`. File-level faults (missing path, empty file, binary file,
truncated or corrupt gzip, a file with no valid row) always raise
`CriteoFormatError`; bad rows raise too, or with `skip_bad_rows=True` are
dropped and counted per reason (and logged once per file).

References: Criteo Kaggle / 1TB click-log format.
"""

from __future__ import annotations

import codecs
import contextlib
import logging
import os
import threading
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

from tfdp_embed.data.criteo.errors import SKIP_REASONS, CriteoFormatError
from tfdp_embed.data.criteo.layout import CriteoLayout, check_format, detect_layout, first_line, is_comma_separated
from tfdp_embed.data.criteo.rows import CriteoChunk, parse_block

_LOG = logging.getLogger(__name__)
_GZIP_MAGIC = b"\x1f\x8b"
_READ_BLOCK_BYTES = 2 << 20  # 2 MiB, ~8k Criteo rows per block
_SNIFF_BYTES = 1 << 16


class CriteoReadStats:
    """Counts of what a Criteo reader read, skipped and failed on.

    One object may be shared by a `tf.data` pipeline's generator thread and
    the caller; updates hold a lock. Counts accumulate over every pass (epoch)
    until `reset()`.

    Attributes:
      rows: valid rows delivered.
      lines: lines read (valid + skipped).
      skipped: reason -> rows dropped (only with `skip_bad_rows=True`).
      first_skipped: reason -> message of the first row dropped for it.
      rows_by_file: path -> valid rows delivered from it.
      files_completed: files read to the end.
      error: the first `CriteoFormatError` raised, if any.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Zeroes every count and forgets the error."""
        self.rows = 0
        self.lines = 0
        self.skipped = {reason: 0 for reason in SKIP_REASONS}
        self.first_skipped: dict[str, str] = {}
        self.rows_by_file: dict[str, int] = {}
        self.files_completed = 0
        self.error: CriteoFormatError | None = None

    @property
    def total_skipped(self) -> int:
        """Rows dropped for any reason."""
        return sum(self.skipped.values())

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready summary for a pipeline report."""
        with self._lock:
            return {
                "rows": self.rows,
                "lines": self.lines,
                "skipped": dict(self.skipped),
                "total_skipped": self.total_skipped,
                "first_skipped": dict(self.first_skipped),
                "rows_by_file": dict(self.rows_by_file),
                "files_completed": self.files_completed,
                "error": None if self.error is None else str(self.error),
            }

    def raise_if_failed(self) -> None:
        """Re-raises the recorded `CriteoFormatError`, if there is one."""
        if self.error is not None:
            raise self.error

    @contextlib.contextmanager
    def python_errors(self) -> Iterator[None]:
        """Turns a TensorFlow iterator error caused by bad input into the Python one.

        Inside `tf.data`, the reader's `CriteoFormatError` surfaces as a
        `tf.errors.InvalidArgumentError` whose message contains it; in this
        context it is re-raised as the original `CriteoFormatError`.

        Example:
            >>> with stats.python_errors():
            ...     model.fit(dataset)
        """
        try:
            yield
        except Exception as exc:  # narrowed below
            error = self.error
            if error is not None and str(error) in str(exc):
                raise error from exc
            raise

    # -- updates from the reader ---------------------------------------
    def _add(self, path: str, rows: int, lines: int, skipped: dict[str, tuple[int, str]]) -> None:
        with self._lock:
            self.rows += rows
            self.lines += lines
            self.rows_by_file[path] = self.rows_by_file.get(path, 0) + rows
            for reason, (count, message) in skipped.items():
                self.skipped[reason] += count
                self.first_skipped.setdefault(reason, message)

    def _fail(self, error: CriteoFormatError) -> CriteoFormatError:
        with self._lock:
            if self.error is None:
                self.error = error
        return error


# ---------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------
def normalize_paths(files: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """Paths as a list of strings, in the order given.

    Raises:
      ValueError: no path given.
    """
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    paths = [os.fspath(f) for f in files]
    if not paths:
        raise ValueError("`files` is empty; pass at least one Criteo TSV file (plain or .gz).")
    return paths


def check_files(paths: Sequence[str]) -> None:
    """Fails early on files that cannot be Criteo text.

    Checks existence, non-zero size, gzip header and the first 64 KiB
    (NUL bytes mean a binary file). Cheap: reads one block per file.

    Raises:
      CriteoFormatError: `missing_file`, `empty_file`, `binary_file`,
        `truncated_gzip` or `corrupt_gzip`.
    """
    for path in paths:
        check_file(path)


def check_file(path: str) -> None:
    """`check_files` for one file."""
    if not os.path.isfile(path):
        what = "is a directory" if os.path.isdir(path) else "does not exist"
        raise CriteoFormatError(path, None, "missing_file", f"{what}; expected a Criteo TSV file (plain or .gz)")
    if os.path.getsize(path) == 0:
        raise CriteoFormatError(path, None, "empty_file", "file is empty (0 bytes); expected Criteo TSV rows")
    head = b""
    try:
        for block in _iter_blocks(path, block_bytes=_SNIFF_BYTES, stop_after=_SNIFF_BYTES):
            head += block
    except _GzipTruncated:
        if head:
            _check_text(path, head)
        raise _truncated_error(path, head.count(b"\n") + 1) from None
    except _GzipCorrupt as exc:
        raise _corrupt_error(path, head.count(b"\n") + 1, exc) from None
    _check_text(path, head)


def file_layout(path: str, format: str = "auto") -> CriteoLayout:
    """The layout of `path` (`layout.detect_layout` on its first 64 KiB), after `check_file`."""
    check_file(path)
    head = b""
    with contextlib.suppress(_GzipTruncated, _GzipCorrupt):  # check_file raised if the first block was cut
        for block in _iter_blocks(path, block_bytes=_SNIFF_BYTES, stop_after=_SNIFF_BYTES):
            head += block
    return detect_layout(path, head, format)


def _check_text(path: str, head: bytes) -> None:
    if not head:
        raise CriteoFormatError(
            path,
            None,
            "empty_file",
            "file has no content after decompression; expected Criteo rows",
        )
    nul = head.find(b"\x00")
    if nul >= 0:
        raise CriteoFormatError(
            path,
            None,
            "binary_file",
            f"looks binary (NUL byte at offset {nul}); expected tab-separated "
            "text (label, I1..I13, C1..C26), plain or gzip",
        )


def _truncated_error(path: str, line: int) -> CriteoFormatError:
    return CriteoFormatError(
        path,
        line,
        "truncated_gzip",
        f"gzip data stops before its end-of-stream marker, inside this line (after "
        f"{line - 1} complete lines): a truncated download or copy; re-fetch or "
        "re-compress the file",
    )


def _corrupt_error(path: str, line: int, exc: Exception) -> CriteoFormatError:
    return CriteoFormatError(
        path,
        line,
        "corrupt_gzip",
        f"gzip data is corrupt near this line ({exc}); re-fetch the file",
    )


def _iter_blocks(path: str, *, block_bytes: int = _READ_BLOCK_BYTES, stop_after: int | None = None) -> Iterator[bytes]:
    """Yields the (decompressed) bytes of `path` block by block, past a leading UTF-8 byte-order mark.

    A file saved by a Windows editor starts with a BOM (EF BB BF): without
    this, the first row's label would read as `\ufeff0` and the row be skipped.
    """
    blocks = _raw_blocks(path, block_bytes=block_bytes, stop_after=stop_after)
    first = next(blocks, b"")
    while len(first) < len(codecs.BOM_UTF8) and (more := next(blocks, b"")):
        first += more
    yield first[len(codecs.BOM_UTF8) :] if first.startswith(codecs.BOM_UTF8) else first
    yield from blocks


def _raw_blocks(path: str, *, block_bytes: int, stop_after: int | None) -> Iterator[bytes]:
    """Yields the (decompressed) bytes of `path` block by block.

    Handles multi-member gzip. A gzip stream that stops early raises
    `_GzipTruncated` *after* every byte before the cut has been yielded;
    undecodable gzip data raises `_GzipCorrupt`.
    """
    total = 0
    with open(path, "rb") as f:
        gzipped = f.read(2) == _GZIP_MAGIC
        f.seek(0)
        if not gzipped:
            while block := f.read(block_bytes):
                yield block
                total += len(block)
                if stop_after is not None and total >= stop_after:
                    return
            return
        decomp = zlib.decompressobj(wbits=31)
        in_member = False
        while raw := f.read(block_bytes):
            while raw:
                in_member = True
                try:
                    out = decomp.decompress(raw)
                except zlib.error as exc:
                    raise _GzipCorrupt(str(exc)) from exc
                if out:
                    yield out
                    total += len(out)
                    if stop_after is not None and total >= stop_after:
                        return
                raw = b""
                if decomp.eof:  # a member ended; more members may follow
                    raw = decomp.unused_data
                    decomp = zlib.decompressobj(wbits=31)
                    in_member = False
        if in_member:
            raise _GzipTruncated()


class _GzipTruncated(Exception):
    pass


class _GzipCorrupt(Exception):
    pass


def iter_line_blocks(path: str, *, block_bytes: int = _READ_BLOCK_BYTES) -> Iterator[tuple[int, bytes]]:
    """Yields `(first_line_number, data)`: whole lines, each ending in `\\n`.

    `\\r\\n` line ends become `\\n`; a last line without a newline gets one.

    Raises:
      CriteoFormatError: `truncated_gzip` / `corrupt_gzip`, naming the line
        where the data stops (the complete lines before it are yielded first).
    """
    line_no = 1
    rest = b""
    try:
        for block in _iter_blocks(path, block_bytes=block_bytes):
            data = rest + block
            if b"\r" in data:
                data = data.replace(b"\r\n", b"\n")
            cut = data.rfind(b"\n") + 1
            rest = data[cut:]
            if cut:
                yield line_no, data[:cut]
                line_no += data.count(b"\n", 0, cut)
    except _GzipTruncated:
        raise _truncated_error(path, line_no) from None  # the cut line is not yielded
    except _GzipCorrupt as exc:
        raise _corrupt_error(path, line_no, exc) from None
    if rest.endswith(b"\r"):
        rest = rest[:-1]
    if rest:
        yield line_no, rest + b"\n"


def iter_chunks(
    paths: Sequence[str],
    *,
    skip_bad_rows: bool = False,
    stats: CriteoReadStats | None = None,
    block_bytes: int = _READ_BLOCK_BYTES,
    format: str = "auto",
) -> Iterator[CriteoChunk]:
    """Streams the valid rows of `paths`, in order, as `CriteoChunk`s.

    Args:
      paths: files in the order to read.
      skip_bad_rows: drop and count bad rows instead of raising.
      stats: counts are added here (a fresh object if None).
      block_bytes: bytes read per step (memory use is a few times this).
      format: "auto" (each file's layout from its first line), "tsv" or
        "csv" (`layout.py`); a CSV header line is skipped, not counted.

    Yields:
      Non-empty chunks of valid rows.

    Raises:
      CriteoFormatError: any file-level fault, or a bad row when not
        `skip_bad_rows`; it is also recorded in `stats.error`.
    """
    check_format(format)
    stats = stats if stats is not None else CriteoReadStats()
    try:
        for path in paths:
            layout = file_layout(path, format)
            rows = lines = 0
            skipped_here: dict[str, int] = {}
            for line_no, data in iter_line_blocks(path, block_bytes=block_bytes):
                if layout.header and line_no == 1:  # the CSV header: not a row
                    line_no, data = 2, data[data.index(b"\n") + 1 :]
                    if not data:
                        continue
                chunk, skipped = parse_block(path, line_no, data, skip_bad_rows=skip_bad_rows, layout=layout)
                n_lines = data.count(b"\n")
                stats._add(path, len(chunk), n_lines, skipped)  # noqa: SLF001 - CriteoReadStats is this module's
                rows += len(chunk)
                lines += n_lines
                for reason, (count, _) in skipped.items():
                    skipped_here[reason] = skipped_here.get(reason, 0) + count
                if len(chunk):
                    yield chunk
            if rows == 0:
                raise _no_valid_rows(path, lines, skipped_here, layout)
            if skipped_here:
                _warn_skipped(path, lines, skipped_here, stats)
            with stats._lock:  # noqa: SLF001
                stats.files_completed += 1
    except CriteoFormatError as error:
        raise stats._fail(error) from None  # noqa: SLF001


def _warn_skipped(path: str, lines: int, skipped_here: dict[str, int], stats: CriteoReadStats) -> None:
    """Warns how many of a file's `lines` were skipped, by reason, with the first one's message."""
    _LOG.warning(
        "%s: skipped %d of %d lines (%s); first: %s",
        path,
        sum(skipped_here.values()),
        lines,
        skipped_here,
        stats.first_skipped.get(next(iter(skipped_here)), ""),
    )


_EXACT_COUNT_BYTES = 4 << 20


def estimate_rows(files: str | os.PathLike | Sequence[str | os.PathLike]) -> int:
    """About how many lines `files` hold, read from their sizes (for choosing settings before reading).

    A file of at most 4 MiB (on disk) is counted exactly; a larger one is
    estimated as its decompressed size over the mean line length of its
    first 4 MiB (gzip: the compressed size times the first block's
    compression ratio). Cheap: at most 4 MiB read per file.

    Raises:
      CriteoFormatError: as `check_files`.
    """
    paths = normalize_paths(files)
    check_files(paths)
    total = 0.0
    for path in paths:
        size = os.path.getsize(path)
        if size <= _EXACT_COUNT_BYTES:
            blocks: list[bytes] = []
            with contextlib.suppress(_GzipTruncated, _GzipCorrupt):  # the read names these faults
                blocks.extend(_iter_blocks(path))
            data = b"".join(blocks)
            total += data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
            continue
        with open(path, "rb") as f:
            raw = f.read(_EXACT_COUNT_BYTES)
        if raw[:2] == _GZIP_MAGIC:
            decomp = zlib.decompressobj(wbits=31)
            head = decomp.decompress(raw)
            consumed = len(raw) - len(decomp.unconsumed_tail) - len(decomp.unused_data)
            per_line = max(consumed, 1) / max(head.count(b"\n"), 1)
        else:
            per_line = len(raw) / max(raw.count(b"\n"), 1)
        total += size / per_line
    return int(round(total))


def _no_valid_rows(path: str, lines: int, skipped: dict, layout: CriteoLayout) -> CriteoFormatError:
    what = (
        f"none of its {lines} lines is a valid Criteo row (skipped per reason: {skipped}); read as {layout.describe()}"
    )
    head = b"".join(_iter_blocks(path, block_bytes=_SNIFF_BYTES, stop_after=_SNIFF_BYTES)) if lines else b""
    if layout.name == "tsv" and is_comma_separated(first_line(head)):
        return CriteoFormatError(
            path, None, "no_valid_rows", what + ", but the file is comma-separated", hint="read it as CSV: {format_csv}"
        )
    return CriteoFormatError(path, None, "no_valid_rows", what + "; is this a Criteo TSV or CSV file?")


def scan_files(
    files: str | os.PathLike | Sequence[str | os.PathLike], *, skip_bad_rows: bool = False, format: str = "auto"
) -> CriteoReadStats:
    """Reads every row of `files` in Python and returns the counts.

    A validation pass that raises the same Python errors as the reader, e.g.
    before a long training run, or to count rows.

    Raises:
      CriteoFormatError: as `iter_chunks`.
    """
    paths = normalize_paths(files)
    check_files(paths)
    stats = CriteoReadStats()
    for _ in iter_chunks(paths, skip_bad_rows=skip_bad_rows, stats=stats, format=format):
        pass
    return stats


__all__ = [
    "CriteoReadStats",
    "check_file",
    "check_files",
    "iter_chunks",
    "iter_line_blocks",
    "estimate_rows",
    "file_layout",
    "normalize_paths",
    "scan_files",
]
