"""Stages 2-5 of a sequential run: frequencies and plan, the SASRec/DPFormer `DPModel`, fit, evaluate."""

from __future__ import annotations

from pipelines import run_limits
from pipelines.sequential import evaluation as sequential_eval
from pipelines.sequential import privacy as sequential_privacy
from pipelines.sequential.config import SequentialConfig
from pipelines.sequential.report import (
    frequency_summary,
)
from pipelines.step_timer import StepTimer
from pipelines.stop_after import StopAfter
from tfdp_embed import DPModel, keras, tf
from tfdp_embed.data import poisson_batches
from tfdp_embed.data.sequences import (
    training_dataset,
)
from tfdp_embed.keras2.attention import effective_errors
from tfdp_embed.keras2.models.sasrec import SASRec, SASRecConfig


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


def log(config: SequentialConfig, message: str) -> None:
    if config.verbose:
        print(f"[sequential] {message}", flush=True)


def plan_privacy(config: SequentialConfig, data) -> sequential_privacy.SequentialPrivacy:
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
        time_limit=(_forward_backward(config, data), config.max_hours) if config.max_hours else None,
    )
    run = privacy.run  # the library's plan: the calibrated mechanism, its budget and report
    log(
        config,
        f"{'private' if privacy.private else 'NON-PRIVATE'}: noise multiplier {run.noise_multiplier:.4g} for "
        f"epsilon {privacy.epsilon:g}, delta {run.target_delta:.3g}, q {run.sampling_probability:.4g}, "
        f"{run.steps} steps; item frequencies {frequency_summary(privacy.frequency_report())}; "
        f"{privacy.items.ids.num_items} item ids ({privacy.items.source})",
    )
    return privacy


def _forward_backward(config: SequentialConfig, data):
    """`run_limits.check_time`'s pass: a throwaway model (the data's item ids: a DP vocabulary keeps at most
    them) on the first `n` users' training sequences; no sampler, no training randomness."""
    model = SASRec(_model_config(config, data.num_items))

    run = run_limits.gradient_pass(model, lambda batch: model.compute_loss(batch, True))

    def step(n: int) -> None:
        run((data.train_inputs[:n], data.train_targets[:n]))

    return step


def _model_config(config: SequentialConfig, num_items: int) -> SASRecConfig:
    return SASRecConfig(
        num_items=num_items,
        max_len=config.max_len,
        dim=config.dim,
        blocks=config.blocks,
        dropout=config.dropout,
        re_attention=config.model == "dpformer",
        popularity_prior=config.popularity_prior,
        head_items=config.head_items,
    )


def _model(config: SequentialConfig, data, privacy: sequential_privacy.SequentialPrivacy) -> SASRec:
    """The SASRec / DPFormer model, its head rows, prior and effective errors set from the frequencies."""
    model = SASRec(_model_config(config, data.num_items))
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


def build_model(config: SequentialConfig, data, privacy: sequential_privacy.SequentialPrivacy) -> tuple:
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


def fit_model(config: SequentialConfig, data, privacy, dp_model: DPModel, budget) -> tuple:
    """Stage 4: fit on Poisson batches of users; the budget stops at T steps. Returns `(timer, history)`."""
    batches, _ = poisson_batches(
        training_dataset(data), sampling_probability=privacy.run.sampling_probability, seed=config.seed
    )
    timer = StepTimer(privacy.run.steps if config.verbose else None, program="python -m pipelines.sequential")
    callbacks = [timer, StopAfter(privacy.run.steps)] + ([budget] if budget is not None else [])
    history = dp_model.fit(batches, epochs=config.epochs, callbacks=callbacks, verbose=config.verbose)
    return timer, history


def evaluate_model(config: SequentialConfig, data, model: SASRec) -> tuple:
    """Stage 5: `(validation, test)` metrics, all items ranked."""
    limit = config.max_eval_users
    valid = sequential_eval.evaluate(
        model, data.valid_histories[:limit], data.valid_targets[:limit], batch_size=config.eval_batch
    )
    test = sequential_eval.evaluate(
        model, data.test_histories[:limit], data.test_targets[:limit], batch_size=config.eval_batch
    )
    log(config, f"validation {valid}; test {test}")
    return valid, test
