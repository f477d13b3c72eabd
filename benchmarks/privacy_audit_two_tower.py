"""Rare-id canaries in the MovieLens two-tower for `benchmarks.privacy_audit --model two-tower`.

Each setting is one `pipelines.movielens.train_and_evaluate` audit run
(`--audit-canaries M`, `pipelines/movielens/audit.py`): M canaries, each a
movie id of its own (context [id], label id) put into the training pool with
probability 1/2, the two-tower trained as the pipeline trains it (legacy SGD
with momentum, full softmax over all items, Poisson batches). Two scores per
canary, each with the bound of `tfdp_embed.audit.fdp_one_run.audit_lower_bound`
(the tightest of Steinke et al.'s and the f-DP analyses, 95 %; each bound
holds on its own):

- row moved (the table's bound): how far the canary's history row in the
  released (flushed) model lies from its initial value, read as the CTR
  audit reads a row (`tfdp_embed.keras2.audit_canaries`); the initial values
  are the pipeline's model rebuilt at the run's seed. A row no update moved
  scores exactly 0.
- log-prob: the pipeline's own score (report.json `audit`), log P(label |
  context) under the released model alone. Weaker: a canary's single
  update at the pipeline's rate does not reliably raise its own
  log-probability (on 40 generated users, without noise, the included
  canaries' mean log-probability came out lower than the excluded ones').

Dense DP-SGD, LazyDP and DP-AdaFEST run at the sigma the pipeline calibrates
for each claimed epsilon at delta = 1e-5 (its plan, PLD, with the DP release
of the dataset size; DP-AdaFEST's split into sigma1 and sigma2 by
`pipelines.movielens.privacy.ADAFEST_OPTIONS`); EANA (not DP) at dense
DP-SGD's sigma for the largest claimed epsilon; "none" without noise.

DP-FEST and DP-AdaFEST+ are not in the pipeline's two-tower
(`pipelines.movielens.privacy.REFUSED_MECHANISMS`): they update only the rows
a frequency selection picked before training, and the full softmax scores
every item row every step; they are audited on the CTR model.

References: Steinke, Nasr & Jagielski, NeurIPS 2023; Mahloujifar, Melis &
Chaudhuri, ICML 2025.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

TWO_TOWER_MECHANISMS = ("dense", "lazy", "adafest", "eana", "none")
DP = ("dense", "lazy", "adafest")
DEFAULTS = {"canaries": 2000, "epochs": 2}
DELTA = 1e-5


def base_config(args):
    """The pipeline config every setting starts from (audit run, delta 1e-5, few test examples: no metrics here)."""
    from pipelines import movielens

    extra = {"data_path": args.data} if args.data else {}
    if args.clip is not None:
        extra["l2_norm_clip"] = args.clip
    return movielens.MovieLensConfig(
        epochs=args.epochs,
        batch_size=args.batch_size,
        delta=DELTA,
        audit_canaries=args.canaries,
        learning_rate=args.learning_rate,
        max_test_examples=100,
        eana_bound_examples=0,
        verbose=0,
        seed=args.seed,
        **extra,
    )


def reference_sigma(base, data, epsilon: float) -> float:
    """Dense DP-SGD's sigma at `epsilon` as the pipeline plans it (with the canaries of seed `base.seed`)."""
    from pipelines.movielens import audit as movielens_audit
    from pipelines.movielens.training import plan_training

    config = dataclasses.replace(base, mechanism="dense", epsilon=epsilon)
    extended, extra, _ = movielens_audit.prepare(config, data, None)
    return float(plan_training(config, extended, extra).plan.noise_multiplier)


def _initial_history_rows(config, data, canaries) -> np.ndarray:
    """The canaries' history rows as the run initialised them: the pipeline's model rebuilt at `config.seed`.

    `pipelines.movielens.training.build_model` seeds Keras with `config.seed` and builds the two-tower
    first; the same construction gives the same initial values (rows no update touched read back equal).
    """
    from tfdp_embed import keras
    from tfdp_embed.keras2.models.two_tower import TwoTowerModel

    keras.utils.set_random_seed(config.seed)
    model = TwoTowerModel(
        num_items=data.num_items + config.audit_canaries,
        embedding_dim=config.embedding_dim,
        hidden_units=tuple(config.hidden_units),
    )
    model(canaries.contexts[:8])
    return model.history_embedding.weights[0].numpy()[canaries.labels]


def _scores(result, config, data) -> tuple:
    """(log-prob scores [M], row-moved scores [M], included [M]) of the canaries of `config.seed`.

    log-prob: the pipeline's score, log P(label | context) under the released model. Row moved: the l2
    distance of the canary's history row in the released model from its initial value (as the CTR audit,
    `tfdp_embed.keras2.audit_canaries`, reads a row against its initial value): exactly 0 for a row no update
    moved.
    """
    from pipelines.movielens import audit as movielens_audit

    _, _, canaries = movielens_audit.prepare(config, data, None)
    log_probs = result.log_probs(canaries.contexts, canaries.labels)
    released = result.model.history_embedding.weights[0].numpy()[canaries.labels]
    moved = np.linalg.norm(released - _initial_history_rows(config, data, canaries), axis=1).astype(np.float64)
    return log_probs, moved, canaries.included


def audit_once(base, data, mechanism: str, epsilon, sigma, seed: int) -> dict:
    """One audited two-tower run; its row (the keys of the CTR rows, plus the pipeline's log-prob bound)."""
    from pipelines import movielens
    from tfdp_embed.audit.fdp_one_run import audit_lower_bound

    started = time.perf_counter()
    config = dataclasses.replace(
        base,
        mechanism=mechanism,
        epsilon=epsilon,
        noise_multiplier=None if epsilon or mechanism == "none" else sigma,
        seed=seed,
    )
    result = movielens.train_and_evaluate(config, data=data)
    report, audit = result.report, result.report["audit"]
    log_probs, scores, included = _scores(result, config, data)
    bound = audit_lower_bound(scores, included, delta=audit["delta"], confidence=audit["confidence"])
    still = scores == 0.0
    return {
        "mechanism": mechanism,
        "claimed_epsilon": epsilon,
        "report_epsilon": report.get("epsilon"),
        "noise_multiplier": report["noise_multiplier"],
        "num_canaries": audit["canaries"],
        "num_included": audit["canaries_included"],
        **{k: v for k, v in bound.as_dict().items() if k not in ("delta", "confidence", "num_canaries")},
        "log_prob": {k: audit[k] for k in ("epsilon_lb", "method", "mu_lb", "correct", "guesses")},
        "log_prob_mean_in_out": [float(np.mean(log_probs[included])), float(np.mean(log_probs[~included]))],
        "zero_scores_in": int(still[included].sum()),
        "zero_scores_out": int(still[~included].sum()),
        "steps": report.get("steps_run"),
        "learning_rate": config.resolved_learning_rate,
        "seed": seed,
        "wall_s": time.perf_counter() - started,
    }


def run_all(args) -> tuple[list, float | None, dict]:
    """Every (mechanism, epsilon) x repeat; (rows, EANA's sigma, the data's summary)."""
    from pipelines import movielens

    base = base_config(args)
    data = movielens.load_movielens(base)
    settings = [(m, eps) for m in args.mechanisms if m in DP for eps in args.epsilons]
    settings += [(m, None) for m in args.mechanisms if m not in DP]
    eana_sigma = reference_sigma(base, data, max(args.epsilons)) if "eana" in args.mechanisms else None
    runs, total = [], len(settings) * args.repeats
    for index, (mechanism, epsilon) in enumerate(settings):
        sigma = 0.0 if mechanism == "none" else eana_sigma
        for repeat in range(args.repeats):
            number = index * args.repeats + repeat + 1
            label = f"eps={epsilon:g}" if epsilon else f"sigma={sigma:.4g}"
            print(f"[{number}/{total}] two-tower {mechanism} {label} repeat {repeat + 1} ...", flush=True)
            row = audit_once(base, data, mechanism, epsilon, sigma, args.seed + repeat)
            runs.append({**row, "repeat": repeat})
            print(
                f"[{number}/{total}] two-tower {mechanism} {label}: sigma={row['noise_multiplier']:.4g} "
                f"eps_lb={row['epsilon_lb']:.3f} ({row['method']}, {row['correct']}/{row['guesses']} correct, "
                f"scores exactly 0 in/out {row['zero_scores_in']}/{row['zero_scores_out']}); pipeline's log-prob "
                f"score: {row['log_prob']['epsilon_lb']:.3f} ({row['log_prob']['correct']}/"
                f"{row['log_prob']['guesses']}) {row['wall_s']:.1f} s",
                flush=True,
            )
    config = {
        **{k: getattr(base, k) for k in ("epochs", "batch_size", "embedding_dim", "momentum", "l2_norm_clip")},
        "hidden_units": list(base.hidden_units),
        "accountant": base.accountant,
        "data_path": base.data_path,
    }
    return runs, eana_sigma, {"data": data.summary(), **config}


def gaps(settings: list) -> dict:
    """Median bound of EANA and none minus the highest DP median (dense at EANA's sigma first)."""
    by = {(s["mechanism"], s["claimed_epsilon"]): s for s in settings}
    dp = [s for s in settings if s["mechanism"] in DP]
    if not dp:
        return {}
    top = max(s["claimed_epsilon"] for s in dp)
    reference = by.get(("dense", top)) or max(dp, key=lambda s: s["epsilon_lb_median"])
    out = {"reference": f"{reference['mechanism']} at ε = {reference['claimed_epsilon']:g}"}
    out["reference_median"] = reference["epsilon_lb_median"]
    out["dp_max"] = max(max(s["epsilon_lb"]) for s in dp)
    for name in ("eana", "none"):
        if (name, None) in by:
            out[name] = by[(name, None)]["epsilon_lb_median"] - reference["epsilon_lb_median"]
    return out


def _gap_line(result: dict) -> str:
    gap = result.get("gaps") or {}
    by = {s["mechanism"]: s for s in result["settings"] if s["claimed_epsilon"] is None}
    parts = [
        f"{name} {by[name]['epsilon_lb_median']:.3f} (+{gap[name]:.3f})" for name in ("eana", "none") if name in gap
    ]
    if not parts:
        return ""
    return (
        f"Median bounds above {gap['reference']} ({gap['reference_median']:.3f}, at EANA's σ): "
        + "; ".join(parts)
        + f". The highest bound of any DP run: {gap['dp_max']:.3f}."
    )


def _row_line(s: dict, result: dict) -> str:
    rows = [
        r for r in result["runs"] if (r["mechanism"], r["claimed_epsilon"]) == (s["mechanism"], s["claimed_epsilon"])
    ]
    claimed = "—" if s["claimed_epsilon"] is None else f"{s['claimed_epsilon']:g}"
    return (
        f"| {s['mechanism']} | {claimed} | {s['noise_multiplier']:.4g} | "
        + ", ".join(f"{r['epsilon_lb']:.3f}" for r in rows)
        + f" | {', '.join(sorted({r['method'] for r in rows}))} | "
        + ", ".join(f"{r['correct']}/{r['guesses']}" for r in rows)
        + " | "
        + ", ".join(f"{r['zero_scores_in']}/{r['zero_scores_out']}" for r in rows)
        + " | "
        + ", ".join(f"{r['log_prob']['epsilon_lb']:.3f}" for r in rows)
        + f" | {result['max_provable_epsilon']:.3f} |"
    )


def markdown(result: dict) -> str:
    """The section of a two-tower run (printed, and appended to `--results-md`)."""
    info, config = result["machine"], result["config"]
    lines = [
        f"## privacy_audit (two-tower) — {info['date_utc']} — rare-id canaries in the MovieLens two-tower",
        "",
        f"Command: `{result['command']}`",
        "",
        f"Machine: {info['nproc']} cores ({info['cpu_model']}), load average at start "
        f"{info['load_average_at_start']}. Git: {info['git'].get('commit', '?')}. Total wall time "
        f"{result['total_wall_s']:.0f} s.",
        "",
        f"Setup: `pipelines.movielens` audit runs on {config['data_path']} ({config['epochs']} epochs, batch "
        f"{config['batch_size']}, dim {config['embedding_dim']}, clip {config['l2_norm_clip']}), "
        f"{config['num_canaries']} canaries (a movie id each, in with probability 1/2), δ = {config['delta']:g}, "
        f"95 %, {config['repeats']} run(s) per setting. Row-moved score: how far the canary's history row in the "
        "released model lies from its initial value (l2; exactly 0 for a row no update moved). The pipeline's score (its report.json `audit`): log P(label | context) alone.",
        "",
        "| mechanism | claimed ε | σ | ε lower bound (95 %), row-moved score, each run | method | correct / guesses "
        "| scores exactly 0 (in / out) | ε lower bound, pipeline's log-prob score | most m canaries can prove |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in result["settings"]:
        lines.append(_row_line(s, result))
    lines += ["", _gap_line(result), "", *(result["flags"] or ["No DP mechanism's bound exceeded its claimed ε."])]
    return "\n".join(lines + [f"Note: {n}" for n in result["notes"]] + [""])


__all__ = ["DEFAULTS", "DP", "TWO_TOWER_MECHANISMS", "audit_once", "gaps", "markdown", "run_all"]
