"""Stacked tables (`StackedEmbedding`, `CTRModelConfig.stack_tables`) against one `DPEmbedding` per feature.

The pCTR model below has 26 tables of widths 3 and 4 and sizes 6..31 rows,
so it stacks into two groups (`embedding_stack_3`, `embedding_stack_4`).
Both layouts start from the same weights (the stacks hold the per-feature
tables end to end). Checked:

* zero noise and a huge clip: every mechanism's weights after 3 steps are
  the unstacked run's, to float32 round-off (the clipped sums add the same
  terms in another order);
* per-example norms: the stacked rule's equal the per-feature rules' summed
  (and the brute-force jacobian's), exactly per example over all tables;
* with noise (LazyDP, dense DP-SGD): after one step the released rows no
  example touched differ from their initial values by N(0, (lr sigma C / B)^2),
  in both layouts (LazyDP's owed noise flushed on the release path);
* export: a fresh load of the stacked model's serving signature on raw
  fields gives the unstacked model's predictions for the same weights;
* checkpoint round trip (`DPCheckpoint`, LazyDP's per-table state in one
  stack variable);
* bad input: one-line errors naming what is wrong and what is allowed.
"""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed import DPModel, export_saved_model, keras, tf
from tfdp_embed.accounting import PrivacyBudget
from tfdp_embed.clipping.taps import layers_owning_weights, record_taps
from tfdp_embed.data import with_lookahead
from tfdp_embed.data.criteo import CAT_FEATURES, INT_FEATURES, INT_MISSING
from tfdp_embed.keras2.checkpointing import DPCheckpoint
from tfdp_embed.keras2.clipping import clipped_step, default_registry, vectorized_layer_gradients
from tfdp_embed.keras2.layers.stacked_embedding import StackedEmbedding, stacked_tables
from tfdp_embed.keras2.models import RAW_FIELDS, CTRModelConfig, CTRServingModule, build_ctr_model
from tfdp_embed.keras2.models.ctr import feature_table, table_counts, table_ids_fn, table_names
from tfdp_embed.mechanisms import create

VOCAB = tuple(range(5, 31))  # V_k; the tables have V_k + 1 rows (row 0: missing)
DIMS = (3, 4) * 13
BATCH, STEPS = 16, 3


def _config(stack: bool) -> CTRModelConfig:
    return CTRModelConfig(vocab_sizes=VOCAB, embedding_dims=DIMS, hidden_units=(8,), stack_tables=stack)


def _features(n: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    features = {name: rng.normal(size=n).astype(np.float32) for name in INT_FEATURES}
    features[INT_MISSING] = rng.integers(0, 2, (n, 13)).astype(np.float32)
    features.update({f: rng.integers(0, v + 1, n).astype(np.int64) for f, v in zip(CAT_FEATURES, VOCAB)})
    return features


def _batches(steps: int = STEPS, seed: int = 0):
    features = _features(BATCH * steps, seed)
    labels = np.random.default_rng(seed + 1).integers(0, 2, (BATCH * steps, 1)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((features, labels)).batch(BATCH)


def _pair():
    """(unstacked model, stacked model holding the same weights)."""
    keras.utils.set_random_seed(7)
    plain, stacked = build_ctr_model(_config(False)), build_ctr_model(_config(True))
    for layer in stacked.layers:
        if isinstance(layer, StackedEmbedding):
            layer.embeddings.assign(
                np.concatenate([plain.get_layer(f"embedding_{f}").get_weights()[0] for f in layer.features])
            )
        elif layer.weights:
            layer.set_weights(plain.get_layer(layer.name).get_weights())
    return plain, stacked


def _per_feature(model) -> dict:
    """`{feature: its table's rows}` in either layout."""
    config = _config(any(isinstance(layer, StackedEmbedding) for layer in model.layers))
    rows = {}
    for feature, vocab in zip(CAT_FEATURES, VOCAB):
        name, offset = feature_table(config, feature)
        rows[feature] = model.get_layer(name).embeddings.numpy()[offset : offset + vocab + 1]
    return rows


def _mechanism(name: str, config: CTRModelConfig, *, noise: float = 0.0, clip: float = 1e6):
    if name == "none":
        return create("none")
    kwargs = dict(l2_norm_clip=clip, noise_multiplier=noise, seed=3)
    counts = table_counts(config, {f: np.ones(v + 1) for f, v in zip(CAT_FEATURES, VOCAB)})
    if name == "fest":  # every row selected: the selection's noise changes nothing
        kwargs.update(selection_epsilon=1.0, top_fraction=1.0, counts=counts)
    elif name in ("adafest", "adafest+"):  # a tiny contribution noise: every touched row survives
        kwargs.update(contribution_clip=1.0, contribution_noise_multiplier=1e-6, threshold=0.0)
        if name == "adafest+":
            kwargs.update(counts=counts, selection_epsilon=1.0, top_fraction=1.0)
    return create(name, **kwargs)


def _train(model, mechanism, *, steps: int = STEPS, lr: float = 0.3) -> DPModel:
    dp = DPModel(model, mechanism=mechanism, expected_batch_size=BATCH)
    dp.compile(optimizer=keras.optimizers.legacy.SGD(lr), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    dp.fit(_batches(steps), epochs=1, verbose=0)
    return dp


@pytest.mark.parametrize("name", ["none", "dense", "eana", "lazy", "fest", "adafest", "adafest+"])
def test_zero_noise_and_a_huge_clip_give_the_unstacked_weights(name):
    plain, stacked = _pair()
    released = []
    for model, stack in ((plain, False), (stacked, True)):
        dp = _train(model, _mechanism(name, _config(stack)))
        dp.get_weights()  # the release path (LazyDP: flush; no noise owed here)
        released.append(model)
    assert table_names(_config(True)) == ["embedding_stack_3", "embedding_stack_4"]
    for feature, rows in _per_feature(plain).items():
        np.testing.assert_allclose(_per_feature(stacked)[feature], rows, rtol=1e-6, atol=1e-7, err_msg=feature)
    for layer in plain.layers:
        if layer.weights and not layer.name.startswith("embedding_"):
            for a, b in zip(layer.get_weights(), stacked.get_layer(layer.name).get_weights()):
                np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7, err_msg=layer.name)


def test_lazy_lookahead_takes_the_stacks_offset_ids():
    """`table_ids_fn` gives each stack its features' ids plus offsets: LazyDP's lookahead catches those rows up."""
    plain, stacked = _pair()
    for model, stack in ((plain, False), (stacked, True)):
        dp = DPModel(model, mechanism=_mechanism("lazy", _config(stack)), expected_batch_size=BATCH, lookahead=True)
        dp.compile(optimizer=keras.optimizers.legacy.SGD(0.3), loss=keras.losses.BinaryCrossentropy(from_logits=True))
        dp.fit(with_lookahead(_batches(), table_ids_fn(_config(stack))), epochs=1, verbose=0)
        dp.get_weights()
    ids = table_ids_fn(_config(True))({f: tf.constant([0, 1]) for f in CAT_FEATURES})
    offsets = [feature_table(_config(True), f)[1] for f in CAT_FEATURES[0::2]]  # the width-3 features: C1, C3, ...
    np.testing.assert_array_equal(ids["embedding_stack_3"].numpy(), np.array([offsets, [o + 1 for o in offsets]]))
    for feature, rows in _per_feature(plain).items():
        np.testing.assert_allclose(_per_feature(stacked)[feature], rows, rtol=1e-6, atol=1e-7, err_msg=feature)


def _norms(model, features):
    model(features)
    registry = default_registry()
    with tf.GradientTape(persistent=True) as tape:
        with record_taps(layers_owning_weights(model), registry) as taps:
            logits = model(features)
        loss = tf.reduce_sum(tf.square(logits - 0.3), axis=1)
    step = clipped_step(taps, loss, tape, registry=registry, fallback=vectorized_layer_gradients, l2_norm_clip=1.0)
    jacobians = tape.jacobian(loss, model.trainable_variables)
    brute = sum(np.sum(np.square(np.reshape(tf.convert_to_tensor(j), [len(loss), -1])), axis=1) for j in jacobians)
    tables = sum(info.squared_norms.numpy() for tap, info in step.layers if tap.layer.name.startswith("embedding_"))
    return step.norms.numpy(), np.sqrt(brute), tables


def test_per_example_norms_are_exact_over_all_stacked_tables():
    plain, stacked = _pair()
    features = {k: tf.constant(v) for k, v in _features(BATCH, seed=5).items()}
    features["C3"] = tf.constant(np.full(BATCH, 2, np.int64))  # one shared row: its sum is per example
    plain_norms, plain_brute, plain_tables = _norms(plain, features)
    stacked_norms, stacked_brute, stacked_tables_sq = _norms(stacked, features)
    np.testing.assert_allclose(stacked_norms, plain_norms, rtol=1e-5)
    np.testing.assert_allclose(stacked_norms, stacked_brute, rtol=1e-4)
    np.testing.assert_allclose(stacked_tables_sq, plain_tables, rtol=1e-5)  # the tables' part, per example


@pytest.mark.parametrize("name", ["lazy", "dense"])
def test_released_noise_on_untouched_rows_matches_the_formula(name):
    """One step, sigma = 2, C = 0.5, lr = 0.3, B = 16: untouched rows move by N(0, (0.3 * 2 * 0.5 / 16)^2)."""
    big = tuple(range(400, 426))
    config_of = {
        s: CTRModelConfig(vocab_sizes=big, embedding_dims=DIMS, hidden_units=(8,), stack_tables=s)
        for s in (False, True)
    }
    expected = 0.3 * 2.0 * 0.5 / BATCH  # 0.01875
    features = _features(BATCH, seed=9)  # ids < 31 of vocabularies >= 400: rows 31.. are untouched
    labels = np.zeros((BATCH, 1), np.float32)
    for stack, config in config_of.items():
        keras.utils.set_random_seed(11)
        model = build_ctr_model(config)
        before = {layer.name: layer.embeddings.numpy() for layer in model.layers if layer.name.startswith("embedding_")}
        mechanism = create(name, l2_norm_clip=0.5, noise_multiplier=2.0, seed=13)
        dp = DPModel(model, mechanism=mechanism, expected_batch_size=BATCH)
        dp.compile(optimizer=keras.optimizers.legacy.SGD(0.3), loss=keras.losses.BinaryCrossentropy(from_logits=True))
        dp.fit(tf.data.Dataset.from_tensors((features, labels)), epochs=1, verbose=0)
        released = dict(zip([w.name for w in model.weights], dp.get_weights()))  # flushed
        deltas = []
        for feature, vocab in zip(CAT_FEATURES, big):
            table, offset = feature_table(config, feature)
            weight = next(v for k, v in released.items() if k.startswith(f"{table}/"))
            deltas.append((weight - before[table])[offset + 31 : offset + vocab + 1].ravel())
        deltas = np.concatenate(deltas)  # ~34,000 values: the std is within 2% with overwhelming probability
        assert abs(deltas.std() / expected - 1) < 0.03, (stack, deltas.std(), expected)
        assert abs(deltas.mean()) < 3 * expected / np.sqrt(deltas.size)


def test_export_serves_raw_fields_as_the_unstacked_model(tmp_path):
    plain, stacked = _pair()
    dp = _train(stacked, _mechanism("lazy", _config(True), noise=1.0, clip=1.0))
    module = CTRServingModule(stacked, _config(True))
    export_saved_model(dp, str(tmp_path / "model"), serving_module=module, signatures={"serving_default": module.serve})
    for layer in plain.layers:  # the released (flushed) weights, split per feature
        if layer.name.startswith("embedding_"):
            name, offset = feature_table(_config(True), layer.name.removeprefix("embedding_"))
            rows = layer.vocabulary_size
            layer.embeddings.assign(stacked.get_layer(name).embeddings.numpy()[offset : offset + rows])
        elif layer.weights:
            layer.set_weights(stacked.get_layer(layer.name).get_weights())
    rng = np.random.default_rng(2)
    raw = {name: tf.constant(rng.integers(-2, 100, 6).astype(str)) for name in INT_FEATURES}
    raw.update({name: tf.constant([f"{x:08x}" for x in rng.integers(0, 2**32, 6)]) for name in CAT_FEATURES})
    raw["C4"] = tf.constant(["", "", "68fd1e64", "", "", ""])  # missing: each feature's own row 0
    served = tf.saved_model.load(str(tmp_path / "model")).signatures["serving_default"](**raw)
    reference = CTRServingModule(plain, _config(False)).serve({name: raw[name] for name in RAW_FIELDS})
    np.testing.assert_allclose(served["logit"].numpy(), reference["logit"].numpy(), rtol=1e-5, atol=1e-6)


def test_checkpoint_round_trip_restores_the_stacks_and_lazy_state(tmp_path):
    def build():
        keras.utils.set_random_seed(3)
        model = build_ctr_model(_config(True))
        mechanism = _mechanism("lazy", _config(True), noise=1.0, clip=1.0)
        dp = DPModel(model, mechanism=mechanism, expected_batch_size=BATCH)
        dp.compile(optimizer=keras.optimizers.legacy.SGD(0.3), loss=keras.losses.BinaryCrossentropy(from_logits=True))
        budget = PrivacyBudget(mechanism, sampling_probability=0.1, target_epsilon=50.0, target_delta=1e-5)
        ckpt = DPCheckpoint(str(tmp_path), dp_model=dp, budget=budget, every_n_steps=STEPS, batches_per_epoch=STEPS)
        return dp, budget, ckpt

    dp, budget, ckpt = build()
    ckpt.restore_or_initialize()
    dp.fit(_batches(), epochs=1, verbose=0, callbacks=[budget, ckpt])
    state = [v.numpy().copy() for v in list(dp.inner.weights) + list(dp.mechanism.variables)]
    fresh, _, fresh_ckpt = build()
    fresh.prepare(_batches())
    assert fresh_ckpt.restore_or_initialize().step == STEPS
    for before, after in zip(state, list(fresh.inner.weights) + list(fresh.mechanism.variables)):
        np.testing.assert_array_equal(after.numpy(), before)


def test_bad_input_gets_one_line_errors():
    with pytest.raises(ValueError, match=r"one width.*\{'C1': 3, 'C2': 4\}.*Allowed: one width") as error:
        StackedEmbedding({"C1": 5, "C2": 6}, {"C1": 3, "C2": 4})
    assert "\n" not in str(error.value)
    layer = StackedEmbedding({"C1": 5, "C2": 6}, 3, name="stack")
    with pytest.raises(ValueError, match=r"no ids for features \['C2'\]; it needs \['C1', 'C2'\]"):
        layer({"C1": tf.constant([1, 2])})  # Keras adds the call's arguments on lines of their own
    with pytest.raises(ValueError, match=r"no ids for features \['C2'\]; it needs \['C1', 'C2'\]") as error:
        layer.stack_ids({"C1": tf.constant([1, 2])})
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="takes no `combiner`"):
        StackedEmbedding({"C1": 5}, 3, combiner="mean")
    with pytest.raises(ValueError, match=r"feature 'C1' needs integer ids of shape \[batch\]"):
        layer({"C1": tf.constant([[1]]), "C2": tf.constant([[1]])})
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=r"an offending feature .* smallest and largest ids:\]? \[1 5\] \[4 6\]"
    ):
        layer(
            {"C1": tf.constant([1, 4]), "C2": tf.constant([5, 6])}
        )  # C2 has rows 0..5: 6 would read nothing of its own


class _ReadsOneFeatureTwice(StackedEmbedding):
    """Hands `lookup` ids of its own making: both columns in C1's rows (each example reads one row twice)."""

    def call(self, features):
        ids = self.stack_ids(features)
        rows = self.lookup(tf.stack([ids[:, 0], ids[:, 0]], axis=1))
        return dict(zip(self.features, tf.unstack(rows, num=2, axis=1)))


@pytest.mark.parametrize("layer_class", [StackedEmbedding, _ReadsOneFeatureTwice])
def test_only_the_ids_stack_ids_returned_skip_the_distinct_rows_check(layer_class):
    """The clipping rule's premise (no example reads a row twice) is checked on any other ids `lookup` gets."""
    inputs = {f: keras.Input([], dtype=tf.int64, name=f) for f in ("C1", "C2")}
    rows = layer_class({"C1": 5, "C2": 6}, 3, name="stack")(inputs)
    outputs = keras.layers.Dense(1)(keras.layers.Concatenate()([rows["C1"], rows["C2"]]))
    mechanism = create("dense", l2_norm_clip=1.0, noise_multiplier=0.0)
    dp = DPModel(keras.Model(inputs, outputs), mechanism=mechanism, expected_batch_size=4)
    dp.compile(optimizer=keras.optimizers.legacy.SGD(0.1), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    data = tf.data.Dataset.from_tensor_slices(
        ({"C1": np.arange(4) % 5, "C2": np.arange(4) % 6}, np.ones([4, 1], np.float32))
    ).batch(4)
    if layer_class is StackedEmbedding:
        dp.fit(data, epochs=1, verbose=0)
        return
    with pytest.raises(tf.errors.InvalidArgumentError, match="`lookup` needs ids"):
        dp.fit(data, epochs=1, verbose=0)


def test_stacked_layer_round_trips_its_config_and_groups_by_width():
    layers = stacked_tables({"a": (5, 3), "b": (7, 4), "c": (2, 3)})
    assert [(layer.name, layer.features, layer.vocabulary_size) for layer in layers] == [
        ("embedding_stack_3", ("a", "c"), 7),
        ("embedding_stack_4", ("b",), 7),
    ]
    clone = StackedEmbedding.from_config(layers[0].get_config())
    assert (clone.features, clone.feature_rows("c"), clone.output_dim) == (("a", "c"), (5, 2), 3)
    out = layers[0]({"a": tf.constant([0, 4]), "c": tf.constant([1, 0]), "b": tf.constant([6, 6])})
    table = layers[0].embeddings.numpy()
    np.testing.assert_array_equal(out["c"].numpy(), table[[6, 5]])  # c's row r is stack row 5 + r
    config = _config(True)
    assert CTRModelConfig.from_config(config.get_config()) == config
    legacy = {k: v for k, v in config.get_config().items() if k != "stack_tables"}
    assert CTRModelConfig.from_config(legacy).stack_tables is False  # saved before stacking: per-feature tables
