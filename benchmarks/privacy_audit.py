"""One-run privacy audit per mechanism: the empirical epsilon lower bound against the claimed epsilon.

    python -m benchmarks.privacy_audit [--canaries 5000] [--steps 500] [--epsilons 1,4,8]
        [--mechanisms dense,lazy,fest,adafest,adafest+,eana,none] [--repeats 3] [--clip 0.01]
    python -m benchmarks.privacy_audit --canary-kind white-box [--canaries 100000] [--steps 10]
        [--sampling-probability 1] [--mechanisms dense,lazy,fest,adafest,adafest+,eana,none]
    python -m benchmarks.privacy_audit --model two-tower [--canaries 1000] [--epochs 2]
        [--mechanisms dense,lazy,adafest,eana,none] [--repeats 3] [--data PATH/u.data]

`--model two-tower` audits the MovieLens two-tower of `pipelines.movielens`
with its own rare-id canaries (a movie id each; `benchmarks.privacy_audit_two_tower`,
the pipeline's `--audit-canaries` code path) on the pipeline's default data
(ml-100k); `--steps`, `--sampling-probability` and `--real-examples` are the
CTR model's, `--epochs` and `--data` the two-tower's.

`--canary-kind white-box` audits the mechanisms' noising itself with Dirac
gradient canaries (`benchmarks.privacy_audit_white_box`: dense DP-SGD, EANA
and no noise observed step by step, LazyDP, DP-FEST, DP-AdaFEST and
DP-AdaFEST+ through the table they release; `--learning-rate` is that SGD's
rate). With `--model two-tower` the canaries' table is scored as the
two-tower's full-softmax item table is (every row in every step's gradient,
read whatever the data: `where="scored-table"`), for the two-tower's
mechanisms (dense, lazy, adafest, eana, none). The rest of this text is the
default kind, rare-id canaries in a trained model.

For each mechanism and claimed epsilon, `tfdp_embed.keras2.audit_canaries.audit_run`
trains the small CTR-style model of `benchmarks.privacy_audit_setup` once, on
generated click data plus m rare-id canaries (each on its own `C1` row, each
put in with probability 1/2), with sigma calibrated by `plan_run` for the
claimed epsilon at delta = 1e-5 (PLD), and returns the one-run lower bound of
Steinke, Nasr & Jagielski (95 % confidence over the canaries' coin flips and
the training randomness). EANA (not DP) runs at the sigma of the largest
claimed epsilon's DP-SGD run, "none" at sigma = 0. Each setting is repeated
`--repeats` times with other audit, batch, noise and initialisation seeds.

The clip norm defaults to 0.01, small enough that every per-example gradient
is clipped: the canary's whole clipped norm is then signal against noise of
std sigma C (at C = 1 the canary's unclipped gradient is a fraction of C and
the audit is weaker: dense at eps = 8 gave 0.02 with C = 1 against 0.36 with
C = 0.01, one run each, 5000 canaries, 500 steps). The model trains little at
that clip; the audit measures the mechanism, not the model's quality.

Every row says the largest bound m canaries could prove at all (every guess
of the best guess pair correct), and how many canary scores are exactly 0
(the canary's row did not move, or moved too little for float32): DP-FEST and
DP-AdaFEST+ freeze the rows their DP top-k did not select, so those canaries
cannot be told apart by the score. A FLAG line is
printed when a DP mechanism's bound exceeds its claimed epsilon (each bound
holds with 95 %: with many runs, about one in twenty may exceed by chance;
a gross excess is a bug). Nothing is asserted here.

Writes `--json` and `--png` (bound vs claimed epsilon, one line per mechanism,
the y = x line; both default to new files under `benchmarks/results/`);
`make results` regenerates `benchmarks/RESULTS.md` from the JSON files.

References: Steinke, Nasr & Jagielski, "Privacy Auditing with One (1) Training
Run", NeurIPS 2023, §3 (Algorithm 1) and §5 (Corollary 5.4).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
import time

from benchmarks import cli_args, outputs
from benchmarks import privacy_audit_setup as setup_module
from benchmarks import privacy_audit_two_tower as two_tower_module
from benchmarks import privacy_audit_white_box as white_box_module
from benchmarks.privacy_audit_report import markdown, max_provable_epsilon, plot, summarize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RARE_ID_DEFAULTS = {"steps": 500, "sampling_probability": 0.1, "canaries": 5000}
CTR_DEFAULTS = {"clip": 0.01, "learning_rate": 0.5}  # the two-tower takes the pipeline's clip and rates


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m benchmarks.privacy_audit", description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("ctr", "two-tower"), default="ctr", help="the audited model")
    p.add_argument("--epochs", type=int, default=None, help="two-tower: passes over ml-100k (default 2)")
    p.add_argument("--data", default=None, help="two-tower: ratings file (default: the pipeline's, ml-100k)")
    p.add_argument("--batch-size", type=int, default=256, help="two-tower: expected Poisson batch (pipeline's 256)")
    p.add_argument(
        "--canary-kind",
        choices=("rare-id", "white-box"),
        default="rare-id",
        help="rare-id: canaries in a trained model's rows (black box); white-box: gradient canaries through the "
        "mechanism's noising",
    )
    p.add_argument("--canaries", type=int, default=None, help="m, canaries per run (default 5000; white-box 100000)")
    p.add_argument("--epsilons", type=cli_args.floats, default=(1.0, 4.0, 8.0), help="claimed epsilons")
    p.add_argument("--mechanisms", default=None, help="comma-separated subset (default: all of the kind)")
    p.add_argument("--steps", type=int, default=None, help="T, Poisson-sampled steps (default 500; white-box 10)")
    p.add_argument("--repeats", type=int, default=3, help="runs per setting, each with other seeds")
    p.add_argument("--real-examples", type=int, default=5000, help="generated click examples (besides canaries)")
    p.add_argument(
        "--tables",
        choices=tuple(setup_module.TABLE_SIZES),
        default="small",
        help="CTR: the real rows of C1, C2, C3: small (200, 50, 20) or table3 (Criteo's, DP-FEST Table 3)",
    )
    p.add_argument("--sampling-probability", type=float, default=None, help="q (default 0.1; white-box 1)")
    p.add_argument(
        "--clip",
        type=float,
        default=None,
        help="per-example l2 clip norm C (CTR: 0.01, every gradient clipped; two-tower: the pipeline's 1.0)",
    )
    p.add_argument("--learning-rate", type=float, default=None, help="legacy SGD rate (CTR 0.5; two-tower: pipeline's)")
    p.add_argument("--seed", type=int, default=0, help="first seed; repeat r uses seed + r")
    p.add_argument("--json", default=outputs.AUTO, help="'auto': a new file under benchmarks/results/; '' skips")
    p.add_argument("--png", default=outputs.AUTO, help="'auto': a new file under benchmarks/results/; '' skips")
    p.add_argument("--results-md", default=outputs.RESULTS_MD, help="'' skips")
    p.add_argument("--note", action="append", default=[], help="a sentence added under the table")
    args = p.parse_args(argv)
    _complete(p, args)
    if args.model == "two-tower" and args.canary_kind == "white-box":
        tag = f"two-tower-m{args.canaries}-T{args.steps}-eps{outputs.range_tag(args.epsilons)}-white-box"
    elif args.model == "two-tower":
        tag = f"two-tower-m{args.canaries}-ep{args.epochs}-eps{outputs.range_tag(args.epsilons)}"
    else:
        kind = "-white-box" if args.canary_kind == "white-box" else ""
        tables = "" if args.tables == "small" else f"-{args.tables}"
        tag = f"m{args.canaries}-T{args.steps}-eps{outputs.range_tag(args.epsilons)}{kind}{tables}"
    outputs.resolve(p, args, benchmark="privacy_audit", tag=tag, files={"json": ".json", "png": ".png"})
    return args


def _complete(p, args) -> None:
    """Fills the defaults of the model and canary kind; refuses mechanisms they cannot audit."""
    white_box, two_tower = args.canary_kind == "white-box", args.model == "two-tower"
    if white_box and two_tower:  # the item table scored by the full softmax (`where="scored-table"`)
        allowed, defaults = two_tower_module.TWO_TOWER_MECHANISMS, {**white_box_module.DEFAULTS, **CTR_DEFAULTS}
    elif two_tower:
        allowed, defaults = two_tower_module.TWO_TOWER_MECHANISMS, two_tower_module.DEFAULTS
    elif white_box:
        allowed, defaults = white_box_module.WHITE_BOX_MECHANISMS, {**white_box_module.DEFAULTS, **CTR_DEFAULTS}
    else:
        allowed, defaults = setup_module.MECHANISMS, {**RARE_ID_DEFAULTS, **CTR_DEFAULTS}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.mechanisms = tuple(m for m in (args.mechanisms or ",".join(allowed)).split(",") if m)
    unknown = sorted(set(args.mechanisms) - set(allowed))
    if unknown:
        what = " ".join([*(["--model two-tower"] if two_tower else []), f"--canary-kind {args.canary_kind}"])
        p.error(f"--mechanisms: {unknown} not for {what}; allowed: {','.join(allowed)}")
    if not args.epsilons or min(args.epsilons) <= 0:
        p.error(f"--epsilons must be positive numbers; received {args.epsilons!r}")


def _settings(mechanisms, epsilons) -> list:
    """(mechanism, claimed epsilon or None): DP mechanisms at every epsilon, EANA and none once."""
    runs = [(m, eps) for m in mechanisms if m in setup_module.DP_MECHANISMS for eps in epsilons]
    return runs + [(m, None) for m in mechanisms if m in setup_module.NOT_DP]


def _audit_once(setup, mechanism: str, epsilon, sigma, seed: int) -> dict:
    """One audited training run; its row (bound, guesses, sigma, canary scores exactly 0, wall time)."""
    from tfdp_embed import keras
    from tfdp_embed.keras2.audit_canaries import audit_run, draw_inclusion

    started = time.perf_counter()
    keras.utils.set_random_seed(seed)
    examples = setup_module.real_examples(setup)
    counts = setup_module.training_counts(setup, examples, draw_inclusion(setup.num_canaries, audit_seed=seed))
    plan = setup_module.make_plan(
        setup, mechanism, epsilon=epsilon, noise_multiplier=None if epsilon else sigma, counts=counts, seed=seed
    )
    audit = audit_run(
        lambda: setup_module.build_model(setup),
        examples,
        plan=plan,
        first_canary_id=setup.first_canary_id,
        num_canaries=setup.num_canaries,
        audit_seed=seed,
        batch_seed=seed,
        optimizer_fn=lambda: keras.optimizers.legacy.SGD(setup.learning_rate),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
        table="embedding_C1",
        canary_examples=setup_module.canary_examples,
    )
    still = audit.scores == 0.0
    return {
        **audit.as_dict(),
        "claimed_epsilon": epsilon,
        "noise_multiplier": plan.noise_multiplier,
        "noise_source": plan.noise_source,
        "mechanism_arguments": {k: v for k, v in plan.mechanism_arguments.items() if isinstance(v, (int, float))},
        "seed": seed,
        "zero_scores_in": int(still[audit.included].sum()),
        "zero_scores_out": int(still[~audit.included].sum()),
        "wall_s": time.perf_counter() - started,
    }


def _reference_sigma(setup, epsilons) -> float:
    """DP-SGD's sigma at the largest claimed epsilon: the sigma EANA runs at."""
    plan = setup_module.make_plan(setup, "dense", epsilon=max(epsilons), seed=0)
    return float(plan.noise_multiplier)


def _run_all(args, setup) -> tuple[list, float]:
    settings = _settings(args.mechanisms, args.epsilons)
    sigma = _reference_sigma(setup, args.epsilons) if "eana" in args.mechanisms else None
    runs, total = [], len(settings) * args.repeats
    for index, (mechanism, epsilon) in enumerate(settings):
        noise = 0.0 if mechanism == "none" else sigma
        for repeat in range(args.repeats):
            number = index * args.repeats + repeat + 1
            label = f"eps={epsilon:g}" if epsilon else ("sigma=0" if noise == 0.0 else f"sigma={noise:.4g}")
            print(f"[{number}/{total}] {mechanism} {label} repeat {repeat + 1} ...", flush=True)
            row = _audit_once(setup, mechanism, epsilon, noise, args.seed + repeat)
            runs.append({**row, "repeat": repeat})
            print(
                f"[{number}/{total}] {mechanism} {label}: sigma={row['noise_multiplier']:.4g} "
                f"eps_lb={row['epsilon_lb']:.3f} ({row['correct']}/{row['guesses']} correct, "
                f"score exactly 0 in/out {row['zero_scores_in']}/{row['zero_scores_out']}) {row['wall_s']:.1f} s",
                flush=True,
            )
    return runs, sigma


def _flags(runs) -> list:
    """A line per DP run whose bound exceeds its claimed epsilon (white-box: or the run's own PLD epsilon)."""
    return [
        f"FLAG: {r['mechanism']} at claimed eps={r['claimed_epsilon']:g} (seed {r['seed']}): lower bound "
        f"{r['epsilon_lb']:.3f} > {white_box_module.flag_epsilon(r):.3f}: the run leaked more than its guarantee "
        "allows (a bug, or the 5 % chance of the 95 % bound)."
        for r in runs
        if r["mechanism"] in setup_module.DP_MECHANISMS and r["epsilon_lb"] > white_box_module.flag_epsilon(r)
    ]


def main(argv=None) -> int:
    args = _parse(argv)
    from benchmarks.machine import machine_info

    info = machine_info(ROOT)
    command = "python -m benchmarks.privacy_audit " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    setup = setup_module.AuditSetup(
        num_canaries=args.canaries,
        steps=args.steps,
        num_real=args.real_examples,
        vocab_sizes=setup_module.TABLE_SIZES[args.tables],
        sampling_probability=args.sampling_probability,
        l2_norm_clip=args.clip,
        learning_rate=args.learning_rate,
    )
    print(f"privacy_audit: {command} (load average {info['load_average_at_start']})", flush=True)
    started = time.perf_counter()
    runs, sigma, ceiling, config, section_of = _run_kind(args, setup)
    result = {
        "benchmark": "privacy_audit",
        "command": command,
        "machine": info,
        "config": config,
        "eana_noise_multiplier": sigma,
        "max_provable_epsilon": ceiling,
        "runs": runs,
        "settings": summarize(runs),
        "flags": _flags(runs),
        "notes": list(args.note),
    }
    if args.model == "two-tower" and args.canary_kind == "rare-id":
        result["gaps"] = two_tower_module.gaps(result["settings"])
    result["total_wall_s"] = time.perf_counter() - started
    section = section_of(result)
    outputs.write_run(args, result, plot=lambda path: plot(result, path), section=lambda **_: section)
    print(section)
    for line in result["flags"]:
        print(line, flush=True)
    return 0


def _run_kind(args, setup) -> tuple:
    """(runs, EANA's sigma, the most m canaries can prove, config, the Markdown section's function)."""
    run = dict(epsilons=list(args.epsilons), repeats=args.repeats, canary_kind=args.canary_kind, model=args.model)
    if args.model == "two-tower" and args.canary_kind == "rare-id":
        runs, sigma, extra = two_tower_module.run_all(args)
        ceiling = white_box_module.max_provable(args.canaries, delta=two_tower_module.DELTA)
        config = {"num_canaries": args.canaries, "delta": two_tower_module.DELTA, **extra, **run}
        return runs, sigma, ceiling, config, two_tower_module.markdown
    if args.canary_kind == "white-box":
        runs, sigma = white_box_module.run_all(args, setup.delta)
        ceiling = white_box_module.max_provable(args.canaries, delta=setup.delta)
        keep = ("num_canaries", "steps", "sampling_probability", "delta", "accountant")
        config = {**{k: getattr(setup, k) for k in keep}, "l2_norm_clip": 1.0, **run}
        return runs, sigma, ceiling, config, white_box_module.markdown
    runs, sigma = _run_all(args, setup)
    ceiling = max_provable_epsilon(setup.num_canaries, delta=setup.delta, confidence=0.95)
    return runs, sigma, ceiling, {**dataclasses.asdict(setup), **run}, markdown


if __name__ == "__main__":
    sys.exit(main())
