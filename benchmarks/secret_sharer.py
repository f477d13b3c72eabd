"""The secret sharer test on MovieLens (EANA §4.1): exposure vs insertion count, and precision@k.

    python -m benchmarks.secret_sharer [--epochs N] [--canaries-per-count K] [--num-candidates N] ...

Canaries (random 20-movie histories with a random label; `tfdp_embed.audit`)
are inserted 1, 2, 3, 4, 5, 10, 20, 50, 100 times into the ml-100k training
pool of `pipelines.movielens`; the two-tower model is trained with SGD
(`none`), DP-SGD (`dense`), EANA (`eana`) and LazyDP (`lazy`) at noise
multipliers 0.01 and 0.001 (EANA's settings) and at a noise multiplier
calibrated to one target epsilon; every trained model scores the canaries,
`--num-candidates` non-inserted candidates from the same distribution and a
control group of never-inserted sequences. For each run it records rank
exposure log2(n) - log2(m), extrapolated exposure (skew-normal fit), and
precision@k / recall@k on the test users, then

* writes `--json`, `--png-exposure` (mean exposure vs insertion count, one
  line per run) and `--png-precision` (precision@k vs k), by default new
  files of this run under `benchmarks/results/`; `make results` regenerates
  `benchmarks/RESULTS.md` from the JSON files;
* with `--results-md` naming another page, appends its section there
  (command, date, machine, versions, settings, tables, EANA's data-dependent
  bound, and what the numbers can and cannot show).

Every setting is trained once (one seed): the run-to-run spread of exposure
is not measured here, and the tables say so.

References: Berlowitz et al., "EANA", RecSys 2022, §2.3, §4.1.3, Fig. 4-5;
Carlini et al., "The Secret Sharer", USENIX Security 2019, §4.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import resource
import shlex
import sys
import time
from collections.abc import Sequence

import numpy as np

from benchmarks import cli_args, outputs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DATA = os.path.join(os.path.dirname(ROOT), "shared", "data", "movielens", "ml-100k", "u.data")
MECHANISMS = ("none", "dense", "eana", "lazy")
LABELS = {"none": "SGD (none)", "dense": "DP-SGD (dense)", "eana": "EANA (not DP)", "lazy": "LazyDP"}
KS = (1, 5, 10, 20)
#: A skew-normal whose Kolmogorov-Smirnov distance to the candidates' scores exceeds this is flagged in the
#: tables: its tail (the extrapolated exposure) then describes the fit, not the model.
POOR_FIT_KS = 0.15


@dataclasses.dataclass(frozen=True)
class Setting:
    """One training run: a mechanism with a fixed noise multiplier or a target epsilon (or neither)."""

    mechanism: str
    noise_multiplier: float | None = None
    epsilon: float | None = None

    @property
    def name(self) -> str:
        if self.mechanism == "none":
            return "none"
        if self.epsilon is not None:
            return f"{self.mechanism} eps={self.epsilon:g}"
        return f"{self.mechanism} z={self.noise_multiplier:g}"


def settings_for(mechanisms: Sequence[str], noise_multipliers: Sequence[float], epsilon: float | None) -> list:
    """`none` once, then every other mechanism at every noise multiplier and at the target epsilon."""
    out = [Setting("none")] if "none" in mechanisms else []
    for mechanism in mechanisms:
        if mechanism == "none":
            continue
        out += [Setting(mechanism, noise_multiplier=z) for z in noise_multipliers]
        if epsilon is not None:
            out.append(Setting(mechanism, epsilon=epsilon))
    return out


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _config_for(movielens, base: dict, setting: Setting, out_dir: str | None):
    fields = dict(base, mechanism=setting.mechanism)
    if setting.mechanism != "none":
        if setting.epsilon is not None:
            fields.update(epsilon=setting.epsilon, noise_multiplier=None)
        else:
            fields.update(noise_multiplier=setting.noise_multiplier, epsilon=None)
    return movielens.MovieLensConfig(**fields)


def _report_numbers(report: dict) -> dict:
    """The utility and privacy numbers of a `pipelines.movielens` report, under fixed names."""
    bound = report.get("eana_bound")
    return {
        "precision": {str(k): report.get(f"precision@{k}") for k in KS},
        "recall": {str(k): report.get(f"recall@{k}") for k in KS},
        "epsilon": report.get("epsilon"),
        "nominal_epsilon_not_dp": report.get("nominal_epsilon_not_dp"),
        "delta": report.get("delta"),
        "noise_multiplier": report.get("noise_multiplier"),
        "noise_source": report.get("noise_source"),
        "steps": report.get("steps_run"),
        "learning_rate": (report.get("training") or {}).get("learning_rate"),
        "train_examples": report.get("train_examples"),
        "final_train_loss": report.get("final_train_loss"),
        "median_step_s": report.get("median_step_s"),
        "guarantee": report.get("guarantee"),
        "eana_bound": bound,
        "eana_per_instance_bounds": report.get("eana_per_instance_bounds"),
    }


def run_setting(movielens, audit, data, base: dict, setting: Setting, *, canaries, candidates, controls, out_dir):
    """Trains one setting with the canaries inserted and audits it. Returns a JSON-able dict."""
    config = _config_for(movielens, base, setting, out_dir)
    run_dir = os.path.join(out_dir, setting.name.replace(" ", "_").replace("=", "")) if out_dir else None
    started = time.perf_counter()
    result = movielens.train_and_evaluate(
        config,
        data=data,
        extra_train_examples=canaries.training_examples(shuffle_seed=base["seed"]),
        out_dir=run_dir,
    )
    train_seconds = time.perf_counter() - started
    started = time.perf_counter()
    exposure = audit.secret_sharer_audit(result.log_probs, canaries=canaries, candidates=candidates)
    control_scores = audit.score_sequences(result.log_probs, controls)
    control_exposure = audit.rank_exposure(control_scores, exposure.candidate_scores)
    control_extrapolated = exposure.fit.exposure(control_scores)
    audit_seconds = time.perf_counter() - started
    return {
        "setting": setting.name,
        "mechanism": setting.mechanism,
        "requested_noise_multiplier": setting.noise_multiplier,
        "target_epsilon": setting.epsilon,
        **_report_numbers(result.report),
        "exposure": exposure.summary(),
        "per_canary": exposure.as_dict()["per_canary"],
        "control": {
            "num_sequences": len(controls),
            "mean_exposure": float(control_exposure.mean()),
            "max_exposure": float(control_exposure.max()),
            "mean_extrapolated_exposure": float(control_extrapolated.mean()),
        },
        "train_seconds": train_seconds,
        "audit_seconds": audit_seconds,
        "peak_rss_mb_so_far": _peak_rss_mb(),
    }


def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "not measured"
    if isinstance(value, float) and not math.isfinite(value):
        return "inf"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _privacy_cell(run: dict) -> str:
    if run["mechanism"] == "none":
        return "no privacy"
    if run["mechanism"] == "eana":
        nominal = run.get("nominal_epsilon_not_dp")
        return "not DP" + ("" if nominal is None else f" (DP-SGD at this z: {_eps(nominal)})")
    return "not reported" if run["epsilon"] is None else _eps(run["epsilon"])


def _eps(eps: float) -> str:
    return f"{eps:.3g}" if math.isfinite(eps) else "inf"


def markdown(document: dict) -> str:
    """The RESULTS.md section for one run of this script."""
    runs, params, machine = document["runs"], document["parameters"], document["machine"]
    counts = [int(c) for c in params["insertion_counts"]]
    n = params["num_candidates"]
    versions = ", ".join(f"{k} {v}" for k, v in machine["versions"].items())
    lines = [
        (
            f"## secret_sharer — {machine['date_utc']} — MovieLens ml-100k, canary exposure and precision@k "
            f"(SGD learning rate {json.loads(params['training']).get('learning_rate')})"
        ),
        "",
        f"- Command: `{document['command']}` ({document['wall_minutes']:.1f} min wall).",
        (
            f"- Machine: {machine['cpu_model']}, nproc {machine['nproc']}, {machine['memory_total_gb']} GiB RAM, "
            f"GPU: {', '.join(machine['gpus']) or 'none (CPU only)'}; load average at start "
            f"{'/'.join(str(x) for x in machine['load_average_at_start'])} (shared machine)."
        ),
        f"- Versions: {versions}.",
        (
            f"- Library: commit `{machine['git']['commit'][:12]}`; uncommitted library files at start: "
            f"{', '.join(machine['git']['uncommitted_library_files']) or 'none'}."
        ),
        f"- Peak RSS of the whole run: {document['peak_rss_mb']:.0f} MB.",
        f"- Data: `{params['data']}`; {params['data_summary']}.",
        f"- Training (every run, one seed = {params['seed']}): {params['training']}.",
        (
            f"- Canaries: {params['canaries_per_count']} per insertion count x counts {counts} = "
            f"{params['num_canaries']} canaries, {params['num_inserted_examples']} inserted rows "
            f"(EANA: 50 per count); n = {n} non-inserted candidates (EANA: 16,384), rank exposure ceiling "
            f"log2(n) = {math.log2(n):.2f} bits; control: {params['num_controls']} never-inserted sequences scored "
            "like the canaries (chance level 1/ln 2 = 1.44 bits); ties ahead of the canary; skew-normal fit for the "
            "extrapolated exposure."
        ),
        f"- Target epsilon for the calibrated runs: {params['epsilon']} at delta = {params['delta_words']}.",
        "",
        (
            "Utility and privacy (precision@k / recall@k over all items on the test users; eps as the pipeline "
            "reports it):"
        ),
        "",
        "| run | noise multiplier | eps | lr | P@1 | P@5 | P@10 | P@20 | R@10 | R@20 | final train loss | train s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        p, r = run["precision"], run["recall"]
        lines.append(
            f"| {run['setting']} | {_fmt(run['noise_multiplier'], 4) if run['mechanism'] != 'none' else '—'} | "
            f"{_privacy_cell(run)} | {_fmt(run['learning_rate'])} | {_fmt(p['1'], 4)} | {_fmt(p['5'], 4)} | "
            f"{_fmt(p['10'], 4)} | {_fmt(p['20'], 4)} | {_fmt(r['10'], 4)} | {_fmt(r['20'], 4)} | "
            f"{_fmt(run['final_train_loss'])} | {run['train_seconds']:.0f} |"
        )
    popular = document.get("popularity_baseline")
    if popular:
        p, r = popular["precision"], popular["recall"]
        lines.append(
            f"| popularity (no model: the k most-rated training labels) | — | — | — | {_fmt(p['1'], 4)} | "
            f"{_fmt(p['5'], 4)} | {_fmt(p['10'], 4)} | {_fmt(p['20'], 4)} | {_fmt(r['10'], 4)} | "
            f"{_fmt(r['20'], 4)} | — | — |"
        )
    extrapolated = "mean_extrapolated_exposure"
    for title, key in (
        ("Mean rank exposure (bits) per insertion count", "mean_exposure"),
        ("Max rank exposure (bits) per insertion count", "max_exposure"),
        (
            (
                "Mean extrapolated exposure (bits, skew-normal tail; not capped at log2 n; fit KS distance to the "
                f"candidates' scores in the last column, '(poor fit)' above {POOR_FIT_KS})"
            ),
            extrapolated,
        ),
    ):
        fit_column = key == extrapolated
        lines += [
            "",
            f"{title}; control = never-inserted sequences:",
            "",
            "| run | " + " | ".join(f"x{c}" for c in counts) + " | control |" + (" fit KS |" if fit_column else ""),
            "|---|" + "---:|" * (len(counts) + 1 + fit_column),
        ]
        for run in runs:
            by = run["exposure"]["by_insertion_count"]
            control = run["control"].get(key)
            ks = run["exposure"]["fit"]["ks_statistic"]
            lines.append(
                f"| {run['setting']} | "
                + " | ".join(_fmt(by[str(c)][key], 2) for c in counts)
                + f" | {_fmt(control, 2)} |"
                + (f" {ks:.3f}{' (poor fit)' if ks > POOR_FIT_KS else ''} |" if fit_column else "")
            )
    lines += [
        "",
        "EANA's data-dependent bound (Theorem 3.1 / Remark 2) from the real per-row counts, as reported:",
    ]
    for run in runs:
        if run["mechanism"] == "eana":
            lines.append(f"- {run['setting']}: {bound_words(run)}")
    lines += [
        "",
        (
            f"Plots: `{params['png_exposure']}` (mean exposure vs insertion count, rank and extrapolated), "
            f"`{params['png_precision']}` (precision@k vs k)."
        ),
        "",
        "**What these numbers can and cannot show.** " + document["limits"],
        "",
    ]
    notes = document.get("notes") or []
    if notes:
        lines += ["**Reading of this run** (written after looking at the numbers above):", ""]
        lines += [f"- {note}" for note in notes] + [""]
    return "\n".join(lines)


def bound_words(run: dict) -> str:
    """EANA's Theorem 3.1 and Remark 2 numbers of one run, in one line."""
    bound = run.get("eana_bound")
    if not bound:
        return "not reported by the pipeline"
    text = (
        f"Theorem 3.1 data-dependent eps = {_eps(float(bound['data_dependent_epsilon']))} at delta "
        f"{bound['delta']:.3g} (not DP), {bound.get('passes_composed', '?')} passes composed, d_0 = "
        f"{bound.get('d0', '?')}, smallest history-row count per pass {bound.get('min_history_row_count_per_pass')}, "
        f"history rows never touched: {bound.get('history_rows_never_touched', '?')} of {bound.get('history_rows', '?')}"
    )
    per_instance = run.get("eana_per_instance_bounds") or []
    if per_instance:
        text += "; Remark 2 per-instance eps of the first training examples: " + ", ".join(
            _eps(float(b["data_dependent_epsilon"])) for b in per_instance
        )
    return text + "."


def limits_paragraph(runs: list, params: dict) -> str:
    """Plain words, with this run's own numbers."""
    n = params["num_candidates"]
    top = max(params["insertion_counts"])
    by_setting = {r["setting"]: r["exposure"]["by_insertion_count"][str(top)]["mean_exposure"] for r in runs}
    controls = [r["control"]["mean_exposure"] for r in runs]
    text = (
        f"One training run per setting and {params['canaries_per_count']} canaries per count: a mean exposure "
        f"over {params['canaries_per_count']} canaries has a sampling spread of roughly 1.44 / "
        f"sqrt({params['canaries_per_count']}) = {1.44 / math.sqrt(params['canaries_per_count']):.2f} bits when the "
        "model has not memorised them, and run-to-run variation (initialisation, batches, noise) is not measured. "
        f"Rank exposure is capped at log2({n}) = {math.log2(n):.1f} bits, so settings that all reach the cap cannot "
        "be ordered by it; the extrapolated column orders them only as far as a skew-normal describes the tail of "
        "the candidates' scores, which nothing here verifies beyond the bulk fit (KS distance in the last column of that table). The "
        f"control sequences' mean rank exposure ranged over {min(controls):.2f}-{max(controls):.2f} bits across runs "
        "(chance: 1.44). Mean exposure of the x"
        f"{top} canaries per run: "
        + ", ".join(f"{k} {v:.2f}" for k, v in by_setting.items())
        + ". Exposure measures how much this model memorised these canaries at these settings on ml-100k "
        f"({params['epochs']} epochs); it is a lower-bound style empirical audit, not a privacy guarantee, and "
        "EANA's paper ran MovieLens-20M with 50 canaries per count. Noise multipliers 0.01 and 0.001 give no "
        "meaningful DP epsilon (the pipeline reports inf or astronomically large values); only the calibrated "
        "runs carry a DP guarantee (dense, lazy), and EANA's never does. That epsilon is per example: a canary "
        "inserted r times is a group of r examples, protected only by group privacy (an epsilon that grows "
        "roughly r-fold), so high exposure of the x50 and x100 canaries does not contradict it. Noise "
        "convention: this library's noise multiplier z puts std z C on the SUM of clipped gradients (divided "
        f"by the expected batch {params.get('batch_size', 64)}), as in tensorflow-privacy; EANA's Algorithm 1 "
        "writes N(0, sigma^2) on the averaged gradient, which would be z = sigma B / C here."
    )
    return text


def plot_exposure(runs: list, params: dict, path: str) -> None:
    """Mean rank exposure and mean extrapolated exposure vs insertion count, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = [int(c) for c in params["insertion_counts"]]
    colors = plt.get_cmap("tab20").colors
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    for ax, key, title in (
        (axes[0], "mean_exposure", "(a) rank exposure (interpolation)"),
        (axes[1], "mean_extrapolated_exposure", "(b) extrapolated exposure (skew-normal)"),
    ):
        for index, run in enumerate(runs):
            by = run["exposure"]["by_insertion_count"]
            style = {"none": "-", "dense": "--", "eana": ":", "lazy": "-."}[run["mechanism"]]
            poor = key != "mean_exposure" and run["exposure"]["fit"]["ks_statistic"] > POOR_FIT_KS
            label = run["setting"] + (" (poor fit)" if poor else "")
            values = [by[str(c)][key] for c in counts]
            ax.plot(
                counts,
                values,
                style,
                marker="o",
                ms=3,
                label=label,
                alpha=0.35 if poor else 1.0,
                color=colors[(2 * index) % 20 + (index // 10) % 2],
            )
        ax.axhline(1 / math.log(2), color="0.6", lw=0.8, ls="--")
        if key == "mean_exposure":
            ax.axhline(math.log2(params["num_candidates"]), color="0.3", lw=0.8, ls=":")
        ax.set_xscale("log")
        ax.set_xticks(counts)
        ax.set_xticklabels([str(c) for c in counts])
        ax.set_xlabel("insertions per canary")
        ax.set_ylabel("mean exposure (bits)")
        ax.set_title(title, fontsize=10)
    axes[0].legend(fontsize=7, loc="upper left")
    axes[1].legend(fontsize=7, loc="upper left")
    fig.suptitle(
        f"Secret sharer on ml-100k: {params['canaries_per_count']} canaries/count, n = {params['num_candidates']} "
        f"candidates (dotted: log2 n; dashed grey: chance 1.44 bits)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_precision(runs: list, path: str) -> None:
    """Precision@k vs k, one line per run (EANA Fig. 4)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = plt.get_cmap("tab20").colors
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for index, run in enumerate(runs):
        ys = [run["precision"][str(k)] for k in KS]
        if any(y is None for y in ys):
            continue
        style = {"none": "-", "dense": "--", "eana": ":", "lazy": "-."}[run["mechanism"]]
        ax.plot(
            KS,
            ys,
            style,
            marker="o",
            ms=3,
            label=run["setting"],
            color=colors[(2 * index) % 20 + (index // 10) % 2],
        )
    ax.set_xticks(KS)
    ax.set_xlabel("k")
    ax.set_ylabel("precision@k (test users, all items)")
    ax.set_title("ml-100k next-movie two-tower, canaries inserted")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.secret_sharer",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--data", default=DEFAULT_DATA, help="MovieLens u.data")
    parser.add_argument("--mechanisms", default=",".join(MECHANISMS), help=f"subset of {','.join(MECHANISMS)}")
    parser.add_argument("--noise-multipliers", type=cli_args.floats, default=(0.01, 0.001), help="EANA's settings")
    parser.add_argument("--epsilon", type=float, default=8.0, help="calibrated target epsilon; <= 0 skips")
    parser.add_argument("--delta", type=float, default=None, help="delta; default: the pipeline's default")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--accountant", choices=("rdp", "pld"), default="rdp", help="see main() for why RDP")
    parser.add_argument("--batch-size", type=int, default=64, help="expected Poisson batch (EANA §4.1.2: 64)")
    parser.add_argument(
        "--learning-rate",
        type=float,
        default=0.1,
        help="SGD rate of every run (momentum 0.9); <= 0: the pipeline's per-mechanism default. At 0.5 the "
        "eps = 8 runs diverged (benchmarks/archive/RESULTS-2026-11-lab-notebook.md)",
    )
    parser.add_argument("--insertion-counts", type=cli_args.ints, default=(1, 2, 3, 4, 5, 10, 20, 50, 100))
    parser.add_argument("--canaries-per-count", type=int, default=20, help="EANA: 50")
    parser.add_argument("--num-candidates", type=int, default=16384)
    parser.add_argument("--num-controls", type=int, default=100, help="never-inserted sequences scored as canaries")
    parser.add_argument("--seed", type=int, default=0, help="canaries, candidates, training")
    parser.add_argument(
        "--out",
        default="",
        help="if set, each run writes DIR/<run>/report.json and a retrieval SavedModel there",
    )
    parser.add_argument("--verbose", type=int, default=0, help="Keras progress bar inside each run (1) or not (0)")
    parser.add_argument("--json", default=outputs.AUTO, help="'auto': a new file under benchmarks/results/; '' skips")
    parser.add_argument("--results-md", default=outputs.RESULTS_MD, help="'' skips")
    parser.add_argument("--png-exposure", default=outputs.AUTO, help="'auto': a new file; '' skips")
    parser.add_argument("--png-precision", default=outputs.AUTO, help="'auto': a new file; '' skips")
    parser.add_argument("--note", action="append", default=[], help="a sentence added under the tables")
    parser.add_argument(
        "--from-json",
        action="append",
        default=[],
        help="re-render tables, plots and section from a saved JSON; repeat to combine runs of several "
        "invocations made with the same canaries and candidates (each command is listed)",
    )
    args = parser.parse_args(argv)
    files = {"json": ".json", "png_exposure": "-exposure.png", "png_precision": "-precision.png"}
    if args.from_json:
        missing = [path for path in args.from_json if not os.path.isfile(path)]
        if missing:
            parser.error(f"--from-json: {missing} do(es) not exist.")
        outputs.resolve(parser, args, benchmark="secret_sharer", tag="render", files=files)
        return args
    lr = f"lr{args.learning_rate:g}" if args.learning_rate > 0 else "lr-default"
    outputs.resolve(parser, args, benchmark="secret_sharer", tag=f"{lr}-eps{args.epsilon:g}", files=files)
    mechanisms = [m for m in args.mechanisms.split(",") if m]
    unknown = sorted(set(mechanisms) - set(MECHANISMS))
    if unknown or not mechanisms:
        parser.error(f"--mechanisms: unknown {unknown or 'empty list'}; allowed: {', '.join(MECHANISMS)}.")
    args.mechanisms = mechanisms
    for name in ("epochs", "canaries_per_count", "num_candidates", "num_controls"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1; received {getattr(args, name)}.")
    if not os.path.isfile(args.data):
        parser.error(f"--data: {args.data} does not exist (ml-100k's u.data lives in ../shared/data/movielens).")
    return args


def popularity_baseline(data) -> dict:
    """precision@k / recall@k of recommending the k most frequent training labels (canaries excluded) to all.

    One relevant item per test example, so recall@k is the hit rate and precision@k = recall@k / k, as in
    `tfdp_embed.metrics.retrieval`; ties in the counts go to the lower item id.
    """
    counts = np.bincount(data.train_labels, minlength=data.num_items + 1)[1:]
    ranked = np.argsort(-counts, kind="stable") + 1
    hits = {k: float(np.isin(data.test_labels, ranked[:k]).mean()) for k in KS}
    return {"precision": {str(k): hits[k] / k for k in KS}, "recall": {str(k): hits[k] for k in KS}}


def _shown_path(path: str) -> str:
    """Paths inside the project's parent directory relative to the repository; others absolute."""
    relative = os.path.relpath(os.path.abspath(path), ROOT)
    return relative if not relative.startswith(os.pardir + os.sep + os.pardir) else os.path.abspath(path)


def render_from_json(args) -> int:
    """Tables, plots and the RESULTS.md section from a saved JSON (its command and machine); no training.

    Notes given with --note replace the saved ones (the JSON is rewritten with them when --json is set).
    """
    documents = []
    for path in args.from_json:
        with open(path) as f:
            documents.append(json.load(f))
    document = documents[0]
    for other in documents[1:]:
        same = ("insertion_counts", "canaries_per_count", "num_candidates", "num_controls", "seed", "data")
        if other["canaries"] != document["canaries"] or any(
            other["parameters"][key] != document["parameters"][key] for key in same
        ):
            raise SystemExit(
                f"--from-json: {args.from_json[0]} and another file were made with different canaries, "
                f"candidates or data ({', '.join(same)} must match); they cannot share one table."
            )
        document["runs"] = document["runs"] + other["runs"]
        document["command"] = document["command"] + "`, then `" + other["command"]
        document["wall_minutes"] += other["wall_minutes"]
        document["peak_rss_mb"] = max(document["peak_rss_mb"], other["peak_rss_mb"])
    if args.note:
        document["notes"] = list(args.note)
    document["limits"] = limits_paragraph(document["runs"], document["parameters"])  # current wording
    if "popularity_baseline" not in document:  # runs saved before the baseline existed: same data, same split
        from pipelines import movielens

        path = os.path.join(ROOT, document["parameters"]["data"])
        data = movielens.load_movielens(movielens.MovieLensConfig(data_path=path, mechanism="none"))
        document["popularity_baseline"] = popularity_baseline(data)
    document["parameters"]["png_exposure"] = _shown_path(args.png_exposure) if args.png_exposure else "not written"
    document["parameters"]["png_precision"] = _shown_path(args.png_precision) if args.png_precision else "not written"
    return _write_outputs(document, args)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json:
        return render_from_json(args)
    from tqdm import tqdm

    from benchmarks.machine import machine_info
    from pipelines import movielens
    from tfdp_embed import audit

    argv_list = list(sys.argv[1:] if argv is None else argv)
    command = "python -m benchmarks.secret_sharer " + " ".join(shlex.quote(a) for a in argv_list)
    machine = machine_info(ROOT)
    started = time.perf_counter()

    # RDP, not PLD: dp-accounting 0.4.3's PLD discretisation at sigma <= 0.01 did not finish in 2 minutes here
    # (and held GBs), and PLD calibration + budget bisection cost minutes per calibrated run on this machine.
    # RDP is a valid (slightly looser) accountant: calibrated sigma is a little larger than PLD's.
    base = {
        "data_path": args.data,
        "epochs": args.epochs,
        "seed": args.seed,
        "verbose": args.verbose,
        "accountant": args.accountant,
    }
    base["batch_size"] = args.batch_size
    if args.learning_rate > 0:  # one rate for all runs: the comparison then differs only in clipping and noise
        base["learning_rate"] = args.learning_rate
    if args.delta is not None:
        base["delta"] = args.delta
    data = movielens.load_movielens(movielens.MovieLensConfig(**base, mechanism="none"))
    items = np.arange(1, data.num_items + 1)
    context_length = int(data.train_contexts.shape[1])
    canaries = audit.generate_canaries(
        item_ids=items,
        context_length=context_length,
        seed=args.seed,
        insertion_counts=args.insertion_counts,
        canaries_per_count=args.canaries_per_count,
    )
    candidates = audit.sample_candidates(
        item_ids=items,
        context_length=context_length,
        num_candidates=args.num_candidates,
        seed=args.seed + 1,
        exclude=canaries,
    )
    taken = audit.RandomSequences(
        contexts=np.concatenate([canaries.contexts, candidates.contexts]),
        labels=np.concatenate([canaries.labels, candidates.labels]),
    )
    controls = audit.sample_candidates(
        item_ids=items,
        context_length=context_length,
        num_candidates=args.num_controls,
        seed=args.seed + 2,
        exclude=taken,
    )

    settings = settings_for(args.mechanisms, args.noise_multipliers, args.epsilon if args.epsilon > 0 else None)
    runs = []
    progress = tqdm(settings, desc="secret_sharer", unit="run")
    for setting in progress:
        progress.set_postfix_str(setting.name)
        run = run_setting(
            movielens,
            audit,
            data,
            base,
            setting,
            canaries=canaries,
            candidates=candidates,
            controls=controls,
            out_dir=args.out or None,
        )
        runs.append(run)
        by = run["exposure"]["by_insertion_count"]
        top = str(max(args.insertion_counts))
        tqdm.write(
            f"[secret_sharer] {setting.name:18} P@10 {_fmt(run['precision']['10'], 4)}  eps {_privacy_cell(run)}  "
            f"exposure x{top}: mean {by[top]['mean_exposure']:.2f} (extrapolated "
            f"{by[top]['mean_extrapolated_exposure']:.1f})  control {run['control']['mean_exposure']:.2f}  "
            f"({run['train_seconds']:.0f} s train, {run['audit_seconds']:.0f} s audit)"
        )
        if setting.mechanism == "eana":
            tqdm.write(f"[secret_sharer]   EANA bound: {bound_words(run)}")

    delta = runs[-1]["delta"] if runs else None
    params = {
        "data": _shown_path(args.data),
        "data_summary": json.dumps(data.summary()) if hasattr(data, "summary") else "not recorded",
        "seed": args.seed,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "training": json.dumps(
            {
                k: v
                for k, v in dataclasses.asdict(movielens.MovieLensConfig(**base, mechanism="none")).items()
                if k not in ("data_path", "mechanism", "noise_multiplier", "epsilon")
            },
            default=str,
        ),
        "insertion_counts": list(args.insertion_counts),
        "canaries_per_count": args.canaries_per_count,
        "num_canaries": len(canaries),
        "num_inserted_examples": canaries.num_inserted_examples,
        "num_candidates": args.num_candidates,
        "num_controls": args.num_controls,
        "epsilon": args.epsilon if args.epsilon > 0 else None,
        "delta_words": _fmt(delta, 8) if delta is not None else "the pipeline default (not reported)",
        "png_exposure": _shown_path(args.png_exposure) if args.png_exposure else "not written",
        "png_precision": _shown_path(args.png_precision) if args.png_precision else "not written",
    }
    document = {
        "command": command.strip(),
        "machine": machine,
        "parameters": params,
        "wall_minutes": (time.perf_counter() - started) / 60,
        "peak_rss_mb": _peak_rss_mb(),
        "runs": runs,
        "canaries": canaries.as_dict(),
        "popularity_baseline": popularity_baseline(data),
    }
    document["limits"] = limits_paragraph(runs, params)
    document["notes"] = list(args.note)
    return _write_outputs(document, args)


def _write_outputs(document: dict, args) -> int:
    runs, params = document["runs"], document["parameters"]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(document, f, indent=1, default=str)
    if args.png_exposure:
        plot_exposure(runs, params, args.png_exposure)
    if args.png_precision:
        plot_precision(runs, args.png_precision)
    section = markdown(document)
    if args.results_md:
        outputs.append_section(args.results_md, section, files=(args.json, args.png_exposure, args.png_precision))
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
