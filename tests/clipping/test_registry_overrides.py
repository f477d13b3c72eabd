"""A registry rule applies to a subclass only while the subclass keeps the math the rule describes."""

from __future__ import annotations

import pytest

from tfdp_embed.errors import PrivacyContractError
from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.clipping import (
    LayerRegistry,
    clipped_step,
    default_registry,
    dense_layer_gradients,
    embedding_layer_gradients,
    phantom_layer_gradients,
    record_taps,
    vectorized_layer_gradients,
)
from tfdp_embed.keras2.layers.embedding import DPEmbedding
from tfdp_embed.keras2.layers.shared_embedding import SharedEmbedding
from tfdp_embed.keras2.models.two_tower import (
    ItemEmbedding,
    item_embedding_gradients,
    two_tower_registry,
)

from .brute_force import check_against_brute_force

F64 = "float64"


class Scaled(DPEmbedding):
    def call(self, ids):
        return 10.0 * super().call(ids)


class Normalised(DPEmbedding):
    def call(self, ids):
        return tf.nn.l2_normalize(super().call(ids), axis=-1)


class LookupOverride(DPEmbedding):
    def lookup(self, ids):
        return 2.0 * super().lookup(ids)


class SharedCallOverride(SharedEmbedding):
    def call(self, inputs, mode="embed"):
        return super().call(inputs, mode=mode) * 2.0


class SharedLookupOverride(SharedEmbedding):
    def lookup(self, ids):
        return super().lookup(ids) * 2.0


class ItemCandidatesOverride(ItemEmbedding):
    def candidates(self):
        return tf.nn.l2_normalize(super().candidates(), axis=-1)


class SquaredDense(keras.layers.Dense):
    def call(self, x):
        return tf.square(super().call(x))


class DescribedDense(keras.layers.Dense):
    def describe(self):
        return self.name


def test_embedding_subclass_overriding_call_keeps_the_rule_on_lookup():
    registry = default_registry()
    layer = Scaled(5, 2)
    assert registry.lookup(layer) is embedding_layer_gradients
    assert registry.tapped_method(layer) == "lookup"


@pytest.mark.parametrize("cls", [Scaled, Normalised])
def test_embedding_subclass_overriding_call_has_exact_norms(cls):
    layer = cls(6, 3, combiner="mean", dtype=F64)
    inputs = keras.Input((3,), dtype="int64")
    model = keras.Model(inputs, keras.layers.Dense(2, activation="tanh", dtype=F64)(layer(inputs)))
    check_against_brute_force(model, tf.constant([[1, 1, 2], [3, 3, 3], [0, 5, 4], [2, 2, 1]], tf.int64))


@pytest.mark.parametrize(
    "layer, registry, overridden",
    [
        (LookupOverride(5, 2), default_registry(), "`lookup`"),
        (SharedCallOverride(5, 2), default_registry(), "`call`"),
        (SharedLookupOverride(5, 2), default_registry(), "`lookup`"),
        (ItemCandidatesOverride(5, 2), two_tower_registry(), "`candidates`"),
    ],
)
def test_table_subclass_overriding_what_its_rule_describes_is_refused(layer, registry, overridden):
    with pytest.raises(PrivacyContractError, match=f"{type(layer).__name__}.*overrides {overridden}"):
        registry.lookup(layer)


def test_dense_subclass_overriding_call_gets_the_fallback_on_call():
    registry = default_registry()
    assert registry.lookup(SquaredDense(2)) is None
    assert registry.tapped_method(SquaredDense(2)) == "call"
    assert registry.lookup(DescribedDense(2)) is dense_layer_gradients


def test_dense_subclass_overriding_call_has_exact_norms():
    inputs = keras.Input((3,), dtype=F64)
    model = keras.Model(inputs, keras.layers.Dense(2, dtype=F64)(SquaredDense(4, dtype=F64)(inputs)))
    x = tf.constant([[0.3, -1.0, 2.0], [1.5, 0.2, -0.7], [0.0, 0.4, 0.9]], tf.float64)
    with pytest.warns(RuntimeWarning, match="No per-example clipping rule"):
        check_against_brute_force(model, x)


def test_built_in_classes_keep_their_rules():
    registry = two_tower_registry()
    assert registry.lookup(SharedEmbedding(5, 2)) is phantom_layer_gradients
    assert registry.lookup(ItemEmbedding(4, 2)) is item_embedding_gradients
    assert registry.tapped_method(ItemEmbedding(4, 2)) == "call"
    assert registry.tapped_method(DPEmbedding(5, 2)) == "lookup"


def test_copies_and_concatenations_keep_tapped_methods():
    registry = LayerRegistry([*default_registry()]).copy()
    assert registry.tapped_method(DPEmbedding(5, 2)) == "lookup"
    with pytest.raises(PrivacyContractError):
        registry.lookup(LookupOverride(5, 2))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"tapped_method": "no_such_method"}, "no_such_method"),
        ({"described": ("no_such_method",)}, "no_such_method"),
        ({"if_overridden": "ignore"}, "`if_overridden`"),
    ],
)
def test_bad_entries_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LayerRegistry().register(DPEmbedding, embedding_layer_gradients, **kwargs)


def test_taps_and_rules_from_different_registries_are_an_error():
    layer = DPEmbedding(5, 2)
    ids = tf.constant([1, 2, 3])
    plain = LayerRegistry([(DPEmbedding, embedding_layer_gradients)])  # records `call`
    with tf.GradientTape() as tape, record_taps([layer], plain) as taps:
        loss = tf.reduce_sum(layer(ids), axis=1)
    with pytest.raises(ValueError, match="same registry"):
        clipped_step(
            taps, loss, tape, registry=default_registry(), fallback=vectorized_layer_gradients, l2_norm_clip=1.0
        )
