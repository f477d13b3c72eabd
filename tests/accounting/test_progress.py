"""Slow accounting work says so (tfdp_embed/accounting/progress.py), as a user running a calibration sees it."""

from __future__ import annotations

import time

import pytest

from tfdp_embed.accounting import calibrate_noise_multiplier, progress
from tfdp_embed.accounting import calibration as calibration_module


def test_slow_work_is_announced_then_its_result_and_time(monkeypatch, capsys):
    monkeypatch.setattr(progress, "ANNOUNCE_AFTER_SECONDS", 0.05)
    with progress.announced("searching") as note:
        time.sleep(0.3)
        note.result = "found 42"
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "tfdp_embed: searching ..."
    assert lines[1].startswith("tfdp_embed: found 42 (") and lines[1].endswith(" s)")


def test_fast_work_and_nested_work_stay_quiet(monkeypatch, capsys):
    monkeypatch.setattr(progress, "ANNOUNCE_AFTER_SECONDS", 0.05)
    with progress.announced("fast") as note:
        note.result = "done"
    assert capsys.readouterr().err == ""
    with progress.announced("outer") as outer:
        with progress.announced("inner") as inner:
            time.sleep(0.3)
            inner.result = "inner done"
        outer.result = "outer done"
    err = capsys.readouterr().err
    assert "outer ..." in err and "outer done" in err and "inner" not in err


def test_silenced(monkeypatch, capsys):
    monkeypatch.setattr(progress, "ANNOUNCE_AFTER_SECONDS", None)
    with progress.announced("slow") as note:
        time.sleep(0.1)
        note.result = "done"
    assert capsys.readouterr().err == ""


def test_a_slow_calibration_says_what_it_calibrates_and_the_result(monkeypatch, capsys):
    monkeypatch.setattr(progress, "ANNOUNCE_AFTER_SECONDS", 0.01)
    calibration_module._entries_epsilon.cache_clear()
    sigma = calibrate_noise_multiplier(
        target_epsilon=3.0, target_delta=1e-5, sampling_probability=0.01, steps=100, value_discretization_interval=1e-3
    )
    err = capsys.readouterr().err
    assert (
        "tfdp_embed: calibrating the noise multiplier for epsilon=3 at delta=1e-05 (q=0.01, 100 steps, PLD) ..." in err
    )
    assert f"tfdp_embed: noise multiplier {sigma:.6g} for epsilon=3" in err


def test_an_error_inside_prints_no_result(monkeypatch, capsys):
    monkeypatch.setattr(progress, "ANNOUNCE_AFTER_SECONDS", 0.01)
    with pytest.raises(ValueError, match="boom"):
        with progress.announced("failing") as note:
            time.sleep(0.1)
            note.result = "never"
            raise ValueError("boom")
    assert "never" not in capsys.readouterr().err
