"""benchmarks/dpformer_table2 drives pipelines.sequential with flags it accepts (no training here)."""

from __future__ import annotations

import argparse

import pytest

from benchmarks import dpformer_table2
from pipelines import sequential


def _args(tmp_path, **overrides):
    data = tmp_path / "s.txt"
    data.write_text("1 1\n")
    a = dict(
        data=str(data),
        epochs=1,
        batch=8,
        max_len=5,
        lr=1e-3,
        dropout=0.0,
        delta=None,
        seed=0,
        popularity_prior=True,
        head_items=4,
        frequencies_file=None,
        frequency_epsilon_share=None,
    )
    a.update(overrides)
    return argparse.Namespace(**a)


def _config(a, eps):
    return sequential.parse_args(dpformer_table2._pipeline_args(a, "dpformer", eps, "out"))


def test_default_is_the_dp_frequency_release(tmp_path):
    config = _config(_args(tmp_path), 8.0)
    assert config.frequencies == "private" and config.frequencies_file is None
    assert config.frequency_epsilon_share is None and config.popularity_prior and config.head_items == 4
    # The section states each run's source as its report records it (a DP release here).
    words = dpformer_table2.frequency_words([{"item_frequencies": "dp_gaussian z=30, eps 0.8 (10%)"}])
    assert "dp_gaussian" in words and "NOT a valid DP result" not in words
    shared = _config(_args(tmp_path, frequency_epsilon_share=0.2), 8.0)
    assert shared.frequency_epsilon_share == 0.2
    assert _config(_args(tmp_path, frequency_epsilon_share=0.2), float("inf")).frequency_epsilon_share is None


def test_public_file_is_passed_as_public(tmp_path):
    path = tmp_path / "freq.txt"
    path.write_text("1 0.5\n")
    config = _config(_args(tmp_path, frequencies_file=str(path)), 5.0)
    assert config.frequencies == "public" and config.frequencies_file == str(path)
    assert "privacy assumption" in dpformer_table2.frequency_words([{"item_frequencies": "public (file)"}])


@pytest.mark.parametrize(
    "info, expected",
    [
        (
            {
                "source": "private-gaussian",
                "noise_multiplier": 4.231,
                "dp_event": "GaussianDpEvent(4.231)",
                "release_epsilon": 0.8,
                "epsilon_share": 0.1,
            },
            "private-gaussian z=4.23, eps 0.8 (10%)",
        ),
        ({"source": "public-file", "dp_event": None}, "public-file"),
    ],
)
def test_row_states_the_frequencies(info, expected):
    assert dpformer_table2._frequencies({"extra": {"item_frequencies": info}}) == expected
