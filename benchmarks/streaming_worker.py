"""One measurement of `benchmarks.streaming` in a fresh process: one DP epoch of one method over one file.

    python -m benchmarks.streaming_worker SPEC.json OUT.json

Runs a warm-up epoch of the method on the warm-up file, then resets the
process's peak RSS (VmHWM, Linux `clear_refs`) and times one epoch of the
measured file: wall seconds, process CPU seconds (user + system, all
threads), the RSS before the epoch and the peak during it. Prints a
progress line every `progress_s` seconds of a long epoch. The parent adds
the process's lifetime peak RSS (`ru_maxrss` from `wait4`).
"""

from __future__ import annotations

import json
import resource
import sys
import threading
import time

from benchmarks import machine

READ_BATCH = 8192


def build(method: str, path: str, rows: int, *, batch: int, buffer_rows: int, spill_dir: str, seed: int):
    """`(dataset, info, read_stats)` of one epoch of `method` over `path` (info None for the plain read)."""
    from tfdp_embed.data import CriteoReadStats, criteo_dataset, one_pass_poisson_batches, streaming_poisson_batches

    read = CriteoReadStats()
    source = criteo_dataset([path], batch_size=READ_BATCH, stats=read)
    q = batch / rows
    if method == "one_pass":
        dataset, info = one_pass_poisson_batches(
            source,
            sampling_probability=q,
            num_examples=rows,
            seed=seed,
            spill_dir=spill_dir,
            bucket_rows=buffer_rows,
            source_batched=True,
        )
        return dataset, info, read
    if method == "multi_pass":
        dataset, info = streaming_poisson_batches(
            source,
            sampling_probability=q,
            num_examples=rows,
            batches_per_pass=max(1, buffer_rows // batch),
            seed=seed,
            source_batched=True,
        )
        return dataset, info, read
    return source, None, read


def file_reads(method: str, rows: int, *, batch: int, buffer_rows: int) -> int:
    """Reads of the file per epoch: 1, or ceil(round(N / B) / G) for the multi-pass streamer."""
    if method != "multi_pass":
        return 1
    batches = max(1, round(rows / batch))
    return -(-batches // min(max(1, buffer_rows // batch), batches))


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _progress(stop: threading.Event, label: str, every: float, read, counted: dict, info, expected: int) -> None:
    """Prints what the epoch has done so far every `every` seconds until `stop` is set."""
    start = time.perf_counter()
    while not stop.wait(every):
        line = f"  [{label}] {time.perf_counter() - start:,.0f} s: parsed {read.rows:,} of {expected:,} rows"
        spill = getattr(info, "spill", None)
        if spill is not None:
            line += f", spilled {spill.bytes_written / 2**20:,.0f} MiB"
        print(line + f", {counted['batches']:,} batches out", flush=True)


def epoch(method: str, path: str, rows: int, *, progress_s: float = 0.0, label: str = "", **common) -> dict:
    """One timed epoch of `method`: seconds, CPU seconds, batches, sampled rows, spill facts."""
    dataset, info, read = build(method, path, rows, **common)
    counted = {"batches": 0, "rows": 0}
    stop = threading.Event()
    if progress_s > 0:
        expected = rows * file_reads(method, rows, batch=common["batch"], buffer_rows=common["buffer_rows"])
        args = (stop, label or method, progress_s, read, counted, info, expected)
        threading.Thread(target=_progress, args=args, daemon=True).start()
    cpu, started = _cpu_seconds(), time.perf_counter()
    try:
        for _, labels in dataset:
            counted["rows"] += int(labels.shape[0])
            counted["batches"] += 1
    finally:
        stop.set()
    seconds, cpu = time.perf_counter() - started, _cpu_seconds() - cpu
    spill = getattr(info, "spill", None)
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "rows_per_s": rows / seconds,
        "batches": counted["batches"],
        "sampled_rows": counted["rows"],
        "passes": file_reads(method, rows, batch=common["batch"], buffer_rows=common["buffer_rows"]),
        "spill_bytes": spill.bytes_written if spill is not None else 0,
        "largest_bucket_records": spill.largest_bucket_records if spill is not None else None,
    }


def main(argv: list[str]) -> int:
    spec_path, out_path = argv
    with open(spec_path, encoding="utf-8") as handle:
        spec = json.load(handle)
    common = {key: spec[key] for key in ("batch", "buffer_rows", "spill_dir", "seed")}
    epoch(spec["method"], spec["warmup_path"], spec["warmup_rows"], **common)
    rss_before = machine.status_kb("VmRSS") * 1024
    reset = machine.reset_peak_rss()
    result = epoch(
        spec["method"], spec["path"], spec["rows"], progress_s=spec["progress_s"], label=spec["label"], **common
    )
    result["rss_before_bytes"] = rss_before
    result["epoch_peak_rss_bytes"] = machine.status_kb("VmHWM") * 1024
    result["epoch_peak_was_reset"] = reset  # False: the peak also covers imports and the warm-up (an upper bound)
    with open(out_path, "w", encoding="utf-8") as handle:
        json.dump(result, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
