"""Attack (issue 33, N1): the weight-0 padding of `fixed_shape_batches` enters DP-AdaFEST's contribution map.

`fixed_shape_batches` pads a capped Poisson batch up to its cap with
all-zero examples of weight 0. Their loss is 0, but they still look rows
up (id 0 here). If those lookups count, adding the target example to a
batch also removes one padding example, and DP-AdaFEST's clipped
contribution map moves by the target's clipped vector *and* a padding
vector: L2 sensitivity sqrt(2) C1 where the accounting assumes C1.

Neighbouring datasets: D = four examples reading rows 1..5, D' = D plus
the target, reading rows 9 and 10. Both go through the library path
(`poisson_batches(q=1, max_batch_size=cap)` -> `fixed_shape_batches`),
the batch is fed to `DPModel` and the map is computed (noise off) from
exactly what the mechanism receives (`contribution_map` of its
`ClippedGradients`). What is measured:

* ||V(D') - V(D)||_2 (C1 = 1): on the old code sqrt(2) = 1.414; it must be <= C1.
* with one padding row left in D (cap = 5) and a near-zero map noise, row
  0, which no real example reads, survives the threshold (and is updated)
  without the target and not with it: a certain distinguisher. Both runs
  must treat row 0 alike.

The same for DP-AdaFEST+ and for `TpuDPStep` (CPU engine of the
TPUEmbeddingV2 interface; a static-shape TPU batch is padded the same way).
Then, for every mechanism, a step on a padded batch must equal the step on
the batch without its padding (same seeds, noise on): padding enters no
count, norm, sum or row set. On the old code the released weights differ
for EANA (row 0 noised, 0.56 apart) and the lookups and clip factors (1,
not 0) of the padding reach every mechanism. Last, DP-FEST's
`bucket_counts` over padded batches must not count the padding (old code:
row 0 counted once per padding example, so adding an example moved a count
down).

Sections 1 and 3 (the contribution map, every mechanism's padded step) run for both front
ends (the `fe` fixture of tests/conftest.py); `TpuDPStep` is tf-keras's.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
from pathlib import Path

import dp_accounting
import numpy as np
import pytest

from tfdp_embed.data import fixed_shape_batches, poisson_batches
from tfdp_embed.keras2 import distribute
from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.mechanisms import DPFEST, EANA, DenseDPSGD, DPAdaFEST, DPAdaFESTPlus, LazyDP
from tfdp_embed.mechanisms.adafest import contribution_map
from tfdp_embed.mechanisms.topk_selection import bucket_counts

VOCAB, DIM, C1 = 16, 2, 1.0
OTHERS = [[1, 2], [2, 3], [3, 4], [4, 5]]  # the four other examples: rows 1..5
TARGET = [9, 10]  # rows no other example reads; padding reads row 0
BCE = keras.losses.BinaryCrossentropy(from_logits=True)  # tf-keras's (TpuDPStep)
pytestmark = pytest.mark.filterwarnings(
    "ignore:DP-AdaFEST.*lets each untouched row through", "ignore:.*not verified Poisson"
)


# -- the data: the library's padded batches of D and D' ---------------------------------------
def _arrays(with_target: bool):
    ids = np.array(OTHERS + ([TARGET] if with_target else []), "int32")
    return ids, np.ones((len(ids), 1), "float32")


def _batch(with_target: bool, cap: int | None):
    """The one batch of `poisson_batches(q=1)` over D (or D'), padded to `cap` by `fixed_shape_batches`."""
    batches, info = poisson_batches(_arrays(with_target), sampling_probability=1.0, max_batch_size=cap or 8, seed=1)
    if cap is not None:
        batches, info = fixed_shape_batches(batches, info)
    return next(iter(batches))


# -- the model and one step with the mechanism's input captured -------------------------------
def _model(fe):
    keras = fe.keras
    keras.utils.set_random_seed(3)
    ids = keras.Input((2,), dtype="int32")
    table = fe.DPEmbedding(VOCAB, DIM, combiner="mean", name="items")
    return keras.Model(ids, keras.layers.Dense(1, name="out")(table(ids)))


def _capture(mechanism) -> dict:
    """Wraps `mechanism.update`: records the contribution map (noise off) and each table's updated rows."""
    seen: dict = {}
    update = mechanism.update

    def capture(clipped):
        maps = contribution_map(clipped.tables, clipped.batch_size, C1)
        seen["map"] = {
            (t, int(r)): float(c) for t, (rows, counts) in enumerate(maps) for r, c in zip(rows.numpy(), counts.numpy())
        }
        seen["clip_factors"] = clipped.tables[0].clip_factors.numpy() if clipped.tables else None
        pairs = update(clipped)
        seen["pairs"] = pairs
        seen["rows"] = {
            v.name: sorted(int(i) for i in g.indices.numpy()) for g, v in pairs if isinstance(g, tf.IndexedSlices)
        }
        return pairs

    mechanism.update = capture
    return seen


def _dp_step(fe, mechanism, batch) -> tuple[dict, list]:
    """One `DPModel` step (eager, SGD lr 1) on `batch`; (what the mechanism saw, weights after, flushed)."""
    model = _model(fe)
    seen = _capture(mechanism)
    dp = fe.DPModel(model, mechanism=mechanism, expected_batch_size=4.0)
    bce = fe.keras.losses.BinaryCrossentropy(from_logits=True)
    dp.compile(optimizer=fe.sgd(1.0), loss=bce, run_eagerly=True)
    dp.fit(tf.data.Dataset.from_tensors(batch), epochs=1, verbose=0)
    return seen, dp.get_weights()


def _adafest(sigma1=1.0, tau=0.5, seed=7):
    return DPAdaFEST(
        l2_norm_clip=1.0,
        noise_multiplier=1.0,
        contribution_clip=C1,
        contribution_noise_multiplier=sigma1,
        threshold=tau,
        seed=seed,
    )


def _adafest_plus(sigma1=1.0, tau=0.5, seed=7):
    return DPAdaFESTPlus(
        selected_rows={"items": range(VOCAB)},
        selection_event=dp_accounting.NoOpDpEvent(),
        l2_norm_clip=1.0,
        noise_multiplier=1.0,
        contribution_clip=C1,
        contribution_noise_multiplier=sigma1,
        threshold=tau,
        seed=seed,
    )


def _sensitivity(map_a: dict, map_b: dict) -> float:
    keys = set(map_a) | set(map_b)
    return math.sqrt(sum((map_a.get(k, 0.0) - map_b.get(k, 0.0)) ** 2 for k in keys))


# -- 1. the contribution map's sensitivity ------------------------------------------------------
@pytest.mark.parametrize("make", [_adafest, _adafest_plus], ids=["adafest", "adafest+"])
def test_contribution_map_of_padded_neighbours_moves_by_at_most_c1(fe, make):
    cap = 6  # D: 4 examples + 2 padding; D': 5 examples + 1 padding
    without, _ = _dp_step(fe, make(), _batch(False, cap))
    with_target, _ = _dp_step(fe, make(), _batch(True, cap))
    measured = _sensitivity(without["map"], with_target["map"])
    # Expected: the target's clipped vector, two rows at 1/sqrt(2) each: exactly C1.
    # (Old code: and row 0 loses one padding example's count 1: sqrt(2) C1 = 1.414.)
    assert measured <= C1 + 1e-6, (
        f"the contribution map of padded neighbours moved by {measured:.4f} > C1 = {C1}: the weight-0 "
        f"padding rows count (map without target {without['map']}, with {with_target['map']})"
    )
    assert measured == pytest.approx(C1, abs=1e-6)  # the target itself still counts fully


@pytest.mark.parametrize("make", [_adafest, _adafest_plus], ids=["adafest", "adafest+"])
def test_row_read_only_by_padding_is_treated_alike_with_and_without_the_target(fe, make):
    cap = 5  # D: one padding example; D': none
    # sigma1 tiny: a counted row survives tau = 0.5 with certainty, an uncounted one never.
    without, _ = _dp_step(fe, make(sigma1=1e-3), _batch(False, cap))
    with_target, _ = _dp_step(fe, make(sigma1=1e-3), _batch(True, cap))
    row0 = (0 in _table_rows(without), 0 in _table_rows(with_target))
    assert row0[0] == row0[1], (
        f"row 0, read by no real example, is updated without the target: {row0[0]}, with it: {row0[1]} "
        "(the padding example's lookup passed the threshold)"
    )
    assert row0 == (False, False)
    assert 9 in _table_rows(with_target)  # the target's rows survive (count 1/sqrt(2) > 0.5)


def _table_rows(seen: dict) -> list:
    """The rows the mechanism updates in the one table (its only sparse gradient)."""
    (rows,) = seen["rows"].values()
    return rows


# -- 2. TpuDPStep: the static-shape TPU batch ---------------------------------------------------
def _cpu_engine():
    path = Path(__file__).resolve().parents[1] / "distributed" / "cpu_engine.py"
    spec = importlib.util.spec_from_file_location("_padding_cpu_engine", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CpuEngine


def _tpu_step(mechanism, batch, traced: bool = False) -> tuple[dict, list]:
    """One `TpuDPStep` on the batch (sequence feature "f" of table "items"); (seen, weights).

    `traced`: the step runs as a `tf.function` (nothing is captured then).
    """
    keras.utils.set_random_seed(3)
    table = np.random.default_rng(0).uniform(-0.5, 0.5, (VOCAB, DIM)).astype("float32")
    engine = _cpu_engine()(
        {"items": table}, {"f": ("items", None), distribute.noise_feature_name("items"): ("items", "sum")}, 1.0
    )
    inp = keras.Input((2, DIM), name="f")
    tower = keras.Model({"f": inp}, keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(inp)))
    seen = {} if traced else _capture(mechanism)
    step = distribute.TpuDPStep(
        engine,
        model=tower,
        features=[distribute.TpuFeature("f", "items", None)],
        mechanism=mechanism,
        loss=BCE,
        optimizer=keras.optimizers.legacy.SGD(1.0),
        expected_batch_size=4.0,
        table_sizes={"items": (VOCAB, DIM)},
        max_noise_rows=VOCAB,
    )
    features, labels, *weights = batch
    step = tf.function(step) if traced else step
    if weights and "sample_weight" in inspect.signature(distribute.TpuDPStep.__call__).parameters:
        step({"f": features}, labels, sample_weight=weights[0])
    else:  # a step with no way to mark padding: the padded batch is all it can be given
        step({"f": features}, labels)
    return seen, [engine.embedding_tables["items"].numpy(), *tower.get_weights()]


def test_tpu_step_contribution_map_of_padded_neighbours_moves_by_at_most_c1():
    without, _ = _tpu_step(_adafest(), _batch(False, 6))
    with_target, _ = _tpu_step(_adafest(), _batch(True, 6))
    measured = _sensitivity(without["map"], with_target["map"])
    assert measured <= C1 + 1e-6, f"TpuDPStep's contribution map moved by {measured:.4f} > C1 = {C1}"


def test_tpu_step_on_a_padded_batch_equals_the_step_without_padding():
    seen_padded, padded = _tpu_step(_adafest(), _batch(True, 7))
    seen_plain, plain = _tpu_step(_adafest(), _batch(True, None))
    assert seen_padded["rows"] == seen_plain["rows"]
    for got, want in zip(padded, plain):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    _, traced = _tpu_step(_adafest(), _batch(True, 7), traced=True)  # the same as a tf.function
    for got, want in zip(traced, plain):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


# -- 3. every mechanism: a padded step is the unpadded step -------------------------------------
def _fest():
    counts = {"items": np.arange(VOCAB)[::-1].astype("float64")}
    return DPFEST(l2_norm_clip=1.0, noise_multiplier=1.0, selection_epsilon=1.0, top_k=8, counts=counts, seed=7)


MECHANISMS = {
    "dense": lambda: DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0, seed=7),
    "eana": lambda: EANA(l2_norm_clip=1.0, noise_multiplier=1.0, seed=7),
    "lazy": lambda: LazyDP(l2_norm_clip=1.0, noise_multiplier=1.0, seed=7),
    "fest": _fest,
    "adafest": _adafest,
    "adafest+": _adafest_plus,
}


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_every_mechanism_steps_on_a_padded_batch_as_on_the_batch_without_padding(fe, name):
    seen_padded, padded = _dp_step(fe, MECHANISMS[name](), _batch(True, 8))  # 5 examples + 3 padding
    seen_plain, plain = _dp_step(fe, MECHANISMS[name](), _batch(True, None))
    assert seen_padded["rows"] == seen_plain["rows"], "padding changed the rows the mechanism updates"
    assert seen_padded["map"] == pytest.approx(seen_plain["map"]), "padding entered the lookups"
    np.testing.assert_array_equal(seen_padded["clip_factors"][5:], 0.0)  # padding: no share of any sum
    np.testing.assert_allclose(seen_padded["clip_factors"][:5], seen_plain["clip_factors"], rtol=1e-6)
    for i, (got, want) in enumerate(zip(padded, plain)):  # noise on, same seeds: the same weights
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6, err_msg=f"{name}: weight {i}")


# -- 4. DP-FEST's counts: a padded dataset counts its real examples only ------------------------
def test_bucket_counts_of_padded_batches_count_the_real_examples_only():
    batches, info = poisson_batches(_arrays(True), sampling_probability=1.0, max_batch_size=8, seed=1)
    padded, _ = fixed_shape_batches(batches, info)  # 5 examples + 3 padding examples reading row 0
    sizes = {"items": VOCAB}
    plain = bucket_counts(batches.map(lambda x, y: ({"items": x}, y)), vocabulary_sizes=sizes)["items"]
    counted = bucket_counts(padded.map(lambda x, y, w: ({"items": x}, y, w)), vocabulary_sizes=sizes)["items"]
    # Old code: row 0 counted 3 (the padding), so adding an example moved row 0's count down by 1
    # while the target's rows moved up: not the one-directional sensitivity-1 counts dp_top_k assumes.
    assert counted[0] == plain[0] == 0, f"row 0 counted {counted[0]} times: the padding examples were counted"
    np.testing.assert_array_equal(counted, plain)
