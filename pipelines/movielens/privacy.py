"""Privacy side of the MovieLens pipeline: the plan, touch counts, EANA's bound.

The plan is the library's (`tfdp_embed.plan_run`): sigma given, or
calibrated for (eps, delta), q and T (dense, lazy; adafest, split into
sigma1 and sigma2 by `ADAFEST_OPTIONS`; for eana the NOMINAL sigma dense
DP-SGD would need: EANA has no epsilon, the report says so and gives the
data-dependent bound); none: no clipping, no noise. DP-FEST and DP-AdaFEST+
are refused (`REFUSED_MECHANISMS`): their rows come from a selection made
before training, and the full softmax scores every item row every step.

EANA's data-dependent bound (Theorem 3.1) and per-instance bound (Remark 2,
eq. 9) come from `tfdp_embed.accounting.eana_bound` with the run's *real*
per-row counts: C_j = the number of steps in which row j was noised.
`TouchCounter` records them from the very batches the model trained on. In
this model an example's gradient is non-zero on its context rows of the
history table, on **every** item row (full softmax) and on every dense
parameter, so those are the coordinates of x_*; item rows and dense
parameters are noised at every step (C_j = steps). The theorem covers one
pass; Poisson epochs are treated as passes and their RDP curves added
(adaptive composition), as `eana_bound` prescribes.

References: EANA (RecSys 2022) §3.1, Theorem 3.1, Remark 2; Abadi et al.
2016 (calibration); Mironov 2017 (RDP composition and conversion).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant

from tfdp_embed import RunPlan, plan_run, tf
from tfdp_embed.accounting import compute_epsilon, dpsgd_event
from tfdp_embed.accounting.eana_bound import (
    DEFAULT_ORDERS,
    NOT_DP_LABEL,
    eana_per_instance_rdp_bound,
    eana_rdp_bound,
)

MECHANISM_NAMES = ("none", "dense", "eana", "lazy", "adafest")

#: Mechanisms the two-tower cannot train honestly, and why (`plan` and the command line refuse them in one line).
REFUSED_MECHANISMS = {
    name: (
        f"{label} updates only the rows a frequency selection picked before training, but the "
        "two-tower's full softmax scores every item row every step, so the other item rows would keep their "
        "initial values and still be scored; use adafest (it noises the scored rows every step), lazy or dense"
    )
    for name, label in (("fest", "DP-FEST"), ("adafest+", "DP-AdaFEST+"))
}

#: DP-AdaFEST's contribution map: C1, sigma1 / sigma2 and tau in units of sigma1 C1 (the Criteo pipeline's
#: defaults, DP-FEST App. D.1); the full-softmax item rows survive every step (public rows, no count needed).
ADAFEST_OPTIONS = {"contribution_clip": 1.0, "ratio": 1.0, "threshold_sigmas": 2.0}


def plan(
    *,
    mechanism: str,
    noise_multiplier,
    epsilon,
    delta: float,
    sampling_probability: float,
    steps: int,
    l2_norm_clip: float,
    accountant: str = "pld",
    seed: int | None = None,
    releases=(),
) -> RunPlan:
    """The run's plan: sigma given (`noise_multiplier`) or calibrated for `epsilon`; nothing for "none".

    `releases` (e.g. `Release.dataset_size(N~)`) are charged to the same budget.

    Raises:
      ValueError: both or neither of `noise_multiplier` / `epsilon` for a noised
        mechanism, either for "none", or a mechanism this pipeline does not run.
    """
    if mechanism in REFUSED_MECHANISMS:
        raise ValueError(f"`mechanism` {mechanism!r}: {REFUSED_MECHANISMS[mechanism]}.")
    if mechanism not in MECHANISM_NAMES:
        raise ValueError(f"`mechanism` must be one of {MECHANISM_NAMES}; received {mechanism!r}.")
    common: dict[str, Any] = dict(
        target_delta=delta, accountant=accountant, sampling_probability=sampling_probability, steps=steps, seed=seed
    )
    if mechanism == "none":
        if noise_multiplier is not None or epsilon is not None:
            raise ValueError(
                "mechanism 'none' trains without clipping or noise; do not pass `noise_multiplier` or "
                f"`epsilon` (received {noise_multiplier!r}, {epsilon!r})."
            )
        return plan_run("none", **common)
    if (noise_multiplier is None) == (epsilon is None):
        raise ValueError(
            f"mechanism {mechanism!r} needs exactly one of `noise_multiplier` (sigma) or `epsilon` (sigma is then "
            f"calibrated); received noise_multiplier={noise_multiplier!r}, epsilon={epsilon!r}."
        )
    return plan_run(
        mechanism,
        target_epsilon=epsilon,
        noise_multiplier=noise_multiplier,
        l2_norm_clip=l2_norm_clip,
        releases=releases,
        **common,
        **(ADAFEST_OPTIONS if mechanism == "adafest" else {}),
    )


def noise_source(run: RunPlan) -> str:
    """Where sigma came from, in the report's words ("given", "non-private", "calibrated for dense DP-SGD ...")."""
    if run.noise_source != "calibrated":
        return run.noise_source
    nominal = "" if run.is_dp else f" (nominal: {run.mechanism_name.upper()} has no epsilon)"
    return "calibrated for dense DP-SGD" + nominal


def nominal_epsilon(
    *, noise_multiplier: float, sampling_probability: float, steps: int, delta: float, accountant: str = "pld"
) -> float | None:
    """Epsilon that dense DP-SGD with this sigma would have (None for sigma = 0)."""
    if not noise_multiplier > 0 or steps < 1:
        return None
    event = dpsgd_event(sampling_probability=sampling_probability, noise_multiplier=noise_multiplier, steps=steps)
    return float(compute_epsilon(event, target_delta=delta, accountant=accountant))


class TouchCounter:
    """Per-epoch counts of the steps in which each history-table row was touched.

    `record(contexts)` is called once per training batch (the batch the model
    trains on); a new epoch starts after `batches_per_epoch` batches (when
    set) or at `start_epoch()`.
    """

    def __init__(self, num_rows: int, padding_id: int = 0, batches_per_epoch: int | None = None):
        self.num_rows = int(num_rows)
        self.padding_id = padding_id
        self.batches_per_epoch = batches_per_epoch
        self.epochs: list[np.ndarray] = []
        self.steps_per_epoch: list[int] = []
        self.rows_per_step: list[int] = []

    def start_epoch(self) -> None:
        self.epochs.append(np.zeros(self.num_rows, np.int64))
        self.steps_per_epoch.append(0)

    def record(self, contexts: np.ndarray) -> None:
        full = self.batches_per_epoch is not None and self.epochs and self.steps_per_epoch[-1] >= self.batches_per_epoch
        if not self.epochs or full:
            self.start_epoch()
        rows = np.unique(contexts)
        rows = rows[rows != self.padding_id]
        self.epochs[-1][rows] += 1
        self.steps_per_epoch[-1] += 1
        self.rows_per_step.append(int(rows.size))

    @property
    def steps(self) -> int:
        return int(sum(self.steps_per_epoch))

    def total(self) -> np.ndarray:
        return np.sum(self.epochs, axis=0) if self.epochs else np.zeros(self.num_rows, np.int64)


def _dense_coordinates(model) -> int:
    tables = {
        model.history_embedding.embeddings.ref(),
        model.item_embedding.embeddings.ref(),
    }
    return int(sum(int(np.prod(v.shape)) for v in model.trainable_variables if v.ref() not in tables))


def _sum_and_convert(kind: str, bounds: list, delta: float, source: str) -> dict:
    orders = np.asarray(bounds[0].orders)
    rdp = np.sum([np.asarray(b.rdp) for b in bounds], axis=0)
    rdp = np.where(np.isfinite(rdp), rdp, np.inf)
    eps, order = rdp_privacy_accountant.compute_epsilon(orders.tolist(), rdp.tolist(), delta)
    return {
        "kind": kind,
        "is_dp": False,
        "label": NOT_DP_LABEL.format(source=source),
        "data_dependent_epsilon": float(eps),
        "optimal_order": float(order) if math.isfinite(float(eps)) else None,
        "delta": delta,
        "passes_composed": len(bounds),
    }


def eana_theorem_bound(
    *, model, counter: TouchCounter, noise_multiplier: float, context_length: int, delta: float
) -> dict:
    """Theorem 3.1 from the real counts: per pass C_0 = min over every coordinate an example can touch.

    Coordinates: history rows 1..n (counts as recorded), item rows 1..n and dense
    parameters (noised every step of the pass). d_0 = L * d + n * d + dense parameters.
    """
    dim, num_items = model.embedding_dim, model.num_items
    d0 = context_length * dim + num_items * dim + _dense_coordinates(model)
    bounds = []
    for counts, steps in zip(counter.epochs, counter.steps_per_epoch):
        touch = np.concatenate([counts[1:], [steps]])  # item rows / dense: `steps` draws in this pass
        bounds.append(
            eana_rdp_bound(
                noise_multiplier=noise_multiplier, touch_counts=touch, max_coordinates_per_example=d0, delta=delta
            )
        )
    out = _sum_and_convert("theorem_3_1", bounds, delta, "Theorem 3.1, eq. 1, summed over passes")
    total = counter.total()[1:]
    out.update(
        d0=d0,
        min_history_row_count_per_pass=[int(c[1:].min()) for c in counter.epochs],
        history_rows_never_touched=int(np.sum(total == 0)),
        history_rows=int(total.size),
        note=(
            "C_0 is the smallest count over every coordinate an example can touch (every item id can be "
            "in a context); a history row that no training batch touched has C_0 = 0 and makes the bound "
            "infinite: its value reveals that no example used it."
        ),
    )
    return out


def _per_row_squared_norms(model, context: np.ndarray, label: np.ndarray, l2_norm_clip: float) -> tuple:
    """Per-row squared (clipped) gradient norms of one example: history rows, item rows, dense total."""
    with tf.GradientTape() as tape:
        loss = model.compute_loss((context[None], label[None]))[0]
    variables = model.trainable_variables
    grads = tape.gradient(loss, variables)
    hist_var, item_var = (
        model.history_embedding.embeddings,
        model.item_embedding.embeddings,
    )
    hist = item = None
    dense_sq = 0.0
    for v, g in zip(variables, grads):
        g = tf.convert_to_tensor(g).numpy()
        if v is hist_var:
            hist = np.sum(np.square(g), axis=1)
        elif v is item_var:
            item = np.sum(np.square(g), axis=1)
        else:
            dense_sq += float(np.sum(np.square(g)))
    assert hist is not None and item is not None  # both tables are trainable variables of the model
    total = float(hist.sum() + item.sum() + dense_sq)
    scale = min(1.0, l2_norm_clip**2 / total) if total > 0 else 1.0
    return hist * scale, item * scale, dense_sq * scale


def eana_per_instance_bounds(
    *,
    model,
    counter: TouchCounter,
    contexts: np.ndarray,
    labels: np.ndarray,
    noise_multiplier: float,
    l2_norm_clip: float,
    delta: float,
) -> list:
    """Remark 2 (eq. 9) for each given example x_*, from its clipped per-row gradient and the real counts.

    s_j is x_*'s clipped squared gradient norm on row j at the released model (the theorem's
    linear loss has one fixed gradient; here it stands in for the gradient at each use). Each
    Poisson pass is one pass of the theorem; the passes' RDP curves are added.
    """
    out = []
    for context, label in zip(contexts, labels):
        hist_sq, item_sq, dense_sq = _per_row_squared_norms(model, context, label, l2_norm_clip)
        rows = np.unique(context[context != 0])
        bounds = []
        for counts, steps in zip(counter.epochs, counter.steps_per_epoch):
            touch = np.concatenate([counts[rows], np.full(model.num_items, steps), [steps]])
            norms = np.concatenate([hist_sq[rows], item_sq[1:], [dense_sq]])
            dims = np.concatenate(
                [
                    np.full(rows.size + model.num_items, model.embedding_dim),
                    [max(1, _dense_coordinates(model))],
                ]
            )
            bounds.append(
                eana_per_instance_rdp_bound(
                    noise_multiplier=noise_multiplier,
                    touch_counts=touch,
                    row_squared_norms=norms,
                    row_dims=dims,
                    delta=delta,
                    l2_norm_clip=l2_norm_clip,
                    orders=DEFAULT_ORDERS,
                )
            )
        record = _sum_and_convert("remark_2_eq_9", bounds, delta, "Remark 2, eq. 9, summed over passes")
        record.update(
            label_item=int(label),
            context_rows=rows.tolist(),
            min_context_row_count=int(counter.total()[rows].min()) if rows.size else None,
        )
        out.append(record)
    return out


__all__ = [
    "ADAFEST_OPTIONS",
    "MECHANISM_NAMES",
    "REFUSED_MECHANISMS",
    "TouchCounter",
    "eana_per_instance_bounds",
    "eana_theorem_bound",
    "noise_source",
    "nominal_epsilon",
    "plan",
]
