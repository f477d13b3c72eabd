"""Training side of the Criteo pipeline: the DP model and gradient-size statistics.

`make_dp_model` wraps the pCTR model in `DPModel` with the chosen mechanism
and a `keras.optimizers.legacy.SGD` (sparse row updates; the only optimizer
LazyDP can defer exactly). `gradient_size` turns the mechanism's
statistics into DP-FEST's gradient-size reduction factor. The privacy budget
itself is `tfdp_embed.accounting.PrivacyBudget`; the step timer is
`pipelines.step_timer`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pipelines import run_limits
from tfdp_embed import DPModel, keras
from tfdp_embed.data.criteo import CAT_FEATURES, INT_FEATURES, INT_MISSING
from tfdp_embed.keras2.models import CTRModelConfig, build_ctr_model
from tfdp_embed.mechanisms import capabilities_of

TIMING_TABLE_ROWS = 100_000
"""The throwaway model's tables are capped at this many rows (widths kept): a step reads and updates only the
rows a batch touches, and a copy of 10^8-row tables would double the run's memory. benchmarks/RESULTS.md's
non-private step is 1.5-6.2 ms at 10^5-10^7 rows: the estimate may be low, never high, for larger tables."""


def make_dp_model(
    model: keras.Model,
    mechanism,
    *,
    expected_batch_size: float,
    learning_rate: float,
    momentum: float,
    lookahead: bool,
) -> DPModel:
    """`DPModel` + legacy SGD + per-example logistic loss, ready to `fit`.

    The optimizer's step counter, hyperparameters and momentum slots are
    created eagerly (public `OptimizerV2` accessors and `add_slot`) so that
    Keras traces the train step once instead of twice: variables created
    inside the first trace force a second one, and a trace of the 26-table
    model is slow.
    """
    dp_model = DPModel(model, mechanism=mechanism, expected_batch_size=expected_batch_size, lookahead=lookahead)
    optimizer = keras.optimizers.legacy.SGD(learning_rate=learning_rate, momentum=momentum)
    dp_model.compile(optimizer=optimizer, loss=keras.losses.BinaryCrossentropy(from_logits=True))
    optimizer.iterations  # noqa: B018 - public accessors that create the variables eagerly
    optimizer.learning_rate  # noqa: B018
    if momentum > 0:
        for variable in model.trainable_variables:
            optimizer.add_slot(variable, "momentum")
    return dp_model


def forward_backward(model_config: CTRModelConfig):
    """`run_limits.check_time`'s pass: a throwaway pCTR model (tables capped at `TIMING_TABLE_ROWS` rows) on
    `n` rows of the training batches' shape; it reads no file (streamed periods and Beam shards are read once)
    and draws no training randomness (the features are fixed: ids `i * (f + 1) mod rows`)."""
    capped = dataclasses.replace(
        model_config,
        vocab_sizes=tuple(min(int(v), TIMING_TABLE_ROWS) for v in model_config.vocab_sizes),
        embedding_dims=tuple(model_config.dims),
    )
    model = build_ctr_model(capped, name="pctr_timing")
    loss = keras.losses.BinaryCrossentropy(from_logits=True, reduction="none")
    run = run_limits.gradient_pass(model, lambda batch: loss(batch[1], model(batch[0], training=True)))

    def step(n: int) -> None:
        rows = np.arange(n, dtype=np.int64)
        features: dict = {name: np.ones(n, np.float32) for name in INT_FEATURES}
        features[INT_MISSING] = np.zeros((n, len(INT_FEATURES)), np.float32)
        for f, (name, size) in enumerate(zip(CAT_FEATURES, capped.vocab_sizes)):
            features[name] = rows * (f + 1) % (size + 1)
        labels = (rows % 2).astype(np.float32)[:, None]
        run((features, labels))

    return step


def gradient_size(mechanism, tables, *, touched: float) -> dict:
    """Embedding-gradient size per step relative to dense DP-SGD (rows x dim, all tables).

        fraction = mean_t sum_f rows_noised_f(t) dim_f / sum_f V_f dim_f,  reduction = 1 / fraction

    Args:
      mechanism: the trained mechanism.
      tables: the model's `DPEmbedding` layers.
      touched: mean dim-weighted distinct rows a training batch reads
        (`data.TouchedRows`).

    Returns:
      `{"gradient_size_fraction", "gradient_size_reduction", "gradient_size_basis"}`.
    """
    total = sum(int(t.vocabulary_size) * int(t.output_dim) for t in tables)
    capabilities = capabilities_of(mechanism)
    rows = capabilities.noised_rows
    touched = touched / total if total else float("nan")
    if rows is None:
        basis = "no noise" if mechanism.noise_multiplier == 0 else "not reported"
        return {"gradient_size_fraction": None, "gradient_size_reduction": None, "gradient_size_basis": basis}
    if rows == "all":
        fraction, basis = 1.0, "every row noised every step"
    elif rows == "thresholded":
        fraction, basis = (
            float(mechanism.gradient_size_fraction()),
            "rows surviving the noisy threshold (mechanism statistics)",
        )
    elif rows == "selected":
        dims = {t.name: int(t.output_dim) for t in tables}
        fraction = sum(k * dims[n] for n, k in mechanism.top_k.items()) / total
        basis = "DP-selected rows (all noised every step)"
    elif capabilities.defers_noise:
        fraction = touched
        basis = (
            "noise draws per step = rows the next batch reads (measured on the training batches: operator-only, "
            "NOT DP); the released, flushed model carries dense DP-SGD noise on every row"
        )
    else:
        fraction, basis = touched, "rows touched by a batch (measured on the training batches: operator-only, NOT DP)"
    reduction = (1.0 / fraction) if fraction and fraction == fraction else None
    return {"gradient_size_fraction": fraction, "gradient_size_reduction": reduction, "gradient_size_basis": basis}


__all__ = ["TIMING_TABLE_ROWS", "forward_backward", "gradient_size", "make_dp_model"]
