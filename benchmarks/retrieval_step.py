"""DP vs non-private train step of the SAME retrieval model, timed side by side in one process.

    python -m benchmarks.retrieval_step [--negatives 256] [--batch-size 512] [--steps 40] [--mechanism lazy]
                                        [--reference lazy] [--softmax sampled] [--profile] [--json PATH]

Two copies of `benchmarks.retrieval`'s ml-100k two-tower (user-id table +
Dense; item tower = movie-id table + genre table + Dense) with the DP
`Retrieval` task, each wrapped in `DPModel` with legacy SGD: one with the DP
mechanism (`--mechanism`, LazyDP by default), one with `NonPrivate` (the
plain gradient of the mean loss: same towers, same loss, same negatives,
same batches). Their traced train steps run alternately on the same
Poisson batches (expected size `--batch-size`), the order swapped every
step, so that load from other processes hits both alike; the medians of
wall and process CPU time per step and their ratios are reported. With
`--profile`, the TensorFlow op profiler's per-op-type times of both steps
are printed too (`benchmarks.step_time_profile.profile`).

`--reference` adds further mechanisms to the same rotation (each on its own
copy of the model), e.g. `--mechanism adafest --reference lazy`: both DP
steps and the non-private one under the same load.

`benchmarks.retrieval` calls `interleaved` and records its result with the
recall runs. This module's own CLI writes nothing unless `--json` names a
file (keep it outside `benchmarks/results/`: RESULTS.md is generated from
the files there).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from benchmarks import retrieval

WARMUP = 6


def _step_function(data, catalogue, args, mechanism_name: str, negatives):
    """A traced `DPModel.train_step` of a fresh model (seed `args.seed`) with the given mechanism."""
    from tfdp_embed import DPModel, keras, mechanisms, tf

    keras.utils.set_random_seed(args.seed)
    towers = retrieval.build_towers(data["num_users"], len(data["movie_ids"]), 19, args.dim)
    model = retrieval.dp_model(towers, catalogue, negatives)
    if mechanism_name == "none":
        mechanism = mechanisms.NonPrivate(seed=args.seed)
    else:
        taus = {"user_id": args.tau_user, "movie_id": args.tau_movie, "genres": args.tau_genres}
        mechanism = retrieval.mechanism(mechanism_name, args.noise_multiplier, args.seed, taus)
    dp = DPModel(model, mechanism=mechanism, expected_batch_size=args.batch_size)
    dp.compile(optimizer=keras.optimizers.legacy.SGD(args.dp_learning_rate))
    return dp, tf.function(dp.train_step, reduce_retracing=True)


def _finish(result) -> None:
    for value in result.values() if isinstance(result, dict) else [result]:
        np.asarray(value)


def _timed_steps(functions: dict, batches: list) -> tuple:
    """Per-step wall and process CPU seconds of each function, the order rotated (and reversed) every step."""
    names = list(functions)
    wall = {name: [] for name in names}
    cpu = {name: [] for name in names}
    for i, batch in enumerate(batches):
        order = names[i % len(names) :] + names[: i % len(names)]
        for name in order if (i // len(names)) % 2 == 0 else order[::-1]:
            start, cpu_start = time.perf_counter(), time.process_time()
            _finish(functions[name](batch))
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - cpu_start)
    return wall, cpu


def interleaved(
    data, catalogue, args, *, steps: int, softmax: str = "sampled", mechanism_name: str = "lazy", references=()
) -> dict:
    """Median wall / CPU ms per step of the DP and the non-private step of one model, alternating.

    `references` names more DP mechanisms stepped in the same rotation (e.g.
    LazyDP beside DP-AdaFEST), each on its own copy of the model.

    Returns:
      {"dp": {"wall_ms", "cpu_ms"}, "none": {...}, "wall_ratio", "cpu_ratio", "steps",
       "mechanism", "negatives", "mean_batch", "load_average"}, plus
      "references": {name: {"wall_ms", "cpu_ms", "wall_ratio", "cpu_ratio"}} when `references` is given.
    """
    from tfdp_embed.data import poisson_batches
    from tfdp_embed.keras2.retrieval import FullSoftmax, SampledSoftmax

    def negatives():
        return FullSoftmax() if softmax == "full" else SampledSoftmax(args.negatives, seed=args.seed)

    n = len(data["train"]["user_id"])
    dataset, _ = poisson_batches(data["train"], sampling_probability=args.batch_size / n, seed=args.seed)
    batches = list(dataset.repeat().take(WARMUP + steps))
    functions = {}
    for name in ("none", mechanism_name, *[r for r in references if r not in ("none", mechanism_name)]):
        dp, fn = _step_function(data, catalogue, args, name, negatives())
        dp.prepare(dataset)
        functions[name] = fn
    for batch in batches[:WARMUP]:  # traces (batch sizes vary: the step is retraced once, then relaxed)
        for fn in functions.values():
            _finish(fn(batch))
    load = os.getloadavg()[0]
    wall, cpu = _timed_steps(functions, batches[WARMUP:])
    medians = {
        name: {"wall_ms": 1e3 * float(np.median(wall[name])), "cpu_ms": 1e3 * float(np.median(cpu[name]))}
        for name in functions
    }
    none = medians["none"]
    result = {
        "dp": medians[mechanism_name],
        "none": none,
        "wall_ratio": medians[mechanism_name]["wall_ms"] / none["wall_ms"],
        "cpu_ratio": medians[mechanism_name]["cpu_ms"] / none["cpu_ms"],
        "steps": steps,
        "mechanism": mechanism_name,
        "negatives": "full" if softmax == "full" else f"sampled K={args.negatives}",
        "mean_batch": float(np.mean([int(b["user_id"].shape[0]) for b in batches[WARMUP:]])),
        "load_average": [load, os.getloadavg()[0]],
    }
    others = [name for name in functions if name not in ("none", mechanism_name)]
    if others:
        result["references"] = {
            name: {
                **medians[name],
                "wall_ratio": medians[name]["wall_ms"] / none["wall_ms"],
                "cpu_ratio": medians[name]["cpu_ms"] / none["cpu_ms"],
            }
            for name in others
        }
    return result


def _profile(data, catalogue, args) -> None:
    """Per-op-type time of the DP and the non-private step (TensorFlow profiler)."""
    from benchmarks.step_time_profile import profile
    from tfdp_embed.data import poisson_batches
    from tfdp_embed.keras2.retrieval import FullSoftmax, SampledSoftmax

    n = len(data["train"]["user_id"])
    dataset, _ = poisson_batches(data["train"], sampling_probability=args.batch_size / n, seed=args.seed)
    batches = list(dataset.repeat().take(WARMUP + 2 * args.steps))
    found = {}
    for name in ("none", args.mechanism):
        negatives = FullSoftmax() if args.softmax == "full" else SampledSoftmax(args.negatives, seed=args.seed)
        dp, fn = _step_function(data, catalogue, args, name, negatives)
        dp.prepare(dataset)
        found[name] = profile(lambda i, fn=fn: fn(batches[i % len(batches)]), args.steps)
    (nw, nc, plain), (mw, mc, mech) = found["none"], found[args.mechanism]
    print(
        f"wall/step: none {nw * 1e3:.2f} ms, {args.mechanism} {mw * 1e3:.2f} ms ({mw / nw:.2f}x); "
        f"CPU/step: {nc * 1e3:.2f} ms, {mc * 1e3:.2f} ms ({mc / nc:.2f}x)"
    )
    print(f"{'op type':34s} {args.mechanism + ' us/step':>16s} {'execs':>6s} {'none us/step':>14s} {'execs':>6s}")
    for op_type, (us, count) in sorted(mech.items(), key=lambda kv: -kv[1][0])[: args.top]:
        p_us, p_n = plain.get(op_type, (0.0, 0.0))
        print(f"{op_type:34s} {us:16.1f} {count:6.0f} {p_us:14.1f} {p_n:6.0f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.retrieval_step", description=__doc__.splitlines()[0])
    p.add_argument("--data", default=retrieval.DEFAULT_DATA)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--negatives", type=int, default=256)
    p.add_argument("--softmax", choices=("sampled", "full"), default="sampled")
    p.add_argument("--mechanism", default="lazy", help="lazy or adafest")
    p.add_argument(
        "--reference",
        default="",
        help="comma-separated further mechanisms stepped in the same rotation (e.g. lazy beside --mechanism adafest)",
    )
    p.add_argument("--json", default="", help="also write the result, with the machine and command, to this file")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--profile", action="store_true", help="print per-op-type times instead of the interleaved medians")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--noise-multiplier", type=float, default=1.0)
    p.add_argument("--dp-learning-rate", type=float, default=2.0)
    p.add_argument("--tau-user", type=float, default=1.0)
    p.add_argument("--tau-movie", type=float, default=2.0)
    p.add_argument("--tau-genres", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    from tfdp_embed import tf

    data = retrieval.load_ml100k(args.data, args.seed)
    catalogue = {"movie_id": data["movie_ids"], "genres": tf.ragged.constant(data["genres"], dtype=tf.int64)}
    if args.profile:
        _profile(data, catalogue, args)
        return 0
    references = tuple(name for name in args.reference.split(",") if name)
    found = interleaved(
        data,
        catalogue,
        args,
        steps=args.steps,
        softmax=args.softmax,
        mechanism_name=args.mechanism,
        references=references,
    )
    print(found)
    if args.json:
        _write_json(args.json, found, argv)
    return 0


def _write_json(path: str, found: dict, argv) -> None:
    """The result with the command, the machine (load, commit) and the time, as one JSON document."""
    import json
    import sys

    from benchmarks.machine import machine_info
    from benchmarks.outputs import REPO

    argv = sys.argv[1:] if argv is None else list(argv)
    document = {
        "benchmark": "retrieval_step",
        "command": " ".join(["python -m benchmarks.retrieval_step", *argv]),
        "machine": machine_info(REPO),
        "result": found,
    }
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(document, handle, indent=1)


if __name__ == "__main__":
    raise SystemExit(main())
