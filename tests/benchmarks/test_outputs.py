"""benchmarks/outputs.py: every run writes new files, and its section lands under "New measurements"."""

from __future__ import annotations

import argparse
import datetime

import pytest

from benchmarks import outputs, step_time


@pytest.fixture
def results_dir(tmp_path, monkeypatch):
    """Redirects benchmarks/results/ and the cited pages to a temporary tree."""
    monkeypatch.setattr(outputs, "RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.setattr(outputs, "RESULTS_MD", str(tmp_path / "RESULTS.md"))
    monkeypatch.setattr(outputs, "ARCHIVE_DIR", str(tmp_path / "archive"))
    (tmp_path / "results").mkdir()
    (tmp_path / "archive").mkdir()
    return tmp_path


def test_tags_name_the_main_settings():
    assert outputs.short_number(100_000) == "1e5"
    assert outputs.short_number(50_000_000) == "5e7"
    assert outputs.short_number(24_000) == "2.4e4"
    assert outputs.short_number(512) == "512"
    assert outputs.short_number(0.1) == "0.1"
    assert outputs.range_tag([1_000_000, 100_000, 50_000_000]) == "1e5-5e7"
    assert outputs.range_tag([10_000_000]) == "1e7"
    when = datetime.datetime(2026, 11, 21, 21, 18, 54, tzinfo=datetime.UTC)
    assert outputs.utc_stamp(when) == "20261121T211854Z"


def test_default_paths_never_reuse_an_existing_file(results_dir):
    first = outputs.default_path("step_time", "uniform-1e5-5e7", ".json", stamp="20261121T211854Z")
    assert first == str(results_dir / "results" / "step_time-uniform-1e5-5e7-20261121T211854Z.json")
    open(first, "w").close()
    second = outputs.default_path("step_time", "uniform-1e5-5e7", ".json", stamp="20261121T211854Z")
    assert second == first.replace(".json", "-2.json")


def test_resolve_fills_auto_keeps_explicit_and_refuses_a_cited_file(results_dir):
    parser = argparse.ArgumentParser()
    args = argparse.Namespace(json=outputs.AUTO, png="", extra=str(results_dir / "mine.png"))
    outputs.resolve(parser, args, benchmark="b", tag="t", files={"json": ".json", "png": ".png", "extra": ".png"})
    assert args.json.startswith(str(results_dir / "results" / "b-t-")) and args.json.endswith("Z.json")
    assert args.png == "" and args.extra == str(results_dir / "mine.png")

    cited = results_dir / "results" / "step_time-20261121T211854Z.png"
    cited.write_bytes(b"png")
    (results_dir / "RESULTS.md").write_text("Plot: [x](results/step_time-20261121T211854Z.png)\n")
    with pytest.raises(SystemExit):
        outputs.resolve(parser, argparse.Namespace(png=str(cited)), benchmark="b", tag="t", files={"png": ".png"})
    uncited = results_dir / "results" / "other.png"
    uncited.write_bytes(b"png")
    outputs.resolve(parser, argparse.Namespace(png=str(uncited)), benchmark="b", tag="t", files={"png": ".png"})


def test_sections_go_under_new_measurements_one_level_down(tmp_path):
    page = tmp_path / "RESULTS.md"
    page.write_text("# Benchmark results\n\n## (a) Speed\n\ntext\n")
    outputs.append_section(
        str(page), "## step_time — t1\n\n- Command: `x`\n\n### detail\n", files=(str(tmp_path / "a.json"), "")
    )
    outputs.append_section(str(page), "## step_time — t2\n\nPlot: `b.png`.\n", files=(str(tmp_path / "b.png"),))
    text = page.read_text()
    assert text.count(outputs.NEW_HEADING) == 1
    assert text.index("## (a) Speed") < text.index(outputs.NEW_HEADING) < text.index("### step_time — t1")
    assert "#### detail" in text and "\n## step_time" not in text
    assert text.index("### step_time — t1") < text.index("### step_time — t2")
    assert "Files written by this run: `" + str(tmp_path / "a.json") + "`." in text  # outside the repository: absolute
    assert "Files written by this run" not in text.split("### step_time — t2")[1]  # b.png is named by the section


def test_a_new_page_gets_the_header(tmp_path):
    page = tmp_path / "new.md"
    outputs.append_section(str(page), "## x — t\n")
    assert page.read_text().startswith("# Benchmark results\n\nProtocol:")
    assert outputs.NEW_HEADING + "\n" in page.read_text() and "\n### x — t\n" in page.read_text()


def test_step_time_defaults_are_new_files_named_by_its_settings():
    args = step_time.parse_args(["--vocab", "100000,10000000", "--zipf", "1.1"])
    for path, suffix in ((args.json, ".json"), (args.png, ".png")):
        name = path.rsplit("/", 1)[1]
        assert path.startswith(outputs.RESULTS_DIR) and name.startswith("step_time-zipf1.1-1e5-1e7-")
        assert name.endswith("Z" + suffix)
    assert args.results_md == outputs.RESULTS_MD
