"""MovieLens files as users have them: ml-100k `u.data`, ml-latest / ML-20M `ratings.csv`, ML-1M `ratings.dat`.

Accepted layouts (detected from the first non-blank line; one rating per line):

* ml-100k `u.data`: `user<TAB>item<TAB>rating<TAB>timestamp`, no header.
* ml-latest, ml-latest-small, ML-20M, ML-25M `ratings.csv`: `userId,movieId,rating,timestamp`
  with that header line (optional), commas, half-star ratings such as `3.5`.
* ML-1M / ML-10M `ratings.dat`: `UserID::MovieID::Rating::Timestamp`, no header.

Ids are integers >= 1 (0 pads contexts and serving requests); the rating is
any number (the next-movie task only uses which movie came when, so half
stars are read, never refused); the timestamp is an integer. CRLF line ends
are accepted. A malformed line is refused with one line naming the file, the
1-based line and the field.

A *dataset directory* may be given instead of a file: its `ratings.csv`,
`ratings.dat` or `u.data` (first found, in that order) is read. The catalogue
beside the ratings (`movies.csv`, `movies.dat`, `u.item`) lists every movie
id of the dataset whether rated or not; `read_catalogue` reads its ids, which
number the items densely without looking at the ratings (see
`tfdp_embed.data.item_ids`).

References: Harper & Konstan, "The MovieLens Datasets", TiiS 2015; the
README of each GroupLens release (file layouts).
"""

from __future__ import annotations

import array
import dataclasses
import os

import numpy as np

RATINGS_FILES = ("ratings.csv", "ratings.dat", "u.data")
"""Ratings file names looked for in a dataset directory, in this order."""
CATALOGUES = {"ratings.csv": "movies.csv", "ratings.dat": "movies.dat", "u.data": "u.item"}
"""The catalogue that sits beside each ratings file in a GroupLens release."""
CSV_HEADER = ("userid", "movieid", "rating", "timestamp")
_FIELDS = ("user", "item", "rating", "timestamp")
MAX_ITEM_ID = 2**31 - 1
"""The largest movie id: contexts and labels are int32."""
_MAX_INT64 = 2**63 - 1
_ID_LIMITS = (_MAX_INT64, MAX_ITEM_ID, None, _MAX_INT64)  # users and timestamps are stored as int64
_LIMIT_TYPES = {MAX_ITEM_ID: "int32", _MAX_INT64: "int64"}
_NUM_GENRES = 19  # u.genre: unknown, Action, ..., Western
_SEPARATORS = {"\t": ("tab", "u.data"), "::": ("'::'", "ratings.dat"), ",": ("comma", "ratings.csv")}


class MovieLensFormatError(ValueError):
    """A ratings or catalogue file in no MovieLens layout; the message names file, line and field."""


@dataclasses.dataclass(frozen=True)
class Ratings:
    """All ratings of a file, in file order: int64 users, items, timestamps; float64 ratings."""

    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray
    timestamps: np.ndarray
    path: str = ""
    separator: str = "\t"

    def __len__(self) -> int:
        return int(self.users.shape[0])

    @property
    def num_items(self) -> int:
        """The largest original item id (not the number of items: ids may be sparse)."""
        return int(self.items.max())


def resolve_ratings_path(path: str | os.PathLike) -> str:
    """The ratings file of `path`: the file itself, or a dataset directory's `RATINGS_FILES` entry.

    Raises:
      FileNotFoundError: no such file, or a directory without a ratings file (the message lists
        the names looked for).
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        for name in RATINGS_FILES:
            if os.path.isfile(os.path.join(path, name)):
                return os.path.join(path, name)
        raise FileNotFoundError(
            f"MovieLens dataset directory {path!r} holds none of {', '.join(RATINGS_FILES)}; pass the ratings "
            "file itself or a GroupLens dataset directory (ml-100k, ml-1m, ml-latest, ml-20m)."
        )
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"MovieLens ratings file {path!r} does not exist; expected ml-100k's u.data "
            "(user<TAB>item<TAB>rating<TAB>timestamp per line), ml-latest's ratings.csv "
            "(userId,movieId,rating,timestamp) or a dataset directory holding one, e.g. "
            "../shared/data/movielens/ml-100k/u.data."
        )
    return path


def read_ratings(path: str | os.PathLike) -> Ratings:
    """Reads a MovieLens ratings file (u.data, ratings.csv or ratings.dat) or a dataset directory's.

    Args:
      path: the ratings file or a dataset directory.

    Returns:
      `Ratings` in file order (original ids, unchanged).

    Raises:
      FileNotFoundError: see `resolve_ratings_path`.
      MovieLensFormatError: a line without 4 fields in the file's layout, a non-integer id or
        timestamp, a non-numeric rating, an id < 1, a header other than ratings.csv's, or no
        rating at all; the message names the file, the 1-based line and the field.
    """
    path = resolve_ratings_path(path)
    # Typed arrays, 8 bytes a value: ML-20M's 20M ratings would take gigabytes as lists of Python numbers.
    users, items, ratings, stamps = array.array("q"), array.array("q"), array.array("d"), array.array("q")
    separator = None
    with open(path, encoding="utf-8-sig", errors="strict", newline="") as f:
        try:
            for number, line in enumerate(f, start=1):
                line = line.rstrip("\r\n")
                if not line.strip():
                    continue
                if separator is None:
                    separator = _detect_separator(line, path, number)
                    if _is_csv_header(line, separator, path, number):
                        continue
                user, item, rating, stamp = _parse_line(line, separator, path, number)
                users.append(user)
                items.append(item)
                ratings.append(rating)
                stamps.append(stamp)
        except UnicodeDecodeError as error:
            raise MovieLensFormatError(f"{path}: not a UTF-8 text file ({error}).") from None
    if not users:
        raise MovieLensFormatError(f"{path}: no ratings (the file is empty or holds only a header).")
    return Ratings(
        np.frombuffer(users, np.int64),
        np.frombuffer(items, np.int64),
        np.frombuffer(ratings, np.float64),
        np.frombuffer(stamps, np.int64),
        path=path,
        separator=separator or "\t",
    )


def _detect_separator(line: str, path: str, number: int) -> str:
    for separator in _SEPARATORS:
        if separator in line:
            return separator
    raise MovieLensFormatError(
        f"{path}:{number}: not a MovieLens ratings line (no tab, '::' or comma): {line.strip()[:80]!r}; expected "
        "u.data (user<TAB>item<TAB>rating<TAB>timestamp) or ratings.csv (userId,movieId,rating,timestamp)."
    )


def _is_csv_header(line: str, separator: str, path: str, number: int) -> bool:
    first = line.split(separator, 1)[0].strip()
    if first.lstrip("-").isdigit():
        return False
    names = tuple(name.strip().lower() for name in line.split(separator))
    if separator == "," and names == CSV_HEADER:
        return True
    raise MovieLensFormatError(
        f"{path}:{number}: field 'user' must be an integer; found {first[:40]!r}. The only header accepted is "
        "ratings.csv's 'userId,movieId,rating,timestamp' (comma-separated)."
    )


def _parse_line(line: str, separator: str, path: str, number: int) -> tuple:
    fields = line.split(separator)
    if len(fields) != 4:
        raise MovieLensFormatError(
            f"{path}:{number}: expected 4 {_SEPARATORS[separator][0]}-separated fields ({', '.join(_FIELDS)}; the "
            f"{_SEPARATORS[separator][1]} layout); found {len(fields)} in {line.strip()[:80]!r}."
        )
    values: list = []
    for name, text in zip(_FIELDS, fields):
        try:
            values.append(float(text) if name == "rating" else int(text))
        except ValueError:
            kind = "a number" if name == "rating" else "an integer"
            raise MovieLensFormatError(
                f"{path}:{number}: field {name!r} must be {kind}; found {text[:40]!r}."
            ) from None
    if values[0] < 1 or values[1] < 1:
        raise MovieLensFormatError(
            f"{path}:{number}: user and item ids must be >= 1 (id 0 is reserved for padding); "
            f"found user {values[0]}, item {values[1]}."
        )
    for name, value, limit in zip(_FIELDS, values, _ID_LIMITS):
        if limit is not None and abs(value) > limit:
            raise MovieLensFormatError(
                f"{path}:{number}: field {name!r} must be at most {limit} ({_LIMIT_TYPES[limit]}); found {str(value)[:40]}."
            )
    return tuple(values)


def catalogue_path(ratings_path: str) -> str | None:
    """The catalogue beside a ratings file (`CATALOGUES`), or None when there is none."""
    name = CATALOGUES.get(os.path.basename(ratings_path))
    if name is None:
        return None
    path = os.path.join(os.path.dirname(ratings_path), name)
    return path if os.path.isfile(path) else None


def read_catalogue(path: str | os.PathLike) -> np.ndarray:
    """The movie ids of a catalogue: `movies.csv` (header, comma), `movies.dat` ('::') or `u.item` ('|').

    Only the first field (the id) is read; titles may hold any character.

    Returns:
      int64 `[n]` sorted distinct ids.

    Raises:
      MovieLensFormatError: a non-integer or < 1 id, or no id (file and line named).
    """
    path = os.fspath(path)
    ids = []
    with open(path, encoding="latin-1", newline="") as f:  # u.item and movies.dat are Latin-1
        for number, line in enumerate(f, start=1):
            line = line.rstrip("\r\n").lstrip("\ufeff").lstrip("ï»¿")
            if not line.strip():
                continue
            first = line.replace("::", "|").replace(",", "|").split("|", 1)[0].strip()
            if number == 1 and first.lower() == "movieid":
                continue
            if not first.isdigit() or int(first) < 1:
                raise MovieLensFormatError(
                    f"{path}:{number}: field 'movieId' must be an integer >= 1; found {first[:40]!r}."
                )
            if int(first) > MAX_ITEM_ID:
                raise MovieLensFormatError(
                    f"{path}:{number}: field 'movieId' must be at most {MAX_ITEM_ID} (int32); found {first[:40]!r}."
                )
            ids.append(int(first))
    if not ids:
        raise MovieLensFormatError(f"{path}: no movie ids (the catalogue is empty).")
    return np.unique(np.asarray(ids, np.int64))


def read_item_genres(path: str | os.PathLike) -> tuple:
    """Reads a MovieLens `u.item` file: each movie's id and genres (item features for a candidate tower).

    A line is `id|title|release date|video date|url|g_0|...|g_18`, latin-1
    encoded, with one 0/1 flag per genre of `u.genre` (genre 0 is "unknown").

    Args:
      path: the `u.item` file.

    Returns:
      `(ids, genres)`: int64 `[N]` movie ids in file order and, per movie, the
      list of its genre indices (a movie with no flag set gets [0], "unknown").

    Raises:
      FileNotFoundError: the file does not exist.
      MovieLensFormatError: a line without an integer id and 19 0/1 flags
        (the message names the file and the 1-based line), or an empty file.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"MovieLens items file {path!r} does not exist; expected ml-100k's u.item.")
    ids, genres = [], []
    with open(path, encoding="latin-1") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            fields = line.rstrip("\r\n").split("|")
            flags = fields[-_NUM_GENRES:]
            if len(fields) < 5 + _NUM_GENRES or not fields[0].isdigit() or any(g not in ("0", "1") for g in flags):
                raise MovieLensFormatError(
                    f"{path}:{number}: expected 'id|title|date|video date|url' and {_NUM_GENRES} 0/1 genre "
                    f"flags separated by '|'; received {line.strip()[:80]!r}."
                )
            ids.append(int(fields[0]))
            genres.append([g for g, flag in enumerate(flags) if flag == "1"] or [0])
    if not ids:
        raise MovieLensFormatError(f"{path}: no movies (the file is empty).")
    return np.asarray(ids, np.int64), genres


def line_of_item(ratings: Ratings, item: int) -> int:
    """The 1-based line of the first rating of `item` in `ratings.path` (for error messages)."""
    with open(ratings.path, encoding="utf-8-sig", newline="") as f:
        for number, line in enumerate(f, start=1):
            fields = line.rstrip("\r\n").split(ratings.separator)
            if len(fields) == 4 and fields[1].strip() == str(item):
                return number
    return 0


__all__ = [
    "CATALOGUES",
    "MAX_ITEM_ID",
    "RATINGS_FILES",
    "MovieLensFormatError",
    "Ratings",
    "catalogue_path",
    "line_of_item",
    "read_catalogue",
    "read_item_genres",
    "read_ratings",
    "resolve_ratings_path",
]
