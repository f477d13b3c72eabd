"""Attacks on user-level DP: what one user's whole history can move, and what the run claims about it.

(a) Neighbouring datasets D' = D + one user (40 rows, k = 4): with zero noise the step's
    clipped sum moves by at most C, for every mechanism that trains at user level; a
    broken variant that clips each of the user's rows on its own (the user's rows as
    separate units) moves it by more, so the test can fail. DP-AdaFEST's contribution
    map moves by at most C1, the user's rows counted once however many examples read them.
(b) Zero noise, a huge clip and k >= every user's count: the user-level step is the
    gradient of the summed loss over the same rows, trained without privacy.
(c) The noise of a user-level step has std sigma C per coordinate (before the 1 / (q U) scale).
(d) The accounting of a user-level run is that of an example-level run on U examples.
(e) Mechanisms and clipping rules not exact per user are refused in one line (bad
    sampler input: test_user_batches.py).
"""

from __future__ import annotations

import types

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf
from front_ends.front_ends import mechanism

from tfdp_embed import mechanisms
from tfdp_embed.accounting.report import privacy_report
from tfdp_embed.accounting.report_text import format_report
from tfdp_embed.data import poisson_batches, poisson_user_batches, with_lookahead
from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.mechanisms.adafest import contribution_map
from tfdp_embed.mechanisms.capabilities import MechanismCapabilities
from tfdp_embed.mechanisms.topk_selection import bucket_counts
from tfdp_embed.planning.plan import plan_run

from .units import (
    VOCAB,
    K,
    bce,
    dp_step_sum,
    first_batch,
    global_norm,
    row_logits,
    skewed_rows,
    unit_model,
    variables,
)

USER_LEVEL = ["DenseDPSGD", "LazyDP", "EANA", "DPAdaFEST", "DPFEST", "DPAdaFESTPlus"]
CLIP = 0.05  # binding: every user's and every row's gradient is larger


def _mechanism(name: str, *, clip: float, sigma: float, seed: int = 1):
    """The front ends' test mechanisms; DP-FEST with its (all-rows) selection counted per user."""
    if name == "DPFEST":
        counts = {"items": np.ones(VOCAB)}
        common = dict(l2_norm_clip=clip, noise_multiplier=sigma, seed=seed, selection_epsilon=1.0, top_k=VOCAB)
        return mechanisms.DPFEST(**common, counts=counts, counts_unit="user")
    if name == "DPAdaFESTPlus":  # every row selected; a stand-in selection event, counted per user
        return mechanisms.DPAdaFESTPlus(
            l2_norm_clip=clip,
            noise_multiplier=sigma,
            seed=seed,
            selected_rows={"items": range(VOCAB)},
            selection_event=dp_accounting.LaplaceDpEvent(100.0),
            contribution_clip=1.0,
            contribution_noise_multiplier=1e-3,
            threshold=0.1,
            counts_unit="user",
        )
    return mechanism(name, clip=clip, sigma=sigma, seed=seed, vocabulary=VOCAB)


def _without_last_user(batch):
    return tuple(t[:-1] for t in batch)


def _rows_as_units(batch, slot: int):
    """The broken variant: user `slot`'s rows each become a unit of their own (per-example clipping)."""
    ids, labels, weight = batch
    real = np.flatnonzero(weight[slot] > 0)
    units = [tuple(np.zeros_like(t[slot]) for t in batch) for _ in real]
    for unit, row in zip(units, real):
        for part, source in zip(unit, batch):
            part[0] = source[slot, row]
    stacked = [np.stack([u[i] for u in units]) for i in range(3)]
    return tuple(np.concatenate([t[:slot], s, t[slot + 1 :]]) for t, s in zip(batch, stacked))


def _moved(fe, name, with_user, without_user) -> float:
    sums = [
        dp_step_sum(fe, unit_model(fe), batch, _mechanism(name, clip=CLIP, sigma=0.0))
        for batch in (with_user, without_user)
    ]
    return global_norm([a - b for a, b in zip(*sums)])


@pytest.mark.parametrize("name", USER_LEVEL)
def test_a_one_users_history_moves_the_clipped_sum_by_at_most_c(fe, name):
    examples, users = skewed_rows()  # the last user has 40 rows, k = 4
    with_user = first_batch(examples, users)
    assert (with_user[2][-1] > 0).sum() == K
    moved = _moved(fe, name, with_user, _without_last_user(with_user))
    assert 0.5 * CLIP < moved <= CLIP * (1 + 1e-4), moved
    # The broken variant (the user's k rows clipped one by one) moves it by more than C.
    broken = _moved(fe, name, _rows_as_units(with_user, slot=4), _without_last_user(with_user))
    assert broken > 1.5 * CLIP, broken


def _map(fe, batch, clip):
    layer = unit_model(fe).get_layer("items")
    table = types.SimpleNamespace(layer=layer, occurrences=[layer.occurrences(batch[0])])
    ((rows, counts),) = contribution_map([table], batch[0].shape[0], clip)
    dense = np.zeros(VOCAB)
    dense[rows.numpy()] = counts.numpy()
    return dense


def test_a_adafest_contribution_map_counts_a_user_once_per_row(fe):
    # The heavy user's 4 rows read some ids several times; each distinct row counts once, the vector clipped to C1.
    examples, users = skewed_rows()
    with_user = first_batch(examples, users)
    moved = _map(fe, with_user, 1.0) - _map(fe, _without_last_user(with_user), 1.0)
    distinct = len(np.unique(with_user[0][-1]))  # ids of its 4 real rows (no padding: 4 = k rows)
    assert distinct < 12  # repeated ids: some row is read through several examples
    np.testing.assert_allclose(moved[moved > 0], 1.0 / np.sqrt(distinct), rtol=1e-6)
    assert np.linalg.norm(moved) <= 1.0 + 1e-6
    broken = _map(fe, _rows_as_units(with_user, slot=4), 1.0) - _map(fe, _without_last_user(with_user), 1.0)
    assert np.linalg.norm(broken) > 1.5, np.linalg.norm(broken)


@pytest.mark.parametrize("name", USER_LEVEL)
def test_b_zero_noise_huge_clip_is_non_private_training_on_the_same_rows(fe, name):
    examples, users = skewed_rows()
    batch = first_batch(examples, users, k=40)  # k >= every user's count: every row is used
    model = unit_model(fe, k=40)
    with tf.GradientTape() as tape:  # the summed loss over the 51 rows, no unit axis, no clipping
        loss = tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(examples[1], row_logits(model, examples[0])))
    expected = [tf.convert_to_tensor(g).numpy() for g in tape.gradient(loss, variables(model))]
    got = dp_step_sum(fe, model, batch, _mechanism(name, clip=1e9, sigma=0.0))
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g, e, rtol=2e-4, atol=2e-6)


def test_c_noise_std_is_sigma_c_per_coordinate(fe):
    examples, users = skewed_rows()
    batch = first_batch(examples, users)
    sigma, clip, b = 2.0, 0.5, 2.5  # b: q U expected users, the divisor of the noised sum
    noised = dp_step_sum(
        fe,
        unit_model(fe, vocabulary=2000, dim=16),
        batch,
        mechanism("DenseDPSGD", clip=clip, sigma=sigma, seed=7),
        expected_batch_size=b,
    )
    clean = dp_step_sum(
        fe,
        unit_model(fe, vocabulary=2000, dim=16),
        batch,
        mechanism("DenseDPSGD", clip=clip, sigma=0.0),
        expected_batch_size=b,
    )
    noise = np.concatenate([(n - c).ravel() for n, c in zip(noised, clean)])
    # 32,145 coordinates: the sample std's relative sd is 1/sqrt(2 n) ~ 0.4%; 3% is ~7 sd.
    assert noise.size > 30_000
    assert np.std(noise) == pytest.approx(sigma * clip, rel=0.03)
    assert abs(np.mean(noise)) < 0.03 * sigma * clip


def _fit_user_level(fe, chosen=None):
    """Two epochs of q = 0.4 user-level batches (registered: `fit` sees privacy_unit "user")."""
    examples, users = skewed_rows()
    chosen = chosen or _mechanism("DenseDPSGD", clip=1.0, sigma=1.1)
    batches, info = poisson_user_batches(
        examples, user_ids=users, max_examples_per_user=K, sampling_probability=0.4, seed=2
    )
    dp = fe.dp_model(unit_model(fe), chosen, batch=info.expected_batch_size, loss=bce(fe))
    dp.fit(batches, epochs=2, verbose=0)
    return dp, info


def test_d_user_level_accounting_is_example_level_accounting_over_units(fe):
    dp, info = _fit_user_level(fe)
    steps = 2 * info.batches_per_epoch
    user = privacy_report(
        mechanism=dp.mechanism, delta=1e-5, sampling_probability=0.4, dataset_size=5, batching=dp.batching, steps=steps
    )
    _, example_info = poisson_batches((np.zeros((5, 1)),), sampling_probability=0.4)
    example = privacy_report(
        mechanism=dp.mechanism, delta=1e-5, sampling_probability=0.4, dataset_size=5, batching=example_info, steps=steps
    )
    assert user["epsilon"] == pytest.approx(example["epsilon"], rel=1e-12)
    assert (user["privacy_unit"], user["max_examples_per_unit"], user["num_units"]) == ("user", K, 5)
    assert user["adjacency"] == "add-or-remove-one-user" and "add-or-remove-one-user adjacency" in user["guarantee"]
    assert (
        f"at most {K} of the user's examples" in user["contribution_bound"]
        and "L2 norm 1" in user["contribution_bound"]
    )
    assert user["batching_source"] == "verified" and user["batching_details"]["num_rows"] == 51
    assert (example["privacy_unit"], example["num_units"], example["adjacency"]) == (
        "one example",
        5,
        "add-or-remove-one-example",
    )
    assert "max_examples_per_unit" not in example
    assert f"privacy unit       user: 5 users, at most {K} examples per user per step" in format_report(user)
    assert "privacy unit" not in format_report(example)
    with pytest.raises(ValueError, match="sampled per user") as error:
        privacy_report(
            mechanism=dp.mechanism,
            delta=1e-5,
            sampling_probability=0.4,
            dataset_size=5,
            batching=dp.batching,
            steps=steps,
            privacy_unit="one example",
        )
    assert "\n" not in str(error.value)


class _Undeclared(mechanisms.DenseDPSGD):
    """A sixth mechanism that does not declare `user_level` (capabilities are never inherited by name)."""

    capabilities = MechanismCapabilities()


def test_e_a_mechanism_not_declaring_user_level_is_refused_in_one_line(fe):
    with pytest.raises(PrivacyContractError) as error:
        _fit_user_level(fe, _Undeclared(l2_norm_clip=1.0, noise_multiplier=1.1, seed=1))
    assert "does not support privacy_unit='user'" in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("name", ["DPFEST", "DPAdaFESTPlus"])
def test_e_a_selection_counted_per_example_is_refused_in_one_line(fe, name):
    per_example = _mechanism(name, clip=1.0, sigma=1.1)
    per_example.counts_unit = "example"  # as built without counts_unit
    with pytest.raises(PrivacyContractError) as error:
        _fit_user_level(fe, per_example)
    assert "counts per example" in str(error.value) and "counts_unit='user'" in str(error.value)
    assert "\n" not in str(error.value)


def test_a_fest_counts_a_user_once_per_row():
    # bucket_counts over user-level batches (q = 1, k >= every count): a user's distinct ids count once,
    # padding rows (weight 0, id 0) not at all; adding the 40-row user moves every count by 0 or 1.
    examples, users = skewed_rows()

    def counts(rows, ids_of):
        batches, _ = poisson_user_batches(rows, user_ids=ids_of, max_examples_per_user=40, sampling_probability=1.0)
        return bucket_counts(batches, vocabulary_sizes={"items": VOCAB}, ids_fn=lambda e: {"items": e[0]})["items"]

    heavy = users == users.max()
    rest = tuple(t[~heavy] for t in examples)
    moved = counts(examples, users) - counts(rest, users[~heavy])
    assert set(np.unique(moved)) == {0, 1} and moved.sum() == len(np.unique(examples[0][heavy]))
    assert counts(examples, users)[0] == 0  # ids are 1..19: padding rows read 0 and are not counted
    # The broken variant, counting rows (examples) instead of users, moves a row by more than 1.
    rows = tf.data.Dataset.from_tensor_slices(examples[0]).batch(64)
    per_row = bucket_counts(rows, vocabulary_sizes={"items": VOCAB}, ids_fn=lambda ids: {"items": ids})["items"]
    rest_rows = tf.data.Dataset.from_tensor_slices(rest[0]).batch(64)
    per_row_rest = bucket_counts(rest_rows, vocabulary_sizes={"items": VOCAB}, ids_fn=lambda ids: {"items": ids})
    assert (per_row - per_row_rest["items"]).max() > 1


def test_e_a_rule_not_marked_for_the_unit_axis_is_refused_in_one_line(fe):
    clipping = __import__(f"tfdp_embed.{fe.name}.clipping", fromlist=["default_registry"])
    registry = clipping.default_registry()
    unmarked = clipping.LayerRegistry(
        [
            (fe.keras.layers.Dense, lambda layer, taps, grads: clipping.dense_layer_gradients(layer, taps, grads)),
            *registry,
        ]
    )
    examples, users = skewed_rows()
    batches, info = poisson_user_batches(
        examples, user_ids=users, max_examples_per_user=K, sampling_probability=1.0, seed=2
    )
    dp = fe.DPModel(
        unit_model(fe),
        mechanism=mechanism("DenseDPSGD", clip=1.0, sigma=1.0),
        expected_batch_size=5.0,
        registry=unmarked,
    )
    dp.compile(optimizer=fe.sgd(0.1), loss=bce(fe))
    with pytest.raises(PrivacyContractError) as error:
        dp.fit(batches, epochs=1, verbose=0)
    assert "not verified exact over the unit axis" in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("fe", ["keras2"], indirect=True)  # lookahead: tf-keras' DPModel only
def test_b_lazy_dp_with_lookahead_on_user_batches_is_non_private_training(fe):
    examples, users = skewed_rows()
    batches, info = poisson_user_batches(examples, user_ids=users, max_examples_per_user=40, sampling_probability=1.0)
    model = unit_model(fe, k=40)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(examples[1], row_logits(model, examples[0])))
    expected = [tf.convert_to_tensor(g).numpy() for g in tape.gradient(loss, variables(model))]
    before = [v.numpy().copy() for v in variables(model)]
    lazy = _mechanism("LazyDP", clip=1e9, sigma=0.0)
    dp = fe.DPModel(model, mechanism=lazy, expected_batch_size=info.expected_batch_size, lookahead=True)
    dp.compile(optimizer=fe.sgd(1.0), loss=bce(fe))
    dp.fit(with_lookahead(batches, lambda ids: {"items": ids}), epochs=1, verbose=0)
    assert dp.batching.info.privacy_unit == "user"
    lazy.flush()
    for e, b, v in zip(expected, before, variables(model)):
        np.testing.assert_allclose((b - v.numpy()) * info.expected_batch_size, e, rtol=2e-4, atol=2e-6)


def test_d_a_plan_over_users_trains_and_reports_in_users(fe):
    # plan_run reads q and N (users) from the sampler's info; the budget's ledger gives the report's epsilon.
    examples, users = skewed_rows()
    batches, info = poisson_user_batches(examples, user_ids=users, max_examples_per_user=K, sampling_probability=0.4)
    plan = plan_run("dense", target_epsilon=8.0, target_delta=1e-5, batching=info, epochs=2, accountant="rdp")
    dp = fe.DPModel(unit_model(fe), plan=plan)
    assert dp.expected_batch_size == pytest.approx(0.4 * 5)  # q U users
    dp.compile(optimizer=fe.sgd(0.1), loss=bce(fe))
    budget = plan.budget()
    dp.fit(batches, epochs=2, verbose=0, callbacks=[budget])
    report = plan.report(dp_model=dp, ledger=budget.ledger)
    assert (report["privacy_unit"], report["num_units"], report["max_examples_per_unit"]) == ("user", 5, K)
    assert report["epsilon"] <= 8.0 and report["adjacency"] == "add-or-remove-one-user"


@pytest.mark.parametrize("fe", ["keras2"], indirect=True)
def test_e_user_level_batches_under_a_mirrored_strategy_are_refused_in_one_line(fe):
    """Per-user clipping across replicas is untested: refused, not run (Keras 3 refuses every strategy)."""
    examples, users = skewed_rows()
    batches, info = poisson_user_batches(
        examples, user_ids=users, max_examples_per_user=K, sampling_probability=0.4, seed=2
    )
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        dp = fe.dp_model(unit_model(fe), _mechanism("DenseDPSGD", clip=1.0, sigma=1.1), batch=2, loss=bce(fe))
    with pytest.raises(PrivacyContractError) as error:
        dp.fit(batches, epochs=1, verbose=0)
    assert "tf.distribute strategy" in str(error.value) and "\n" not in str(error.value)
