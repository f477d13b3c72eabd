"""Op-level profile of one mechanism's train step on the step_time reference workload.

    python -m benchmarks.step_time_profile --mechanism lazy --vocab 1000000 [--steps 40]

Traces `--steps` steps with the TensorFlow profiler and prints, per op type,
the time spent per step (summed over the op's executions, all threads) and
the executions per step, next to the same for the plain non-private step on
the same model. Also prints wall and process CPU time per step: on a shared
machine CPU time is the steadier of the two. This is the tool that decides
where a step's overhead goes; `benchmarks.step_time` measures the ratios.
Nothing is written to RESULTS.md.
"""

from __future__ import annotations

import argparse
import collections
import glob
import tempfile
import time
import types

import numpy as np

from benchmarks import step_time_worker as worker
from tfdp_embed.keras2._keras import keras, tf

_WRAPPERS = ("__inference", "Run", "Process", "Executor", "Record", "StartRegion", "StopRegion")


def _step_functions(name: str, spec: dict, batches: list) -> types.SimpleNamespace:
    """Plain and mechanism steps on ONE model: a 5e7 x 64 table (12.8 GB) exists once.

    Returns a namespace: `plain(i)`, `step(i)` (step i on batch i), `mechanism`,
    `plain_function` (the traced plain tf.function) and `table` (the variable).

    The plain step is `step_time_worker.plain_step` on the mechanism's model,
    traced with the read hooks removed (as the worker's in-process baseline).
    """
    from tfdp_embed.keras2.training import DPModel

    model = worker.build_model(vocab=spec["vocab"], dim=spec["dim"], dp_embedding=True, seed=0)
    counts = np.ones(spec["vocab"], np.int64) if name == "fest" else None
    mechanism = worker.make_mechanism(worker.registry_name(name), spec, counts)
    lookahead = name == worker.LAZY_LOOKAHEAD
    dp = DPModel(model, mechanism=mechanism, expected_batch_size=spec["batch"], lookahead=lookahead)
    dp.compile(
        optimizer=keras.optimizers.legacy.SGD(worker.LEARNING_RATE),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
    )
    dp.prepare()
    fn = tf.function(dp.train_step)

    def step(i):
        if lookahead:
            return fn(batches[i % len(batches)] + ({worker.TABLE_NAME: batches[(i + 1) % len(batches)][0]},))
        return fn(batches[i % len(batches)])

    plain = worker.plain_step(model)
    layers = [layer for layer in model.layers if hasattr(layer, "set_read_hook")]
    hooks = [layer.read_hook for layer in layers]
    for layer in layers:
        layer.set_read_hook(None)
    try:
        plain(*batches[0])  # traced without hooks; later calls reuse the trace
    finally:
        for layer, hook in zip(layers, hooks):
            layer.set_read_hook(hook)
    return types.SimpleNamespace(
        plain=lambda i: plain(*batches[i % len(batches)]),
        step=step,
        mechanism=mechanism,
        plain_function=plain,
        table=model.get_layer(worker.TABLE_NAME).embeddings,
    )


def untouched_rows_floor(spec: dict, batches: list, rows: int, steps: int, mechanism: str | None = None) -> dict:
    """Median step times of the plain step with and without writing `rows` untouched rows, interleaved.

    On one model, alternating step by step:
      plain            the plain non-private step (`step_time_worker.plain_step`);
      plain+write      the same step, then `rows` distinct random rows (sorted,
                       drawn beforehand: no sampling cost) get fresh fused
                       Gaussian noise (`sparse_rows.noised_values` on zeros, as
                       DP-AdaFEST's noise-only rows) scaled by -lr and added to
                       the table with one `scatter_add`;
      `mechanism`      optionally, that mechanism's DPModel step.
    plain+write - plain is what any mechanism pays to noise and write that
    many rows the batch did not touch (cold rows: TLB and cache misses in a
    large table): the floor of DP-AdaFEST's step when `rows` rows survive by
    noise alone.

    Returns:
      {step name: {"wall_s": median, "cpu_s": median process CPU}}.
    """
    from tfdp_embed.ops import sparse_rows

    steps_on_model = _step_functions(mechanism or "none", spec, batches)
    model_table, plain_traced = steps_on_model.table, steps_on_model.plain_function
    generator = tf.random.Generator.from_seed(1)
    rng = np.random.default_rng(1)
    row_sets = [
        tf.constant(np.sort(rng.choice(spec["vocab"], size=rows, replace=False)), tf.int64) for _ in range(steps + 5)
    ]

    @tf.function
    def write_step(ids, labels, drawn):
        loss = plain_traced(ids, labels)  # inlined: one call, as a mechanism's step
        noise = sparse_rows.noised_values(
            generator, tf.zeros([rows, spec["dim"]]), stddev=1.0, divisor=float(spec["batch"])
        )
        model_table.scatter_add(tf.IndexedSlices(-worker.LEARNING_RATE * noise, drawn))
        return loss

    fns = {"plain": steps_on_model.plain, "plain+write": lambda i: write_step(*batches[i % len(batches)], row_sets[i])}
    if mechanism:
        fns[mechanism] = steps_on_model.step
    for i in range(5):
        for fn in fns.values():
            _finish(fn(i))
    wall = {name: [] for name in fns}
    cpu = {name: [] for name in fns}
    for i in range(steps):
        for name, fn in fns.items():
            start, cpu_start = time.perf_counter(), time.process_time()
            _finish(fn(i))
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - cpu_start)
    return {name: {"wall_s": float(np.median(wall[name])), "cpu_s": float(np.median(cpu[name]))} for name in fns}


def _finish(result) -> None:
    for value in result.values() if isinstance(result, dict) else [result]:
        np.asarray(value)


def profile(step, steps: int) -> tuple:
    """(wall s/step, cpu s/step, {op type: (us/step, executions/step)})."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    for i in range(5):
        _finish(step(i))
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for i in range(steps):
        _finish(step(i))
    wall, cpu = (time.perf_counter() - wall0) / steps, (time.process_time() - cpu0) / steps
    logdir = tempfile.mkdtemp(prefix="tfdp_profile_")
    tf.profiler.experimental.start(logdir)
    for i in range(steps):
        _finish(step(i))
    tf.profiler.experimental.stop()
    space = xplane_pb2.XSpace()
    with open(glob.glob(logdir + "/**/*.xplane.pb", recursive=True)[0], "rb") as handle:
        space.ParseFromString(handle.read())
    time_us, count = collections.Counter(), collections.Counter()
    for plane in space.planes:
        names = {key: meta.name for key, meta in plane.event_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                name = names.get(event.metadata_id, "")
                if ":" not in name or any(w in name for w in _WRAPPERS):
                    continue
                op_type = name.split(":")[-1]
                time_us[op_type] += event.duration_ps / 1e6 / steps
                count[op_type] += 1 / steps
    return wall, cpu, {k: (time_us[k], count[k]) for k in time_us}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mechanism", default="eana")
    parser.add_argument("--vocab", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--adafest-threshold", type=float, default=19.0, help="tau (step_time's default)")
    parser.add_argument(
        "--untouched-rows",
        type=int,
        default=0,
        help="instead: time plain, plain + noising and writing this many untouched rows, and --mechanism, interleaved",
    )
    args = parser.parse_args(argv)
    spec = dict(
        vocab=args.vocab,
        dim=args.dim,
        batch=args.batch,
        l2_norm_clip=1.0,
        noise_multiplier=1.0,
        seed=0,
        fest_top_k=4096,
        fest_selection_epsilon=0.1,
        adafest_ratio=5.0,
        adafest_contribution_clip=1.0,
        adafest_threshold=args.adafest_threshold,
    )
    batches = worker.make_batches(vocab=args.vocab, batch=args.batch, count=40, zipf=None, seed=0)
    batches = [(tf.constant(ids), tf.constant(labels)) for ids, labels in batches]
    if args.untouched_rows:
        with_mechanism = args.mechanism if args.mechanism not in ("", "none") else None
        medians = untouched_rows_floor(spec, batches, args.untouched_rows, args.steps, with_mechanism)
        base = medians["plain"]
        print(
            f"vocab {args.vocab:,}, dim {args.dim}, batch {args.batch}, {args.steps} interleaved steps "
            f"(plain+write: {args.untouched_rows} untouched rows noised and written):"
        )
        for name, m in medians.items():
            print(
                f"  {name:14s} wall {m['wall_s'] * 1e3:7.2f} ms ({m['wall_s'] / base['wall_s']:.2f}x)   "
                f"CPU {m['cpu_s'] * 1e3:7.2f} ms ({m['cpu_s'] / base['cpu_s']:.2f}x)"
            )
        return 0
    steps_on_model = _step_functions(args.mechanism, spec, batches)
    mechanism = steps_on_model.mechanism
    results = {
        "plain": profile(steps_on_model.plain, args.steps),
        args.mechanism: profile(steps_on_model.step, args.steps),
    }
    (pw, pc, plain), (mw, mc, mech) = results["plain"], results[args.mechanism]
    print(f"vocab {args.vocab:,}, dim {args.dim}, batch {args.batch}, {args.steps} steps")
    print(
        f"wall/step: plain {pw * 1e3:.2f} ms, {args.mechanism} {mw * 1e3:.2f} ms ({mw / pw:.2f}x); "
        f"process CPU/step: {pc * 1e3:.2f} ms, {mc * 1e3:.2f} ms ({mc / pc:.2f}x)"
    )
    print(
        f"summed op time/step: plain {sum(v[0] for v in plain.values()) / 1e3:.2f} ms, "
        f"{args.mechanism} {sum(v[0] for v in mech.values()) / 1e3:.2f} ms"
    )
    if hasattr(mechanism, "rows_noised"):
        steps = max(1, int(mechanism.steps.numpy()))
        print(f"rows noised/step: {float(mechanism.rows_noised.numpy()[0]) / steps:.0f}")
    print(f"{'op type':34s} {args.mechanism + ' us/step':>16s} {'execs':>6s} {'plain us/step':>14s} {'execs':>6s}")
    for op_type, (us, n) in sorted(mech.items(), key=lambda kv: -kv[1][0])[: args.top]:
        p_us, p_n = plain.get(op_type, (0.0, 0.0))
        print(f"{op_type:34s} {us:16.1f} {n:6.0f} {p_us:14.1f} {p_n:6.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
