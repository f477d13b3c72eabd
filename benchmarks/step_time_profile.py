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

import numpy as np

from benchmarks import step_time_worker as worker
from tfdp_embed._keras import keras, tf  # noqa: I001

_WRAPPERS = ("__inference", "Run", "Process", "Executor", "Record", "StartRegion", "StopRegion")


def _step_functions(name: str, spec: dict, batches: list) -> tuple:
    """(plain step, mechanism step) on ONE model: a 5e7 x 64 table (12.8 GB) exists once.

    The plain step is `step_time_worker.plain_step` on the mechanism's model,
    traced with the read hooks removed (as the worker's in-process baseline).
    """
    from tfdp_embed.training import DPModel

    model = worker.build_model(vocab=spec["vocab"], dim=spec["dim"], dp_embedding=True, seed=0)
    counts = np.ones(spec["vocab"], np.int64) if name == "fest" else None
    mechanism = worker.make_mechanism(name, spec, counts)
    dp = DPModel(model, mechanism=mechanism, expected_batch_size=spec["batch"], lookahead=name == "lazy")
    dp.compile(optimizer=keras.optimizers.legacy.SGD(worker.LEARNING_RATE),
               loss=keras.losses.BinaryCrossentropy(from_logits=True))
    dp.prepare()
    fn = tf.function(dp.train_step)
    if name == "lazy":
        step = lambda i: fn(batches[i % len(batches)] + ({worker.TABLE_NAME: batches[(i + 1) % len(batches)][0]},))
    else:
        step = lambda i: fn(batches[i % len(batches)])
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
    return (lambda i: plain(*batches[i % len(batches)])), step, mechanism


def untouched_rows_floor(spec: dict, batches: list, rows: int, steps: int) -> tuple:
    """Median (plain step, plain step + scatter-add of `rows` random rows), interleaved, one model.

    The second step is the plain step followed by `table.scatter_add` of
    `rows` uniformly drawn rows (fresh each step; constant values, no noise draw): what
    any mechanism must pay to update that many rows the batch did not touch
    (cold rows: TLB and cache misses in a large table). A lower bound for
    DP-AdaFEST's step when `rows` rows survive by noise alone.

    Returns:
      (plain median s, plain + scatter median s), wall time.
    """
    model = worker.build_model(vocab=spec["vocab"], dim=spec["dim"], dp_embedding=True, seed=0)
    plain = worker.plain_step(model)
    table = model.get_layer(worker.TABLE_NAME).embeddings
    generator = tf.random.Generator.from_seed(1)

    @tf.function
    def both_step(ids, labels):
        loss = plain(ids, labels)  # inlined: one call, as a mechanism's step
        rows_drawn = generator.uniform([rows], 0, spec["vocab"], dtype=tf.int64)
        table.scatter_add(tf.IndexedSlices(tf.fill([rows, spec["dim"]], 1e-6), rows_drawn))
        return loss

    def both(i):
        return both_step(*batches[i % len(batches)])

    times = {"plain": [], "plain+scatter": []}
    for i in range(5):
        _finish(plain(*batches[i % len(batches)]))
        _finish(both(i))
    for i in range(steps):
        for name, fn in (("plain", lambda j: plain(*batches[j % len(batches)])), ("plain+scatter", both)):
            start = time.perf_counter()
            _finish(fn(i))
            times[name].append(time.perf_counter() - start)
    return float(np.median(times["plain"])), float(np.median(times["plain+scatter"]))


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
    parser.add_argument("--untouched-rows", type=int, default=0,
                        help="instead: time the plain step with and without a scatter-add of this many random rows")
    args = parser.parse_args(argv)
    spec = dict(vocab=args.vocab, dim=args.dim, batch=args.batch, l2_norm_clip=1.0, noise_multiplier=1.0, seed=0,
                fest_top_k=4096, fest_selection_epsilon=0.1, adafest_ratio=5.0, adafest_contribution_clip=1.0,
                adafest_threshold=args.adafest_threshold)
    batches = worker.make_batches(vocab=args.vocab, batch=args.batch, count=40, zipf=None, seed=0)
    batches = [(tf.constant(ids), tf.constant(labels)) for ids, labels in batches]
    if args.untouched_rows:
        plain_s, both_s = untouched_rows_floor(spec, batches, args.untouched_rows, args.steps)
        print(f"vocab {args.vocab:,}, dim {args.dim}, batch {args.batch}, {args.steps} interleaved steps: "
              f"plain {plain_s * 1e3:.2f} ms, plain + scatter-add of {args.untouched_rows} random rows "
              f"{both_s * 1e3:.2f} ms ({both_s / plain_s:.2f}x)")
        return 0
    plain_fn, mechanism_fn, mechanism = _step_functions(args.mechanism, spec, batches)
    results = {"plain": profile(plain_fn, args.steps), args.mechanism: profile(mechanism_fn, args.steps)}
    (pw, pc, plain), (mw, mc, mech) = results["plain"], results[args.mechanism]
    print(f"vocab {args.vocab:,}, dim {args.dim}, batch {args.batch}, {args.steps} steps")
    print(f"wall/step: plain {pw * 1e3:.2f} ms, {args.mechanism} {mw * 1e3:.2f} ms ({mw / pw:.2f}x); "
          f"process CPU/step: {pc * 1e3:.2f} ms, {mc * 1e3:.2f} ms ({mc / pc:.2f}x)")
    print(f"summed op time/step: plain {sum(v[0] for v in plain.values()) / 1e3:.2f} ms, "
          f"{args.mechanism} {sum(v[0] for v in mech.values()) / 1e3:.2f} ms")
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
