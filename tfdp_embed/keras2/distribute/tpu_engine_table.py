"""The DP step's view of the TPU embedding engine: `TpuFeature` (a looked-up feature) and `EngineTable`.

`EngineTable` stands for a table living on the engine as a `DPEmbedding`, so
that the clipping registry (with `engine_table_gradients` as its rule) and
every mechanism treat it like a table on the TensorCore.

References: Bu et al. 2022 (book-keeping: per-example norms from the
activation gradients); TensorFlow `tpu_embedding_v3.TPUEmbeddingV2`
(FeatureConfig, TableConfig).
"""

from __future__ import annotations

import dataclasses

from tfdp_embed.keras2._keras import tf
from tfdp_embed.keras2.layers.embedding import DPEmbedding


@dataclasses.dataclass(frozen=True)
class TpuFeature:
    """One feature the TPU embedding engine looks up for the DP step.

    Attributes:
      name: key of the feature in the dicts given to the engine's `enqueue`
        and `apply_gradients` (and in the activations dict the TensorCore
        model receives).
      table: the engine table it reads (a key of `TpuDPStep`'s `table_sizes`).
      combiner: how the engine pools the feature's ids: "sum", "mean",
        "sqrtn" (activations `[batch, dim]`), or None for a sequence feature
        (`[batch, n, dim]`, one activation per id; the TensorCore pools).
        Mechanisms that freeze touched rows (DP-FEST, DP-AdaFEST(+)) need
        sequence features: only a per-id activation gradient can be masked.
    """

    name: str
    table: str
    combiner: str | None = "mean"


class EngineTable(DPEmbedding):
    """A table living on the TPU embedding engine, seen as a `DPEmbedding` by clipping and mechanisms.

    Never built and never called. `occurrences(ids)` flattens the batch's ids
    with the feature's combiner weights, exactly as the engine combines them;
    the clipping registry's `DPEmbedding` rule (through
    `engine_table_gradients`) and every mechanism then treat it like a table
    on the TensorCore. The table's values never reach the TensorCore:
    `embeddings` is a `[1, dim]` stand-in whose dtype and width the rule
    reads (TPUEmbeddingV2's own variables are stacked, padded and
    mod-sharded, not a `[vocabulary, dim]` array in row order); it also keys
    the table's gradient in the mechanism's `(gradient, variable)` pairs.

    Args:
      name: the engine table name.
      vocabulary_size: rows of the table (`TableConfig.vocabulary_size`).
      dim: its width (`TableConfig.dim`).
      combiner: the combiner of every feature reading this table.
    """

    def __init__(self, name: str, vocabulary_size: int, dim: int, combiner: str | None):
        super().__init__(vocabulary_size, dim, combiner=combiner, name=name, trainable=False)
        stand_in = tf.Variable(tf.zeros([1, dim]), trainable=False, name=f"{name}_engine_table")
        object.__setattr__(self, "_stand_in", stand_in)  # not tracked as this layer's weight
        self.built = True

    @property
    def embeddings(self):
        return self._stand_in

    @property
    def dense_shape(self) -> tf.Tensor:
        """int64 `[vocabulary, dim]`: the dense shape of this table's gradients."""
        return tf.constant([self.vocabulary_size, self.output_dim], tf.int64)


def engine_table_gradients(layer: EngineTable, taps, output_grads):
    """The `DPEmbedding` registry rule for an engine table, its clipped sums given the table's dense shape.

    Same per-example norms and clipped sums as `clipping.embedding_layer_gradients`
    (it is called); only the `IndexedSlices`' dense shape is the table's
    `[vocabulary, dim]` instead of the stand-in's.
    """
    from tfdp_embed.keras2.clipping import embedding_layer_gradients

    info = embedding_layer_gradients(layer, taps, output_grads)
    inner = info.clipped_sum

    def clipped_sum(clip_factors):
        return [tf.IndexedSlices(g.values, g.indices, layer.dense_shape) for g in inner(clip_factors)]

    return dataclasses.replace(info, clipped_sum=clipped_sum)


def _check_table_sizes(table_sizes) -> dict:
    """{table: (vocabulary_size, dim)} with positive ints, or a ValueError naming the bad entry."""
    if not isinstance(table_sizes, dict) or not table_sizes:
        raise ValueError(
            f"`table_sizes` must map each engine table name to (vocabulary_size, dim); received {table_sizes!r}."
        )
    out = {}
    for name, size in table_sizes.items():
        ok = isinstance(size, (tuple, list)) and len(size) == 2
        ok = ok and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in size)
        if not ok:
            raise ValueError(
                f"`table_sizes[{name!r}]` must be (vocabulary_size, dim), two ints > 0; received {size!r}."
            )
        out[name] = (int(size[0]), int(size[1]))
    return out


__all__ = ["EngineTable", "TpuFeature", "engine_table_gradients"]
