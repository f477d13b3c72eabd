"""A model mixing the two front ends is refused in one line that names the front end to use (issue 29).

Before, a tf-keras `DPEmbedding` in a Keras 3 functional model (or the
reverse) failed with 23-28 lines of Keras error; a Keras 3 subclassed model
holding a tf-keras table trained with the table never updated (neither Keras
tracks the other's layers: the table is not among the model's weights); the
reverse failed in `prepare` with an AttributeError. `fe` is the model's
(host's) front end; the layer comes from the other one.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import tensorflow as tf

from tfdp_embed import mechanisms

from .front_ends import front_end

NAMES = {"keras2": "tf-keras", "keras3": "Keras 3"}


def _other(fe):
    return front_end("keras3" if fe.name == "keras2" else "keras2")


def _expected(fe, guest, cls="DPEmbedding") -> str:
    return f"`tfdp_embed.{guest.name}.{cls}` ({NAMES[guest.name]}) inside a {NAMES[fe.name]} model: use `tfdp_embed.{fe.name}.{cls}`."


def _one_line(error) -> str:
    message = str(error.value)
    assert "\n" not in message, message
    return message


def test_a_table_of_the_other_front_end_in_a_functional_model_is_refused_in_one_line(fe):
    guest = _other(fe)
    inputs = fe.keras.Input((4,), dtype="int32")
    with pytest.raises(TypeError) as error:
        guest.DPEmbedding(100, 8, combiner="mean")(inputs)
    assert _one_line(error) == _expected(fe, guest)


def test_a_shared_table_of_the_other_front_end_is_named_as_such(fe):
    guest = _other(fe)
    shared = importlib.import_module(f"tfdp_embed.{guest.name}").SharedEmbedding(100, 8)
    inputs = fe.keras.Input((4,), dtype="int32")
    with pytest.raises(TypeError) as error:
        shared(inputs)
    assert _one_line(error) == _expected(fe, guest, "SharedEmbedding")


def _subclassed(fe, guest):
    class Model(fe.keras.Model):
        def __init__(self):
            super().__init__()
            self.table = guest.DPEmbedding(1000, 8, combiner="mean", name="table")
            self.out = fe.keras.layers.Dense(1)

        def call(self, x):
            return self.out(self.table(x))

    model = Model()
    model(tf.constant(np.zeros((2, 4), "int32")))  # eager tensors: nothing to tell the Keras apart by here
    return model


def test_a_table_of_the_other_front_end_in_a_subclassed_model_is_refused_when_wrapped(fe):
    guest = _other(fe)
    model = _subclassed(fe, guest)
    with pytest.raises(TypeError) as error:
        fe.DPModel(
            model, mechanism=mechanisms.DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0), expected_batch_size=2
        )
    assert _one_line(error) == _expected(fe, guest)


def test_a_subclass_of_the_other_tables_and_a_plain_layer_of_the_other_keras_are_named(fe):
    guest = _other(fe)

    class Scaled(guest.DPEmbedding):
        def call(self, ids):
            return 2.0 * self.lookup(ids)

    class Model(fe.keras.Model):
        def __init__(self, inner):
            super().__init__()
            self.inner_layers = [fe.keras.layers.Dense(1), {"deep": inner}]  # found inside lists and dicts too

        def call(self, x):
            return x

    sgd = mechanisms.DenseDPSGD(l2_norm_clip=1.0, noise_multiplier=1.0)
    with pytest.raises(TypeError, match=rf"^Scaled \(a subclass of `tfdp_embed\.{guest.name}\.DPEmbedding`\)"):
        fe.DPModel(Model(Scaled(10, 2)), mechanism=sgd, expected_batch_size=2)
    with pytest.raises(TypeError) as error:
        fe.DPModel(Model(guest.keras.layers.Dense(3, name="d3")), mechanism=sgd, expected_batch_size=2)
    assert _one_line(error) == (
        f"Dense layer 'd3' ({NAMES[guest.name]}) inside a {NAMES[fe.name]} model: use "
        f"{NAMES[fe.name]} layers throughout, with `tfdp_embed.{fe.name}`."
    )
