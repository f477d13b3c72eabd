"""benchmarks/calibration_time.py: the cases are the README's and the Criteo pipeline's; the section reads right."""

from __future__ import annotations

from benchmarks import calibration_time


def test_cases_use_q_and_t_as_their_code_computes_them():
    readme = calibration_time.case_settings("readme")
    assert readme["sampling_probability"] == 256 / 20_000 and readme["steps"] == round(20_000 / 256) == 78
    assert readme["target_delta"] == 1 / 20_000 and readme["mechanism"] == "lazy"
    criteo = calibration_time.case_settings("criteo")
    # pipelines.criteo: q = B / N, T = epochs x round(N / B), delta = 1 / N, 5% of epsilon for the output calibration.
    assert criteo["sampling_probability"] == 2_048 / 200_000 and criteo["steps"] == 2 * round(200_000 / 2_048) == 196
    assert criteo["target_delta"] == 1 / 200_000 and criteo["output_calibration_share"] == 0.05


def _run(seconds, holds=True):
    return {
        "case": "readme",
        "seconds": dict(zip(calibration_time.PHASES, seconds)),
        "noise_multiplier": 0.6286,
        "max_steps": 78,
        "final_epsilon": 2.9995,
        "exact_epsilon_at_max_steps": 2.9995,
        "exact_epsilon_at_max_steps_plus_1": 3.0087,
        "guarantee_holds": holds,
    }


def test_summary_takes_medians_and_any_violation_shows():
    row = calibration_time.summarise([_run((3.0, 2.0, 0.1)), _run((5.0, 1.0, 0.3), holds=False), _run((4.0, 3.0, 0.2))])
    assert row["seconds"]["plan"] == {"median_s": 4.0, "min_s": 3.0, "max_s": 5.0}
    assert row["seconds"]["budget"]["median_s"] == 2.0 and row["guarantee_holds"] is False
    machine = {
        "date_utc": "2026-11-26T00:00:00Z",
        "cpu_model": "cpu",
        "nproc": 2,
        "memory_total_gb": 1,
        "gpus": [],
        "load_average_at_start": [1.0],
        "load_average_at_end": [1.0],
        "git": {"commit": "0" * 40, "uncommitted_library_files": []},
        "versions": {"python": "3", "tensorflow": "2", "dp-accounting": "0"},
    }
    document = {
        "command": "c",
        "settings": {"repeats": 3},
        "baseline": None,
        "machine": machine,
        "rows": [{"checkout": "this", **row}],
    }
    table_row = calibration_time.markdown_section(document).splitlines()[-1]
    assert table_row.startswith("| readme | this | 0.628600 | 4.00 s (3.00–5.00) | 2.00 s (1.00–3.00) |")
    assert table_row.endswith("| 78 | 2.99950 / 3.00870 | VIOLATED |")
