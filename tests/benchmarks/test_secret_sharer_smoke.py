"""Smoke test of `python -m benchmarks.secret_sharer` on a tiny generated u.data (no real data needed).

It runs the script in-process at toy sizes (2 runs, 1 epoch, 36 steps each) and checks the
JSON, the Markdown section and both plots; it never touches benchmarks/RESULTS.md or
benchmarks/secret_sharer*.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from benchmarks import secret_sharer


def write_ratings(path, *, users=30, items=60, per_user=25, seed=0):
    """MovieLens u.data format: user<TAB>item<TAB>rating<TAB>timestamp, distinct items per user."""
    rng = np.random.default_rng(seed)
    lines = []
    for user in range(1, users + 1):
        for position, item in enumerate(rng.choice(np.arange(1, items + 1), size=per_user, replace=False)):
            lines.append(f"{user}\t{item}\t{rng.integers(1, 6)}\t{880_000_000 + 1000 * user + position}")
    path.write_text("\n".join(lines) + "\n")


def test_secret_sharer_smoke(tmp_path):
    data = tmp_path / "u.data"
    write_ratings(data)
    out = {name: tmp_path / name for name in ("ss.json", "RESULTS.md", "exposure.png", "precision.png")}
    argv = [
        "--data",
        str(data),
        "--mechanisms",
        "none,eana",
        "--noise-multipliers",
        "0.01",
        "--epsilon",
        "0",
        "--epochs",
        "1",
        "--batch-size",
        "16",
        "--insertion-counts",
        "1,5",
        "--canaries-per-count",
        "2",
        "--num-candidates",
        "64",
        "--num-controls",
        "8",
        "--json",
        str(out["ss.json"]),
        "--results-md",
        str(out["RESULTS.md"]),
        "--png-exposure",
        str(out["exposure.png"]),
        "--png-precision",
        str(out["precision.png"]),
    ]
    assert secret_sharer.main(argv) == 0

    document = json.loads(out["ss.json"].read_text())
    assert document["command"].startswith("python -m benchmarks.secret_sharer --data")
    for key in ("nproc", "memory_total_gb", "cpu_model", "date_utc", "versions", "load_average_at_start"):
        assert key in document["machine"], key
    assert [r["setting"] for r in document["runs"]] == ["none", "eana z=0.01"]
    ceiling, floor = math.log2(64), math.log2(64 / 65)
    for run in document["runs"]:
        assert set(run["exposure"]["by_insertion_count"]) == {"1", "5"}
        for row in run["exposure"]["by_insertion_count"].values():
            assert row["num_canaries"] == 2
            assert floor - 1e-9 <= row["min_exposure"] <= row["max_exposure"] <= ceiling + 1e-9
        assert all(0.0 <= run["precision"][k] <= 1.0 for k in ("1", "5", "10", "20"))
        assert run["control"]["num_sequences"] == 8
    eana = document["runs"][1]
    assert eana["epsilon"] is None and eana["eana_bound"]["is_dp"] is False
    # the canaries in the JSON are the ones the seed gives
    assert document["canaries"]["insertion_counts"] == [1, 1, 5, 5]
    assert document["canaries"]["num_inserted_examples"] == 12

    page = out["RESULTS.md"].read_text()
    assert "\n## New measurements (not yet folded in)\n" in page
    section = page.split("\n### secret_sharer — ", 1)[1]
    assert "| none | — | no privacy |" in section and "| eana z=0.01 |" in section
    assert "EANA's data-dependent bound" in section and "What these numbers can and cannot show" in section
    assert out["exposure.png"].stat().st_size > 10_000 and out["precision.png"].stat().st_size > 5_000

    # re-rendering from the JSON (no training) reproduces the tables and adds the notes
    again = tmp_path / "again.md"
    rerender = [
        "--from-json",
        str(out["ss.json"]),
        "--json",
        "",
        "--results-md",
        str(again),
        "--png-exposure",
        "",
        "--png-precision",
        "",
        "--note",
        "a reading",
    ]
    assert secret_sharer.main(rerender) == 0
    rendered = again.read_text()
    assert "- a reading" in rendered
    assert (
        rendered.split("Utility and privacy")[1].split("Plots:")[0]
        == section.split("Utility and privacy")[1].split("Plots:")[0]
    )


@pytest.mark.parametrize(
    "flags, match",
    [
        (["--mechanisms", "none,fest"], "unknown"),
        (["--canaries-per-count", "0"], "canaries-per-count"),
        (["--data", "/nonexistent/u.data"], "does not exist"),
    ],
)
def test_bad_flags_exit_with_a_message(flags, match, capsys):
    with pytest.raises(SystemExit) as exit_info:
        secret_sharer.parse_args(flags)
    assert exit_info.value.code == 2
    assert match in capsys.readouterr().err
