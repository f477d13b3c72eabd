"""Tests of LazyDP (tfdp_embed/mechanisms/lazy/mechanism.py).

A tiny DPEmbedding + Dense model is trained by a hand-written DP step
(per-example gradients by a loop, clipped, summed) that calls the mechanism
exactly as `DPModel` does: update -> optimizer.apply_gradients ->
after_apply(lookahead). Ids are drawn from a skewed distribution so rows
sit idle for long stretches, some are never read, and touched rows are
often not in the next batch (the one-step-ahead flag).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from scipy import stats

from tfdp_embed import read_guard
from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.layers.embedding import DPEmbedding
from tfdp_embed.mechanisms.base import ClippedGradients, TableGradient
from tfdp_embed.mechanisms.dense import DenseDPSGD
from tfdp_embed.mechanisms.lazy import LazyDP
from tfdp_embed.mechanisms.lazy import closed_form as lazy_math

VOCAB, DIM, BATCH, IDS = 24, 3, 4, 2
CLIP, SIGMA = 1.0, 1.3


def schedule():
    return keras.optimizers.schedules.PiecewiseConstantDecay([5, 12], [0.3, 0.1, 0.03])


def make_data(steps, seed=0):
    rng = np.random.default_rng(seed)
    p = 1.0 / (np.arange(VOCAB) + 1.0)
    ids = rng.choice(VOCAB - 4, size=(steps, BATCH, IDS), p=p[:-4] / p[:-4].sum())  # rows 20..23 never read
    labels = rng.integers(0, 2, size=(steps, BATCH)).astype(np.float32)
    return ids.astype(np.int32), labels


class Harness:
    """Model + optimizer + mechanism + a traced DP step; `reset(seed)` starts a fresh run."""

    def __init__(
        self,
        mechanism,
        *,
        momentum=0.0,
        nesterov=False,
        learning_rate=None,
        decay=0.0,
        lookahead=True,
        before_init=None,
    ):
        ids = keras.Input((IDS,), dtype="int32")
        self.table = DPEmbedding(
            VOCAB,
            DIM,
            combiner="mean",
            name="items",
            embeddings_initializer=keras.initializers.RandomUniform(-0.5, 0.5, seed=1),
        )
        out = keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(seed=2))(self.table(ids))
        self.model = keras.Model(ids, out)
        self.initial = self.model.get_weights()
        self.optimizer = keras.optimizers.legacy.SGD(
            schedule() if learning_rate is None else learning_rate, momentum=momentum, nesterov=nesterov, decay=decay
        )
        self.mechanism = mechanism
        self.dense_vars = [v for v in self.model.trainable_variables if v is not self.table.embeddings]
        if before_init is not None:
            before_init(self)
        mechanism.init(tables=[self.table], dense_variables=self.dense_vars, optimizer=self.optimizer)
        self.lookahead = lookahead
        self.step = tf.function(
            self._step,
            input_signature=[
                tf.TensorSpec([BATCH, IDS], tf.int32),
                tf.TensorSpec([BATCH], tf.float32),
                tf.TensorSpec([None], tf.int32),
            ],
        )

    def _step(self, x, y, next_ids):
        variables = [self.table.embeddings, *self.dense_vars]
        with tf.GradientTape(persistent=True) as tape:
            losses = tf.nn.sigmoid_cross_entropy_with_logits(y, self.model(x)[:, 0])
            per_example = [losses[i] for i in range(BATCH)]
        sums = [tf.zeros_like(v) for v in variables]
        for loss in per_example:
            grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, variables)]
            norm = tf.sqrt(tf.add_n([tf.reduce_sum(g * g) for g in grads]))
            clip = self.mechanism.l2_norm_clip
            factor = clip / tf.maximum(norm, clip)
            sums = [s + factor * g for s, g in zip(sums, grads)]
        rows = tf.unique(tf.reshape(tf.cast(x, tf.int64), [-1])).y
        table_grad = tf.IndexedSlices(tf.gather(sums[0], rows), rows, tf.shape(sums[0], out_type=tf.int64))
        clipped = ClippedGradients(
            tables=[TableGradient(self.table, self.table.embeddings, table_grad, [], None)],
            dense=list(zip(self.dense_vars, sums[1:])),
            expected_batch_size=float(BATCH),
            batch_size=tf.constant(BATCH),
        )
        self.optimizer.apply_gradients(self.mechanism.update(clipped))
        self.mechanism.after_apply({"items": next_ids} if self.lookahead else None)

    def run(self, ids, labels, *, flush=True):
        for t in range(len(ids)):
            nxt = ids[t + 1].reshape(-1) if t + 1 < len(ids) else np.zeros([0], np.int32)
            self.step(ids[t], labels[t], nxt)
        if flush:
            self.mechanism.flush()
        return self.weights()

    def weights(self):
        """The raw training state (un-flushed unless flushed): white-box reads skip the read guard."""
        with read_guard.unguarded():
            out = [v.numpy() for v in self.model.weights]
            if self.optimizer.get_slot_names():
                out += [self.optimizer.get_slot(v, "momentum").numpy() for v in self.model.trainable_variables]
        return out

    @read_guard.unguarded()
    def reset(self, seed):
        self.model.set_weights(self.initial)
        self.optimizer.iterations.assign(0)
        for v in self.model.trainable_variables if self.optimizer.get_slot_names() else []:
            try:
                slot = self.optimizer.get_slot(v, "momentum")
            except KeyError:  # not created before the first apply
                continue
            slot.assign(tf.zeros_like(slot))
        mech = self.mechanism
        mech.steps.assign(0)
        # Distinct Philox keys: Generator.from_seed(s) only sets the *counter* to s, so
        # seeds s and s + 1 give the same stream shifted by 4 draws (dependent runs).
        mech.generator.reset_from_key_counter(key=seed, counter=[0, 0])
        if isinstance(mech, LazyDP):
            mech.flushed_at.assign(0)
            for history in mech._histories:
                history.assign(tf.zeros_like(history))


# -- exactness: LazyDP replays dense DP-SGD's own noise ------------------------------
@functools.cache
def _stateless_dense_run(momentum, nesterov):
    """Dense DP-SGD with row r's step-t noise keyed by (seed, t, r): the reference weights."""
    mechanism = DenseDPSGD(l2_norm_clip=CLIP, noise_multiplier=SIGMA, seed=7, row_noise="stateless")
    return Harness(mechanism, **_optimizer_args(momentum, nesterov)).run(*make_data(24))


def _optimizer_args(momentum, nesterov):
    if momentum == 0:
        return dict(learning_rate=0.3, decay=0.1)
    return dict(momentum=momentum, nesterov=nesterov)


@pytest.mark.parametrize(
    "momentum,nesterov,lookahead",
    [(0.9, False, True), (0.0, False, True), (0.9, True, True), (0.9, False, False)],
    ids=["momentum", "plain_sgd_inverse_time_decay", "nesterov", "momentum_read_hook_only"],
)
def test_per_step_stateless_lazy_equals_dense_dpsgd(momentum, nesterov, lookahead):
    """24 steps, PiecewiseConstantDecay (plain SGD: lr 0.3 with Keras decay=0.1 instead)."""
    ids, labels = make_data(24)
    kwargs = dict(l2_norm_clip=CLIP, noise_multiplier=SIGMA, seed=7, row_noise="stateless")
    dense = _stateless_dense_run(momentum, nesterov)
    lazy_h = Harness(LazyDP(aggregate=False, **kwargs), lookahead=lookahead, **_optimizer_args(momentum, nesterov))
    lazy = lazy_h.run(ids, labels, flush=False)
    # Rows 20..23 are never read: before the flush they still hold their initial values.
    np.testing.assert_array_equal(lazy[0][20:], lazy_h.initial[0][20:])
    assert lazy_h.mechanism.owes_noise()
    lazy_h.mechanism.flush()
    lazy = lazy_h.weights()
    assert not lazy_h.mechanism.owes_noise()
    for got, want in zip(lazy, dense):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _dp_model_run(mechanism, steps=12, momentum=0.9):
    """DPModel.fit over a lookahead dataset (without it for mechanisms not declaring lookahead), then
    evaluate (read hooks) and flush."""
    from tfdp_embed.keras2.training import DPModel
    from tfdp_embed.mechanisms import capabilities_of

    rng = np.random.default_rng(11)
    ids = rng.integers(0, VOCAB - 4, size=(steps, BATCH, IDS)).astype(np.int32)
    labels = rng.integers(0, 2, size=(steps, BATCH, 1)).astype(np.float32)
    nxt = [np.unique(ids[t + 1]) if t + 1 < steps else np.zeros([0], np.int32) for t in range(steps)]
    data = tf.data.Dataset.from_generator(
        lambda: ((ids[t], labels[t], {"items": nxt[t]}) for t in range(steps)),
        output_signature=(
            tf.TensorSpec([BATCH, IDS], tf.int32),
            tf.TensorSpec([BATCH, 1], tf.float32),
            {"items": tf.TensorSpec([None], tf.int32)},
        ),
    )
    inputs = keras.Input((IDS,), dtype="int32")
    table = DPEmbedding(
        VOCAB,
        DIM,
        combiner="mean",
        name="items",
        embeddings_initializer=keras.initializers.RandomUniform(-0.5, 0.5, seed=1),
    )
    outputs = keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(seed=2))(table(inputs))
    model = keras.Model(inputs, outputs)
    lookahead = capabilities_of(mechanism).lookahead
    if not lookahead:
        data = data.map(lambda x, y, _: (x, y))
    dp_model = DPModel(model, mechanism=mechanism, expected_batch_size=float(BATCH), lookahead=lookahead)
    dp_model.compile(
        optimizer=keras.optimizers.legacy.SGD(schedule(), momentum=momentum),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
    )
    dp_model.fit(data, epochs=1, verbose=0)
    dp_model.evaluate(data.take(2), verbose=0)  # reads rows mid-way: the read hook catches them up
    dp_model.flush()
    return [w.numpy() for w in model.weights]


def test_dp_model_end_to_end_equals_dense_dpsgd():
    kwargs = dict(l2_norm_clip=CLIP, noise_multiplier=SIGMA, seed=5, row_noise="stateless")
    lazy_mechanism = LazyDP(aggregate=False, **kwargs)
    lazy = _dp_model_run(lazy_mechanism)
    # Keras runs the step function once more at the end of the data; that phantom step must
    # not count (DenseDPSGD's counter does advance: 13).
    assert int(lazy_mechanism.steps.numpy()) == 12 and not lazy_mechanism.owes_noise()
    dense = _dp_model_run(DenseDPSGD(**kwargs))
    for got, want in zip(lazy, dense):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_dp_model_fit_on_the_fused_path_counts_real_steps_only():
    """Plain SGD (fused ops): the phantom end-of-data step records nothing; evaluate and flush work."""
    mechanism = LazyDP(l2_norm_clip=CLIP, noise_multiplier=SIGMA, seed=5)
    weights = _dp_model_run(mechanism, momentum=0.0)
    assert mechanism._fused(0)
    assert int(mechanism.steps.numpy()) == 12 and not mechanism.owes_noise()
    np.testing.assert_array_equal(mechanism._histories[0].numpy(), np.full(VOCAB, 24))
    assert all(np.isfinite(w).all() for w in weights)


@pytest.mark.parametrize("momentum", [0.9, 0.0], ids=["momentum", "plain_sgd_fused"])
def test_checkpoint_mid_training_resumes_exactly(tmp_path, momentum):
    """History, step sums, RNG and catch-up stream live in variables: an un-flushed resume is exact."""
    ids, labels = make_data(16, seed=9)
    kwargs = dict(l2_norm_clip=CLIP, noise_multiplier=SIGMA, seed=4)

    def checkpoint(h):
        return tf.train.Checkpoint(model=h.model, optimizer=h.optimizer, mechanism=h.mechanism)

    first = Harness(LazyDP(**kwargs), momentum=momentum)
    first.run(ids[:8], labels[:8], flush=False)
    with read_guard.unguarded():  # training state, as TrainingCheckpoint writes it (un-flushed)
        path = checkpoint(first).save(str(tmp_path / "ckpt"))
    first.run(ids[8:], labels[8:])
    # Restored after init (resume a run) and before init (restore, then DPModel.fit inits).
    after = Harness(LazyDP(**kwargs), momentum=momentum)
    with read_guard.unguarded():  # restored as saved (listing a LazyDP's children outside would flush it)
        checkpoint(after).restore(path).assert_existing_objects_matched()
        before = Harness(LazyDP(**kwargs), momentum=momentum, before_init=lambda h: checkpoint(h).restore(path))
    for resumed in (after, before):
        assert resumed.mechanism.owes_noise()
        np.testing.assert_array_equal(resumed.mechanism._histories[0].numpy(), first_histories(path))
        resumed.run(ids[8:], labels[8:])
        for got, want in zip(resumed.weights(), first.weights()):
            np.testing.assert_array_equal(got, want)


def first_histories(path):
    """The HistoryTable stored in the checkpoint (rows behind, some flagged)."""
    names = [n for n, _ in tf.train.list_variables(path) if "_histories/0/" in n]
    return tf.train.load_variable(path, names[0])


def test_fused_plain_sgd_step_is_bit_identical_to_its_tf_ops(monkeypatch):
    """The fused ops (catch-up, step record) and their TensorFlow references train to the same bits.

    Plain SGD with a schedule, lookahead, read hooks and flush: everything the fused path does.
    """
    from tfdp_embed.ops import sparse_rows

    if not sparse_rows.available():
        pytest.skip("the op library is not built: only the TensorFlow references exist")
    ids, labels = make_data(14, seed=2)
    kwargs = dict(l2_norm_clip=CLIP, noise_multiplier=SIGMA, seed=3)
    fused = Harness(LazyDP(**kwargs))
    assert fused.mechanism._fused(0)
    unflushed = fused.run(ids, labels, flush=False)
    assert int(fused.mechanism.steps.numpy()) == 14
    fused.mechanism.flush()
    want = fused.weights()
    assert fused.mechanism._rows.paths.tables[0].fused  # init chose the custom ops
    # LazyDP chooses its ops once, at init (`sparse_rows.lazy_ops`): here it is given the references.
    monkeypatch.setattr(sparse_rows, "lazy_ops", lambda *variables: sparse_rows.LAZY_REFERENCE)
    reference = Harness(LazyDP(**kwargs))
    assert reference.mechanism._fused(0) and not reference.mechanism._rows.paths.tables[0].fused
    got_unflushed = reference.run(ids, labels, flush=False)
    reference.mechanism.flush()
    for got, expected in zip(got_unflushed + reference.weights(), unflushed + want):
        np.testing.assert_array_equal(got, expected)
    # Rows 20..23 were never read: only the flush moved them, by one aggregated draw each.
    assert not np.array_equal(want[0][20:], fused.initial[0][20:])
    np.testing.assert_array_equal(unflushed[0][20:], fused.initial[0][20:])


# -- distribution: aggregated sampling vs dense DP-SGD over seeded runs -----------------
@pytest.mark.parametrize("momentum", [0.9, 0.0], ids=["momentum", "plain_sgd_fused"])
def test_aggregated_lazy_matches_dense_in_distribution(momentum):
    """Plain SGD runs the fused path (one key per step, catch-up streams, in-op step sums)."""
    runs, steps = 200, 10
    ids, labels = make_data(steps, seed=3)
    finals = {}
    for name, mech in [
        ("lazy", LazyDP(l2_norm_clip=CLIP, noise_multiplier=SIGMA, seed=0)),
        ("dense", DenseDPSGD(l2_norm_clip=CLIP, noise_multiplier=SIGMA, seed=0)),
    ]:
        harness = Harness(mech, momentum=momentum)
        if name == "lazy":
            assert harness.mechanism._fused(0) == (momentum == 0)
        samples = []
        for run in range(runs):
            harness.reset(seed=run + (0 if name == "lazy" else 10_000))
            samples.append(np.concatenate([w.ravel() for w in harness.run(ids, labels)]))
        finals[name] = np.array(samples)
    lazy, dense = finals["lazy"], finals["dense"]
    coords = lazy.shape[1]  # weights and momentum slots: 2 * (24*3 + 3 + 1) = 152 (76 without momentum)
    # Means: Welch z per coordinate; |z| < 4.5 for all (family-wise false alarm ~ 152 * 7e-6 = 1e-3).
    z = (lazy.mean(0) - dense.mean(0)) / np.sqrt(lazy.var(0, ddof=1) / runs + dense.var(0, ddof=1) / runs)
    assert np.max(np.abs(z)) < 4.5, np.max(np.abs(z))
    # Pooled: E sum z^2 = 152 if the means agree (measured: 164); coordinates are correlated,
    # so a loose bound, the chi2 quantile at 1 - 1e-6 of twice the dof (~420).
    assert np.sum(z**2) < stats.chi2.ppf(1 - 1e-6, 2 * coords)
    # Variances: F test per coordinate at two-sided 1e-5 (family-wise ~1.5e-3).
    ratio = lazy.var(0, ddof=1) / dense.var(0, ddof=1)
    low, high = stats.f.ppf([0.5e-5, 1 - 0.5e-5], runs - 1, runs - 1)  # ~[0.53, 1.89]
    assert np.all((ratio > low) & (ratio < high)), (ratio.min(), ratio.max())
    # And on average the variance ratio is 1 within 10% (mean of 152 log ratios; measured -0.006).
    # Power check (run by hand): dropping the momentum/weight covariance gives -0.15 (and a
    # ratio of 0.46), scaling the owed covariance by 0.8 gives -0.22.
    assert abs(np.mean(np.log(ratio))) < 0.1


# -- one catch-up draw vs the closed form -------------------------------------------
def _idle_mechanism(vocab, dim, *, momentum, learning_rate, nesterov=False, seed=0):
    layer = DPEmbedding(vocab, dim, embeddings_initializer="zeros", name="idle")
    layer.build(None)
    optimizer = keras.optimizers.legacy.SGD(learning_rate, momentum=momentum, nesterov=nesterov)
    mech = LazyDP(l2_norm_clip=2.0, noise_multiplier=0.5, seed=seed)
    mech.init(tables=[layer], dense_variables=[], optimizer=optimizer)
    empty = tf.IndexedSlices(tf.zeros([0, dim]), tf.zeros([0], tf.int64), tf.constant([vocab, dim], tf.int64))
    clipped = ClippedGradients(
        tables=[TableGradient(layer, layer.embeddings, empty, [], None)],
        dense=[],
        expected_batch_size=4.0,
        batch_size=tf.constant(4),
    )
    return layer, optimizer, mech, clipped


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_catch_up_draw_matches_closed_form(momentum):
    vocab, dim, steps = 4000, 4, 9
    lrs = [0.3, 0.1, 0.03]
    layer, optimizer, mech, clipped = _idle_mechanism(
        vocab, dim, momentum=momentum, learning_rate=keras.optimizers.schedules.PiecewiseConstantDecay([3, 6], lrs)
    )

    @tf.function
    def step():
        optimizer.apply_gradients(mech.update(clipped))
        mech.after_apply(None)

    for _ in range(steps):
        step()
    # Nothing was read: every row still holds zero and owes all 9 steps (a raw, unguarded read).
    with read_guard.unguarded():
        assert np.all(layer.embeddings.numpy() == 0)
    mech.flush()  # one aggregated draw per row
    theta = layer.embeddings.numpy().ravel()
    # Brute force: w_r = (eta_r sigma C / B)^2, sigma = 0.5, C = 2, B = 4.
    # PiecewiseConstantDecay([3, 6]): iterations 0..3 -> 0.3, 4..6 -> 0.1, 7.. -> 0.03.
    eta = [lrs[0] if i <= 3 else lrs[1] if i <= 6 else lrs[2] for i in range(steps)]
    w = np.array([0.0] + [(e * 0.5 * 2.0 / 4.0) ** 2 for e in eta])
    m_coef = np.array([momentum ** (steps - r) for r in range(1, steps + 1)])
    t_coef = np.array([sum(momentum**i for i in range(steps - r + 1)) for r in range(1, steps + 1)])
    var_theta = np.sum(w[1:] * t_coef**2)
    n = theta.size  # 16,000 draws: sample variance has relative sd sqrt(2/n) = 1.1%; bound 5 sd
    assert np.var(theta) == pytest.approx(var_theta, rel=5 * np.sqrt(2 / n))
    assert abs(theta.mean()) < 5 * np.sqrt(var_theta / n)
    if momentum:
        m = optimizer.get_slot(layer.embeddings, "momentum").numpy().ravel()
        var_m = np.sum(w[1:] * m_coef**2)
        cov = np.sum(w[1:] * m_coef * t_coef)
        assert np.var(m) == pytest.approx(var_m, rel=5 * np.sqrt(2 / n))
        corr = cov / np.sqrt(var_m * var_theta)
        assert np.corrcoef(m, theta)[0, 1] == pytest.approx(corr, abs=5 * (1 - corr**2) / np.sqrt(n))


@pytest.mark.parametrize("nesterov", [False, True])
def test_hot_row_owing_one_step_gets_rank_one_noise(nesterov):
    """Touched at t and read at t + 1: (M, Theta) = (u, (1 + nesterov beta) u), u ~ N(0, w)."""
    vocab, dim, beta = 3000, 4, 0.9
    layer = DPEmbedding(vocab, dim, embeddings_initializer="zeros", name="hot")
    layer.build(None)
    optimizer = keras.optimizers.legacy.SGD(0.2, momentum=beta, nesterov=nesterov)
    mech = LazyDP(l2_norm_clip=2.0, noise_multiplier=0.5, seed=1)
    mech.init(tables=[layer], dense_variables=[], optimizer=optimizer)
    rows = tf.range(vocab, dtype=tf.int64)
    zero_grad = tf.IndexedSlices(tf.zeros([vocab, dim]), rows, tf.constant([vocab, dim], tf.int64))
    clipped = ClippedGradients([TableGradient(layer, layer.embeddings, zero_grad, [], None)], [], 4.0, tf.constant(4))
    optimizer.apply_gradients(mech.update(clipped))  # every row touched (flagged), gradient 0
    mech.after_apply({"hot": rows})  # and read next: each owes exactly step 1's noise
    m = optimizer.get_slot(layer.embeddings, "momentum").numpy()
    theta = layer.embeddings.numpy()
    np.testing.assert_allclose(theta, (1 + beta if nesterov else 1.0) * m, rtol=1e-6, atol=1e-7)
    w = (float(np.float32(0.2)) * 0.5 * 2.0 / 4.0) ** 2
    assert np.var(m) == pytest.approx(w, rel=5 * np.sqrt(2 / m.size))  # 12,000 draws, 5 sd


def test_lookahead_catches_up_only_next_batch_rows_once():
    vocab, dim = 50, 2
    layer, optimizer, mech, clipped = _idle_mechanism(vocab, dim, momentum=0.9, learning_rate=0.1)

    @tf.function
    def step(next_ids):
        optimizer.apply_gradients(mech.update(clipped))
        mech.after_apply({"idle": next_ids})

    def raw_table():  # a white-box read of the un-flushed table (the read guard would flush it)
        with read_guard.unguarded():
            return layer.embeddings.numpy()

    step(tf.constant([3, 7, 7, 3]))  # duplicates are caught up once
    history = mech._histories[0].numpy()
    assert history[3] == history[7] == 2  # current through step 1, flag clear
    assert np.count_nonzero(history) == 2
    assert np.count_nonzero(raw_table().any(axis=1)) == 2  # only rows 3 and 7 moved
    before = raw_table()[[3, 7]]
    step(tf.constant([9]))
    np.testing.assert_array_equal(raw_table()[[3, 7]], before)  # deferred again
    # A read through the layer catches a row up (the read hook): row 3 now owes step 2.
    layer(tf.constant([3]))
    assert mech._histories[0].numpy()[3] == 4 and not np.array_equal(raw_table()[3], before[0])
    assert mech.owes_noise()  # the lookup caught up row 3 only: no flush


# -- degenerate settings ----------------------------------------------------------------
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_zero_noise_huge_clip_reproduces_non_private_sgd(momentum):
    ids, labels = make_data(15, seed=5)
    lazy = Harness(LazyDP(l2_norm_clip=1e9, noise_multiplier=0.0, seed=0), momentum=momentum)
    got = lazy.run(ids, labels)
    # Non-private SGD on the mean loss. With momentum, dense semantics: every row's momentum
    # decays every step (the model dense DP-SGD and LazyDP both implement).
    ref = Harness(DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=0.0, seed=0), momentum=momentum)
    model, optimizer = ref.model, ref.optimizer
    for t in range(len(ids)):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels[t], model(ids[t])[:, 0]))
        grads = tape.gradient(loss, model.trainable_variables)
        if momentum:
            grads = [tf.convert_to_tensor(g) for g in grads]
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
    for g, w in zip(got, ref.weights()):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_flush_owes_noise_and_export_guard():
    ids, labels = make_data(4)
    harness = Harness(LazyDP(l2_norm_clip=CLIP, noise_multiplier=SIGMA, seed=0), momentum=0.9)
    mech = harness.mechanism
    assert not mech.owes_noise()
    mech.assert_flushed()
    harness.run(ids, labels, flush=False)
    assert mech.owes_noise()
    with pytest.raises(PrivacyContractError, match="owes noise"):
        mech.assert_flushed("export")

    @tf.function
    def guarded():
        with tf.control_dependencies([mech.assert_flushed("checkpoint")]):
            return mech.owes_noise_tensor()

    with pytest.raises(tf.errors.InvalidArgumentError, match="owes noise"):
        guarded()
    mech.flush()
    assert not mech.owes_noise() and not guarded().numpy()
    history = mech._histories[0].numpy()
    np.testing.assert_array_equal(history, np.full(VOCAB, 2 * 4))  # every row current, no flag
    # Flushing twice adds nothing.
    before = harness.weights()
    mech.flush()
    for a, b in zip(before, harness.weights()):
        np.testing.assert_array_equal(a, b)


def test_step_sums_grow_past_capacity():
    _, _, mech, clipped = _idle_mechanism(3, 1, momentum=0.5, learning_rate=0.1)
    step = tf.function(lambda: mech.update(clipped))
    for _ in range(1030):
        step()
    sums = mech._step_sums
    assert int(tf.shape(sums.sums.p_hi)[0]) == 2048
    w = (float(np.float32(0.1)) * 0.5 * 2.0 / 4.0) ** 2  # Keras applies the lr in float32
    np.testing.assert_allclose(sums.weights(tf.range(1, 1031)).numpy(), w, rtol=1e-12)
    a = lazy_math.zero_running_sums()
    for _ in range(1030):
        a = lazy_math.advance_running_sums(a, w, beta=0.5)
    assert sums.at(1030).a.numpy() == pytest.approx(a.a.numpy(), rel=1e-12)


# -- refusals and bad arguments -----------------------------------------------------------
@pytest.mark.parametrize(
    "optimizer,match",
    [
        (lambda: keras.optimizers.legacy.Adam(0.1), "no.*closed form.*adafest"),
        (lambda: keras.optimizers.legacy.Adagrad(0.1), "adafest"),
        (lambda: keras.optimizers.SGD(0.1), "legacy.SGD"),
        (lambda: keras.optimizers.legacy.SGD(0.1, clipnorm=1.0), "clipnorm"),
        (lambda: keras.optimizers.legacy.SGD(0.1, momentum=1.0), "momentum"),
        (lambda: None, "optimizer"),
    ],
)
def test_refuses_optimizers_without_exact_lazy_form(optimizer, match):
    layer = DPEmbedding(5, 2)
    layer.build(None)
    mech = LazyDP(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0)
    with pytest.raises(ValueError, match=match):
        mech.init(tables=[layer], dense_variables=[], optimizer=optimizer())


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(l2_norm_clip=0.0), ValueError, "l2_norm_clip"),
        (dict(noise_multiplier=-1.0), ValueError, "noise_multiplier"),
        (dict(noise_multiplier="a lot"), TypeError, "noise_multiplier"),
        (dict(seed="7"), TypeError, "seed"),
        (dict(aggregate="yes"), TypeError, "aggregate"),
        (dict(row_noise="philox"), ValueError, "row_noise"),
        (dict(row_noise="stateless", seed=None), ValueError, "seed"),
        (dict(flush_chunk_rows=0), ValueError, "flush_chunk_rows"),
    ],
)
def test_bad_hyperparameters_raise(kwargs, error, match):
    args = dict(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0) | kwargs
    with pytest.raises(error, match=match):
        LazyDP(**args)


def test_privacy_args_are_keyword_only_and_misuse_is_reported():
    with pytest.raises(TypeError):
        LazyDP(1.0, 1.0)
    mech = LazyDP(l2_norm_clip=1.0, noise_multiplier=1.0, seed=0)
    with pytest.raises(RuntimeError, match="init"):
        mech.flush()
    layer = DPEmbedding(5, 2, name="t")
    with pytest.raises(ValueError, match="not built"):
        mech.init(tables=[layer], dense_variables=[], optimizer=keras.optimizers.legacy.SGD(0.1))
    layer.build(None)
    mech.init(tables=[layer], dense_variables=[], optimizer=keras.optimizers.legacy.SGD(0.1))
    with pytest.raises(KeyError, match="'t'"):
        mech.after_apply({"other": tf.constant([1])})
    with pytest.raises(RuntimeError, match="already"):
        mech.init(tables=[layer], dense_variables=[], optimizer=keras.optimizers.legacy.SGD(0.1))


def test_event_and_report():
    mech = LazyDP(l2_norm_clip=1.0, noise_multiplier=1.1, seed=0)
    event = mech.step_event(0.01)
    assert event.sampling_probability == 0.01 and event.event.noise_multiplier == 1.1
    report = mech.report()
    assert report["mechanism"] == "lazy" and report["is_dp"]
    assert any("flushed" in c for c in report["caveats"])
