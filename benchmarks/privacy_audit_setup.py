"""The model, data and plans of `benchmarks.privacy_audit` (one audited training run per setting).

A small CTR-style model: three `DPEmbedding` tables (`C1` with the canaries'
rows, `C2`, `C3`), concatenated, a ReLU layer and a click logit. The real
examples are generated (seeded): Zipf-like ids per table and a click drawn
from a hidden logistic model of the three ids. Canary i is the example
(C1 = first_canary_id + i, C2 = 0, C3 = 0, click = 1): its `C1` row is its
own, its other two ids are the most frequent real rows.

DP-FEST and DP-AdaFEST+ select rows from bucket counts before training. The
counts here are those of the data the run really trains on: the real
examples plus the canaries that `draw_inclusion(m, audit_seed=...)` puts in
(the same draw `audit_run` makes), so the selection's own leak (an included
canary's row has count 1, an excluded one 0) is part of what is audited.

References: Steinke, Nasr & Jagielski, NeurIPS 2023 (the audit); Ghazi et al.,
DP-FEST / DP-AdaFEST, NeurIPS 2023 §3.1, §3.2, §4.2 (the selections).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tfdp_embed.data.criteo.schema import CRITEO_VOCAB_SIZES

DP_MECHANISMS = ("dense", "lazy", "fest", "adafest", "adafest+")
MECHANISMS = (*DP_MECHANISMS, "eana", "none")
NOT_DP = {"eana": "not DP (sigma of the largest claimed epsilon)", "none": "no noise (sigma = 0)"}


@dataclasses.dataclass(frozen=True)
class AuditSetup:
    """Static settings of every audited run (one per mechanism and epsilon)."""

    num_canaries: int = 5000
    steps: int = 500
    num_real: int = 5000
    vocab_sizes: tuple = (200, 50, 20)  # real rows of C1, C2, C3
    dim: int = 4
    hidden: int = 16
    sampling_probability: float = 0.1
    l2_norm_clip: float = 0.01
    learning_rate: float = 0.5
    delta: float = 1e-5
    accountant: str = "pld"
    selection_share: float = 0.1  # of epsilon, for DP-FEST / DP-AdaFEST+ top-k
    adafest_ratio: float = 1.0  # sigma1 / sigma2 of DP-AdaFEST's contribution map
    adafest_threshold_sigmas: float = 1.0  # tau = this x sigma1 x C1
    data_seed: int = 0

    @property
    def table_rows(self) -> tuple:
        """Rows of each table: C1 also holds the m canary rows."""
        return (self.vocab_sizes[0] + self.num_canaries, *self.vocab_sizes[1:])

    @property
    def first_canary_id(self) -> int:
        return self.vocab_sizes[0]


FEATURES = ("C1", "C2", "C3")
TABLE_SIZES = {"small": (200, 50, 20), "table3": tuple(CRITEO_VOCAB_SIZES[name] for name in FEATURES)}
"""`--tables`: the real rows of each table; table3 is Criteo's (DP-FEST Table 3), most rows never looked up."""


def build_model(setup: AuditSetup):
    """The CTR-style model: {C1, C2, C3} int32 [batch] -> click logit [batch, 1]."""
    from tfdp_embed import DPEmbedding, keras

    inputs = {name: keras.Input((), dtype="int32", name=name) for name in FEATURES}
    parts = [
        DPEmbedding(rows, setup.dim, name=f"embedding_{name}")(inputs[name])
        for name, rows in zip(FEATURES, setup.table_rows)
    ]
    x = keras.layers.Concatenate()(parts)
    x = keras.layers.Dense(setup.hidden, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(1)(x))


def real_examples(setup: AuditSetup) -> tuple:
    """({C1, C2, C3} int32 [N], clicks float32 [N, 1]): Zipf-like ids, clicks from a hidden logistic model."""
    rng = np.random.default_rng(setup.data_seed)
    features, logit = {}, np.full(setup.num_real, -0.5)
    for name, vocab in zip(FEATURES, setup.vocab_sizes):
        weights = 1.0 / np.arange(1, vocab + 1)
        ids = rng.choice(vocab, size=setup.num_real, p=weights / weights.sum()).astype(np.int32)
        features[name] = ids
        logit = logit + rng.normal(0.0, 1.0, vocab)[ids]
    clicks = (rng.random(setup.num_real) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
    return features, clicks[:, None]


def canary_examples(row_ids: np.ndarray) -> tuple:
    """Canary i: C1 = its own row, C2 = C3 = 0, click = 1."""
    size = len(row_ids)
    zeros = np.zeros(size, np.int32)
    return {"C1": np.asarray(row_ids, np.int32), "C2": zeros, "C3": zeros.copy()}, np.ones((size, 1), np.float32)


def training_counts(setup: AuditSetup, examples: tuple, included: np.ndarray) -> dict:
    """Bucket counts of the data trained on: real ids plus the included canaries' (each example counts once)."""
    features = examples[0]
    canary_rows = setup.first_canary_id + np.flatnonzero(included)
    extra = {"C1": canary_rows, "C2": np.zeros(len(canary_rows), int), "C3": np.zeros(len(canary_rows), int)}
    return {
        f"embedding_{name}": np.bincount(np.concatenate([features[name], extra[name]]), minlength=rows).astype(
            np.float64
        )
        for name, rows in zip(FEATURES, setup.table_rows)
    }


def _selection_options(setup: AuditSetup, counts: dict) -> dict:
    """DP top-k of each table's real vocabulary size: the selection could keep every real row."""
    from tfdp_embed import Release

    top_k = {f"embedding_{name}": vocab for name, vocab in zip(FEATURES, setup.vocab_sizes)}
    return {"releases": [Release.selection(setup.selection_share)], "top_k": top_k, "counts": counts}


def _adafest_options(setup: AuditSetup) -> dict:
    return {
        "contribution_clip": 1.0,
        "ratio": setup.adafest_ratio,
        "threshold_sigmas": setup.adafest_threshold_sigmas,
    }


def make_plan(setup: AuditSetup, mechanism: str, *, epsilon=None, noise_multiplier=None, counts=None, seed: int):
    """`plan_run` for one audited run: sigma calibrated for `epsilon`, or `noise_multiplier` given (EANA, none)."""
    from tfdp_embed import plan_run

    run = dict(
        target_delta=setup.delta,
        accountant=setup.accountant,
        sampling_probability=setup.sampling_probability,
        steps=setup.steps,
        seed=seed,
    )
    if mechanism == "none":
        return plan_run("none", **run)
    options = {}
    if mechanism in ("fest", "adafest+"):
        options.update(_selection_options(setup, counts))
    if mechanism in ("adafest", "adafest+"):
        options.update(_adafest_options(setup))
    noise = {"target_epsilon": epsilon} if noise_multiplier is None else {"noise_multiplier": noise_multiplier}
    return plan_run(mechanism, l2_norm_clip=setup.l2_norm_clip, **run, **noise, **options)
