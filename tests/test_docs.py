"""The README is a front page: at most 150 lines, and every relative link in it points at a file that exists.

The documentation site itself is checked by `make docs` (mkdocs build --strict); this test needs no mkdocs.
"""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 150


def _relative_links(text: str) -> list[str]:
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def test_readme_is_short():
    lines = README.read_text().count("\n")
    assert lines <= MAX_LINES, (
        f"README.md has {lines} lines; the front page keeps at most {MAX_LINES}: move the rest to docs/"
    )


def test_readme_relative_links_exist():
    links = _relative_links(README.read_text())
    assert links, "README.md links to no page of docs/"
    missing = [t for t in links if not (ROOT / t.split("#")[0]).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_link_parser_finds_relative_links_only():
    text = "[a](docs/x.md) [b](https://example.org) [c](#anchor) [d](benchmarks/RESULTS.md#step-time)"
    assert _relative_links(text) == ["docs/x.md", "benchmarks/RESULTS.md#step-time"]


def test_docs_pages_named_in_mkdocs_nav_exist():
    nav = re.findall(r":\s*([\w/.-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert nav, "mkdocs.yml names no page"
    missing = [p for p in nav if not (ROOT / "docs" / p).exists()]
    assert not missing, f"mkdocs.yml's nav names pages that docs/ lacks: {missing}"
