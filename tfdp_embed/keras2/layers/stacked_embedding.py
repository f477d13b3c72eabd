"""`StackedEmbedding` for tf-keras: the tables of several features of one width in one `DPEmbedding` variable.

The lookup math, offsets and checks are `tfdp_embed.layers.stacked_lookup`'s;
this module puts them on the tf-keras `DPEmbedding`, so the clipping
registry, every noise mechanism, checkpoints and export treat the stack as
one table. `stacked_tables` builds one layer per width group.

Example:
    >>> layer = StackedEmbedding({"C1": 10, "C2": 4}, output_dim=8, name="embedding_stack_8")
    >>> out = layer({"C1": tf.constant([3, 9]), "C2": tf.constant([0, 3])})  # {"C1": [2, 8], "C2": [2, 8]}

References: DP-FEST (NeurIPS 2023) App. B.1; LazyDP (ASPLOS 2024) §5.
"""

from __future__ import annotations

from collections.abc import Mapping

from tfdp_embed.keras2._keras import keras
from tfdp_embed.keras2.layers.embedding import DPEmbedding
from tfdp_embed.layers.stacked_lookup import StackedLookup, stacked_arguments, stacked_layers


@keras.saving.register_keras_serializable(package="tfdp_embed")
class StackedEmbedding(StackedLookup, DPEmbedding):
    """One `DPEmbedding` table holding several features' tables of one width, at row offsets.

    Called on `{feature: int ids [batch]}` (one id per example per feature;
    other entries are ignored), it returns `{feature: [batch, output_dim]}`,
    exactly what one `DPEmbedding(V_f, output_dim)` per feature returns for
    the same rows. Feature f's rows are `[offset_f, offset_f + V_f)`
    (`feature_rows`); its ids must lie in `[0, V_f)`.

    Args:
      vocabulary_sizes: `{feature: rows of its table}`, in stacking order.
      output_dim: the width of every table (an int, or `{feature: width}` whose
        widths agree).
      embeddings_initializer: Keras initializer for the whole stack.
      **kwargs: passed to `keras.layers.Layer` (no `combiner`, no `hash_ids`).

    Raises:
      ValueError: bad sizes, several widths, or a `combiner`/`hash_ids`
        argument; at call time, a feature missing from the input.

    References: DP-FEST App. B.1 (top-k over all buckets at once).
    """

    def __init__(self, vocabulary_sizes: Mapping[str, int], output_dim, *, embeddings_initializer="uniform", **kwargs):
        sizes, width = stacked_arguments(vocabulary_sizes, output_dim, kwargs)
        super().__init__(
            sum(sizes.values()),
            width,
            combiner=None,
            hash_ids=False,
            embeddings_initializer=embeddings_initializer,
            **kwargs,
        )
        self._init_stack(sizes)

    def build(self, input_shape=None):
        super().build(None)  # the input is a dict of features; the table's shape does not depend on it

    def get_config(self):
        return self._stack_config(super().get_config())


def stacked_tables(tables: Mapping[str, tuple], *, name_fn=None, **kwargs) -> list[StackedEmbedding]:
    """One `StackedEmbedding` per width group of `tables` (`tfdp_embed.layers.stacked_lookup.stacked_layers`)."""
    return stacked_layers(StackedEmbedding, tables, name_fn=name_fn, **kwargs)


__all__ = ["StackedEmbedding", "stacked_tables"]
