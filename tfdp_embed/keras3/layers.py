"""`DPEmbedding`, `SharedEmbedding` and `StackedEmbedding` for Keras 3: the lookups of `tfdp_embed.layers`.

The table is a `keras.Variable`; `embeddings` is the `tf.Variable` inside it,
so the lookup is a `tf.gather` whose gradient stays a `tf.IndexedSlices`
(Keras 3's SGD applies it as a scatter: 0.5 ms at 10^6 x 16 vs 22 ms for a
dense update) and the mechanisms (`tfdp_embed.mechanisms`) noise and catch
up rows on it as they do for tf-keras. What the layers do and how to
subclass them: `tfdp_embed.layers.lookup`, `tfdp_embed.layers.shared_lookup`,
`tfdp_embed.layers.stacked_lookup`.

Example:
    >>> layer = DPEmbedding(1000, 8, combiner="mean")
    >>> pooled = layer(tf.ragged.constant([[1, 2, 2], [7]]))  # shape [2, 8]
"""

from __future__ import annotations

from tfdp_embed.keras3._keras import keras
from tfdp_embed.layers.lookup import EmbeddingLookup, read_hooks_removed
from tfdp_embed.layers.shared_lookup import MODES, SharedLookup, check_shared_arguments
from tfdp_embed.layers.stacked_lookup import StackedLookup, stacked_arguments, stacked_layers


@keras.saving.register_keras_serializable(package="tfdp_embed")
class DPEmbedding(EmbeddingLookup, keras.layers.Layer):
    """Embedding table for DP training (Keras 3); subclass it by overriding `call` around `self.lookup(ids)`.

    Args:
      vocabulary_size: number of table rows.
      output_dim: embedding dimension.
      combiner: None (no pooling), "sum", "mean" or "sqrtn" over each example's ids.
      hash_ids: hash raw ids (strings or ints) into `vocabulary_size` buckets.
      embeddings_initializer: Keras initializer for the table.
      **kwargs: passed to `keras.layers.Layer`.
    """

    def __init__(
        self,
        vocabulary_size: int,
        output_dim: int,
        *,
        combiner: str | None = None,
        hash_ids: bool = False,
        embeddings_initializer="uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self._init_lookup(vocabulary_size, output_dim, combiner=combiner, hash_ids=hash_ids)
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self._table = None

    def build(self, input_shape=None):
        # Not autocast (as keras.layers.Embedding): rows are read in float32, the output cast to the compute dtype.
        self._table = self.add_weight(
            name="embeddings",
            shape=(self.vocabulary_size, self.output_dim),
            initializer=self.embeddings_initializer,
            trainable=True,
            autocast=False,
        )
        self.built = True

    @property
    def embeddings(self):
        """The table as a `tf.Variable` (the one inside the layer's `keras.Variable`)."""
        if self._table is None:
            raise ValueError(f"DPEmbedding {self.name!r} is not built; call it once (or `build()`) first.")
        return self._table.value

    def compute_output_spec(self, ids):
        shape = tuple(ids.shape)
        if self.combiner is not None and len(shape) == 2:
            shape = shape[:1]
        return keras.KerasTensor((*shape, self.output_dim), dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            self._lookup_config(),
            embeddings_initializer=keras.initializers.serialize(self.embeddings_initializer),
        )
        return config


@keras.saving.register_keras_serializable(package="tfdp_embed")
class SharedEmbedding(SharedLookup, DPEmbedding):
    """One table as input embedding (`layer(ids)`) and output projection (`layer(hidden, mode="logits")`), Keras 3.

    Args: as `tfdp_embed.keras2.SharedEmbedding` (`padding_id` keyword-only; no `combiner` or `hash_ids`).
    """

    def __init__(self, vocabulary_size: int, output_dim: int, *, padding_id: int | None = None, **kwargs):
        check_shared_arguments(vocabulary_size, padding_id, kwargs)
        super().__init__(vocabulary_size, output_dim, **kwargs)
        self.padding_id = padding_id

    def compute_output_spec(self, inputs, mode: str = "embed"):
        if mode == "logits":
            return keras.KerasTensor((*tuple(inputs.shape)[:-1], self.vocabulary_size), dtype=self.compute_dtype)
        return keras.KerasTensor((*tuple(inputs.shape), self.output_dim), dtype=self.compute_dtype)

    def get_config(self):
        return self._shared_config(super().get_config())


@keras.saving.register_keras_serializable(package="tfdp_embed")
class StackedEmbedding(StackedLookup, DPEmbedding):
    """Several features' tables of one width in one Keras 3 `DPEmbedding` variable, at row offsets.

    Args and behaviour: as `tfdp_embed.keras2.StackedEmbedding` (`{feature: ids [batch]}` in,
    `{feature: [batch, output_dim]}` out; one lookup, noise and scatter per stack).
    """

    def __init__(self, vocabulary_sizes, output_dim, *, embeddings_initializer="uniform", **kwargs):
        sizes, width = stacked_arguments(vocabulary_sizes, output_dim, kwargs)
        super().__init__(sum(sizes.values()), width, embeddings_initializer=embeddings_initializer, **kwargs)
        self._init_stack(sizes)

    def build(self, input_shape=None):
        super().build(None)  # the input is a dict of features; the table's shape does not depend on it

    def compute_output_spec(self, features):
        return {
            f: keras.KerasTensor((*tuple(features[f].shape), self.output_dim), dtype=self.compute_dtype)
            for f in self.features
        }

    def get_config(self):
        return self._stack_config(super().get_config())


def stacked_tables(tables, *, name_fn=None, **kwargs) -> list[StackedEmbedding]:
    """One Keras 3 `StackedEmbedding` per width group of `tables` (`tfdp_embed.layers.stacked_lookup.stacked_layers`)."""
    return stacked_layers(StackedEmbedding, tables, name_fn=name_fn, **kwargs)


__all__ = ["MODES", "DPEmbedding", "SharedEmbedding", "StackedEmbedding", "read_hooks_removed", "stacked_tables"]
