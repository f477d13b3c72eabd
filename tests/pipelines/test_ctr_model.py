"""The pCTR model (DP-FEST App. D.1, DCN-v2 option) and its serving helpers, without training runs."""

from __future__ import annotations

import numpy as np
import pytest

from tfdp_embed import DPModel, keras, tf
from tfdp_embed.data.criteo import CRITEO_VOCAB_SIZES, parse_raw_fields
from tfdp_embed.keras2.models import (
    RAW_FIELDS,
    CTRModelConfig,
    build_ctr_model,
    check_request,
    ctr_embedding_dims,
    table_names,
)
from tfdp_embed.mechanisms import DenseDPSGD, NonPrivate


def _dense_units(model):
    return [layer.units for layer in model.layers if isinstance(layer, keras.layers.Dense)]


def test_paper_model_embedding_widths_and_tower():
    config = CTRModelConfig.from_vocab_sizes(stack_tables=False)  # DP-FEST Table 3, one table per feature
    model = build_ctr_model(config)
    tables = {layer.name: layer for layer in model.layers if layer.name.startswith("embedding_")}
    assert sorted(tables) == sorted(table_names())
    # int(2 V^0.25): C3 has V = 82,741 -> int(33.73) = 33; C9 has V = 3 -> int(2.63) = 2.
    assert (tables["embedding_C3"].vocabulary_size, tables["embedding_C3"].output_dim) == (82_742, 33)
    assert (tables["embedding_C9"].vocabulary_size, tables["embedding_C9"].output_dim) == (4, 2)
    assert config.dims == ctr_embedding_dims(CRITEO_VOCAB_SIZES.values())
    assert _dense_units(model) == [598, 598, 598, 598, 1]
    first = model.get_layer("hidden_0")
    assert first.kernel.shape[0] == sum(config.dims) + 13 + 13  # embeddings, log integers, missing flags
    # Stacked (the default): one table per width, 20 widths among Table 3's 26 tables; C3 is alone at width 33.
    stacked = build_ctr_model(CTRModelConfig.from_vocab_sizes())
    stacks = {layer.name: layer for layer in stacked.layers if layer.name.startswith("embedding_")}
    assert len(stacks) == 20 and stacks["embedding_stack_33"].features == ("C3",)
    assert sum(layer.vocabulary_size for layer in stacks.values()) == sum(v + 1 for v in config.vocab_sizes)
    assert stacked.get_layer("hidden_0").kernel.shape == first.kernel.shape


def test_dcn_option_puts_cross_layers_before_the_tower():
    tfrs = pytest.importorskip("tensorflow_recommenders")
    config = CTRModelConfig.from_vocab_sizes(hash_size=10, hidden_units=(4,), architecture="dcn", num_cross_layers=2)
    model = build_ctr_model(config)
    crosses = [layer for layer in model.layers if isinstance(layer, tfrs.layers.dcn.Cross)]
    assert len(crosses) == 2
    ints, cats = tf.constant([["1"] * 13, [""] * 13]), tf.constant([["a"] * 26, [""] * 26])
    features = parse_raw_fields(ints, cats, hash_size=10)
    assert model(features).shape == (2, 1)


def test_config_round_trip_and_errors():
    config = CTRModelConfig.from_vocab_sizes(hash_size=50, hidden_units=(8, 4), embedding_dims=(3,) * 26)
    assert CTRModelConfig.from_config(config.get_config()) == config
    with pytest.raises(ValueError, match="`architecture` must be one of"):
        CTRModelConfig.from_vocab_sizes(hash_size=5, architecture="wide")
    with pytest.raises(ValueError, match="`vocab_sizes` must have 26 entries"):
        CTRModelConfig(vocab_sizes=(10,) * 25)
    with pytest.raises(ValueError, match="`hidden_units` must hold positive ints"):
        CTRModelConfig.from_vocab_sizes(hash_size=5, hidden_units=(8, 0))
    with pytest.raises(ValueError, match="`embedding_dims` must have 26 entries"):
        CTRModelConfig.from_vocab_sizes(hash_size=5, embedding_dims=(2,))
    with pytest.raises(TypeError, match="CTRModelConfig"):
        build_ctr_model({"vocab_sizes": [5] * 26})


def test_dcn_dp_step_with_huge_clip_and_no_noise_is_the_plain_step():
    """Cross layers hold Dense sub-layers: their per-example norms come from the Dense rule.

    With C = 1e6 nothing is clipped and with sigma = 0 nothing is added, so one
    DP step (sum / B) equals one non-private step (mean) on the same batch.
    """
    config = CTRModelConfig.from_vocab_sizes(hash_size=10, hidden_units=(4,), architecture="dcn", num_cross_layers=1)
    rng = np.random.default_rng(0)
    ints = rng.integers(0, 50, (8, 13)).astype(str)
    cats = rng.choice(np.array(["aa", "bb", "cc", ""]), (8, 26))
    features = parse_raw_fields(tf.constant(ints), tf.constant(cats), hash_size=10)
    labels = tf.constant(rng.integers(0, 2, (8, 1)).astype("float32"))
    batch = tf.data.Dataset.from_tensors((features, labels))
    weights = []
    for mechanism in (NonPrivate(), DenseDPSGD(l2_norm_clip=1e6, noise_multiplier=0.0, seed=0)):
        keras.utils.set_random_seed(1)
        model = build_ctr_model(config)
        dp = DPModel(model, mechanism=mechanism, expected_batch_size=8)
        dp.compile(optimizer=keras.optimizers.legacy.SGD(0.5), loss=keras.losses.BinaryCrossentropy(from_logits=True))
        dp.fit(batch, epochs=1, verbose=0)
        weights.append(model.get_weights())
    for plain, private in zip(*weights):
        np.testing.assert_allclose(private, plain, rtol=1e-4, atol=1e-6)


def test_check_request_names_the_bad_field():
    good = {name: ["1"] if name.startswith("I") else ["68fd1e64"] for name in RAW_FIELDS}
    assert set(check_request(good)) == set(RAW_FIELDS)
    with pytest.raises(ValueError, match=r"missing fields \['C5'\], unknown fields \['C27'\]"):
        check_request({**{k: v for k, v in good.items() if k != "C5"}, "C27": ["x"]})
    with pytest.raises(TypeError, match="field I3 has dtype int32"):
        check_request({**good, "I3": tf.constant([3])})
    with pytest.raises(ValueError, match="field C1 must be 1-D"):
        check_request({**good, "C1": [["a"]]})
    with pytest.raises(ValueError, match="different lengths"):
        check_request({**good, "C2": ["a", "b"]})
