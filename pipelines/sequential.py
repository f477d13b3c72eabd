"""Next-item prediction with user-level DP: SASRec-style Transformer or DPFormer, NDCG@10 / HIT@10.

    python -m pipelines.sequential --data ../shared/data/sasrec/amazon_games.txt \\
        --model dpformer --epsilon 8 --delta 1e-5 --epochs 5 --out runs/games_dpformer

What happens:
  1. read the sequence file (time-ordered per user; SASRec "user item" pairs
     or S3-Rec "user item item ..." lines, `--layout`), split leave-one-out
     (last item test, second-last validation), keep the last `--max-len`
     items, left-pad with 0. One training sequence per user: the privacy unit
     is the USER (user-level DP). The item ids the model knows are the data's
     item set released with DP (`dp_vocabulary`, unit = user, D0 =
     `--vocabulary-max-items`, `--vocabulary-epsilon-share` of epsilon; never
     1..largest id) or a public `--item-catalogue` (nothing spent); other
     items are unknown (`pipelines.sequential_vocabulary`);
  2. item frequencies p_i for Re-Attention: by default the training data's
     per-item user counts released once with a Gaussian (or Laplace)
     mechanism sized for `--frequency-epsilon-share` of epsilon (0.1), whose
     event is composed into the ledger; or public ones read from
     `--frequencies-file` with `--frequencies public` (the guarantee is then
     conditional on them being independent of the training data). Counts
     of the training data are never treated as public. With
     `--popularity-prior` the same p_i also give every logit a fixed log p_i
     and with `--head-items` they choose the head rows (post-processing of
     the release, so no further privacy cost);
  3. calibrate sigma so that the frequency release plus T = epochs x
     round(N / B) Poisson-sampled steps at q = B / N meet (epsilon, delta)
     (`tfdp_embed.plan_run` with the release, `dp_accounting`, PLD);
  4. train with `DPModel` + DenseDPSGD (exact per-example clipping: Phantom
     Clipping for the shared item table, ghost norms elsewhere), Adam with
     weight decay and DPFormer's schedule (20% linear warm-up, then linear
     decay); the plan's `PrivacyBudget` stops at the budget;
  5. evaluate on validation and test users, ranking ALL items, next to two
     references that are not released: chance and the most-popular ranking
     of the training split (`tfdp_embed.metrics.baselines`);
  6. export `OUT/saved_model` through `tfdp_embed.keras2.export.export_saved_model`
     (refuses a model that owes noise); `serving_default` maps a history of
     any length `[B, any]` to the top-10 items (padded/trimmed inside, unknown
     ids dropped: `SASRecServing`); `OUT/report.json` holds the metrics, the
     privacy report and the settings. A run that fails leaves no `OUT` behind.

`--epsilon inf` or `--mechanism none` trains without privacy (the reference).

References: DPFormer (§4, App. A.9); Kang & McAuley 2018 (SASRec);
Krichene & Rendle 2020 (full-ranking metrics).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Sequence

from pipelines import cli_types, sequential_eval, sequential_privacy, sequential_vocabulary
from pipelines.output_dir import removed_on_failure
from pipelines.step_timer import StepTimer
from pipelines.stop_after import StopAfter
from tfdp_embed import DPModel, accounting, export_saved_model, keras, tf
from tfdp_embed.accounting import write_privacy_report
from tfdp_embed.accounting.report import not_released_note
from tfdp_embed.data import poisson_batches
from tfdp_embed.data.item_ids import table_size_warning
from tfdp_embed.data.sequence_files import LAYOUTS
from tfdp_embed.data.sequences import (
    SequenceFormatError,
    load_sequences,
    training_dataset,
)
from tfdp_embed.keras2.attention import effective_errors
from tfdp_embed.keras2.models.sasrec import SASRec, SASRecConfig, SASRecServing
from tfdp_embed.metrics.baselines import NOT_RELEASED_NOTE, chance_ranking, item_counts, popularity_ranking

MODELS = ("transformer", "dpformer")
MECHANISM_NAMES = ("dense", "none")
REQUIRED_KEYS = ("ndcg@10", "hit@10", "epsilon", "delta", "noise_multiplier", "steps", "wall_seconds")


@dataclasses.dataclass(frozen=True)
class SequentialConfig:
    """One run's settings (the CLI flags, validated)."""

    data: str
    out: str
    layout: str = "auto"
    model: str = "dpformer"
    mechanism: str = "dense"
    epsilon: float = 8.0
    delta: float | None = None
    epochs: int = 5
    max_steps: int | None = None
    batch: int = 256
    learning_rate: float = 3e-3
    weight_decay: float = 1e-5
    adam_epsilon: float = 1e-7
    warmup_fraction: float = 0.2
    max_len: int = 50
    dim: int = 64
    blocks: int = 2
    dropout: float = 0.5
    clip: float = 1.0
    accountant: str = "pld"
    frequencies: str = "private"
    frequencies_file: str | None = None
    frequency_epsilon_share: float | None = None
    frequency_noise_multiplier: float | None = None
    frequency_mechanism: str = "gaussian"
    error_scale: float = 1.0
    popularity_prior: bool = False
    head_items: int | None = None
    item_catalogue: str | None = None
    vocabulary_epsilon_share: float | None = None
    vocabulary_max_items: int = sequential_vocabulary.DEFAULT_MAX_ITEMS_PER_USER
    eval_batch: int = 512
    max_eval_users: int | None = None
    top_k: int = 10
    seed: int | None = None
    verbose: int = 1


class WarmupLinearDecay(keras.optimizers.schedules.LearningRateSchedule):
    """lr_t = peak t / W for t < W, then peak (T - t) / (T - W) (DPFormer §5: 20% warm-up, linear decay)."""

    def __init__(self, peak: float, total_steps: int, warmup_fraction: float):
        super().__init__()
        self.peak, self.total = float(peak), max(1, int(total_steps))
        self.warmup = max(1, round(warmup_fraction * self.total))

    def __call__(self, step):
        t = tf.cast(step, tf.float32) + 1.0
        up = self.peak * t / self.warmup
        down = self.peak * tf.maximum(float(self.total) - t + 1.0, 0.0) / max(1.0, float(self.total - self.warmup))
        return tf.where(t <= self.warmup, up, tf.minimum(down, self.peak))

    def get_config(self):
        return {"peak": self.peak, "total_steps": self.total, "warmup_fraction": self.warmup / self.total}


# -- command line ---------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pipelines.sequential",
        description="Train a next-item Transformer (or DPFormer) with user-level DP; report NDCG@10/HIT@10.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--data",
        required=True,
        help="sequence file, time-ordered per user: 'user item' per line (SASRec) or 'user item item ...' (S3-Rec)",
    )
    p.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="auto",
        help="--data layout: pairs = 'user item' per line; sequences = one user per line 'user item item ...'; "
        "auto = sequences if the first line has more than 2 fields",
    )
    p.add_argument("--out", required=True, help="output directory (report.json, saved_model/)")
    p.add_argument("--model", choices=MODELS, default="dpformer", help="transformer: vanilla; dpformer: + Re-Attention")
    p.add_argument("--mechanism", choices=MECHANISM_NAMES, default="dense", help="dense: DP-SGD; none: non-private")
    p.add_argument(
        "--epsilon",
        type=cli_types.positive(float, allow_inf=True),
        default=8.0,
        help="target epsilon (inf: non-private)",
    )
    p.add_argument("--delta", type=float, help="target delta in (0, 1) (default 1/N, N = users)")
    p.add_argument("--epochs", type=cli_types.positive(int), default=5)
    p.add_argument(
        "--max-steps",
        type=cli_types.positive(int),
        help="stop after this many steps (noise calibrated for exactly these; default epochs x round(N / B))",
    )
    p.add_argument("--batch", type=cli_types.positive(int), default=256, help="expected (Poisson) batch size B = qN")
    p.add_argument("--lr", type=cli_types.positive(float), default=3e-3, help="peak Adam learning rate")
    p.add_argument("--weight-decay", type=float, default=1e-5, help="Adam weight decay (DPFormer: 1e-5)")
    p.add_argument(
        "--adam-epsilon",
        type=cli_types.positive(float),
        default=1e-7,
        help="Adam's epsilon (Keras default 1e-7); near the per-coordinate noise std it damps steps on noise-only coordinates",
    )
    p.add_argument("--warmup-fraction", type=float, default=0.2, help="share of steps with linear warm-up")
    p.add_argument(
        "--max-len", type=cli_types.positive(int), default=50, help="sequence length L (most recent items kept)"
    )
    p.add_argument("--dim", type=cli_types.positive(int), default=64)
    p.add_argument("--blocks", type=cli_types.positive(int), default=2)
    p.add_argument("--dropout", type=float, default=0.5, help="dropout rate (DPFormer: 0.5 on Amazon)")
    p.add_argument("--clip", type=cli_types.positive(float), default=1.0, help="per-user L2 clip norm C")
    p.add_argument("--accountant", choices=("pld", "rdp"), default="pld")
    _add_frequency_flags(p)
    _add_vocabulary_flags(p)
    p.add_argument("--eval-batch", type=cli_types.positive(int), default=512)
    p.add_argument(
        "--max-eval-users", type=cli_types.positive(int), help="evaluate only the first N users (quick runs)"
    )
    p.add_argument("--seed", type=int, help="seed for sampling, init and noise (tests/reproductions only)")
    p.add_argument("--verbose", type=int, choices=(0, 1, 2), default=1, help="Keras progress bar (1), per epoch (2)")
    return p


def _add_frequency_flags(p: argparse.ArgumentParser) -> None:
    """Where the item frequencies come from, and what they feed (Re-Attention's errors, prior, head rows)."""
    p.add_argument(
        "--frequencies",
        choices=sequential_privacy.SOURCES,
        default="private",
        help="item frequencies (Re-Attention, --popularity-prior, --head-items): private = the training data's "
        "counts released with DP and charged to the budget; public = read from --frequencies-file",
    )
    p.add_argument(
        "--frequencies-file",
        help="public item frequencies, lines 'item_id frequency' (share of users in [0, 1]; '#' comments); "
        "must be independent of the training data (the report's guarantee is conditional on it)",
    )
    p.add_argument(
        "--frequency-epsilon-share",
        type=float,
        help="share of --epsilon the private count release is sized for, in (0, 1) "
        f"(default {sequential_privacy.DEFAULT_FREQUENCY_EPSILON_SHARE})",
    )
    p.add_argument(
        "--frequency-noise-multiplier",
        type=cli_types.positive(float),
        help="z of the private count release (instead of --frequency-epsilon-share)",
    )
    p.add_argument("--frequency-mechanism", choices=("gaussian", "laplace"), default="gaussian")
    p.add_argument(
        "--error-scale", type=cli_types.positive(float), default=1.0, help="multiplies every effective error"
    )
    p.add_argument(
        "--popularity-prior",
        action="store_true",
        help="add log p_i (the run's item frequencies, public or released) to every logit; not trained, no extra privacy cost",
    )
    p.add_argument(
        "--head-items",
        type=cli_types.positive(int),
        help="train rows only for the K most frequent items (the run's frequencies); the rest share one row "
        "(default: every item has its own row)",
    )


def _add_vocabulary_flags(p: argparse.ArgumentParser) -> None:
    """Which item ids the model knows: a DP vocabulary of the data's items, or a public catalogue."""
    p.add_argument(
        "--item-catalogue",
        help="public list of item ids, one per line ('#' comments): the ids the model knows, nothing spent "
        "(the guarantee then assumes the list independent of the training data); default: the data's item set "
        "released with DP (Gaussian thresholding, unit = user)",
    )
    p.add_argument(
        "--vocabulary-epsilon-share",
        type=float,
        help=f"share of --epsilon the item-set release is sized for, in (0, 1) "
        f"(default {sequential_vocabulary.DEFAULT_EPSILON_SHARE})",
    )
    p.add_argument(
        "--vocabulary-max-items",
        type=cli_types.positive(int),
        default=sequential_vocabulary.DEFAULT_MAX_ITEMS_PER_USER,
        help="D0: each user's most recent distinct items counted in the item-set release",
    )


def parse_args(argv: Sequence[str] | None = None) -> SequentialConfig:
    parser = build_parser()
    a = parser.parse_args(argv)
    if not os.path.exists(a.data):
        parser.error(f"file not found: {a.data!r} (given to --data).")
    if a.delta is not None and not 0 < a.delta < 1:
        parser.error(f"--delta must lie in (0, 1); received {a.delta!r}.")
    if not 0 <= a.dropout < 1:
        parser.error(f"--dropout must lie in [0, 1); received {a.dropout!r}.")
    if not 0 <= a.warmup_fraction < 1:
        parser.error(f"--warmup-fraction must lie in [0, 1); received {a.warmup_fraction!r}.")
    if a.max_len < 2:
        parser.error(f"--max-len must be >= 2; received {a.max_len}.")
    try:
        sequential_privacy.check_frequency_options(
            frequencies=a.frequencies,
            frequencies_file=a.frequencies_file,
            epsilon_share=a.frequency_epsilon_share,
            noise_multiplier=a.frequency_noise_multiplier,
        )
    except ValueError as error:
        parser.error(str(error))
    for flag, path in (("--item-catalogue", a.item_catalogue),):
        if path is not None and not os.path.exists(path):
            parser.error(f"file not found: {path!r} (given to {flag}).")
    if a.vocabulary_epsilon_share is not None and not 0 < a.vocabulary_epsilon_share < 1:
        parser.error(f"--vocabulary-epsilon-share must lie in (0, 1); received {a.vocabulary_epsilon_share!r}.")
    if a.frequencies_file is not None and not os.path.exists(a.frequencies_file):
        parser.error(f"file not found: {a.frequencies_file!r} (given to --frequencies-file).")
    return SequentialConfig(
        data=a.data,
        out=a.out,
        layout=a.layout,
        model=a.model,
        mechanism=a.mechanism,
        epsilon=a.epsilon,
        delta=a.delta,
        epochs=a.epochs,
        max_steps=a.max_steps,
        batch=a.batch,
        learning_rate=a.lr,
        weight_decay=a.weight_decay,
        adam_epsilon=a.adam_epsilon,
        warmup_fraction=a.warmup_fraction,
        max_len=a.max_len,
        dim=a.dim,
        blocks=a.blocks,
        dropout=a.dropout,
        clip=a.clip,
        accountant=a.accountant,
        frequencies=a.frequencies,
        frequencies_file=a.frequencies_file,
        frequency_epsilon_share=a.frequency_epsilon_share,
        frequency_noise_multiplier=a.frequency_noise_multiplier,
        frequency_mechanism=a.frequency_mechanism,
        error_scale=a.error_scale,
        popularity_prior=a.popularity_prior,
        head_items=a.head_items,
        item_catalogue=a.item_catalogue,
        vocabulary_epsilon_share=a.vocabulary_epsilon_share,
        vocabulary_max_items=a.vocabulary_max_items,
        eval_batch=a.eval_batch,
        max_eval_users=a.max_eval_users,
        seed=a.seed,
        verbose=a.verbose,
    )


# -- the run --------------------------------------------------------------------------
def _log(config: SequentialConfig, message: str) -> None:
    if config.verbose:
        print(f"[sequential] {message}", flush=True)


@dataclasses.dataclass
class SequentialResult:
    report: dict
    model: SASRec
    serving: SASRecServing


def run(config: SequentialConfig) -> SequentialResult:
    """read -> frequencies + calibration -> build -> train -> evaluate -> export; writes `OUT/report.json`.

    Raises:
      SequenceFormatError: a malformed input line (names file and line).
      ValueError: settings the data or the accountant cannot support.
    """
    with removed_on_failure(config.out):  # a failed run leaves no `out` behind
        return _run(config)


def _run(config: SequentialConfig) -> SequentialResult:
    started = time.perf_counter()
    data = load_sequences(config.data, max_len=config.max_len, layout=config.layout)
    os.makedirs(config.out, exist_ok=True)
    summary = {k: v for k, v in data.summary().items() if k != "users"}  # N is not released, not even to a log
    _log(config, f"read {config.data}: {summary}")
    privacy = _plan(config, data)
    raw, data = data, privacy.data  # the data in the run's item ids (a DP vocabulary or a public catalogue)
    model, dp_model, budget = _build(config, data, privacy)
    timer, history = _train(config, data, privacy, dp_model, budget)
    train_seconds = time.perf_counter() - started
    valid, test = _evaluate(config, data, model)
    report_privacy, serving, saved_model = _release(config, data, privacy, model, dp_model, budget, timer)
    report = dict(report_privacy)
    report.update(
        {
            "ndcg@10": test["ndcg@10"],
            "hit@10": test["hit@10"],
            "test": test,
            "validation": valid,
            "baselines": baselines(raw, limit=config.max_eval_users),
            "warnings": _warnings(data),
            "model": config.model,
            "target_epsilon": privacy.epsilon,
            "noise_multiplier": privacy.run.noise_multiplier,
            "steps": len(timer.durations),
            "loss_per_epoch": [float(x) for x in history.history.get("loss", [])],
            "median_step_s": timer.median(),
            "train_seconds": train_seconds,
            "wall_seconds": time.perf_counter() - started,
            "data": {"file": config.data, **data.summary()},
            "settings": {k: v for k, v in dataclasses.asdict(config).items() if k not in ("data", "out", "seed")}
            | {"seeded": config.seed is not None},  # never the seed itself
            "metric_protocol": "full ranking over all items (no sampling), history items kept, ties pessimistic",
            "saved_model": saved_model,
            "not_released": not_released_note(
                ["ndcg@10", "hit@10", "test", "validation", "baselines", "loss_per_epoch", "data"],
                release="saved_model/",
            ),
        }
    )
    write_privacy_report(os.path.join(config.out, "report.json"), report)
    return SequentialResult(report=report, model=model, serving=serving)


def _plan(config: SequentialConfig, data) -> sequential_privacy.SequentialPrivacy:
    """Stage 2: the item frequencies (released or public) and the library's plan for the rest of the budget."""
    privacy = sequential_privacy.plan(
        data,
        epsilon=config.epsilon,
        delta=config.delta,
        batch=config.batch,
        epochs=config.epochs,
        max_steps=config.max_steps,
        mechanism=config.mechanism,
        frequencies=config.frequencies,
        frequencies_file=config.frequencies_file,
        frequency_epsilon_share=config.frequency_epsilon_share,
        frequency_noise_multiplier=config.frequency_noise_multiplier,
        frequency_mechanism=config.frequency_mechanism,
        accountant=config.accountant,
        seed=config.seed,
        l2_norm_clip=config.clip,
        item_catalogue=config.item_catalogue,
        vocabulary_epsilon_share=config.vocabulary_epsilon_share,
        vocabulary_max_items=config.vocabulary_max_items,
    )
    run = privacy.run  # the library's plan: the calibrated mechanism, its budget and report
    _log(
        config,
        f"{'private' if privacy.private else 'NON-PRIVATE'}: noise multiplier {run.noise_multiplier:.4g} for "
        f"epsilon {privacy.epsilon:g}, delta {run.target_delta:.3g}, q {run.sampling_probability:.4g}, "
        f"{run.steps} steps; item frequencies {_frequency_summary(privacy.frequency_report())}; "
        f"{privacy.items.ids.num_items} item ids ({privacy.items.source})",
    )
    return privacy


def _model(config: SequentialConfig, data, privacy: sequential_privacy.SequentialPrivacy) -> SASRec:
    """The SASRec / DPFormer model, its head rows, prior and effective errors set from the frequencies."""
    model = SASRec(
        SASRecConfig(
            num_items=data.num_items,
            max_len=config.max_len,
            dim=config.dim,
            blocks=config.blocks,
            dropout=config.dropout,
            re_attention=config.model == "dpformer",
            popularity_prior=config.popularity_prior,
            head_items=config.head_items,
        )
    )
    item_frequencies = privacy.frequencies.frequencies
    # Everything below reads only the released (or supplied public) frequencies: post-processing.
    if config.head_items is not None:
        model.set_item_rows(item_frequencies)
    if config.popularity_prior:
        model.set_item_prior(item_frequencies, min_frequency=0.5 / privacy.size.value)  # N~, not N
    item_err, weight_err = effective_errors(
        noise_multiplier=privacy.run.noise_multiplier,
        batch_size=config.batch,
        item_frequencies=model.row_frequencies(item_frequencies),
        min_frequency=1.0 / privacy.size.value,
        error_scale=config.error_scale,
    )
    model.set_effective_errors(item_err, weight_err)
    return model


def _build(config: SequentialConfig, data, privacy: sequential_privacy.SequentialPrivacy) -> tuple:
    """Stage 3: the model, its `DPModel` around the plan's mechanism (Adam, warm-up then decay), the budget.

    Returns:
      `(model, dp_model, budget)`; the budget is None for a non-private run.
    """
    if config.seed is not None:
        keras.utils.set_random_seed(config.seed)
    model = _model(config, data, privacy)
    run = privacy.run
    dp_model = DPModel(model, mechanism=run.mechanism, expected_batch_size=config.batch)
    schedule = WarmupLinearDecay(config.learning_rate, run.steps, config.warmup_fraction)
    dp_model.compile(
        optimizer=keras.optimizers.Adam(
            learning_rate=schedule, epsilon=config.adam_epsilon, weight_decay=config.weight_decay or None
        )
    )
    budget = run.budget() if privacy.private else None  # its ledger holds the frequency release
    return model, dp_model, budget


def _train(config: SequentialConfig, data, privacy, dp_model: DPModel, budget) -> tuple:
    """Stage 4: fit on Poisson batches of users; the budget stops at T steps. Returns `(timer, history)`."""
    batches, _ = poisson_batches(
        training_dataset(data), sampling_probability=privacy.run.sampling_probability, seed=config.seed
    )
    timer = StepTimer()
    callbacks = [timer, StopAfter(privacy.run.steps)] + ([budget] if budget is not None else [])
    history = dp_model.fit(batches, epochs=config.epochs, callbacks=callbacks, verbose=config.verbose)
    return timer, history


def baselines(data, *, limit: int | None = None, k: int = 10) -> dict:
    """Chance and popularity NDCG@k / HIT@k on the test users (references; not released, see `metrics.baselines`).

    Popularity counts every item of the users' training sequences (inputs and their last target).
    """
    counts = item_counts(data.train_inputs, data.num_items) + item_counts(data.train_targets[:, -1], data.num_items)
    return {
        "note": NOT_RELEASED_NOTE,
        "chance": chance_ranking(data.num_items, k=k),
        "popularity": popularity_ranking(counts, data.test_targets[:limit], k=k),
        "popularity_counts": "items of the training sequences (exact counts, not private)",
    }


def _warnings(data) -> list:
    table = table_size_warning(
        table_rows=data.num_items + 1, distinct_ids=data.distinct_items or data.num_items, what="item"
    )
    return [table] if table else []


def _evaluate(config: SequentialConfig, data, model: SASRec) -> tuple:
    """Stage 5: `(validation, test)` metrics, all items ranked."""
    limit = config.max_eval_users
    valid = sequential_eval.evaluate(
        model, data.valid_histories[:limit], data.valid_targets[:limit], batch_size=config.eval_batch
    )
    test = sequential_eval.evaluate(
        model, data.test_histories[:limit], data.test_targets[:limit], batch_size=config.eval_batch
    )
    _log(config, f"validation {valid}; test {test}")
    return valid, test


PRIVACY_UNIT = "user (one training sequence per user: user-level DP)"


def _release(config: SequentialConfig, data, privacy, model, dp_model, budget, timer) -> tuple:
    """Stage 6: the privacy report and the export of `OUT/saved_model`. Returns `(privacy report, serving, path)`."""
    run = privacy.run
    report_privacy = run.report(
        dataset_size=privacy.size,  # N~: the exact number of users is not released
        privacy_unit=PRIVACY_UNIT,
        contribution_bound=f"one training sequence of at most {data.max_len} items per user"
        + (f", its gradient clipped to L2 norm {run.l2_norm_clip:g} in each step" if run.l2_norm_clip else ""),
        dp_model=dp_model,  # what fit was fed (verified from the data)
        ledger=budget.ledger if budget is not None else None,
        steps=None if budget is not None else len(timer.durations),
        extra={
            "privacy_unit": PRIVACY_UNIT,
            "item_frequencies": privacy.frequency_report(),
            "calibrated_steps": run.steps,
        },
    )
    sequential_vocabulary.add_to_report(report_privacy, privacy.items)
    serving = SASRecServing(model, k=min(config.top_k, model.config.num_items), item_ids=privacy.items.ids)
    saved_model = os.path.join(config.out, "saved_model")
    export_saved_model(
        dp_model,
        saved_model,
        serving_module=serving,
        signatures={"serving_default": serving.serve},
        report=report_privacy,
    )
    return report_privacy, serving, saved_model


def _frequency_summary(info: dict) -> str:
    if info.get("dp_event") is None:
        return info["source"] + (f" ({info['file']})" if info.get("file") else "")
    return (
        f"{info['source']}, noise multiplier {info['noise_multiplier']:.4g} (count noise std {info['noise_std']:.3g}), "
        f"epsilon {info['release_epsilon']:.3g} alone ({100 * info['epsilon_share']:.3g}% of the target)"
    )


def format_summary(report: dict) -> str:
    """The summary printed at the end of a run: the library's privacy lines, then the ranking metrics."""
    frequencies = report.get("extra", {}).get("item_frequencies")
    details = {
        "model": report["model"],
        "item frequencies": _frequency_summary(frequencies) if frequencies else "n/a",
        "NDCG@10 / HIT@10": f"{100 * report['ndcg@10']:.2f}% / {100 * report['hit@10']:.2f}% "
        f"({report['test']['users']} test users, all items ranked)",
        **_baseline_lines(report.get("baselines")),
        "wall time": f"{report['wall_seconds']:.1f} s",
    }
    return accounting.format_report(report, title="sequential report", details=details)


def _baseline_lines(baselines: dict | None) -> dict:
    if not baselines:
        return {}
    return {
        f"{name} reference": f"{100 * baselines[name]['ndcg@10']:.2f}% / {100 * baselines[name]['hit@10']:.2f}%"
        + (" (training-split counts, not private, not released)" if name == "popularity" else " (random ranking)")
        for name in ("chance", "popularity")
    }


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns 0, 2 for bad flags (argparse), 1 for bad data or settings."""
    config = parse_args(argv)
    try:
        report = run(config).report
    except (SequenceFormatError, ValueError) as error:  # `config.out` was removed again
        print(f"python -m pipelines.sequential: error: {error}", file=sys.stderr)
        return 1
    print(format_summary(report))
    print(f"report: {os.path.join(config.out, 'report.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
