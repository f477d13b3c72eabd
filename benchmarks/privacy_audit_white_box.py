"""White-box gradient canaries for `benchmarks.privacy_audit --canary-kind white-box`.

Each setting runs `tfdp_embed.audit.gradient_canaries.gradient_canary_audit`:
m Dirac canaries (clipped gradient C e_i on its own row of an embedding
table, each in with probability 1/2) go through the mechanism's own noising
for T steps at Poisson rate q, the auditor scores each canary by the summed
dot product of the noised updates with its direction, and the bound is the
tightest of Steinke et al.'s and the f-DP analyses (Mahloujifar et al. 2025),
union-bounded over guess pairs and methods. Dense DP-SGD at sigma calibrated
(PLD) for each claimed epsilon at this (q, T); EANA at the sigma of the
largest epsilon; "none" is dense DP-SGD at sigma = 0. LazyDP, DP-FEST,
DP-AdaFEST and DP-AdaFEST+ noise tables from lookups, a lookahead, deferred
noise or a selection, which bare gradient canaries do not provide: audit them
with rare-id canaries (the default kind).

References: Nasr et al., USENIX Security 2023 (Dirac canaries); Steinke, Nasr &
Jagielski, NeurIPS 2023, §6; Mahloujifar, Melis & Chaudhuri, ICML 2025.
"""

from __future__ import annotations

import time

WHITE_BOX_MECHANISMS = ("dense", "eana", "none")
DEFAULTS = {"steps": 10, "sampling_probability": 1.0, "canaries": 100_000}


def max_provable(num_canaries: int, *, delta: float, confidence: float = 0.95) -> float:
    """The most any outcome proves: every guess of the best default pair right, the best method, 3 x G tests."""
    from tfdp_embed.audit.fdp_one_run import METHODS, approx_dp_epsilon_for_counts, gdp_epsilon, mu_for_counts
    from tfdp_embed.audit.one_run import default_guess_pairs, epsilon_for_counts

    pairs = default_guess_pairs(num_canaries)
    significance = (1.0 - confidence) / (len(pairs) * len(METHODS))
    best = 0.0
    for a, b in pairs:
        counts = dict(num_canaries=num_canaries, guesses=a + b, correct=a + b, significance=significance)
        best = max(
            best,
            epsilon_for_counts(delta=delta, **counts),
            approx_dp_epsilon_for_counts(delta=delta, **counts),
            gdp_epsilon(mu_for_counts(**counts), delta),
        )
    return best


def _sigma(epsilon: float, args, delta: float) -> float:
    from tfdp_embed.accounting.calibration import calibrate_noise_multiplier

    return calibrate_noise_multiplier(
        target_epsilon=epsilon, target_delta=delta, sampling_probability=args.sampling_probability, steps=args.steps
    )


def audit_once(args, mechanism: str, epsilon, sigma: float, seed: int, delta: float) -> dict:
    """One white-box audit; its row (the keys of the rare-id rows, plus method and mu_lb)."""
    from tfdp_embed.audit.gradient_canaries import gradient_canary_audit
    from tfdp_embed.mechanisms import EANA, DenseDPSGD

    started = time.perf_counter()
    cls = EANA if mechanism == "eana" else DenseDPSGD
    audit = gradient_canary_audit(
        cls(l2_norm_clip=1.0, noise_multiplier=sigma, seed=seed),
        num_canaries=args.canaries,
        steps=args.steps,
        sampling_probability=args.sampling_probability,
        audit_seed=seed,
        delta=delta,
        where="table",
    )
    still = audit.scores == 0.0
    row = audit.as_dict()
    return {
        **row,
        "mechanism": mechanism,
        "claimed_epsilon": epsilon,
        "accountant_epsilon": row["claimed_epsilon"],
        "by_method": dict(row["by_method"]),
        "seed": seed,
        "zero_scores_in": int(still[audit.included].sum()),
        "zero_scores_out": int(still[~audit.included].sum()),
        "wall_s": time.perf_counter() - started,
    }


def run_all(args, delta: float) -> tuple[list, float | None]:
    """Every (mechanism, epsilon) x repeat; (rows, EANA's sigma)."""
    settings = [(m, eps) for m in args.mechanisms if m == "dense" for eps in args.epsilons]
    settings += [(m, None) for m in args.mechanisms if m != "dense"]
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
                f"[{number}/{total}] white-box {mechanism} {label}: eps_lb={row['epsilon_lb']:.3f} "
                f"({row['method']}, mu_lb={row['mu_lb']:.3f}, {row['correct']}/{row['guesses']} correct) "
                f"{row['wall_s']:.1f} s",
                flush=True,
            )
    return runs, eana_sigma


def markdown(result: dict) -> str:
    """The RESULTS section of a white-box run."""
    info, config = result["machine"], result["config"]
    lines = [
        f"## privacy_audit (white-box) — {info['date_utc']} — gradient canaries vs claimed ε",
        "",
        f"Command: `{result['command']}`",
        "",
        f"Machine: {info['nproc']} cores ({info['cpu_model']}), load average at start "
        f"{info['load_average_at_start']}. Git: {info['git'].get('commit', '?')}. Total wall time "
        f"{result['total_wall_s']:.0f} s.",
        "",
        f"Setup: {config['num_canaries']} Dirac gradient canaries (C e_i on a table row of its own, each in with "
        f"probability 1/2) through the mechanism's noising, q = {config['sampling_probability']}, "
        f"T = {config['steps']}, C = 1, δ = {config['delta']:g} (PLD); scores = summed dot products of the noised "
        "updates; bound = the tightest of Steinke et al. and the f-DP analyses (Gaussian and (ε, δ) curves), "
        f"95 % over all tests; {config['repeats']} run(s) per setting.",
        "",
        "| mechanism | claimed ε | σ | ε lower bound (95 %), each run | method | μ lower bound | correct / guesses |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in result["settings"]:
        rows = [
            r
            for r in result["runs"]
            if (r["mechanism"], r["claimed_epsilon"]) == (s["mechanism"], s["claimed_epsilon"])
        ]
        claimed = "—" if s["claimed_epsilon"] is None else f"{s['claimed_epsilon']:g}"
        lines.append(
            f"| {s['mechanism']} | {claimed} | {s['noise_multiplier']:.4g} | "
            + ", ".join(f"{r['epsilon_lb']:.3f}" for r in rows)
            + " | "
            + ", ".join(sorted({r["method"] for r in rows}))
            + " | "
            + ", ".join(f"{r['mu_lb']:.3f}" for r in rows)
            + " | "
            + ", ".join(f"{r['correct']}/{r['guesses']}" for r in rows)
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


__all__ = ["DEFAULTS", "WHITE_BOX_MECHANISMS", "audit_once", "markdown", "max_provable", "run_all"]
