"""Training side of the Criteo pipeline: the DP model and gradient-size statistics.

`make_dp_model` wraps the pCTR model in `DPModel` with the chosen mechanism
and a `keras.optimizers.legacy.SGD` (sparse row updates; the only optimizer
LazyDP can defer exactly). `gradient_size` turns the mechanism's
statistics into DP-FEST's gradient-size reduction factor. The privacy budget
itself is `tfdp_embed.accounting.PrivacyBudget`; the step timer is
`pipelines.step_timer`.
"""

from __future__ import annotations

from tfdp_embed import DPModel, keras
from tfdp_embed.mechanisms import capabilities_of


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


__all__ = ["gradient_size", "make_dp_model"]
