"""benchmarks/RESULTS.md is what `make results` writes from benchmarks/results/*.json, short and portable."""

from __future__ import annotations

import json
import os
import re

from benchmarks import outputs, results_page

LINK = re.compile(r"\]\(([^)#\s]+)\)")
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|tmp|root|home)/")


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def _archive_pages() -> list[str]:
    return sorted(os.path.join(outputs.ARCHIVE_DIR, n) for n in os.listdir(outputs.ARCHIVE_DIR) if n.endswith(".md"))


def _local_links(text: str) -> list[str]:
    return [target for target in LINK.findall(text) if "://" not in target]


def test_the_page_is_what_make_results_writes():
    assert _read(outputs.RESULTS_MD) == results_page.render(), (
        "benchmarks/RESULTS.md differs from what the JSON files under benchmarks/results/ give "
        "(a hand edit, or a new run's JSON): run `make results` and commit the page"
    )


def test_the_page_is_short_and_names_no_machine_path():
    text = _read(outputs.RESULTS_MD)
    assert text.count("\n") <= 600, f"RESULTS.md has {text.count(chr(10))} lines (at most 600)"
    found = [line for line in text.splitlines() if MACHINE_PATH.search(line)]
    assert not found, f"machine paths on the page: {found[:3]}"


def test_every_link_of_the_page_resolves_and_every_plot_exists():
    page_dir = os.path.dirname(outputs.RESULTS_MD)
    targets = _local_links(_read(outputs.RESULTS_MD))
    assert any(t.endswith(".png") for t in targets)
    for target in targets:
        assert os.path.exists(os.path.join(page_dir, target)), f"RESULTS.md links a missing {target}"


def test_every_link_of_the_archive_resolves():
    for page in _archive_pages():
        for target in _local_links(_read(page)):
            # Pages moved verbatim from benchmarks/ keep links relative to benchmarks/.
            bases = (os.path.dirname(page), os.path.dirname(outputs.ARCHIVE_DIR))
            assert any(os.path.exists(os.path.normpath(os.path.join(b, target))) for b in bases), (
                f"{os.path.relpath(page, outputs.REPO)} links a missing {target}"
            )


def test_every_result_file_is_a_run_the_page_reads_or_a_plot_a_page_cites():
    texts = [_read(outputs.RESULTS_MD), *(_read(p) for p in _archive_pages())]
    names = set(os.listdir(outputs.RESULTS_DIR))
    for name in sorted(names):
        run = re.sub(r"(-exposure|-precision)?\.png$", ".json", name)
        assert name.endswith(".json") or run in names or any(name in t for t in texts), (
            f"results/{name} is neither a run's JSON, nor a plot beside one, nor cited by a results page"
        )
    archived = {os.path.basename(t) for page in _archive_pages() for t in _local_links(_read(page))}
    for name in sorted(os.listdir(outputs.ARCHIVE_DIR)):
        if not name.endswith(".md"):
            assert name in archived, f"archive/{name} is not cited by an archived page"


def _write(path, doc) -> None:
    path.write_text(json.dumps(doc))


def test_a_synthetic_results_folder_gives_its_sections(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    machine = {
        "date_utc": "2099-01-02T03:04:05Z",
        "cpu_model": "Test CPU",
        "nproc": 4,
        "memory_total_gb": 8.0,
        "gpus": [],
        "git": {"commit": "0123456789abcdef0123"},
    }
    # 1,000 rows: DP save 0.3 s vs plain 0.2 s (1.50×), restore 0.4 s vs plain 0.1 s (4.00×).
    row = {"vocab": 1000, "save": {"median_s": 0.3}, "plain_write": {"median_s": 0.2}}
    row |= {"restore": {"median_s": 0.4}, "plain_read": {"median_s": 0.1}}
    command = "python -m benchmarks.checkpoint_time --tmp /tmp/ck/run --data /work/shared/data/x"
    _write(results / "checkpoint_time-20990102T030405Z.json", {"command": command, "machine": machine, "rows": [row]})
    (results / "checkpoint_time-20990102T030405Z.png").write_bytes(b"png")
    _write(results / "new_bench-eps1-20990103T000000Z.json", {"command": "python -m benchmarks.new_bench"})

    text = results_page.render(str(results), str(tmp_path / "RESULTS.md"))

    checkpoints = text.split("## Checkpoints\n", 1)[1].split("\n## ", 1)[0]
    assert "| 1,000 | 0.300 s | 1.50× | 0.400 s | 4.00× |" in checkpoints
    assert "[plot](results/checkpoint_time-20990102T030405Z.png)" in checkpoints
    assert "2099-01-02T03:04:05Z" in checkpoints and "commit `0123456789ab`" in checkpoints
    assert "Machine: Test CPU, nproc 4, 8.0 GiB RAM, GPU: none." in checkpoints
    assert "--tmp WORKDIR/run --data ../shared/data/x`" in checkpoints
    other = text.split("## Other benchmarks\n", 1)[1]
    assert "### new_bench" in other and "2099-01-03T00:00:00Z" in other and "no plot" in other
    assert "commit not recorded" in other and "Machine: not recorded" in other
    assert "## Step time" not in text  # no run, no section


def test_check_fails_on_a_stale_page_and_a_benchmark_run_rewrites_the_page(tmp_path, monkeypatch, capsys):
    results, page = tmp_path / "results", tmp_path / "RESULTS.md"
    results.mkdir()
    _write(results / "x_bench-20990101T000000Z.json", {"command": "python -m benchmarks.x_bench"})
    page.write_text("# hand-written\n")
    assert results_page.main(["--results-dir", str(results), "--out", str(page), "--check"]) == 1
    assert "run `make results`" in capsys.readouterr().err

    monkeypatch.setattr(outputs, "RESULTS_DIR", str(results))
    monkeypatch.setattr(outputs, "RESULTS_MD", str(page))
    outputs.append_section(str(page), "## x_bench — by hand\n\nprose\n")
    assert page.read_text() == results_page.render(str(results), str(page))
    assert results_page.main(["--results-dir", str(results), "--out", str(page), "--check"]) == 0


def test_commands_lose_machine_paths_and_long_notes():
    command = (
        "python -m benchmarks.step_time --json /work/wt/after/benchmarks/results/a.json --out /root/x/y "
        "--data /work/main/data/f.txt --note 'a long note that '\"'\"'quotes'\"'\"' itself'"
    )
    assert results_page.clean_command(command) == (
        "python -m benchmarks.step_time --json benchmarks/results/a.json --out WORKDIR/y --data data/f.txt --note '…'"
    )
