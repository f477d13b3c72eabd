"""Bytes sent per step from workers to parameter servers, per mechanism and vocabulary size.

EANA §3's point, measured: under ParameterServerStrategy a sparse mechanism
ships the rows a batch touches, dense DP-SGD ships a table-sized noisy
gradient every step. The workload is BENCHMARKS.md's: one `vocab x 64`
float32 table, 4 ids per example (uniform, or Zipf with `--zipf`),
mean-pooled, Dense(64, relu) -> Dense(1), batch 1024, legacy SGD; the table
and every other variable live on one parameter server.

Cluster: this process is the coordinator; one worker and one parameter
server are `tf.distribute.Server`s in two child processes on loopback
ports. Steps run through Keras `fit` with a `DatasetCreator`
(ClusterCoordinator underneath); warm-up steps first, then `--steps`
measured steps.

Two measurements per (mechanism, vocabulary), both over the measured steps:

  wire: TCP payload bytes the kernel counted as *received* by the parameter
    server's sockets whose peer socket belongs to the worker process
    (`ss -tinp`: `bytes_received` per socket, sockets mapped to processes
    by port), i.e. every byte that went from the worker to the parameter
    server, with gRPC/HTTP2/protobuf framing, whoever opened the
    connection (also read requests, row ids, LazyDP's catch-up writes).
    The reverse direction (rows read by the worker) is recorded too.
  applied: bytes of the gradient structures the optimizer applied to the
    parameter-server variables (values + indices of `IndexedSlices`, the
    whole tensor for dense gradients), summed inside the step by a metered
    legacy SGD. This is the update payload alone.

Outputs: `--json` and `--png` (default: new files of this run under
`benchmarks/results/`); `make results` regenerates `benchmarks/RESULTS.md`
from the JSON files (`--results-md` naming another page appends the section).

Run:
    python -m benchmarks.traffic --vocab 10000,100000,1000000 --steps 5

References: Berlowitz et al., EANA (RecSys 2022) §3 (parameter-server
traffic of dense DP-SGD); LazyDP (ASPLOS 2024) §5.2; DP-AdaFEST §3.2.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time

from benchmarks import outputs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MECHANISMS = ("none", "dense", "eana", "lazy", "adafest")
_SOCKET = re.compile(r"^\S+\s+\d+\s+\d+\s+(\S+):(\d+)\s+(\S+):(\d+)\s+users:\(\(\"[^\"]*\",pid=(\d+)")
_RECEIVED = re.compile(r"bytes_received:(\d+)")


# -- cluster processes --------------------------------------------------------------
def serve(cluster: dict, job: str, index: int) -> None:
    """Runs one gRPC server of `cluster` until killed (the child processes)."""
    from tfdp_embed.keras2.distribute import start_server

    start_server(cluster, job_name=job, task_index=index).join()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def start_cluster() -> tuple[dict, dict]:
    """Starts the worker and the parameter server; returns (cluster, {job: Popen})."""
    cluster = {"worker": [f"localhost:{_free_port()}"], "ps": [f"localhost:{_free_port()}"]}
    processes = {}
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": REPO}
    for job in ("worker", "ps"):
        processes[job] = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.traffic", "--serve", job, "--cluster", json.dumps(cluster)],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    for job, addresses in cluster.items():
        port = int(addresses[0].rsplit(":", 1)[1])
        deadline = time.monotonic() + 120
        while True:
            try:
                with socket.create_connection(("localhost", port), timeout=1):
                    break
            except OSError as error:
                if processes[job].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the {job} server did not start (exit code {processes[job].poll()})") from error
                time.sleep(0.5)
    return cluster, processes


def stop_cluster(processes: dict) -> None:
    for process in processes.values():
        if process.poll() is None:
            os.killpg(process.pid, 9)
            process.wait()


# -- measurements -------------------------------------------------------------------
def socket_bytes() -> dict:
    """{(local port, peer port): (owner pid, bytes received)} for every TCP socket (`ss -tinp`)."""
    return parse_ss(subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, check=True).stdout)


def parse_ss(text: str) -> dict:
    """Parses `ss -tinpH` output: a socket line (ports, owner pid) then its tcp_info line."""
    sockets, current = {}, None
    for line in text.splitlines():
        match = _SOCKET.match(line.strip())
        if match:
            current = (int(match.group(2)), int(match.group(4)), int(match.group(5)))
            continue
        if current is not None:
            received = _RECEIVED.search(line)
            sockets[current[:2]] = (current[2], int(received.group(1)) if received else 0)
            current = None
    return sockets


def directed_bytes(before: dict, after: dict, sender: int, receiver: int) -> int:
    """Bytes received by `receiver`'s sockets from sockets owned by `sender` between two snapshots."""
    owner = {local: pid for (local, _), (pid, _) in after.items()}
    total = 0
    for key, (pid, received) in after.items():
        if pid != receiver or owner.get(key[1]) != sender:
            continue
        total += received - before.get(key, (pid, 0))[1]
    return total


def peak_rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def reset_peak_rss(pid: int) -> None:
    try:
        with open(f"/proc/{pid}/clear_refs", "w", encoding="utf-8") as handle:
            handle.write("5")
    except OSError:
        pass


def metered_sgd_class():
    """Legacy SGD that adds the bytes of every gradient it applies to a counter variable."""
    from tfdp_embed.keras2._keras import keras, tf

    class MeteredSGD(keras.optimizers.legacy.SGD):
        def __init__(self, *args, meter, **kwargs):
            super().__init__(*args, **kwargs)
            self.meter = meter

        def apply_gradients(self, grads_and_vars, *args, **kwargs):
            pairs = list(grads_and_vars)
            total = tf.constant(0, tf.int64)
            for grad, _ in pairs:
                parts = (grad.values, grad.indices) if isinstance(grad, tf.IndexedSlices) else (grad,)
                for part in parts:
                    total += tf.size(part, out_type=tf.int64) * part.dtype.size
            self.meter.assign_add(total)
            return super().apply_gradients(pairs, *args, **kwargs)

    return MeteredSGD


def measure(strategy, name: str, spec: dict, batches: list, pids: dict) -> dict:
    """Warm-up, then `spec['steps']` steps of mechanism `name`; bytes per step both ways."""
    from benchmarks.step_time_worker import build_model, hyperparameters, make_mechanism
    from tfdp_embed.keras2._keras import keras, tf
    from tfdp_embed.keras2.training import DPModel

    ids, labels = batches  # numpy [steps, batch, 4], [steps, batch, 1]

    def dataset_fn(_context):
        return tf.data.Dataset.from_tensor_slices((ids, labels)).repeat()

    creator = keras.utils.experimental.DatasetCreator(dataset_fn)
    with strategy.scope():
        model = build_model(vocab=spec["vocab"], dim=spec["dim"], dp_embedding=True, seed=spec["seed"])
        meter = tf.Variable(0, dtype=tf.int64, trainable=False, name="applied_bytes")
        mechanism = make_mechanism(name, spec, None)
        dp = DPModel(model, mechanism=mechanism, expected_batch_size=spec["batch"])
        dp.compile(
            optimizer=metered_sgd_class()(spec["learning_rate"], meter=meter),
            loss=keras.losses.BinaryCrossentropy(from_logits=True),
        )
    table = model.get_layer("table").embeddings
    dp.fit(creator, epochs=1, steps_per_epoch=spec["warmup"], verbose=0)
    for pid in pids.values():
        reset_peak_rss(pid)
    before, applied_before = socket_bytes(), int(meter.numpy())
    start = time.perf_counter()
    dp.fit(creator, epochs=1, steps_per_epoch=spec["steps"], verbose=0)
    seconds = time.perf_counter() - start
    after, applied_after = socket_bytes(), int(meter.numpy())
    steps = spec["steps"]
    row = {
        "mechanism": name,
        "vocab": spec["vocab"],
        "table_device": table.device,
        "table_bytes": spec["vocab"] * spec["dim"] * 4,
        "steps": steps,
        "worker_to_ps_bytes_per_step": directed_bytes(before, after, pids["worker"], pids["ps"]) / steps,
        "ps_to_worker_bytes_per_step": directed_bytes(before, after, pids["ps"], pids["worker"]) / steps,
        "applied_bytes_per_step": (applied_after - applied_before) / steps,
        "seconds_per_step_coordinator": seconds / steps,
        "peak_rss_mb": {job: peak_rss_mb(pid) for job, pid in pids.items()},
        "hyperparameters": hyperparameters(name, spec),
    }
    if name == "adafest":
        report = mechanism.report()
        row["rows_noised_per_step"] = report["tables"][0]["mean_rows_noised"] if report["tables"] else None
    if name == "lazy":
        dp.flush()
    del dp, model, mechanism, meter, table
    gc.collect()
    return row


# -- reporting ----------------------------------------------------------------------
def fmt_bytes(value) -> str:
    if value is None:
        return "not measured"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.0f} B"


def markdown_section(document: dict) -> str:
    s, m = document["settings"], document["machine"]
    ids = f"Zipf ids (a = {s['zipf']:g})" if s["zipf"] else "uniform ids"
    v = m["versions"]
    lines = [
        f"## traffic — {m['date_utc']} — worker→parameter-server bytes per step, {ids}, dim {s['dim']}, batch {s['batch']}",
        "",
        f"- Command: `{document['command']}`",
        (
            f"- Machine: {m['cpu_model']}, nproc {m['nproc']}, {m['memory_total_gb']} GiB RAM, GPU: "
            f"{', '.join(m['gpus']) or 'none (CPU only)'}; 1-min load average {m['load_average_at_start'][0]} at start."
        ),
        (
            f"- Versions: Python {v['python']}, tensorflow {v['tensorflow']}, tf-keras {v['tf-keras']}, "
            f"dp-accounting {v['dp-accounting']}, numpy {v['numpy']}. Library commit "
            f"`{m['git']['commit'][:12]}`; uncommitted library files at start: "
            f"{', '.join(m['git']['uncommitted_library_files']) or 'none'}."
        ),
        (
            "- Cluster: coordinator (this process) + 1 worker + 1 parameter server, each a separate process "
            "on loopback gRPC; ParameterServerStrategy, Keras `fit` with `DatasetCreator`; every variable "
            "(table, dense layers, mechanism state) on the parameter server."
        ),
        (
            f"- Protocol: {s['warmup']} warm-up steps, then {s['steps']} measured steps per (mechanism, "
            "vocabulary), all in this one process run side by side. **wire**: TCP payload bytes received by "
            "the parameter server's sockets from the worker process's sockets (kernel `tcp_info` "
            "`bytes_received` via `ss -tinp`, sockets attributed to processes by port), divided by the steps: "
            "everything the worker sent the server, with gRPC/protobuf framing, read requests, ids and "
            "LazyDP's catch-up writes. **applied**: bytes of the gradient tensors the optimizer applied to "
            "server variables (values + indices of IndexedSlices; whole tensor when dense), summed inside "
            "the step. Both are per-step means over the measured steps; bytes are exact counts, not samples, "
            "so there is no spread to report beyond the step-to-step variation of the number of distinct rows."
        ),
        f"- Hyperparameters: C = {s['l2_norm_clip']:g}, σ = {s['noise_multiplier']:g}, lr {s['learning_rate']:g}; "
        + "; ".join(
            f"{r['mechanism']}: {r['hyperparameters']}"
            for r in document["rows"]
            if r["vocab"] == s["vocab"][0] and r["mechanism"] == "adafest" and "hyperparameters" in r
        ),
        (
            "- LazyDP runs without lookahead (its read hook catches rows up before each lookup). "
            "Peak RSS: VmHWM of the worker and server processes, reset to the current RSS before each "
            "measured run (`/proc/PID/clear_refs`), so it includes memory the processes kept from earlier "
            "runs. Coordinator s/step is wall time seen by the coordinator on a shared machine "
            f"(1-min load average {m['load_average_at_start'][0]} at start, "
            f"{m.get('load_average_at_end', ['not measured'])[0]} at end): context, not a latency benchmark."
        ),
        "",
        (
            "| mechanism | vocab | table | wire worker→PS / step | applied update / step | wire PS→worker / step | "
            "coordinator s/step | peak RSS worker / PS | notes |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in document["rows"]:
        if "error" in r:
            lines.append(f"| {r['mechanism']} | {r['vocab']:,} | | failed | | | | | {r['error'][:120]} |")
            continue
        rss = r["peak_rss_mb"]
        notes = []
        if r.get("rows_noised_per_step") is not None:
            notes.append(f"{r['rows_noised_per_step']:.0f} rows noised/step")
        lines.append(
            f"| {r['mechanism']} | {r['vocab']:,} | {fmt_bytes(r['table_bytes'])} | "
            f"{fmt_bytes(r['worker_to_ps_bytes_per_step'])} | {fmt_bytes(r['applied_bytes_per_step'])} | "
            f"{fmt_bytes(r['ps_to_worker_bytes_per_step'])} | {r['seconds_per_step_coordinator']:.3g} | "
            f"{rss['worker'] / 1024:.2f} / {rss['ps'] / 1024:.2f} GB | {'; '.join(notes)} |"
        )
    ratios = []
    for vocab in s["vocab"]:
        by = {r["mechanism"]: r for r in document["rows"] if r["vocab"] == vocab and "error" not in r}
        if "dense" in by:
            for name in ("eana", "lazy", "adafest", "none"):
                if name in by and by[name]["worker_to_ps_bytes_per_step"] > 0:
                    ratios.append(
                        f"{vocab:,}: dense/{name} = "
                        f"{by['dense']['worker_to_ps_bytes_per_step'] / by[name]['worker_to_ps_bytes_per_step']:.3g}×"
                    )
    lines += ["", "Wire-byte ratios (same run): " + ("; ".join(ratios) or "not measured") + ".", ""]
    if document.get("png"):
        lines += [f"Plot: `{outputs.shown_path(document['png'])}`.", ""]
    return "\n".join(lines)


def plot(document: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for name in document["settings"]["mechanisms"]:
        rows = sorted(
            (r for r in document["rows"] if r["mechanism"] == name and "error" not in r), key=lambda r: r["vocab"]
        )
        if not rows:
            continue
        (line,) = ax.plot(
            [r["vocab"] for r in rows],
            [r["worker_to_ps_bytes_per_step"] for r in rows],
            marker="o",
            label=f"{name} (wire)",
        )
        ax.plot(
            [r["vocab"] for r in rows],
            [max(r["applied_bytes_per_step"], 1) for r in rows],
            linestyle="--",
            color=line.get_color(),
            alpha=0.6,
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("vocabulary (rows of 64 float32)")
    ax.set_ylabel("bytes per step, worker → parameter server")
    s = document["settings"]
    ids = f"Zipf a={s['zipf']:g}" if s["zipf"] else "uniform ids"
    ax.set_title(f"PS traffic per step, batch {s['batch']}, {ids}\nsolid: wire bytes; dashed: applied update")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- main -------------------------------------------------------------------------
def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", default="10000,100000,1000000")
    parser.add_argument("--mechanisms", default=",".join(MECHANISMS))
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--zipf", type=float, default=None)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--learning-rate", type=float, default=0.1)
    parser.add_argument("--l2-norm-clip", type=float, default=1.0)
    parser.add_argument("--noise-multiplier", type=float, default=1.0)
    parser.add_argument("--adafest-ratio", type=float, default=5.0)
    parser.add_argument("--adafest-contribution-clip", type=float, default=1.0)
    parser.add_argument("--adafest-threshold", type=float, default=19.0)
    parser.add_argument("--json", default=outputs.AUTO, help="'auto': a new file under benchmarks/results/; '' skips")
    parser.add_argument("--png", default=outputs.AUTO, help="'auto': a new file under benchmarks/results/; '' skips")
    parser.add_argument("--results-md", default=outputs.RESULTS_MD, help="RESULTS.md to append to ('' to skip)")
    parser.add_argument("--render", metavar="JSON", help="only re-draw the plot and append the section of a saved run")
    parser.add_argument("--serve", choices=("worker", "ps"), help=argparse.SUPPRESS)
    parser.add_argument("--cluster", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.vocab = [int(float(v)) for v in args.vocab.split(",")]
    args.mechanisms = [m for m in args.mechanisms.split(",") if m]
    unknown = sorted(set(args.mechanisms) - set(MECHANISMS))
    if unknown:
        parser.error(f"--mechanisms: unknown {unknown}; allowed: {', '.join(MECHANISMS)}")
    if args.steps < 1 or args.warmup < 1:
        parser.error("--steps and --warmup must be >= 1")
    if not args.serve:
        ids = f"zipf{args.zipf:g}" if args.zipf else "uniform"
        files = {"png": ".png"} if args.render else {"json": ".json", "png": ".png"}
        tag = "render" if args.render else f"{ids}-{outputs.range_tag(args.vocab)}"
        if args.render:
            args.json = ""  # the saved run's JSON stays as it is
        outputs.resolve(parser, args, benchmark="traffic", tag=tag, files=files)
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.serve:
        serve(json.loads(args.cluster), args.serve, 0)
        return 0
    if args.render:  # a new plot of a saved run (never the file its own section cites)
        with open(args.render, encoding="utf-8") as handle:
            return report({**json.load(handle), "png": args.png or None}, args)
    from tqdm import tqdm

    from benchmarks.machine import machine_info

    machine = machine_info(REPO)
    cluster, processes = start_cluster()
    rows = []
    try:
        import numpy as np

        from benchmarks.step_time_worker import make_batches
        from tfdp_embed.keras2._keras import tf

        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(tf.train.ClusterSpec(cluster), rpc_layer="grpc")
        strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
        pids = {job: p.pid for job, p in processes.items()}
        total = args.warmup + args.steps
        jobs = [(v, m) for v in args.vocab for m in args.mechanisms]
        for vocab, name in tqdm(jobs, desc="traffic", unit="run"):
            spec = {**vars(args), "vocab": vocab}
            batches = make_batches(vocab=vocab, batch=args.batch, count=total, zipf=args.zipf, seed=args.seed)
            data = (np.stack([b[0] for b in batches]), np.stack([b[1] for b in batches]))  # one batch per element
            try:
                row = measure(strategy, name, spec, data, pids)
            except Exception as error:  # noqa: BLE001 - one failed run is reported, not fatal
                row = {"mechanism": name, "vocab": vocab, "error": f"{type(error).__name__}: {error}"}
            rows.append(row)
            tqdm.write(
                json.dumps(
                    {
                        k: row.get(k)
                        for k in (
                            "mechanism",
                            "vocab",
                            "worker_to_ps_bytes_per_step",
                            "applied_bytes_per_step",
                            "error",
                        )
                    }
                )
            )
    finally:
        stop_cluster(processes)
    document = {
        "command": "python -m benchmarks.traffic " + shlex.join(argv),
        "settings": {k: v for k, v in vars(args).items() if k not in ("serve", "cluster")},
        "machine": machine,
        "rows": rows,
        "png": args.png or None,
    }
    document["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=1)
    return report(document, args)


def report(document: dict, args) -> int:
    """Draws the plot, prints the section and passes it to `outputs.append_section` (unless --results-md '')."""
    if document.get("png"):
        plot(document, document["png"])
    section = markdown_section(document)
    print(section)
    if args.results_md:
        outputs.append_section(args.results_md, section, files=(args.json, document.get("png")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
