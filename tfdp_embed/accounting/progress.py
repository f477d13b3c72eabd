"""Slow accounting work says so: a line once it has run `ANNOUNCE_AFTER_SECONDS`, then its result and time.

    with announced("calibrating sigma for epsilon=3 (PLD)") as note:
        sigma = search()
        note.result = f"sigma = {sigma:.5g}"

prints, on stderr and only when the search takes more than a second,

    tfdp_embed: calibrating sigma for epsilon=3 (PLD) ...
    tfdp_embed: sigma = 0.62862 (2.3 s)

Nested announcements (a calibration inside a plan) print only the outermost.
Set `ANNOUNCE_AFTER_SECONDS = None` to silence them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
import threading
import time
from collections.abc import Iterator

_LOG = logging.getLogger(__name__)

# Seconds after which a running search is announced (None: never).
ANNOUNCE_AFTER_SECONDS: float | None = 1.0

_state = threading.local()


@dataclasses.dataclass
class Note:
    """What to print when the work ends (`result`), if it was slow."""

    result: str | None = None
    announced: bool = False


@contextlib.contextmanager
def announced(message: str) -> Iterator[Note]:
    """Prints `message` if the block runs longer than `ANNOUNCE_AFTER_SECONDS`, then `note.result` and the time."""
    depth, after = getattr(_state, "depth", 0), ANNOUNCE_AFTER_SECONDS
    note = Note()
    _state.depth = depth + 1
    if depth or after is None:
        try:
            yield note
        finally:
            _state.depth = depth
        return
    started = time.perf_counter()

    def announce():
        note.announced = True
        _say(f"{message} ...")

    timer = threading.Timer(after, announce)
    timer.daemon = True
    timer.start()
    try:
        yield note
    finally:
        timer.cancel()
        _state.depth = depth
    elapsed = time.perf_counter() - started
    if note.result and (note.announced or elapsed >= after):
        _say(f"{note.result} ({elapsed:.1f} s)")


def _say(text: str) -> None:
    _LOG.info(text)
    print(f"tfdp_embed: {text}", file=sys.stderr, flush=True)


__all__ = ["ANNOUNCE_AFTER_SECONDS", "Note", "announced"]
