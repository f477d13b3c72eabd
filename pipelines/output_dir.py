"""`--out` directories that exist only when a run produced something.

A run that fails (unreadable data, settings the data cannot support,
divergence) must not leave an empty `--out` behind: the next look at the
directory would suggest a run that never happened. `removed_on_failure`
wraps a run: when it raises, the directory is removed again if this run
created it (a directory that existed before is left as it was).

Example:
    >>> with removed_on_failure("runs/a"):
    ...     run(config)          # may create runs/a; removed again if run raises
"""

from __future__ import annotations

import contextlib
import os
import shutil


@contextlib.contextmanager
def removed_on_failure(path: str | os.PathLike | None):
    """Removes `path` (and what the run wrote in it) if the body raises and `path` did not exist before.

    `path` None (a run that writes nothing) makes this a no-op.
    """
    if path is None:
        yield None
        return
    path = os.fspath(path)
    existed = os.path.lexists(path)
    try:
        yield path
    except BaseException:
        if not existed and os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        raise


__all__ = ["removed_on_failure"]
