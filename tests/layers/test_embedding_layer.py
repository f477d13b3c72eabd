"""DPEmbedding: input kinds, combiners, hashing, range errors, config, sparse gradient."""

import os
import subprocess
import sys

import numpy as np
import pytest

from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.layers.embedding import DPEmbedding


def _layer(**kwargs):
    layer = DPEmbedding(10, 3, embeddings_initializer="glorot_uniform", **kwargs)
    layer.build(None)
    return layer


def test_single_and_multi_id_lookups():
    layer = _layer()
    table = layer.embeddings.numpy()
    np.testing.assert_allclose(layer(tf.constant([2, 5])), table[[2, 5]])
    np.testing.assert_allclose(layer(tf.constant([[1, 2], [3, 3]])), table[[[1, 2], [3, 3]]])


@pytest.mark.parametrize(
    "combiner, reduce",
    [
        ("sum", lambda rows: rows.sum(0)),
        ("mean", lambda rows: rows.mean(0)),
        ("sqrtn", lambda rows: rows.sum(0) / np.sqrt(len(rows))),
    ],
)
def test_combiners_dense_ragged_sparse(combiner, reduce):
    layer = _layer(combiner=combiner)
    table = layer.embeddings.numpy()
    rows = [[1, 2, 2], [7]]
    expected = np.stack([reduce(table[r]) for r in rows])
    ragged = tf.ragged.constant(rows)
    np.testing.assert_allclose(layer(ragged), expected, rtol=1e-6)
    np.testing.assert_allclose(layer(ragged.to_sparse()), expected, rtol=1e-6)
    np.testing.assert_allclose(layer(tf.constant([[1, 2, 2]])), expected[:1], rtol=1e-6)


def test_ragged_without_combiner_is_rejected():
    with pytest.raises(ValueError, match="need a `combiner`"):
        _layer()(tf.ragged.constant([[1, 2], [3]]))


def test_out_of_range_id_names_layer_id_and_range():
    layer = DPEmbedding(10, 3, name="country")
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"'country'.*\[0, 10\)") as info:
        layer(tf.constant([3, 12]))
    assert "12" in str(info.value)
    with pytest.raises(tf.errors.InvalidArgumentError, match="country"):
        layer(tf.constant([-1]))


def test_traced_range_checks_are_one_op_and_still_name_the_bad_ids():
    """A traced lookup's range check is a plain Assert (no tf.cond: 2 branch graphs per table per trace)."""
    from tfdp_embed.keras2.layers import StackedEmbedding

    table, stack = DPEmbedding(10, 3, name="country"), StackedEmbedding({"C1": 5, "C2": 6}, 3, name="stack")
    lookups = {
        "table": (lambda ids: table(ids), tf.constant([3, 12]), r"country.*\[0, 10\).*\] \[3\] \[12\]"),
        "stack": (
            lambda ids: stack({"C1": ids[:, 0], "C2": ids[:, 1]}),
            tf.constant([[1, 5], [4, 6]]),
            r"stack.*Features \[.*C1.*C2.*\] \[1 5\] \[4 6\]",
        ),
    }
    for lookup, bad, match in lookups.values():
        traced = tf.function(lookup)
        graph = traced.get_concrete_function(tf.TensorSpec([None, *bad.shape[1:]], tf.int32)).graph
        types = {op.type for op in graph.get_operations()}
        assert "Assert" in types and not types & {"If", "StatelessIf"}, types
        with pytest.raises(tf.errors.InvalidArgumentError, match=match):
            traced(bad)
        assert tf.nest.flatten(traced(tf.constant(bad.numpy() % 5)))[0].shape[0] == 2  # in range: runs


def test_a_traced_range_message_shows_every_features_ids():
    """A stack of 5 features: the traced message lists all 5 smallest and largest ids (not Assert's default 3)."""
    from tfdp_embed.keras2.layers import StackedEmbedding

    features = [f"C{i}" for i in range(5)]
    stack = StackedEmbedding(dict.fromkeys(features, 4), 2, name="five")
    traced = tf.function(lambda ids: stack({f: ids[:, i] for i, f in enumerate(features)}))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"\] \[0 1 2 3 9\] \[0 1 2 3 9\]"):
        traced(tf.constant([[0, 1, 2, 3, 9]]))


def test_hashing_strings_and_large_ints_is_deterministic_and_in_range():
    layer = _layer(hash_ids=True, combiner="sum")
    a = layer(tf.constant([["68fd1e64", "unknown"]]))
    b = layer(tf.constant([["68fd1e64", "unknown"]]))
    np.testing.assert_array_equal(a, b)
    ids = layer.bucket_ids(tf.constant([10**12, -5], tf.int64)).numpy()
    assert ((ids >= 0) & (ids < 10)).all()


def test_float_ids_are_rejected():
    with pytest.raises(TypeError, match="integer ids"):
        _layer()(tf.constant([1.0]))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(vocabulary_size=0, output_dim=2), "`vocabulary_size`"),
        (dict(vocabulary_size=5, output_dim=-1), "`output_dim`"),
        (dict(vocabulary_size=5, output_dim=2, combiner="max"), "`combiner`"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DPEmbedding(**kwargs)


def test_gradient_is_indexed_slices_over_touched_rows():
    layer = _layer(combiner="mean")
    with tf.GradientTape() as tape:
        out = layer(tf.constant([[1, 2], [2, 9]]))
        loss = tf.reduce_sum(out)
    grad = tape.gradient(loss, layer.embeddings)
    assert isinstance(grad, tf.IndexedSlices)
    assert set(grad.indices.numpy().tolist()) == {1, 2, 9}


def test_config_round_trip_and_subclass():
    class MyEmbedding(DPEmbedding):
        pass

    layer = MyEmbedding(10, 3, combiner="sqrtn", hash_ids=True, name="x")
    clone = MyEmbedding.from_config(layer.get_config())
    assert (clone.vocabulary_size, clone.output_dim, clone.combiner, clone.hash_ids) == (10, 3, "sqrtn", True)
    inp = keras.Input((2,), dtype="int32")
    model = keras.Model(inp, DPEmbedding(10, 3, combiner="sum")(inp))
    rebuilt = keras.Model.from_config(model.get_config(), custom_objects={"DPEmbedding": DPEmbedding})
    assert isinstance(rebuilt.layers[1], DPEmbedding)


def test_keras_file_loads_without_custom_objects(tmp_path):
    """DPEmbedding and SharedEmbedding are registered Keras serializables (package tfdp_embed)."""
    from tfdp_embed.keras2.layers.shared_embedding import SharedEmbedding

    inp = keras.Input((2,), dtype="int32")
    items = SharedEmbedding(10, 3, name="items")
    pooled = DPEmbedding(10, 3, combiner="mean", name="pooled")(inp)
    model = keras.Model(inp, items(pooled, mode="logits") + tf.reduce_sum(items(inp), axis=1)[:, :1])
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert {DPEmbedding, SharedEmbedding} <= {type(layer) for layer in loaded.layers}
    ids = np.array([[1, 2], [7, 7]], np.int32)
    np.testing.assert_allclose(loaded(ids), model(ids), rtol=1e-6)


def test_read_hook_sees_bucket_ids_before_lookup():
    layer = _layer(combiner="sum")
    seen = []
    layer.set_read_hook(lambda ids: seen.append(ids.numpy().tolist()))
    layer(tf.ragged.constant([[4, 4], [1]]))
    assert seen == [[4, 4, 1]]


@pytest.mark.parametrize("ragged, combiner", [(False, "sum"), (False, None), (True, "sum")])
def test_read_hook_gather_supplies_the_rows(ragged, combiner):
    """A hook's `gather(ids)` replaces the lookup's own gather (LazyDP's fused catch-up);
    returning None falls back to the hook and tf.gather. Same output either way."""
    ids = tf.ragged.constant([[4, 4, 2], [1]]) if ragged else tf.constant([[4, 4], [1, 0]])
    layer = _layer(combiner=combiner)
    want = layer(ids).numpy()
    calls = []

    def hook(flat):
        calls.append(("hook", flat.numpy().tolist()))

    def gather(flat):
        calls.append(("gather", flat.numpy().tolist()))
        return tf.gather(layer.embeddings, flat) + 1.0  # +1: visible in the output

    hook.gather = gather
    layer.set_read_hook(hook)
    got = layer(ids).numpy()
    assert [c[0] for c in calls] == ["gather"]
    count = (
        1.0
        if combiner is None
        else np.asarray(ids.row_lengths() if isinstance(ids, tf.RaggedTensor) else [2, 2])[:, None]
    )
    np.testing.assert_allclose(got, want + count, rtol=1e-6)
    hook.gather = lambda flat: None  # declines: the hook runs, the layer gathers
    calls.clear()
    np.testing.assert_array_equal(layer(ids).numpy(), want)
    assert [c[0] for c in calls] == ["hook"]


def test_keras3_in_process_is_refused_with_a_clear_message():
    # The core imports under Keras 3; the tf-keras front end (DPModel, DPEmbedding) is what refuses.
    code = "import os; os.environ['TF_USE_LEGACY_KERAS']='0'\nimport tfdp_embed.mechanisms\nfrom tfdp_embed import DPModel\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "needs Keras 2" in result.stderr


def test_keras3_already_loaded_is_refused_with_a_clear_message():
    code = "import tensorflow as tf\ntf.keras.layers.Dense\nimport tfdp_embed\nfrom tfdp_embed import DPEmbedding\n"
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode != 0
    assert "already Keras 3" in result.stderr
