"""The rare-id canary audit of a training run (tfdp_embed/audit/rare_id.py), on both front ends.

`audit_run` of `tfdp_embed.keras2.audit_canaries` (tf-keras) and of `tfdp_embed.keras3.audit_canaries`
(Keras 3) is the core's `run_audit` with the front end's `DPModel` and per-example loss. Each test runs
once per front end (the `fe` fixture of tests/conftest.py) on a tiny DPEmbedding + Dense model, two-sided:
without noise the audit must find a clearly positive epsilon (it has power), with dense DP-SGD and LazyDP
at a calibrated epsilon the bound must stay at or below it (the guarantee holds).
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from tfdp_embed.audit.fdp_one_run import METHODS

REAL_IDS, NUM_CANARIES, NUM_REAL = 50, 400, 400  # table rows 0..49 real, 50..449 canaries
Q, STEPS, DELTA, CLAIMED_EPSILON = 0.1, 50, 1e-5, 4.0


def _audit(fe, mechanism: str, *, table_rows=REAL_IDS + NUM_CANARIES, top_id=REAL_IDS, plan=None, **plan_args):
    from tfdp_embed import plan_run

    keras = fe.keras
    audit_run = importlib.import_module(f"tfdp_embed.{fe.name}.audit_canaries").audit_run

    def build_model():
        inputs = keras.Input((2,), dtype="int32")
        x = fe.DPEmbedding(table_rows, 4, combiner="mean", name="items")(inputs)
        return keras.Model(inputs, keras.layers.Dense(1)(x))

    keras.utils.set_random_seed(0)
    ids = np.random.default_rng(0).integers(0, top_id, (NUM_REAL, 2)).astype(np.int32)
    labels = (ids[:, :1] % 2).astype(np.float32)
    if plan is None:
        plan = plan_run(mechanism, target_delta=DELTA, sampling_probability=Q, steps=STEPS, seed=1, **plan_args)
    return audit_run(
        build_model,
        (ids, labels),
        plan=plan,
        first_canary_id=REAL_IDS,
        num_canaries=NUM_CANARIES,
        audit_seed=7,
        batch_seed=3,
        optimizer_fn=lambda: fe.sgd(0.5),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
    )


@pytest.mark.parametrize(
    "setup, match",
    [
        (dict(table_rows=REAL_IDS + NUM_CANARIES - 1), "rows"),  # no room for the last canary
        (dict(top_id=REAL_IDS + 1), "no real example touches"),  # a real id on a canary row
        (dict(plan="with N"), "not `batching=`"),  # the plan fixes N, the audit run changes it
    ],
)
def test_audit_run_refuses_setups_that_break_the_audit(fe, setup, match):
    from tfdp_embed import data, plan_run

    if setup.get("plan") == "with N":
        _, info = data.poisson_batches(np.arange(NUM_REAL), sampling_probability=Q, seed=0)
        setup["plan"] = plan_run("dense", noise_multiplier=1.0, target_delta=DELTA, batching=info, steps=STEPS)
    with pytest.raises(ValueError, match=match):
        _audit(fe, "dense", noise_multiplier=1.0, **setup)


def test_audit_without_noise_finds_a_clearly_positive_epsilon(fe):
    """sigma = 0, C = 1e6: an out-canary's row never moves (score exactly 0), an in-canary's does (power).

    Observed (seeds as below, CPU, tf-keras): 201 of 400 canaries in, 399 of 400 guesses correct at
    (k+, k-) = (200, 200) (one included canary was never sampled in the 50 steps: 1 - 0.9^50 = 99.5 %),
    epsilon_lb = 5.86 by the mu-GDP curve (mu_lb = 1.28; Steinke et al.'s bound alone 3.69, the
    (eps, delta) curve 3.77, each at 0.05 / 42 tests). Keras 3: the same (5.86, 399 of 400).
    """
    audit = _audit(fe, "dense", noise_multiplier=0.0, l2_norm_clip=1e6)
    assert audit.claimed_epsilon is None and 150 < audit.included.sum() < 250
    assert np.all(audit.scores[~audit.included] == 0.0)
    assert audit.bound.epsilon_lb > 2.0, audit.as_dict()
    # the tightest of Steinke et al.'s and the f-DP analyses (audit_lower_bound), its method named
    assert audit.bound.method in METHODS and audit.as_dict()["method"] == audit.bound.method
    assert audit.bound.epsilon_lb == max(audit.bound.by_method.values()) >= audit.bound.by_method["steinke"]


@pytest.mark.parametrize("mechanism", ["dense", "lazy"])
def test_audit_of_a_dp_run_stays_below_the_claimed_epsilon(fe, mechanism):
    """The plan calibrates sigma for epsilon = 4 at delta = 1e-5 (PLD: sigma = 1.145); the bound must not exceed it.

    Observed (seeds as below, CPU; tightest method, 42 tests), tf-keras: dense epsilon_lb = 0.002 (30 of 40
    correct at (20, 20), mu-GDP), LazyDP 0.11 (126 of 200 at (100, 100), mu-GDP; Steinke et al.'s alone
    0.07); Keras 3 the same (0.002 and 0.11). The audit sees the canaries but stays far below 4, as a one-run
    audit of the final model only does; the bound alone catches only gross leaks. A LazyDP that left
    never-touched rows un-noised would leave the out-canaries' scores at exactly 0, which the last assert
    catches.
    """
    audit = _audit(fe, mechanism, target_epsilon=CLAIMED_EPSILON, l2_norm_clip=1.0)
    assert audit.claimed_epsilon == CLAIMED_EPSILON and audit.delta == DELTA
    assert audit.bound.epsilon_lb <= CLAIMED_EPSILON, audit.as_dict()
    assert np.all(audit.scores[~audit.included] != 0.0)  # noise reached every canary row, taken or not


def test_the_front_ends_share_the_core_audit():
    """One code path: both front ends' `audit_run` are the core's `run_audit` with their own parts."""
    from tfdp_embed.audit import rare_id
    from tfdp_embed.keras2 import audit_canaries as keras2_audit
    from tfdp_embed.keras3 import audit_canaries as keras3_audit

    assert keras2_audit.draw_inclusion is keras3_audit.draw_inclusion is rare_id.draw_inclusion
    assert keras2_audit.CanaryAudit is keras3_audit.CanaryAudit is rare_id.CanaryAudit
    assert keras2_audit.PARTS.dp_model is not keras3_audit.PARTS.dp_model
