"""Sequence files as public projects ship them: SASRec "user item" pairs and S3-Rec "user item item ...".

Two layouts, whitespace-separated positive integer ids (0 pads), one user's
items in time order:

* `pairs` (SASRec, DPFormer's Amazon Games): one interaction "user item" per
  line; a user's lines may be interleaved with other users'.
* `sequences` (S3-Rec, CARCA and most of their derived benchmarks): one user
  per line, "user item item ...", the whole history on that line.

`auto` decides from the first non-blank line: more than two fields is the
`sequences` layout, exactly two is `pairs` (a `sequences` file whose first
user has a single item reads the same either way, and a later longer line
is then refused with a hint to pass the layout). CRLF line ends are fine.
A malformed line is refused with one line naming the file, the 1-based
line and the field.

References: Kang & McAuley 2018 (SASRec data files); Zhou et al., "S3-Rec",
CIKM 2020 (the `data/*.txt` files of its repository).
"""

from __future__ import annotations

import os

LAYOUTS = ("auto", "pairs", "sequences")
MAX_ID = 2**31 - 1
"""The largest user or item id: ids are int32 in the padded arrays, the model and the serving signature."""
_HINT = "; a file with one user per line ('user item item ...', the S3-Rec layout) is read with --layout sequences"


class SequenceFormatError(ValueError):
    """A malformed line in a sequence file; the message names file, line and field."""


def read_sequence_file(path: str | os.PathLike, *, layout: str = "auto") -> tuple:
    """Reads a sequence file in either layout.

    Args:
      path: the text file.
      layout: "auto", "pairs" or "sequences" (see the module docstring).

    Returns:
      `(users, layout)`: `{user: [items in file order]}` and the layout read ("pairs" or "sequences").

    Raises:
      FileNotFoundError: `path` does not exist.
      ValueError: an unknown `layout`.
      SequenceFormatError: a blank line, a line with the wrong number of fields, a non-integer or
        non-positive id, a user on two lines of a `sequences` file, or no interaction at all.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"`layout` must be one of {LAYOUTS}; received {layout!r}.")
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"Sequence file not found: {path!r}.")
    users: dict[int, list[int]] = {}
    first_line: dict[int, int] = {}
    with open(path) as f:
        for number, line in enumerate(f, start=1):
            fields = line.split()
            if layout == "auto" and fields:
                layout = "sequences" if len(fields) > 2 else "pairs"
            if layout == "sequences":
                user, items = _sequence_line(fields, line, path, number)
                if user in users:
                    raise SequenceFormatError(
                        f"{path}:{number}: user {user} already has a line ({first_line[user]}); the sequences layout "
                        "holds one line per user (a file of 'user item' pairs is read with --layout pairs)."
                    )
                users[user], first_line[user] = items, number
            else:
                user, item = _pair_line(fields, line, path, number)
                users.setdefault(user, []).append(item)
    if not users:
        raise SequenceFormatError(f"{path}: the file holds no interactions.")
    return users, layout


def _pair_line(fields: list, line: str, path: str, number: int) -> tuple:
    if len(fields) != 2:
        raise SequenceFormatError(
            f"{path}:{number}: expected 2 fields 'user item', found {len(fields)}: {line.rstrip()[:80]!r}"
            + (_HINT if len(fields) > 2 else "")
            + "."
        )
    try:
        user, item = int(fields[0]), int(fields[1])
    except ValueError:
        raise SequenceFormatError(
            f"{path}:{number}: user and item must be integers; received {line.rstrip()[:80]!r}."
        ) from None
    if user < 1 or item < 1:
        raise SequenceFormatError(
            f"{path}:{number}: ids must be >= 1 (0 is the padding id); received {line.rstrip()[:80]!r}."
        )
    if max(user, item) > MAX_ID:
        raise SequenceFormatError(
            f"{path}:{number}: ids must be at most {MAX_ID} (int32); received {line.rstrip()[:80]!r}."
        )
    return user, item


def _sequence_line(fields: list, line: str, path: str, number: int) -> tuple:
    if len(fields) < 2:
        raise SequenceFormatError(
            f"{path}:{number}: expected 'user item item ...' (at least 2 fields), found {len(fields)}: "
            f"{line.rstrip()[:80]!r}."
        )
    ids = []
    for position, text in enumerate(fields, start=1):
        name = "user" if position == 1 else "item"
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < 1:
            raise SequenceFormatError(
                f"{path}:{number}: field {position} ({name}) must be an integer >= 1 (0 is the padding id); "
                f"found {text[:40]!r}."
            )
        if value > MAX_ID:
            raise SequenceFormatError(
                f"{path}:{number}: field {position} ({name}) must be at most {MAX_ID} (int32); found {text[:40]!r}."
            )
        ids.append(value)
    return ids[0], ids[1:]


__all__ = ["LAYOUTS", "MAX_ID", "SequenceFormatError", "read_sequence_file"]
