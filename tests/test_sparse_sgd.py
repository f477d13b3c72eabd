"""`sparse_sgd`: plain SGD's table steps by one fused op, bit-identical to the optimizer's, on both front ends.

Under a plain SGD the DP step applies each table's noised `tf.IndexedSlices`
gradient itself (`sparse_rows.scatter_add_sum`) and leaves every other
variable, and every other optimizer, to the optimizer. Seeded runs with and
without it must release the same weights bit for bit and count the same
steps; a table that diverges must still stop training, also where no dense
variable is left for the optimizer.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests.front_ends.front_ends import ctr_batches, mechanism
from tfdp_embed import sparse_sgd
from tfdp_embed.ops import sparse_rows

pytestmark = pytest.mark.skipif(not sparse_rows.available(), reason="the op library is not built")


def _fit(fe, name, *, fused: bool, monkeypatch, optimizer=None, model=None, sigma=1.0, batches=None):
    calls = []
    with monkeypatch.context() as patch:
        if not fused:
            patch.setattr(sparse_sgd, "fused_sgd", lambda optimizer: None)
        for op_name in ("scatter_add_sum", "momentum_sum"):  # count the fused steps traced
            real = getattr(sparse_rows, op_name)
            patch.setattr(sparse_rows, op_name, lambda *a, real=real, **k: calls.append(1) or real(*a, **k))
        dp = fe.DPModel(
            model if model is not None else fe.ctr_model(),
            mechanism=mechanism(name, clip=1.0, sigma=sigma, seed=5),
            expected_batch_size=128,
        )
        dp.compile(optimizer=optimizer or fe.sgd(0.5), loss=fe.keras.losses.BinaryCrossentropy(from_logits=True))
        dp.fit(batches if batches is not None else ctr_batches(), epochs=1, verbose=0)
    return dp, len(calls)


@pytest.mark.parametrize("name", ["LazyDP", "EANA", "DPAdaFEST"])
def test_seeded_weights_are_bit_identical_to_the_optimizers_step(fe, name, monkeypatch):
    fused, traced_ops = _fit(fe, name, fused=True, monkeypatch=monkeypatch)
    stock, stock_ops = _fit(fe, name, fused=False, monkeypatch=monkeypatch)
    assert traced_ops >= 1 and stock_ops == 0  # the fused op ran, and only on the fused run
    for got, want in zip(fused.get_weights(), stock.get_weights()):
        np.testing.assert_array_equal(got, want)
    assert int(fused.optimizer.iterations.numpy()) == int(stock.optimizer.iterations.numpy()) == 4


@pytest.mark.parametrize("name", ["EANA", "LazyDP"])
@pytest.mark.parametrize("nesterov", [False, True])
def test_legacy_momentum_gives_the_same_weights_and_slots(name, nesterov, monkeypatch):
    """tf-keras' legacy SGD with momentum: dedup and Keras' momentum op, fused; Keras 3's is dense (not fused).

    The clipping's rows are distinct (`sparse_rows.is_distinct`): the fused step skips the dedup for them.
    """
    from tests.front_ends.front_ends import front_end

    fe = front_end("keras2")
    runs, vouched = [], []
    real_is_distinct = sparse_rows.is_distinct
    monkeypatch.setattr(sparse_rows, "is_distinct", lambda x: vouched.append(real_is_distinct(x)) or vouched[-1])
    for fused in (True, False):
        sgd = fe.keras.optimizers.legacy.SGD(0.5, momentum=0.9, nesterov=nesterov)
        dp, ops = _fit(fe, name, fused=fused, monkeypatch=monkeypatch, optimizer=sgd)
        runs.append((dp, ops, [w.numpy() for w in sgd.variables()]))
    (fused_dp, ops, fused_slots), (stock_dp, _, stock_slots) = runs
    assert ops >= 1 and vouched and all(vouched)
    for got, want in zip(fused_dp.get_weights() + fused_slots, stock_dp.get_weights() + stock_slots):
        np.testing.assert_array_equal(got, want)


def test_a_schedule_gives_the_same_weights(fe, monkeypatch):
    def optimizer():
        return fe.sgd(fe.keras.optimizers.schedules.ExponentialDecay(0.5, decay_steps=1, decay_rate=0.5))

    fused, _ = _fit(fe, "LazyDP", fused=True, monkeypatch=monkeypatch, optimizer=optimizer())
    stock, _ = _fit(fe, "LazyDP", fused=False, monkeypatch=monkeypatch, optimizer=optimizer())
    for got, want in zip(fused.get_weights(), stock.get_weights()):
        np.testing.assert_array_equal(got, want)


def _table_only(fe, vocabulary=1000):
    """ids [B, 4] -> DPEmbedding(width 1, sum): the logit. No dense variable: the fused op applies everything."""
    keras = fe.keras
    inputs = keras.Input((4,), dtype="int32")
    model = keras.Model(inputs, fe.DPEmbedding(vocabulary, 1, combiner="sum", name="table")(inputs))
    model.set_weights([np.random.default_rng(0).normal(0, 0.1, (vocabulary, 1)).astype("float32")])
    return model


@pytest.mark.parametrize(("name", "momentum"), [("EANA", 0.0), ("LazyDP", 0.9)])
def test_a_model_of_tables_only_counts_its_steps(fe, name, momentum, monkeypatch):
    """No variable is left for the optimizer: the step is counted (Keras 3 LazyDP with momentum raised before)."""
    optimizers = fe.keras.optimizers.legacy if fe.name == "keras2" else fe.keras.optimizers
    runs = [
        _fit(
            fe,
            name,
            fused=fused,
            monkeypatch=monkeypatch,
            model=_table_only(fe),
            optimizer=optimizers.SGD(0.5, momentum=momentum),
        )
        for fused in (True, False)
    ]
    (fused, ops), (stock, _) = runs
    assert ops >= 1
    np.testing.assert_array_equal(fused.get_weights()[0], stock.get_weights()[0])
    assert int(fused.optimizer.iterations.numpy()) == 4


@pytest.mark.parametrize(("name", "momentum"), [("EANA", 0.0), ("LazyDP", 0.0), ("LazyDP", 0.9)])
def test_a_diverged_table_stops_training(fe, name, momentum, monkeypatch):
    """Rows written as NaN stop the step, whoever applies the tables (the fused op, or LazyDP's momentum step).

    The table starts as NaN (as after an overflow): every row a batch writes is NaN, while the Dense layers
    stay finite (each example's loss is NaN: clip factor 0, noise only). Keras 3's LazyDP with momentum
    applies the tables itself (`sgd_adapter.apply_sparse`); before this fix its check left the tables out
    and the diverged model trained on (checked on 9d7097a).
    """
    model = fe.ctr_model()
    weights = model.get_weights()
    weights[0][:] = np.nan
    model.set_weights(weights)
    optimizers = fe.keras.optimizers.legacy if fe.name == "keras2" else fe.keras.optimizers
    sgd = optimizers.SGD(0.5, momentum=momentum)
    with pytest.raises(tf.errors.InvalidArgumentError, match="weights are NaN or Inf"):
        _fit(fe, name, fused=True, monkeypatch=monkeypatch, optimizer=sgd, model=model)


def test_float64_tables_keep_the_optimizers_arithmetic(fe, monkeypatch):
    """A float64 table is not fused; LazyDP with momentum still steps it (Keras 3: the op's reference, in float64).

    Before this fix the Keras 3 reference got a float32 learning rate for a float64 gradient and raised.
    """
    keras = fe.keras
    inputs = keras.Input((4,), dtype="int32")
    table = fe.DPEmbedding(1000, 8, combiner="mean", name="table", dtype="float64")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(1, dtype="float64")(table))
    optimizers = keras.optimizers.legacy if fe.name == "keras2" else keras.optimizers
    dp, _ = _fit(
        fe, "LazyDP", fused=True, monkeypatch=monkeypatch, model=model, optimizer=optimizers.SGD(0.5, momentum=0.9)
    )
    weights = dp.get_weights()[0]
    assert weights.dtype == np.float64 and np.isfinite(weights).all()
    assert int(dp.optimizer.iterations.numpy()) == 4


def test_only_an_sgd_that_steps_rows_sparsely_is_fused(fe):
    keras = fe.keras
    optimizers = keras.optimizers.legacy if fe.name == "keras2" else keras.optimizers
    assert sparse_sgd.fused_sgd(fe.sgd(0.1)) is not None

    class Subclass(optimizers.SGD):
        pass

    # Legacy momentum is a sparse step (fused); Keras 3's momentum steps every row (the optimizer's).
    assert (sparse_sgd.fused_sgd(optimizers.SGD(0.1, momentum=0.9)) is None) == (fe.name == "keras3")
    refused = [
        optimizers.SGD(0.1, clipnorm=1.0),
        Subclass(0.1),
        optimizers.Adagrad(0.1),
    ]
    if fe.name == "keras2":
        refused.append(keras.optimizers.SGD(0.1))  # tf-keras' new-style SGD
    for optimizer in refused:
        assert sparse_sgd.fused_sgd(optimizer) is None, optimizer
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
        assert sparse_sgd.fused_sgd(fe.sgd(0.1)) is None  # under a strategy the optimizer applies everything
