"""`StackedEmbedding` on both front ends: the stack trains as the unstacked tables, its noise is the formula's.

A model with two features' tables of one width stacked in one variable must
give, with zero noise, exactly the weights of the same model with one
`DPEmbedding` per feature: with a huge clip (no clipping) and with a small
clip (each example's norm, taken over both tables, is the unstacked one).
With noise, a row no example touched moves by the noise alone, of std
lr * sigma * C / B after one step.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tfdp_embed import mechanisms

SIZES = {"a": 10, "b": 7}
DIM, BATCH = 4, 8


def _stacked_class(fe):
    if fe.name == "keras2":
        from tfdp_embed.keras2.layers import StackedEmbedding, stacked_tables
    else:
        from tfdp_embed.keras3 import StackedEmbedding, stacked_tables
    return StackedEmbedding, stacked_tables


def _model(fe, *, stacked: bool):
    keras = fe.keras
    inputs = {f: keras.Input((), dtype="int32", name=f) for f in SIZES}
    if stacked:
        rows = _stacked_class(fe)[0](SIZES, DIM, name="stack")(inputs)
    else:
        rows = {f: fe.DPEmbedding(v, DIM, name=f"table_{f}")(inputs[f]) for f, v in SIZES.items()}
    hidden = keras.layers.Concatenate()([rows[f] for f in SIZES])
    return keras.Model(inputs, keras.layers.Dense(1, name="logit")(hidden))


def _pair(fe):
    """(unstacked, stacked) models holding the same weights."""
    plain, stacked = _model(fe, stacked=False), _model(fe, stacked=True)
    rng = np.random.default_rng(0)
    plain.set_weights([rng.normal(0, 0.3, w.shape).astype("float32") for w in plain.get_weights()])
    tables = [plain.get_layer(f"table_{f}").get_weights()[0] for f in SIZES]
    stacked.get_layer("stack").set_weights([np.concatenate(tables)])
    stacked.get_layer("logit").set_weights(plain.get_layer("logit").get_weights())
    return plain, stacked


def _batches(steps: int = 3):
    rng = np.random.default_rng(1)
    n = BATCH * steps
    features = {f: rng.integers(0, v - 2, n).astype("int32") for f, v in SIZES.items()}  # top 2 rows untouched
    labels = rng.integers(0, 2, (n, 1)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((features, labels)).batch(BATCH)


def _train(fe, model, name: str, *, clip: float, sigma: float, steps: int = 3, lr: float = 0.5):
    mechanism = mechanisms.create(name, l2_norm_clip=clip, noise_multiplier=sigma, seed=3)
    dp = fe.dp_model(model, mechanism, batch=BATCH, lr=lr)
    dp.fit(_batches(steps), epochs=1, verbose=0)
    return dp


def _tables(dp, stacked: bool) -> dict:
    weights = dp.get_weights()  # flushes LazyDP's owed noise
    if stacked:
        table = weights[0]
        return {"a": table[: SIZES["a"]], "b": table[SIZES["a"] :]}
    return dict(zip(SIZES, weights[:2]))


# clip 0.01 clips every example (their gradient norms are 0.66–1.04 at these weights); 1e6 clips none.
@pytest.mark.parametrize(("name", "clip"), [("dense", 0.01), ("lazy", 0.01), ("eana", 1e6)])
def test_zero_noise_gives_the_unstacked_weights(fe, name, clip):
    plain, stacked = _pair(fe)
    want = _tables(_train(fe, plain, name, clip=clip, sigma=0.0), stacked=False)
    got = _tables(_train(fe, stacked, name, clip=clip, sigma=0.0), stacked=True)
    for feature in SIZES:
        np.testing.assert_allclose(got[feature], want[feature], rtol=1e-5, atol=1e-6)


def test_untouched_rows_get_the_formulas_noise(fe, name="lazy"):
    _, stacked = _pair(fe)
    before = stacked.get_layer("stack").get_weights()[0].copy()
    clip, sigma, lr = 1.0, 2.0, 0.5
    dp = _train(fe, stacked, name, clip=clip, sigma=sigma, steps=1, lr=lr)
    after = _tables(dp, stacked=True)
    untouched = np.concatenate(
        [after["a"][-2:] - before[8:10], after["b"][-2:] - before[15:17]]  # rows no example read
    )
    std = lr * sigma * clip / BATCH
    assert abs(untouched.std() / std - 1) < 0.5  # 16 draws: the ratio's spread is about 0.18
    assert np.all(np.abs(untouched) > 0)


def test_bad_input_and_arguments_get_one_line_errors(fe):
    stacked_class = _stacked_class(fe)[0]
    with pytest.raises(ValueError, match="one width"):
        stacked_class(SIZES, {"a": 4, "b": 8})
    with pytest.raises(ValueError, match="takes no `combiner`"):
        stacked_class(SIZES, DIM, combiner="mean")
    layer = stacked_class(SIZES, DIM, name="stack")
    with pytest.raises(ValueError, match="no ids for features"):
        layer({"a": tf.constant([1, 2])})
    with pytest.raises(tf.errors.InvalidArgumentError, match="must lie in"):
        layer({"a": tf.constant([1, 2]), "b": tf.constant([0, 7])})


def test_config_round_trips_and_tables_group_by_width(fe):
    stacked_class, stacked_tables = _stacked_class(fe)
    layer = stacked_class(SIZES, DIM, name="stack")
    clone = stacked_class.from_config(layer.get_config())
    assert (clone.vocabulary_sizes, clone.output_dim, clone.vocabulary_size) == (SIZES, DIM, 17)
    groups = stacked_tables({"a": (10, 8), "b": (5, 4), "c": (7, 8)})
    assert [(g.name, g.features, g.vocabulary_size) for g in groups] == [
        ("embedding_stack_8", ("a", "c"), 17),
        ("embedding_stack_4", ("b",), 5),
    ]
