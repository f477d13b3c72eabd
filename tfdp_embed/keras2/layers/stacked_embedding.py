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
from tfdp_embed.layers.stacked_lookup import (
    StackedLookup,
    check_one_width,
    check_vocabulary_sizes,
    stack_name,
    width_groups,
)


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
        for key in ("combiner", "hash_ids", "vocabulary_size"):
            if kwargs.pop(key, None) not in (None, False):
                raise ValueError(
                    f"StackedEmbedding takes no `{key}`: each feature gives one int id per example, already "
                    "bucketed (use one DPEmbedding per feature for pooled or hashed ids)."
                )
        sizes = check_vocabulary_sizes(vocabulary_sizes)
        super().__init__(
            sum(sizes.values()),
            check_one_width(output_dim, list(sizes)),
            combiner=None,
            hash_ids=False,
            embeddings_initializer=embeddings_initializer,
            **kwargs,
        )
        self._init_stack(sizes)

    def build(self, input_shape=None):
        super().build(None)  # the input is a dict of features; the table's shape does not depend on it

    def get_config(self):
        config = super().get_config()
        for key in ("combiner", "hash_ids", "vocabulary_size"):
            config.pop(key, None)
        config.update(self._stack_config())
        return config


def stacked_tables(tables: Mapping[str, tuple], *, name_fn=None, **kwargs) -> list[StackedEmbedding]:
    """One `StackedEmbedding` per width group of `tables` (`width_groups`).

    Args:
      tables: `{feature: (vocabulary_size, width)}` (or with a dtype third).
      name_fn: `name_fn(width, features)` -> layer name; default `embedding_stack_{width}`
        (with the dtype appended for a group that is not float32).
      **kwargs: passed to every `StackedEmbedding`.
    """
    layers = []
    for (width, dtype), features in width_groups(tables):
        name = name_fn(width, features) if name_fn is not None else stack_name(width, dtype)
        sizes = {f: int(tables[f][0]) for f in features}
        layers.append(StackedEmbedding(sizes, width, name=name, dtype=dtype, **kwargs))
    return layers


__all__ = ["StackedEmbedding", "stacked_tables"]
