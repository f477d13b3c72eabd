"""Fixed-shape Poisson batches accounted with dp-accounting's TruncatedSubsampledGaussianDpEvent.

Oracles: dp-accounting's own PLD accountant on the same event (epsilon), and
the unpadded step with sigma = 0 (padding never changes an update).
"""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest

from tfdp_embed.accounting import (
    PrivacyBudget,
    PrivacyLedger,
    calibrate_noise_multiplier,
    privacy_report,
    truncate_event,
    truncated_steps,
)
from tfdp_embed.accounting.calibration import PLD_VALUE_DISCRETIZATION_INTERVAL
from tfdp_embed.data import fixed_shape_batches, poisson_batches
from tfdp_embed.data.provenance import register
from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.layers.embedding import DPEmbedding
from tfdp_embed.keras2.training import DPModel
from tfdp_embed.mechanisms.dense import DenseDPSGD
from tfdp_embed.mechanisms.lazy import LazyDP
from tfdp_embed.planning import plan_run

N, Q, CAP, SIGMA, STEPS, DELTA = 1000, 0.05, 60, 1.2, 40, 1e-5  # q N = 50, sd ~6.9: cap at +1.5 sd


def _pld_epsilon(event, steps):
    accountant = dp_accounting.pld.PLDAccountant(value_discretization_interval=PLD_VALUE_DISCRETIZATION_INTERVAL)
    return accountant.compose(event, steps).get_epsilon(DELTA)


def _truncated(sigma=SIGMA):
    return dp_accounting.TruncatedSubsampledGaussianDpEvent(N, Q, CAP, sigma)


def test_truncate_event_rewrites_poisson_gaussian_steps_only():
    step = dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(SIGMA))
    laplace = dp_accounting.LaplaceDpEvent(2.0)
    composed = dp_accounting.ComposedDpEvent([laplace, dp_accounting.SelfComposedDpEvent(step, 3)])
    assert truncate_event(composed, dataset_size=N, max_batch_size=CAP) == dp_accounting.ComposedDpEvent(
        [laplace, dp_accounting.SelfComposedDpEvent(_truncated(), 3)]
    )
    with pytest.raises(ValueError, match="Gaussian"):
        truncate_event(dp_accounting.PoissonSampledDpEvent(Q, laplace), dataset_size=N, max_batch_size=CAP)


def test_report_epsilon_equals_dp_accounting_pld_for_the_truncated_event():
    mechanism = DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=SIGMA, seed=0)
    source = truncated_steps(mechanism, dataset_size=N, max_batch_size=CAP)
    assert source.step_event(Q) == _truncated() and source.l2_norm_clip == 1.0
    ledger = PrivacyLedger()
    ledger.record_steps(source.step_event(Q), STEPS)
    examples = (np.arange(N), np.zeros(N))
    _, info = fixed_shape_batches(*poisson_batches(examples, sampling_probability=Q, max_batch_size=CAP, seed=0))
    report = privacy_report(
        mechanism=source, delta=DELTA, sampling_probability=Q, dataset_size=N, batching=info, ledger=ledger
    )
    expected = _pld_epsilon(_truncated(), STEPS)
    assert report["epsilon"] == pytest.approx(expected, rel=1e-12)
    # Truncation costs something here (P[Binomial(N - 1, q) >= 60] ~ 8%): more than the untruncated epsilon.
    untruncated = _pld_epsilon(mechanism.step_event(Q), STEPS)
    assert expected > untruncated * 1.001
    assert report["step_accounting"] == "truncated_poisson" and "delta_with_truncation" not in report
    assert any("TruncatedSubsampledGaussianDpEvent" in c and "fixed shape" in c for c in report["caveats"])
    # The plain mechanism on the same batches: the coupling bound's extra delta instead.
    plain = privacy_report(
        mechanism=mechanism, delta=DELTA, sampling_probability=Q, dataset_size=N, batching=info, steps=STEPS
    )
    assert plain["delta_with_truncation"] > DELTA and "step_accounting" not in plain


def test_truncated_accounting_for_other_batches_is_refused():
    source = truncated_steps(
        DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=SIGMA, seed=0), dataset_size=N, max_batch_size=CAP
    )
    common = dict(mechanism=source, delta=DELTA, sampling_probability=Q, dataset_size=N, steps=STEPS)
    _, uncapped = poisson_batches(np.arange(N), sampling_probability=Q, seed=0)
    with pytest.raises(PrivacyContractError, match="max_batch_size=None"):
        privacy_report(**common, batching=uncapped)
    _, other_cap = poisson_batches(np.arange(N), sampling_probability=Q, seed=0, max_batch_size=CAP + 1)
    with pytest.raises(PrivacyContractError, match="truncated event would not describe"):
        privacy_report(**common, batching=other_cap)
    with pytest.raises(ValueError, match="exceeds"):
        truncated_steps(source.source, dataset_size=10, max_batch_size=11)


def test_planner_calibrates_budgets_and_reports_truncated_steps():
    target = 2.0
    plan = plan_run(
        "dense",
        target_epsilon=target,
        target_delta=DELTA,
        sampling_probability=Q,
        steps=STEPS,
        dataset_size=N,
        max_batch_size=CAP,
        seed=0,
    )
    sigma = plan.noise_multiplier
    assert _pld_epsilon(_truncated(sigma), STEPS) <= target
    assert _pld_epsilon(_truncated(sigma * 0.97), STEPS) > target  # the smallest such sigma (search rtol < 3%)
    plain = calibrate_noise_multiplier(target_epsilon=target, target_delta=DELTA, sampling_probability=Q, steps=STEPS)
    assert sigma > plain  # the truncation's cost is paid in noise
    budget = plan.budget(dataset_size=N)
    assert isinstance(budget, PrivacyBudget) and budget.mechanism.step_event(Q) == _truncated(sigma)
    with pytest.raises(ValueError, match="PLD accountant only"):
        plan_run(
            "dense",
            target_epsilon=target,
            target_delta=DELTA,
            sampling_probability=Q,
            steps=STEPS,
            dataset_size=N,
            max_batch_size=CAP,
            accountant="rdp",
        )


VOCAB, DIM, IDS = 20, 3, 2


def _model():
    keras.utils.set_random_seed(7)
    inp = keras.Input((IDS,), dtype="int32")
    x = DPEmbedding(VOCAB, DIM, combiner="sum")(inp)
    return keras.Model(inp, keras.layers.Dense(1)(keras.layers.Dense(4, "tanh")(x)))


@pytest.mark.parametrize("mechanism", [DenseDPSGD, LazyDP])
def test_padding_never_changes_an_update(mechanism):
    # sigma = 0, clip active (0.05): padded (fixed-shape) batches give the unpadded run's weights (sums over
    # 24 rows instead of k may round differently in the last bit: rtol 1e-6); a batch of padding alone
    # changes nothing, exactly.
    rng = np.random.default_rng(0)
    ids = rng.integers(1, VOCAB, (200, IDS)).astype("int32")
    labels = rng.integers(0, 2, (200, 1)).astype("float32")
    batches, info = poisson_batches((ids, labels), sampling_probability=0.1, seed=3, max_batch_size=24)
    # One epoch of Poisson batches, drawn once and replayed to both runs (fit may draw extra batches ahead).
    epoch = [(x.numpy(), y.numpy()) for x, y in batches]
    sizes = [len(y) for _, y in epoch]
    assert min(sizes) < 24 and max(sizes) <= 24
    spec = (tf.TensorSpec([None, IDS], tf.int32), tf.TensorSpec([None, 1], tf.float32))
    replay = register(tf.data.Dataset.from_generator(lambda: iter(epoch), output_signature=spec), info)
    fixed, _ = fixed_shape_batches(replay, info)
    padded = [(x.numpy(), y.numpy(), w.numpy()) for x, y, w in fixed]
    assert [len(x) for x, _, _ in padded] == [24] * len(epoch) and [int(w.sum()) for *_, w in padded] == sizes
    batches = replay
    weights = []
    for data in (batches, fixed):
        dp = DPModel(
            _model(), mechanism=mechanism(l2_norm_clip=0.05, noise_multiplier=0.0, seed=0), expected_batch_size=20.0
        )
        dp.compile(optimizer=keras.optimizers.legacy.SGD(0.5), loss=keras.losses.BinaryCrossentropy(from_logits=True))
        dp.fit(data, epochs=1, verbose=0)
        weights.append(dp.inner.get_weights())
    assert any(np.abs(w - v).max() > 0 for w, v in zip(weights[0], _model().get_weights()))  # it trained
    for unpadded, padded in zip(*weights):
        np.testing.assert_allclose(padded, unpadded, rtol=1e-6, atol=1e-12)
    padding_only = tf.data.Dataset.from_tensors((ids[:24], labels[:24], np.zeros(24, np.float32)))
    dp = DPModel(
        _model(), mechanism=mechanism(l2_norm_clip=0.05, noise_multiplier=0.0, seed=0), expected_batch_size=20.0
    )
    dp.compile(optimizer=keras.optimizers.legacy.SGD(0.5), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    dp.fit(padding_only, epochs=1, verbose=0)
    for before, after in zip(_model().get_weights(), dp.inner.get_weights()):
        np.testing.assert_array_equal(after, before)
