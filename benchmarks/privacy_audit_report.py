"""Table, plot and summary of `benchmarks.privacy_audit` (no TensorFlow import here)."""

from __future__ import annotations

import statistics

from benchmarks.privacy_audit_setup import DP_MECHANISMS, NOT_DP


def _all_correct_epsilon(num_canaries: int, guesses: int, *, delta: float, significance: float) -> float:
    """The bound of `guesses` guesses all correct, the best of `audit_lower_bound`'s methods at `significance`."""
    from tfdp_embed.audit.fdp_one_run import approx_dp_epsilon_for_counts, gdp_epsilon, mu_for_counts
    from tfdp_embed.audit.one_run import epsilon_for_counts

    counts = dict(num_canaries=num_canaries, guesses=guesses, correct=guesses, significance=significance)
    return max(
        epsilon_for_counts(delta=delta, **counts),
        approx_dp_epsilon_for_counts(delta=delta, **counts),
        gdp_epsilon(mu_for_counts(**counts), delta),
    )


def max_provable_epsilon(num_canaries: int, *, delta: float, confidence: float) -> float:
    """The largest bound m canaries can give at all: every guess of the best default pair correct.

    Each (pair, method) of `default_guess_pairs(m)` x `METHODS` is tested at (1 - confidence) / (pairs x
    methods), as `audit_lower_bound` does; all r = k+ + k- guesses correct is the best outcome of a pair.
    """
    from tfdp_embed.audit.fdp_one_run import METHODS
    from tfdp_embed.audit.one_run import default_guess_pairs

    pairs = default_guess_pairs(num_canaries)
    significance = (1.0 - confidence) / (len(pairs) * len(METHODS))
    return max(_all_correct_epsilon(num_canaries, a + b, delta=delta, significance=significance) for a, b in pairs)


def summarize(runs: list) -> list:
    """One entry per (mechanism, claimed epsilon), in run order, with every repeat's bound and guesses."""
    groups: dict = {}
    for r in runs:
        groups.setdefault((r["mechanism"], r["claimed_epsilon"]), []).append(r)
    settings = []
    for (mechanism, epsilon), rows in groups.items():
        bounds = [r["epsilon_lb"] for r in rows]
        settings.append(
            {
                "mechanism": mechanism,
                "claimed_epsilon": epsilon,
                "noise_multiplier": rows[0]["noise_multiplier"],
                "num_canaries": rows[0]["num_canaries"],
                "epsilon_lb": bounds,
                "epsilon_lb_median": statistics.median(bounds),
                "epsilon_lb_max": max(bounds),
                "method": [r["method"] for r in rows],
                "correct": [r["correct"] for r in rows],
                "guesses": [r["guesses"] for r in rows],
                "zero_scores_in": [r["zero_scores_in"] for r in rows],
                "zero_scores_out": [r["zero_scores_out"] for r in rows],
                "num_included": [r["num_included"] for r in rows],
                "wall_s": [r["wall_s"] for r in rows],
            }
        )
    return settings


def _claimed(s: dict) -> str:
    if s["mechanism"] in NOT_DP:
        return "— (" + ("not DP" if s["mechanism"] == "eana" else "non-private") + ")"
    return f"{s['claimed_epsilon']:g}"


def _table(settings: list, ceiling: float) -> list:
    lines = [
        "| mechanism | claimed ε | σ | canaries m | ε lower bound (95 %), each run | method | correct / guesses | "
        "canary scores exactly 0 (in / out) | most m canaries can prove | wall |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in settings:
        lines.append(
            f"| {s['mechanism']} | {_claimed(s)} | {s['noise_multiplier']:.4g} | {s['num_canaries']} | "
            + ", ".join(f"{b:.3f}" for b in s["epsilon_lb"])
            + f" | {', '.join(sorted(set(s['method'])))} | "
            + ", ".join(f"{c}/{g}" for c, g in zip(s["correct"], s["guesses"]))
            + " | "
            + ", ".join(f"{a}/{b}" for a, b in zip(s["zero_scores_in"], s["zero_scores_out"]))
            + f" | {ceiling:.3f} | "
            + ", ".join(f"{w:.0f} s" for w in s["wall_s"])
            + " |"
        )
    return lines


def pair_ceiling(row: dict) -> float:
    """The most a run's best pair could prove: all its k+ + k- guesses correct, at (1 - confidence) / tests."""
    significance = (1.0 - row["confidence"]) / row["num_tests"]
    return _all_correct_epsilon(row["num_canaries"], row["guesses"], delta=row["delta"], significance=significance)


def _eana_cap(result: dict) -> str:
    """Why EANA's bound stops where it does (the score's sign, not the leak)."""
    rows = [r for r in result["runs"] if r["mechanism"] == "eana" and r["correct"] == r["guesses"]]
    if not rows:
        return ""
    row = max(rows, key=lambda r: r["epsilon_lb"])
    return (
        f" Its best run guessed {row['correct']}/{row['guesses']} correctly ((k+, k-) = ({row['k_plus']}, "
        f"{row['k_minus']})), the most that pair can prove ({pair_ceiling(row):.3f}): the leak is larger than the "
        'bound shows, but an included canary\'s score can be negative (noise), so guessing "out" for the lowest '
        "scores fails and only one-sided pairs are all correct"
    )


def _eana_line(result: dict) -> list:
    by = {(s["mechanism"], s["claimed_epsilon"]): s for s in result["settings"]}
    eana = by.get(("eana", None))
    if eana is None:
        return []
    top = max(result["config"]["epsilons"])
    dense = by.get(("dense", top))
    text = f"EANA (not DP) at σ = {eana['noise_multiplier']:.4g} (DP-SGD's σ for ε = {top:g}): median bound "
    text += f"{eana['epsilon_lb_median']:.3f}"
    if dense is not None:
        gap = eana["epsilon_lb_median"] - dense["epsilon_lb_median"]
        text += (
            f", against {dense['epsilon_lb_median']:.3f} for dense DP-SGD at the same σ: higher by {gap:.3f}. "
            "EANA adds no noise to rows no example in the batch touched, so an excluded canary's row never moves "
            "(score exactly 0), which the audit reads directly."
        )
    text = text.rstrip(".") + "." + _eana_cap(result)
    return ["", text.rstrip(".") + "."]


def _selection_line(result: dict) -> list:
    picked = [s for s in result["settings"] if s["mechanism"] in ("fest", "adafest+")]
    if not picked:
        return []
    m = picked[0]["num_canaries"]
    parts = [
        f"{s['mechanism']} ε = {s['claimed_epsilon']:g}: "
        + ", ".join(f"{a + b}" for a, b in zip(s["zero_scores_in"], s["zero_scores_out"]))
        for s in picked
    ]
    return [
        "",
        "DP-FEST and DP-AdaFEST+ select each table's top-k rows (k = the real vocabulary) with DP top-k on the "
        "bucket counts of the data trained on (an included canary's row counts 1, an excluded one 0) and never "
        "update the other rows: an unselected canary's row never moves and its score is exactly 0 whether it was "
        f"in or out, so only the selected ones carry signal. Canary scores exactly 0, of {m}, each run: "
        + "; ".join(parts)
        + ".",
    ]


def markdown(result: dict) -> str:
    info, config = result["machine"], result["config"]
    lines = [
        f"## privacy_audit — {info['date_utc']} — one-run ε lower bound vs claimed ε, per mechanism",
        "",
        f"Command: `{result['command']}`",
        "",
        f"Machine: {info['nproc']} cores ({info['cpu_model']}), load average at start "
        f"{info['load_average_at_start']} (shared, busy machine). Git: {info['git'].get('commit', '?')}. "
        f"Total wall time {result['total_wall_s']:.0f} s.",
        "",
        f"Setup: {config['num_real']} generated click examples, tables C1/C2/C3 of "
        f"{'/'.join(str(v) for v in config['vocab_sizes'])} real rows (dim {config['dim']}) + Dense "
        f"{config['hidden']} + logit; {config['num_canaries']} canaries on rows of C1 no real example touches, "
        f"each in with probability 1/2; q = {config['sampling_probability']}, T = {config['steps']}, clip "
        f"{config['l2_norm_clip']}, SGD {config['learning_rate']}, δ = {config['delta']:g} "
        f"({config['accountant'].upper()}), 95 % confidence, {config['repeats']} run(s) per setting (other seeds).",
        "",
        *_table(result["settings"], result["max_provable_epsilon"]),
        "",
        f"With m = {config['num_canaries']} canaries no outcome proves more than "
        f"{result['max_provable_epsilon']:.3f} (all guesses of the best pair correct): a claimed ε above that "
        "cannot be refuted by this audit at all.",
        *_eana_line(result),
        *_selection_line(result),
    ]
    lines += [""] + (result["flags"] or ["No DP mechanism's bound exceeded its claimed ε."])
    lines += [f"Note: {n}" for n in result["notes"]]
    return "\n".join(lines + [""])


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    epsilons = sorted(result["config"]["epsilons"])
    ax.plot(epsilons, epsilons, color="black", linestyle=":", label="y = x (claimed ε)")
    ax.axhline(result["max_provable_epsilon"], color="grey", linestyle="--", label="most m canaries can prove")
    for mechanism in DP_MECHANISMS:
        rows = [s for s in result["settings"] if s["mechanism"] == mechanism]
        if rows:
            xs = [s["claimed_epsilon"] for s in rows]
            (line,) = ax.plot(xs, [s["epsilon_lb_median"] for s in rows], marker="o", label=f"{mechanism} (median)")
            for s in rows:
                ax.scatter([s["claimed_epsilon"]] * len(s["epsilon_lb"]), s["epsilon_lb"], color=line.get_color(), s=10)
    for s in (s for s in result["settings"] if s["mechanism"] in NOT_DP):
        label = f"{s['mechanism']} σ={s['noise_multiplier']:.3g} (not DP / no noise)"
        ax.axhline(
            s["epsilon_lb_median"], linestyle="-.", color="C7" if s["mechanism"] == "none" else "C9", label=label
        )
    ax.set_xlabel(f"claimed ε (δ = {result['config']['delta']:g})")
    ax.set_ylabel("one-run ε lower bound (95 %)")
    model = "MovieLens two-tower" if result["config"].get("model") == "two-tower" else "CTR model"
    canaries = f"rare-id canaries in the {model}"
    if result["config"].get("canary_kind") == "white-box":
        canaries = "white-box gradient canaries"
    ax.set_title(f"One-run privacy audit, {canaries}, m = {result['config']['num_canaries']}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
