"""Where a benchmark run writes its files, and how `benchmarks/RESULTS.md` learns of them.

Every run writes files of its own. A script's `--json` / `--png` default to
`auto`: `benchmarks/results/<benchmark>-<tag>-<UTC start>.<ext>`, the tag
naming the run's main settings (e.g. `step_time-uniform-1e5-5e7-20261121T211854Z.json`),
so a later run never overwrites a file that an earlier section cites. An
explicit path to an existing file that `RESULTS.md` or the archive cites is
refused; `''` skips the file.

`RESULTS.md` is generated from the JSON files (`make results`,
`benchmarks/results_page.py`): a run whose `--results-md` names it rewrites it
from the JSON instead of appending. `append_section` still appends a run's
Markdown section to any other page (a notebook of one's own), under the heading
"New measurements (not yet folded in)", one heading level down.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import re

BENCHMARKS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCHMARKS)
RESULTS_DIR = os.path.join(BENCHMARKS, "results")
RESULTS_MD = os.path.join(BENCHMARKS, "RESULTS.md")
ARCHIVE_DIR = os.path.join(BENCHMARKS, "archive")
AUTO = "auto"
NEW_HEADING = "## New measurements (not yet folded in)"
PAGE_HEADER = (
    '# Benchmark results\n\nProtocol: `../shared/BENCHMARKS.md`. "not measured" means exactly that '
    "(never an estimate).\n"
)
NEW_INTRO = (
    "Sections appended by the benchmark scripts (`--results-md`), newest last, with the files each run wrote "
    "(paths relative to the repository root). They are not part of the answers above until someone folds them in."
)


def utc_stamp(when: datetime.datetime | None = None) -> str:
    """'20261121T211854Z' for `when` (default: now, UTC)."""
    when = when or datetime.datetime.now(datetime.UTC)
    return when.astimezone(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")


def short_number(value: float) -> str:
    """100000 -> '1e5', 50000000 -> '5e7', 24000 -> '2.4e4', 512 -> '512', 0.1 -> '0.1'."""
    value = float(value)
    if abs(value) < 1000 or value != int(value):
        return f"{value:g}"
    mantissa, exponent = f"{value:e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}"


def range_tag(values) -> str:
    """(100000, 1000000, 50000000) -> '1e5-5e7'; one value -> '1e5'."""
    values = sorted(float(v) for v in values)
    if not values:
        return ""
    ends = {short_number(values[0]), short_number(values[-1])}
    return "-".join(sorted(ends, key=lambda text: float(text)))


def _slug(tag: str) -> str:
    return re.sub(r"[^A-Za-z0-9.@]+", "-", tag).strip("-")


def default_path(benchmark: str, tag: str, suffix: str, *, stamp: str) -> str:
    """`results/<benchmark>-<tag>-<stamp><suffix>`, with -2, -3, ... when that name exists already."""
    stem = "-".join(part for part in (benchmark, _slug(tag), stamp) if part)
    path = os.path.join(RESULTS_DIR, stem + suffix)
    count = 2
    while os.path.exists(path):
        path = os.path.join(RESULTS_DIR, f"{stem}-{count}{suffix}")
        count += 1
    return path


def citing_pages(path: str) -> list[str]:
    """The results pages (RESULTS.md, benchmarks/archive/*.md) whose text names this file."""
    name = os.path.basename(path)
    pages = [RESULTS_MD, *sorted(glob.glob(os.path.join(ARCHIVE_DIR, "*.md")))]
    found = []
    for page in pages:
        try:
            with open(page, encoding="utf-8") as handle:
                if name in handle.read():
                    found.append(os.path.relpath(page, REPO))
        except OSError:
            continue
    return found


def resolve(
    parser: argparse.ArgumentParser, args: argparse.Namespace, *, benchmark: str, tag: str, files: dict
) -> None:
    """Sets each output argument in `files` (name -> suffix) from 'auto' to its default path, in place.

    Raises (through `parser.error`) when an explicit path names an existing file that a results page cites.
    """
    stamp = utc_stamp()
    for name, suffix in files.items():
        value = getattr(args, name)
        if value == AUTO:
            setattr(args, name, default_path(benchmark, tag, suffix, stamp=stamp))
        elif value and os.path.exists(value):
            pages = citing_pages(value)
            if pages:
                parser.error(
                    f"--{name.replace('_', '-')}: {value} is cited by {', '.join(pages)}; a run must not overwrite "
                    f"another run's files. Leave --{name.replace('_', '-')} at 'auto' or name a new file."
                )


def shown_path(path: str) -> str:
    """Repository-relative when inside the repository, absolute otherwise."""
    relative = os.path.relpath(os.path.abspath(path), REPO)
    return os.path.abspath(path) if relative.startswith(os.pardir) else relative


def demote_headings(section: str) -> str:
    """One more '#' on every Markdown heading outside code fences."""
    lines, fenced = [], False
    for line in section.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        lines.append("#" + line if not fenced and re.match(r"#{1,5} ", line) else line)
    return "\n".join(lines)


def append_section(path: str, section: str, *, files=()) -> None:
    """Appends `section` under NEW_HEADING at the end of the page `path`, naming the `files` it does not cite.

    Args:
      path: the results page (created with the page header when missing); `RESULTS_MD` itself is rewritten
        from the JSON files (`benchmarks.results_page`) instead.
      section: the run's Markdown section, starting with its `## ` heading.
      files: paths the run wrote ('' / None are skipped); those the section does not name are listed after it.
    """
    if os.path.abspath(path) == os.path.abspath(RESULTS_MD):
        from benchmarks import results_page

        results_page.main(["--results-dir", RESULTS_DIR, "--out", RESULTS_MD])
        print("RESULTS.md is generated from the JSON files: rewritten with `make results` instead of appending.")
        return
    text = ""
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    parts = [] if text.strip() else [PAGE_HEADER]
    if NEW_HEADING not in text:
        parts.append(f"{NEW_HEADING}\n\n{NEW_INTRO}\n")
    body = demote_headings(section.strip("\n"))
    unnamed = [shown_path(f) for f in files if f and os.path.basename(f) not in body]
    if unnamed:
        body += "\n\nFiles written by this run: " + ", ".join(f"`{f}`" for f in unnamed) + "."
    parts.append(body + "\n")
    separator = "" if not text or text.endswith("\n\n") else ("\n" if text.endswith("\n") else "\n\n")
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(separator + "\n".join(parts))


def write_run(args, payload: dict, *, plot, section) -> None:
    """Writes a run's JSON (`args.json`), plot (`args.png`) and results section (`args.results_md`), each if set.

    Args:
      args: the parsed flags; '' / None for `json`, `png` or `results_md` skips that output.
      payload: the JSON document (values JSON cannot hold are written as `str`).
      plot: `plot(path)` draws the PNG.
      section: `section(png=..., json_path=...)` returns the Markdown section, given the files' shown paths
        ("not written" where skipped).
    """
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(payload, handle, indent=2, default=str)
    if args.png:
        plot(args.png)
    if args.results_md:
        text = section(
            png=shown_path(args.png) if args.png else "not written",
            json_path=shown_path(args.json) if args.json else "not written",
        )
        append_section(args.results_md, text, files=(args.json, args.png))
