"""Attack: get a Poisson epsilon for batches that were not Poisson-sampled (issue 16, leak 8).

`dp.fit(numpy_x, numpy_y, batch_size=500)` trains on Keras's shuffled
fixed-size batches, yet PrivacyBudget and privacy_report defaulted to
`batching="poisson"` and printed the Poisson epsilon with no caveat. Now
`DPModel.fit` records what it was fed (`dp.batching`): Poisson only for a
`tfdp_embed.data` sampler seen through pass-through transformations; the
budget reads it, refuses a contradicting Poisson claim, and the report
carries the caveat.

Both front ends (the `fe` fixture of tests/conftest.py), except lookahead
and `fit(..., batching=...)` (a declared source), which are tf-keras's.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

from tfdp_embed.accounting import privacy_report
from tfdp_embed.accounting.report import NOT_POISSON_CAVEAT
from tfdp_embed.data import fixed_size_batches, poisson_batches, with_lookahead
from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.mechanisms import DenseDPSGD, LazyDP

N, VOCAB, IDS, BATCH = 2000, 50, 2, 500
Q = BATCH / N


def _data():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, (N, IDS)).astype(np.int32)
    return ids, (ids[:, :1] % 2).astype(np.float32)


def _dp(fe, mechanism=None, *, lookahead=False):
    keras = fe.keras
    keras.utils.set_random_seed(0)
    inputs = keras.Input((IDS,), dtype="int32")
    model = keras.Model(inputs, keras.layers.Dense(1)(fe.DPEmbedding(VOCAB, 3, combiner="mean", name="t")(inputs)))
    mechanism = mechanism or DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0)
    dp = fe.DPModel(model, mechanism=mechanism, expected_batch_size=BATCH, **({"lookahead": True} if lookahead else {}))
    dp.compile(optimizer=fe.sgd(0.1), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    return dp


def _budget(fe, dp, tmp_path, **kwargs):
    return fe.PrivacyBudget(
        dp.mechanism,
        sampling_probability=Q,
        target_epsilon=50.0,
        target_delta=1e-5,
        accountant="rdp",
        report_path=str(tmp_path / "privacy_report.json"),
        dataset_size=N,
        **kwargs,
    )


def test_numpy_fit_is_reported_as_fixed_size_batches(fe, tmp_path):
    x, y = _data()
    dp = _dp(fe)
    dp.prepare(tf.data.Dataset.from_tensor_slices((x, y)).batch(4))  # build from other data, as usual
    budget = _budget(fe, dp, tmp_path)
    dp.fit(x, y, batch_size=BATCH, epochs=1, callbacks=[budget], verbose=0)
    written = json.loads((tmp_path / "privacy_report.json").read_text())
    # Old code: batching "poisson" and no caveat: a Poisson epsilon for shuffled fixed-size batches.
    assert written["batching"] == "fixed_shuffled"
    assert NOT_POISSON_CAVEAT in written["caveats"]
    assert "not verified" in written["guarantee"]
    assert not budget.fed_batching.verified_poisson
    direct = privacy_report(
        mechanism=dp.mechanism,
        ledger=budget.ledger,
        delta=1e-5,
        sampling_probability=Q,
        dataset_size=N,
        batching=dp.batching,
    )
    assert direct["batching"] == "fixed_shuffled" and NOT_POISSON_CAVEAT in direct["caveats"]


def test_explicit_poisson_claim_for_numpy_data_is_refused(fe, tmp_path):
    x, y = _data()
    dp = _dp(fe)
    dp.prepare(tf.data.Dataset.from_tensor_slices((x, y)).batch(4))
    budget = _budget(fe, dp, tmp_path, batching="poisson")
    with pytest.raises(PrivacyContractError, match="not Poisson-sampled"):
        dp.fit(x, y, batch_size=BATCH, epochs=1, callbacks=[budget], verbose=0)
    if fe.name == "keras3":
        return  # Keras 3's fit takes no `batching=` declaration
    with pytest.raises(ValueError, match="batched by Keras"):  # declaring it to fit does not help either
        _, info = poisson_batches((x, y), sampling_probability=Q, seed=0)
        dp.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, batching=info)


def test_report_needs_batching_and_a_stated_poisson_claim_is_marked_unverified():
    mechanism = DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0)
    with pytest.raises(TypeError, match="batching"):
        privacy_report(mechanism=mechanism, delta=1e-5, sampling_probability=Q, dataset_size=N, steps=4)
    stated = privacy_report(
        mechanism=mechanism, delta=1e-5, sampling_probability=Q, dataset_size=N, steps=4, batching="poisson"
    )
    assert stated["batching_source"] == "stated" and any("not verified" in c for c in stated["caveats"])


@pytest.mark.parametrize("wrap", ["none", "prefetch", "map_repeat_take"])
def test_poisson_sampler_is_verified_through_pass_through_steps(fe, tmp_path, wrap):
    x, y = _data()
    batches, _ = poisson_batches((x, y), sampling_probability=Q, seed=1)
    fed = {
        "none": batches,
        "prefetch": batches.prefetch(2),
        "map_repeat_take": batches.map(lambda a, b: (a, b)).repeat(2).take(4),
    }[wrap]
    dp = _dp(fe)
    budget = _budget(fe, dp, tmp_path, batching="poisson")  # a true claim: accepted
    dp.fit(fed, epochs=1, callbacks=[budget], verbose=0)
    assert dp.batching.verified_poisson and budget.fed_batching.verified_poisson
    written = json.loads((tmp_path / "privacy_report.json").read_text())
    assert written["batching"] == "poisson" and written["batching_source"] == "verified"
    assert not any("Poisson" in c for c in written["caveats"])


@pytest.mark.parametrize("fe", ["keras2"], indirect=True)  # lookahead: tf-keras only
def test_lookahead_pipeline_keeps_the_sampler_batching(fe, tmp_path):
    x, y = _data()
    batches, _ = poisson_batches((x, y), sampling_probability=Q, seed=1)
    fed = with_lookahead(batches, lambda features: {"t": features}).prefetch(2)
    dp = _dp(fe, LazyDP(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0), lookahead=True)
    budget = _budget(fe, dp, tmp_path)
    dp.fit(fed, epochs=1, callbacks=[budget], verbose=0)
    assert dp.batching.verified_poisson
    assert json.loads((tmp_path / "privacy_report.json").read_text())["batching"] == "poisson"


@pytest.mark.parametrize("transform", ["shuffle", "cache", "rebatch", "unbatch_batch", "generator"])
def test_anything_else_is_not_verified_poisson(fe, tmp_path, transform):
    x, y = _data()
    batches, info = poisson_batches((x, y), sampling_probability=Q, seed=1)
    spec = batches.element_spec
    fed = {
        "shuffle": lambda: batches.shuffle(4),
        "cache": lambda: batches.cache(),  # replays epoch 1's draws in every epoch
        "rebatch": lambda: batches.rebatch(BATCH),
        "unbatch_batch": lambda: batches.unbatch().batch(BATCH),
        "generator": lambda: tf.data.Dataset.from_generator(lambda: iter(batches), output_signature=spec),
    }[transform]()
    dp = _dp(fe)
    dp.prepare(tf.data.Dataset.from_tensor_slices((x, y)).batch(4))
    with pytest.raises(PrivacyContractError, match="not Poisson-sampled"):
        dp.fit(fed, epochs=1, callbacks=[_budget(fe, dp, tmp_path, batching=info)], verbose=0)
    assert dp.batching.batching == "unverified" and not dp.batching.claims_poisson


def test_fixed_size_sampler_and_mixed_fits_report_the_least_private(fe, tmp_path):
    x, y = _data()
    poisson, _ = poisson_batches((x, y), sampling_probability=Q, seed=1)
    fixed, _ = fixed_size_batches((x, y), batch_size=BATCH, seed=1)
    dp = _dp(fe)
    budget = _budget(fe, dp, tmp_path)
    dp.fit(poisson, epochs=1, callbacks=[budget], verbose=0)
    assert budget.fed_batching.verified_poisson
    dp.fit(fixed, epochs=1, callbacks=[budget], verbose=0)  # the same run continues on shuffled batches
    assert dp.batching.batching == "fixed_shuffled" and budget.fed_batching.batching == "fixed_shuffled"
    written = json.loads((tmp_path / "privacy_report.json").read_text())
    assert written["batching"] == "fixed_shuffled" and NOT_POISSON_CAVEAT in written["caveats"]


@pytest.mark.parametrize("fe", ["keras2"], indirect=True)  # `fit(..., batching=...)`: tf-keras only
def test_uninspectable_source_can_be_declared_and_is_reported_as_declared(fe, tmp_path):
    x, y = _data()
    batches, info = poisson_batches((x, y), sampling_probability=Q, seed=1)
    opaque = tf.data.Dataset.from_generator(lambda: iter(batches), output_signature=batches.element_spec)
    dp = _dp(fe)
    dp.prepare(tf.data.Dataset.from_tensor_slices((x, y)).batch(4))
    budget = _budget(fe, dp, tmp_path, batching="poisson")
    dp.fit(opaque, epochs=1, callbacks=[budget], verbose=0, batching=info)
    assert dp.batching.source == "declared" and dp.batching.claims_poisson and not dp.batching.verified_poisson
    written = json.loads((tmp_path / "privacy_report.json").read_text())
    assert written["batching"] == "poisson" and written["batching_source"] == "declared"
    assert any("declared by the caller" in c for c in written["caveats"])
