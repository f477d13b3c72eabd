"""`--out` releases that appear whole or not at all, one writer at a time.

A release is a directory holding `report.json` (written last) beside the
model and its privacy report. `staged_release(out)` wraps a run:

1. takes `OUT.lock` (`fcntl.flock`, released by the kernel when the process
   dies); a second run on the same `--out` is refused at once, naming the pid
   that holds it (`OutputBusyError`);
2. removes what killed runs left beside `OUT` (`OUT.partial-PID`,
   `OUT.replaced-PID`): holding the lock proves their writers are gone;
3. yields a `Staging`: the run writes into `OUT.partial-PID` (same parent
   directory, so the same file system) and SIGTERM raises `SystemExit(143)`
   so the staging directory is removed like on any failure;
4. on success, checks that the release is complete (`required` files) and
   publishes it: a new or empty `OUT` is the staging directory renamed into
   place (one `rename`); an existing directory (a previous release, or files
   of the caller such as a log) gets the new entries one rename each, its old
   `report.json` moved away first and the new one moved in last.

A run that fails, is interrupted (Ctrl-C, SIGTERM) or killed (SIGKILL) leaves
`OUT` as it was: never a half-written model, never a model without its report.
A SIGKILL leaves `OUT.partial-PID`, removed by the next run on `OUT`.

Before the rename every file of the release and every directory is fsynced
(and `OUT`'s parent after it): a power cut after the run exits cannot leave
a release whose `report.json` is empty. An `OUT` that cannot be written (a
read-only or missing parent, a parent that is a file) is refused before the
body runs, and a full disk while writing is reported in one line naming
the path; both raise `OutputDirError` (a ValueError). The spent privacy
budget of every run on `OUT` is kept in `OUT.budget.jsonl`
(`Staging.budget`, `pipelines.budget_record`).

Example:
    >>> with staged_release("runs/a", required=("report.json",)) as staging:
    ...     write_everything(staging.path)     # runs/a.partial-1234/...
    >>> # runs/a/report.json exists now; runs/a.partial-1234 does not
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import glob
import os
import shutil
import signal
import threading

from pipelines.budget_record import BudgetRecord

RELEASE_MARKER = "report.json"
"""The file whose presence makes a directory a finished release; published last."""
PARTIAL = ".partial-"
REPLACED = ".replaced-"


class OutputBusyError(ValueError):
    """Another run holds the lock of the same `--out`."""


class OutputDirError(ValueError):
    """`--out` cannot be written: not creatable, not writable, or the disk filled up while writing."""


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


@dataclasses.dataclass(frozen=True)
class Staging:
    """Where a run writes (`path`, `OUT.partial-PID`), where its release appears (`out`), the budget record."""

    path: str
    out: str
    budget: BudgetRecord

    def published(self, value):
        """`value` (a report: dicts, lists, strings) with paths inside `path` rewritten to their place in `out`."""
        if isinstance(value, str):
            inside = value == self.path or value.startswith(self.path + os.sep)
            return self.out + value[len(self.path) :] if inside else value
        if isinstance(value, dict):
            return {key: self.published(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self.published(item) for item in value)
        return value


@contextlib.contextmanager
def staged_release(out: str | os.PathLike | None, *, required: tuple = (RELEASE_MARKER,), flag: str = "--out"):
    """Locks `out`, yields a `Staging` to write the release into, publishes it when the body returns.

    Args:
      out: the release directory; None (a run that writes nothing) yields None and does nothing.
      required: paths relative to the release that must exist before it is published
        (e.g. the SavedModel and its `privacy_report.json`).
      flag: the option that named `out`, for the messages.

    Raises:
      OutputBusyError: another run holds `OUT.lock` (raised before the body runs).
      OutputDirError: `OUT.lock` or the staging directory cannot be created (raised before the body
        runs), or the disk filled up while the body wrote or the release was published.
      ValueError: `out` names no directory one could publish to ('.', '/', an existing file).
      RuntimeError: the body returned without writing every `required` file (nothing is published).
    """
    if out is None:
        yield None
        return
    out = _checked_out(os.fspath(out), flag)
    lock = _writable(lambda: _lock(out, flag), out, flag)
    try:
        _remove_leftovers(out)
        budget = BudgetRecord.read(out)  # under the lock: no other run appends now
        staging = Staging(f"{out}{PARTIAL}{os.getpid()}", out, budget)
        _writable(lambda: os.makedirs(staging.path), out, flag)
        try:
            with _sigterm_as_exit():
                yield staging
            _check_complete(staging.path, required)
            _sync_tree(staging.path)
            _publish(staging.path, out)
            _sync_directory(os.path.dirname(os.path.abspath(out)))
        except BaseException as error:
            shutil.rmtree(staging.path, ignore_errors=True)
            budget.close(finished=False)
            if _disk_full(error):
                where = getattr(error, "filename", None) or staging.path
                raise OutputDirError(
                    f"`{flag}` {out}: no space left on device while writing {where}; the partial release was "
                    f"removed and {out} left as it was: free some space or give another {flag}."
                ) from None
            raise
        budget.close(finished=True)
    finally:
        _unlock(lock)


def _writable(create, out: str, flag: str):
    """`create()`, an OSError of which (read-only or missing parent, a file in the way, a full disk) becomes one line."""
    try:
        return create()
    except OSError as error:
        if isinstance(error, BlockingIOError):
            raise
        reason = "no space left on device" if error.errno in DISK_FULL else error.strerror or str(error)
        if isinstance(error, (FileExistsError, NotADirectoryError)):
            reason = "a file is in the way, not a directory"
        where = error.filename or out
        raise OutputDirError(
            f"`{flag}` {out} cannot be written ({where}: {reason}); nothing was read or trained: "
            f"give a {flag} in a directory you can write to."
        ) from None


def _disk_full(error: BaseException) -> bool:
    """An OSError ENOSPC / EDQUOT, or a TensorFlow error that says so (the SavedModel writer's)."""
    if isinstance(error, OSError) and error.errno in DISK_FULL:
        return True
    return isinstance(error, Exception) and "No space left on device" in str(error)


def _sync_tree(root: str) -> None:
    """fsync every file and directory under `root` (the release), deepest first, `root` last."""
    for directory, _, files in os.walk(root, topdown=False):
        for name in files:
            path = os.path.join(directory, name)
            if os.path.isfile(path) and not os.path.islink(path):
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        _sync_directory(directory)


def _sync_directory(path: str) -> None:
    """fsync a directory (its entries: a rename into it is durable); ignored where directories cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as error:
        if error.errno not in (errno.EINVAL, errno.EBADF):  # e.g. a file system without directory fsync
            raise
    finally:
        os.close(fd)


def _checked_out(out: str, flag: str) -> str:
    """`out` without a trailing separator; refuses names with no parent to stage beside, and files."""
    stripped = out.rstrip(os.sep) or out
    if os.path.basename(os.path.normpath(stripped)) in ("", ".", ".."):
        raise ValueError(f"`{flag}` must name a directory to create or update, not {out!r}; e.g. {flag} runs/a.")
    if os.path.lexists(stripped) and not os.path.isdir(stripped):
        raise ValueError(f"`{flag}` {out!r} exists and is not a directory; give a directory to create or update.")
    return stripped


def _lock(out: str, flag: str) -> int:
    """Takes `OUT.lock` without waiting; writes this pid into it. Returns the file descriptor."""
    path = out + ".lock"
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno not in (errno.EAGAIN, errno.EACCES):
            os.close(fd)
            raise
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise OutputBusyError(
            f"`{flag}` {out} is being written by another run (pid {holder}, lock {path}); "
            f"wait for it to finish or give another {flag}."
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _unlock(fd: int) -> None:
    """Empties and releases the lock file (it stays: removing it would let two runs lock different files)."""
    try:
        os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _remove_leftovers(out: str) -> None:
    """Removes `OUT.partial-*` and `OUT.replaced-*` (called under the lock: their writers are dead)."""
    for prefix in (out + PARTIAL, out + REPLACED):
        for path in glob.glob(glob.escape(prefix) + "*"):
            if path[len(prefix) :].isdigit():  # OUT.partial-1234, never OUT.partial-notes
                shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def _sigterm_as_exit():
    """SIGTERM raises `SystemExit(143)` in the main thread (so cleanup runs), unless someone else handles it."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def terminate(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _check_complete(staging: str, required: tuple) -> None:
    missing = [name for name in required if not os.path.exists(os.path.join(staging, name))]
    if missing:
        raise RuntimeError(f"The release in {staging} is incomplete (missing {', '.join(missing)}); not published.")


def _publish(staging: str, out: str) -> None:
    """Moves the finished release into `out`: one rename if `out` is new or empty, else entry by entry."""
    if not os.path.lexists(out):
        os.rename(staging, out)
        return
    if not os.listdir(out):
        try:
            os.replace(staging, out)  # an empty directory is replaced atomically
            return
        except OSError:
            pass  # e.g. a mount point, or a file appeared: fall through
    _publish_into(staging, out)


def _publish_into(staging: str, out: str) -> None:
    """`out` exists: its `report.json` goes first (no longer a release), the new entries in, `report.json` last.

    Entries of `out` the release does not name (a caller's log) stay; those it replaces go to
    `OUT.replaced-PID`, removed at the end (or by the next run if this one is killed).
    """
    replaced = f"{out}{REPLACED}{os.getpid()}"
    os.makedirs(replaced)
    names = sorted(name for name in os.listdir(staging) if name != RELEASE_MARKER) + [RELEASE_MARKER]
    for name in [RELEASE_MARKER, *names[:-1]]:
        if os.path.lexists(os.path.join(out, name)):
            os.rename(os.path.join(out, name), os.path.join(replaced, name))
    for name in names:
        if os.path.lexists(os.path.join(staging, name)):
            os.rename(os.path.join(staging, name), os.path.join(out, name))
    _sync_directory(out)
    shutil.rmtree(replaced, ignore_errors=True)
    os.rmdir(staging)


__all__ = ["OutputBusyError", "OutputDirError", "RELEASE_MARKER", "Staging", "staged_release"]
