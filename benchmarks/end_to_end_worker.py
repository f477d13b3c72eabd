"""One Criteo pipeline run with its fixed costs timed stage by stage (a child of `benchmarks.end_to_end`).

    python -m benchmarks.end_to_end_worker TIMINGS.json -- <python -m pipelines.criteo flags>

Runs `pipelines.criteo.cli.main` in this process after wrapping the
pipeline's stage functions and the library calls inside them with timers
(the wrappers only add up wall time; nothing else changes), then writes
`TIMINGS.json`: seconds per stage, the step durations Keras' callbacks saw,
and how many times each of the library's `tf.function`s was traced.
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
import time
from collections import defaultdict

SECONDS: dict = defaultdict(float)
CALLS: dict = defaultdict(int)
MARKS: dict = {}


def _wrap(owner, name: str, key: str) -> None:
    """Replaces `owner.name` by a wrapper adding its wall time to SECONDS[key] (outermost call only)."""
    original = getattr(owner, name)
    depth = {"n": 0}

    @functools.wraps(original)
    def timed(*args, **kwargs):
        depth["n"] += 1
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            depth["n"] -= 1
            if depth["n"] == 0:
                SECONDS[key] += time.perf_counter() - started
                CALLS[key] += 1

    setattr(owner, name, timed)


def _mark_first_step(step_timer_class) -> None:
    """Records when the first training batch ends (the end of the first step, tracing included)."""
    original = step_timer_class.on_train_batch_end

    def on_train_batch_end(self, batch, logs=None):
        original(self, batch, logs)
        MARKS.setdefault("first_step_end", time.perf_counter())
        MARKS["durations"] = self.durations

    step_timer_class.on_train_batch_end = on_train_batch_end


def _mark_fit_start(dp_model_class) -> None:
    original = dp_model_class.fit

    def fit(self, *args, **kwargs):
        MARKS.setdefault("fit_start", time.perf_counter())
        try:
            return original(self, *args, **kwargs)
        finally:
            function = getattr(self, "train_function", None)
            if hasattr(function, "experimental_get_tracing_count"):
                MARKS["train_function_traces"] = function.experimental_get_tracing_count()

    dp_model_class.fit = fit


def install() -> dict:
    """Wraps the stages and library calls; returns the module objects the report reads back."""
    from pipelines import step_timer
    from pipelines.criteo import calibration, evaluation, pipeline
    from pipelines.criteo import data as criteo_data
    from pipelines.criteo import privacy as criteo_privacy
    from tfdp_embed.keras2 import export, training
    from tfdp_embed.keras2.callbacks import PrivacyBudget

    for stage in ("_read", "_plan", "_build", "_train", "_release", "_report"):
        _wrap(pipeline, stage, stage.lstrip("_"))
    _wrap(criteo_data, "write_default_data", "read.write_synthetic_data")
    _wrap(criteo_data, "bucket_counts", "plan.bucket_counts")
    _wrap(criteo_privacy, "plan", "plan.noise_calibration")
    _wrap(training.DPModel, "fit", "train.fit")
    _wrap(training.DPModel, "prepare", "train.fit.prepare")
    _wrap(training.DPModel, "_check_contract", "train.fit.contract_check")
    _wrap(PrivacyBudget, "on_train_begin", "train.fit.budget_on_train_begin")
    _wrap(PrivacyBudget, "on_epoch_end", "train.fit.budget_on_epoch_end")
    _wrap(PrivacyBudget, "on_train_end", "train.fit.budget_on_train_end")
    _wrap(pipeline, "release_ready", "release.flush")
    _wrap(export, "release_ready", "release.export.flush_again")
    _wrap(pipeline, "_calibrate", "release.output_calibration")
    _wrap(calibration, "calibrate_output", "release.output_calibration.histogram")
    _wrap(pipeline, "_privacy", "release.privacy_report")
    _wrap(pipeline, "export_saved_model", "release.export")
    _wrap(evaluation, "evaluate", "release.evaluate")
    _mark_first_step(step_timer.StepTimer)
    _mark_fit_start(training.DPModel)
    return {"step_timer": step_timer}


def _traces() -> dict:
    """Traces of the library's flush and catch-up functions (LazyDP; each serves every table)."""
    from tfdp_embed.mechanisms.lazy import traced as lazy_traced

    found = {}
    for functions in list(lazy_traced._TRACED.values()):  # noqa: SLF001
        for name, function in functions.items():
            traced = getattr(function, "traced", function)
            found[f"lazy_{name}"] = found.get(f"lazy_{name}", 0) + traced.experimental_get_tracing_count()
    return found


def main(argv: list[str]) -> int:
    timings_path, rest = argv[0], argv[argv.index("--") + 1 :]
    started = time.perf_counter()
    install()
    from pipelines.criteo import cli

    imported = time.perf_counter()
    status = cli.main(rest)
    finished = time.perf_counter()
    first_step = None
    if "first_step_end" in MARKS and "fit_start" in MARKS:
        first_step = MARKS["first_step_end"] - MARKS["fit_start"]
    durations = MARKS.get("durations", [])
    result = {
        "status": status,
        "steps": len(durations),
        "first_step_s": durations[0] if durations else None,
        "later_steps_s": sum(durations[1:]),
        "median_step_s": statistics.median(durations[3:]) if len(durations) > 3 else None,
        "train_function_traces": MARKS.get("train_function_traces"),
        "import_s": imported - started,
        "run_s": finished - imported,
        "fit_start_to_first_step_s": first_step,
        "seconds": dict(SECONDS),
        "calls": dict(CALLS),
        "traces": _traces(),
    }
    with open(timings_path, "w") as handle:
        json.dump(result, handle, indent=2)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
