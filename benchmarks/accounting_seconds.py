"""Seconds of privacy accounting in one Criteo-default run, stage by stage, and how many PLD compositions each needs.

    python -m benchmarks.accounting_seconds [--mechanism lazy]

Replays, in one process and without training, every epsilon computation of
`python -m pipelines.criteo --epochs 1` on its default data (N = 200,000,
B = 2,048, T = 98, epsilon 3, delta 1 / N, 5% of epsilon for the output
calibration, PLD): the plan (noise calibration), `PrivacyBudget.on_train_begin`
(the step search), the epoch-end epsilon, and the privacy report. Prints the
seconds of each, the number of PLD compositions it ran (what the memo saves)
and the epsilons (which the memo must not change). Run it from two checkouts
to compare; it writes no file.
"""

from __future__ import annotations

import argparse
import collections
import time
from collections.abc import Sequence

ROWS, BATCH, STEPS = 200_000, 2_048, 98


def _count_compositions(counts: collections.Counter, stage: list) -> None:
    """Counts `PLDAccountant.compose` calls per stage (a measurement hook: the values are untouched)."""
    from dp_accounting.pld import pld_privacy_accountant

    original = pld_privacy_accountant.PLDAccountant.compose

    def compose(self, event, count=1):
        counts[stage[0]] += 1
        return original(self, event, count)

    pld_privacy_accountant.PLDAccountant.compose = compose


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.accounting_seconds", description=__doc__.split("\n")[0])
    parser.add_argument("--mechanism", default="lazy")
    args = parser.parse_args(argv)
    compositions: collections.Counter = collections.Counter()
    stage = ["import"]
    _count_compositions(compositions, stage)
    import numpy as np

    from pipelines.criteo import privacy, report
    from tfdp_embed.accounting import AccountingPeriod
    from tfdp_embed.data.criteo import CAT_FEATURES

    seconds: dict = {}

    def timed(name, function):
        stage[0] = name
        started = time.perf_counter()
        result = function()
        seconds[name] = time.perf_counter() - started
        return result

    settings = privacy.PrivacySettings(
        mechanism=args.mechanism, epsilon=3.0, delta=1 / ROWS, calibration_fraction=0.05, seed=0
    )
    counts = None
    if privacy.selects_rows(args.mechanism):
        rng = np.random.default_rng(0)
        counts = {f"embedding_{name}": rng.integers(0, 50, size=1001) for name in CAT_FEATURES}
    plan = timed("plan", lambda: privacy.plan(settings, periods=[AccountingPeriod(BATCH / ROWS, STEPS)], counts=counts))
    budget = plan.budget()
    budget.set_model(type("Model", (), {"batching": None, "stop_training": False})())
    timed("budget on_train_begin", budget.on_train_begin)
    budget.ledger.record_steps(budget.mechanism.step_event(plan.sampling_probability), STEPS)
    timed("epoch-end epsilon", lambda: budget.on_epoch_end(0, {}))
    privacy_report = timed(
        "report",
        lambda: report.run_privacy_report(plan, budget=budget, dataset_size=ROWS, batching="poisson", steps=STEPS),
    )
    print(f"| stage ({args.mechanism}) | seconds | PLD compositions |")
    print("|---|---:|---:|")
    for name, value in seconds.items():
        print(f"| {name} | {value:.2f} | {compositions[name]} |")
    print(f"| all | {sum(seconds.values()):.2f} | {sum(compositions[n] for n in seconds)} |")
    print(
        f"reported epsilon {privacy_report['epsilon']!r}; budget epsilon {budget.epsilon!r}; max steps {budget.max_steps}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
