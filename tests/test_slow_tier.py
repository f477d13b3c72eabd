"""Every entry of the slow tier (tests/slow_tier.py) still names a test, and the tier leaves each test module a case."""

from __future__ import annotations

import pathlib
import re

from slow_tier import SLOW

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _names(pattern: str) -> tuple[pathlib.Path, str]:
    path, _, test = pattern.partition("::")
    return ROOT / path, re.split(r"[\[*]", test, maxsplit=1)[0]


def test_each_entry_names_a_test_module_and_function():
    for pattern in SLOW:
        path, name = _names(pattern)
        assert path.is_file(), f"slow_tier.py: {pattern!r} names no file"
        if name:
            assert f"def {name}" in path.read_text(), f"slow_tier.py: {pattern!r}: {path.name} defines no {name}"


def test_a_whole_module_in_the_tier_is_one_the_default_run_can_spare():
    whole = sorted(_names(p)[0].relative_to(ROOT).as_posix() for p in SLOW if p.endswith("::*"))
    assert whole == [
        "tests/colab/test_keras3_two_tower_notebook.py",
        "tests/distributed/test_adafest_mirrored.py",
        "tests/distributed/test_checkpoint_distributed.py",
        "tests/distributed/test_multi_worker.py",
        "tests/distributed/test_parameter_server.py",
        "tests/examples/test_keras3_two_tower.py",
        "tests/pipelines/test_full_filesystem.py",
        "tests/pipelines/test_signals_each_stage.py",
    ]
