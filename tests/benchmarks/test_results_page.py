"""benchmarks/RESULTS.md and its archive: links resolve, files are cited, no plot is shared between sections."""

from __future__ import annotations

import os
import re

from benchmarks import outputs

LINK = re.compile(r"\]\(([^)#\s]+)\)")


def _links(page: str) -> list[str]:
    with open(page, encoding="utf-8") as handle:
        text = handle.read()
    return [target for target in LINK.findall(text) if "://" not in target]


def _pages() -> list[str]:
    archive = [os.path.join(outputs.ARCHIVE_DIR, n) for n in os.listdir(outputs.ARCHIVE_DIR) if n.endswith(".md")]
    return [outputs.RESULTS_MD, *sorted(archive)]


def test_every_link_of_the_page_and_the_archive_resolves():
    for page in _pages():
        for target in _links(page):
            path = os.path.normpath(os.path.join(os.path.dirname(page), target))
            assert os.path.exists(path), f"{os.path.relpath(page, outputs.REPO)} links a missing {target}"


def test_results_holds_only_what_the_page_cites_and_archive_only_what_the_archive_cites():
    with open(outputs.RESULTS_MD, encoding="utf-8") as handle:
        page = handle.read()  # links, or the backticked paths of appended "New measurements" sections
    for name in sorted(os.listdir(outputs.RESULTS_DIR)):
        run = re.sub(r"(-exposure|-precision)?\.png$", ".json", name)
        assert name in page or run in page, f"results/{name} is cited by RESULTS.md neither itself nor by its run"
    archived = {os.path.basename(t) for page in _pages()[1:] for t in _links(page)}
    for name in sorted(os.listdir(outputs.ARCHIVE_DIR)):
        if not name.endswith(".md"):
            assert name in archived, f"archive/{name} is not cited by the archived notebook"


def test_each_section_of_the_page_cites_its_own_plot():
    with open(outputs.RESULTS_MD, encoding="utf-8") as handle:
        sections = re.split(r"\n## ", handle.read())
    owners: dict = {}
    for section in sections:
        for target in LINK.findall(section):
            if target.endswith(".png"):
                owners.setdefault(os.path.basename(target), set()).add(section.splitlines()[0])
    shared = {png: titles for png, titles in owners.items() if len(titles) > 1}
    assert owners and not shared, shared
