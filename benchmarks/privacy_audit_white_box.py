"""White-box gradient canaries for `benchmarks.privacy_audit --canary-kind white-box`.

Each setting runs `tfdp_embed.audit.gradient_canaries.gradient_canary_audit`:
m Dirac canaries (clipped gradient C e_i on its own row of an embedding
table, each in with probability 1/2) go through the mechanism's own noising
for T steps at Poisson rate q, the auditor scores each canary by the summed
dot product of the noised updates with its direction, and the bound is the
tightest of Steinke et al.'s and the f-DP analyses (Mahloujifar et al. 2025),
union-bounded over guess pairs and methods. Dense DP-SGD at sigma calibrated
(PLD) for each claimed epsilon at this (q, T), observed step by step; EANA at
the sigma of the largest epsilon; "none" is dense DP-SGD at sigma = 0.
LazyDP, DP-FEST, DP-AdaFEST and DP-AdaFEST+ are observed through the table
they release after T steps of SGD at `--learning-rate` (LazyDP flushed
first), each canary's lookup of its own row passed to the mechanism as a
training step passes it; `plan_run` calibrates them as the rare-id audit does
(`benchmarks.privacy_audit_setup.AuditSetup`): DP-FEST and DP-AdaFEST+ select
top_k = m / 2 rows from the auditor's data (an included canary's row counts 1)
with 10 % of epsilon, DP-AdaFEST splits sigma at sigma1 / sigma2 = 1 with
tau = sigma1 C1. The flag compares each bound with the smaller of the claimed
epsilon and the run's own PLD epsilon (for a selection, its event composed
with the steps: below the plan's basic composition).

References: Nasr et al., USENIX Security 2023 (Dirac canaries); Steinke, Nasr &
Jagielski, NeurIPS 2023, §6; Mahloujifar, Melis & Chaudhuri, ICML 2025.
"""

from __future__ import annotations

import time

WHITE_BOX_MECHANISMS = ("dense", "lazy", "fest", "adafest", "adafest+", "eana", "none")
DP_WHITE_BOX = ("dense", "lazy", "fest", "adafest", "adafest+")
RELEASED = ("lazy", "fest", "adafest", "adafest+")  # observed through the released table
DEFAULTS = {"steps": 10, "sampling_probability": 1.0, "canaries": 100_000}


def max_provable(num_canaries: int, *, delta: float, confidence: float = 0.95) -> float:
    """The most any outcome proves: every guess of the best default pair right, the best method, 3 x G tests."""
    from benchmarks.privacy_audit_report import max_provable_epsilon

    return max_provable_epsilon(num_canaries, delta=delta, confidence=confidence)


def _sigma(epsilon: float, args, delta: float) -> float:
    from tfdp_embed.accounting.calibration import calibrate_noise_multiplier

    return calibrate_noise_multiplier(
        target_epsilon=epsilon, target_delta=delta, sampling_probability=args.sampling_probability, steps=args.steps
    )


def _planned(args, mechanism: str, epsilon: float, seed: int, delta: float):
    """(the mechanism `plan_run` calibrates for `epsilon`, its DP-SGD-equivalent sigma)."""
    from benchmarks.privacy_audit_setup import AuditSetup
    from tfdp_embed import Release, plan_run
    from tfdp_embed.audit.gradient_canaries import TABLE_NAME, canary_inclusion, lookup_counts

    setup, options = AuditSetup(), {}
    if mechanism in ("fest", "adafest+"):
        counts = {TABLE_NAME: lookup_counts(canary_inclusion(args.canaries, audit_seed=seed))}
        options.update(
            releases=[Release.selection(setup.selection_share)], top_k={TABLE_NAME: args.canaries // 2}, counts=counts
        )
    if mechanism in ("adafest", "adafest+") and args.model == "two-tower":  # the MovieLens pipeline's options
        from pipelines.movielens.privacy import ADAFEST_OPTIONS

        options.update(ADAFEST_OPTIONS)
    elif mechanism in ("adafest", "adafest+"):
        options.update(
            contribution_clip=1.0, ratio=setup.adafest_ratio, threshold_sigmas=setup.adafest_threshold_sigmas
        )
    plan = plan_run(
        mechanism,
        target_epsilon=epsilon,
        target_delta=delta,
        sampling_probability=args.sampling_probability,
        steps=args.steps,
        l2_norm_clip=1.0,
        seed=seed,
        **options,
    )
    return plan.mechanism, float(plan.noise_multiplier)


def audit_once(args, mechanism: str, epsilon, sigma: float, seed: int, delta: float) -> dict:
    """One white-box audit; its row (the keys of the rare-id rows, plus method, mu_lb and what was observed)."""
    from tfdp_embed.audit.gradient_canaries import gradient_canary_audit
    from tfdp_embed.mechanisms import EANA, DenseDPSGD

    started = time.perf_counter()
    if mechanism in RELEASED:
        built, sigma = _planned(args, mechanism, epsilon, seed, delta)
    else:
        built = (EANA if mechanism == "eana" else DenseDPSGD)(l2_norm_clip=1.0, noise_multiplier=sigma, seed=seed)
    audit = gradient_canary_audit(
        built,
        num_canaries=args.canaries,
        steps=args.steps,
        sampling_probability=args.sampling_probability,
        audit_seed=seed,
        delta=delta,
        where="scored-table" if args.model == "two-tower" else "table",  # two-tower: its full-softmax item table
        observe="released" if mechanism in RELEASED else "update",
        learning_rate=args.learning_rate,
    )
    still = audit.scores == 0.0
    row = audit.as_dict()
    return {
        **row,
        "mechanism": mechanism,
        "claimed_epsilon": epsilon,
        "accountant_epsilon": row["claimed_epsilon"],
        "noise_multiplier": sigma,
        "mechanism_noise_multiplier": row["noise_multiplier"],
        "by_method": dict(row["by_method"]),
        "seed": seed,
        "zero_scores_in": int(still[audit.included].sum()),
        "zero_scores_out": int(still[~audit.included].sum()),
        "wall_s": time.perf_counter() - started,
    }


def run_all(args, delta: float) -> tuple[list, float | None]:
    """Every (mechanism, epsilon) x repeat; (rows, EANA's sigma)."""
    settings = [(m, eps) for m in args.mechanisms if m in DP_WHITE_BOX for eps in args.epsilons]
    settings += [(m, None) for m in args.mechanisms if m not in DP_WHITE_BOX]
    eana_sigma = _sigma(max(args.epsilons), args, delta) if "eana" in args.mechanisms else None
    runs, total = [], len(settings) * args.repeats
    for index, (mechanism, epsilon) in enumerate(settings):
        sigma = _sigma(epsilon, args, delta) if epsilon else (0.0 if mechanism == "none" else eana_sigma)
        for repeat in range(args.repeats):
            number = index * args.repeats + repeat + 1
            row = audit_once(args, mechanism, epsilon, float(sigma or 0.0), args.seed + repeat, delta)
            runs.append({**row, "repeat": repeat})
            label = f"eps={epsilon:g}" if epsilon else f"sigma={sigma:.4g}"
            print(
                f"[{number}/{total}] white-box {mechanism} ({row['observe']}) {label}: "
                f"eps_lb={row['epsilon_lb']:.3f} ({row['method']}, mu_lb={row['mu_lb']:.3f}, "
                f"{row['correct']}/{row['guesses']} correct, score exactly 0 in/out {row['zero_scores_in']}/"
                f"{row['zero_scores_out']}) {row['wall_s']:.1f} s",
                flush=True,
            )
    return runs, eana_sigma


def flag_epsilon(row: dict) -> float:
    """What a DP row's bound is checked against: the smaller of the claimed and the run's PLD epsilon."""
    accountant = row.get("accountant_epsilon")
    return row["claimed_epsilon"] if accountant is None else min(row["claimed_epsilon"], accountant)


def markdown(result: dict) -> str:
    """The RESULTS section of a white-box run."""
    info, config = result["machine"], result["config"]
    lines = [
        f"## privacy_audit (white-box{', two-tower' if config.get('model') == 'two-tower' else ''}) — "
        f"{info['date_utc']} — gradient canaries vs claimed ε",
        "",
        f"Command: `{result['command']}`",
        "",
        f"Machine: {info['nproc']} cores ({info['cpu_model']}), load average at start "
        f"{info['load_average_at_start']}. Git: {info['git'].get('commit', '?')}. Total wall time "
        f"{result['total_wall_s']:.0f} s.",
        "",
        (
            "Two-tower: the canaries' table is scored as the MovieLens two-tower's full-softmax item table (every "
            "row in every step's gradient, read whatever the data; DP-FEST and DP-AdaFEST+ refuse such a table). "
            if config.get("model") == "two-tower"
            else ""
        )
        + f"Setup: {config['num_canaries']} Dirac gradient canaries (C e_i on a table row of its own, each in with "
        f"probability 1/2) through the mechanism's noising, q = {config['sampling_probability']}, "
        f"T = {config['steps']}, C = 1, δ = {config['delta']:g} (PLD); scores = summed dot products of the noised "
        "updates (observed: update) or the released table's displacement after T SGD steps, flushed first "
        "(observed: released table; each canary's lookup of its own row passed to the mechanism); bound = the "
        "tightest of Steinke et al. and the f-DP analyses (Gaussian and (ε, δ) curves), 95 % over all tests; "
        f"{config['repeats']} run(s) per setting. σ: the DP-SGD-equivalent noise multiplier; run's ε: the "
        "run's events composed by PLD (a selection's event with the steps: below the claimed ε's basic "
        "composition).",
        "",
        "| mechanism | observed | claimed ε | run's ε | σ | ε lower bound (95 %), each run | method | μ lower bound "
        "| correct / guesses | score exactly 0, in / out |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in result["settings"]:
        rows = [
            r
            for r in result["runs"]
            if (r["mechanism"], r["claimed_epsilon"]) == (s["mechanism"], s["claimed_epsilon"])
        ]
        claimed = "—" if s["claimed_epsilon"] is None else f"{s['claimed_epsilon']:g}"
        accountant = rows[0].get("accountant_epsilon")
        run_epsilon = "—" if accountant is None else f"{accountant:.3g}"
        observed = "released table" if rows[0].get("observe") == "released" else "update"
        lines.append(
            f"| {s['mechanism']} | {observed} | {claimed} | {run_epsilon} | {s['noise_multiplier']:.4g} | "
            + ", ".join(f"{r['epsilon_lb']:.3f}" for r in rows)
            + " | "
            + ", ".join(sorted({r["method"] for r in rows}))
            + " | "
            + ", ".join(f"{r['mu_lb']:.3f}" for r in rows)
            + " | "
            + ", ".join(f"{r['correct']}/{r['guesses']}" for r in rows)
            + " | "
            + ", ".join(f"{r['zero_scores_in']}/{r['zero_scores_out']}" for r in rows)
            + " |"
        )
    lines += [
        "",
        f"With m = {config['num_canaries']} canaries no outcome proves more than {result['max_provable_epsilon']:.3f}.",
        "",
        *(result["flags"] or ["No DP mechanism's bound exceeded its claimed ε."]),
        *[f"Note: {n}" for n in result["notes"]],
    ]
    return "\n".join(lines + [""])


__all__ = [
    "DEFAULTS",
    "DP_WHITE_BOX",
    "RELEASED",
    "WHITE_BOX_MECHANISMS",
    "audit_once",
    "flag_epsilon",
    "markdown",
    "max_provable",
    "run_all",
]
