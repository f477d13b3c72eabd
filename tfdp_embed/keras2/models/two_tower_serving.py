"""Serving a trained two-tower model: watch history in, top-k item ids and scores out.

`RetrievalServingModule` holds the query tower of a trained `TwoTowerModel`
(history embedding + dense layers), the map from the dataset's own movie ids
to the model's dense ids (`tfdp_embed.data.item_ids.ItemIdMap`) and a TFRS
brute-force index (`tfrs.layers.factorized_top_k.BruteForce`) over the item
vectors V[1:] labelled with the ORIGINAL movie ids. Its `serve` signature takes

* `history`: tf.int32 `[batch, length]`, original movie ids (as in the
  ratings file), 0 = padding, any length (0 columns included),

and returns `{"item_ids": int32 [batch, k], "scores": float32 [batch, k],
"known_ids": int32 [batch]}`: the top-k original movie ids, highest score
first, and how many ids of each history the model knows. Nothing is
excluded from the ranking (watched movies may be returned).

Unknown ids (the documented fallback): an id the map does not hold (a movie
absent from the training catalogue, a negative id) is dropped like padding.
A history with no known id (`known_ids` 0) is served as the empty history:
the query tower applied to a zero pooled vector, the same top-k for every
such request. Wrong dtype or rank is rejected by the signature;
`check_history` gives those checks in Python.

Export only through `tfdp_embed.keras2.export.export_saved_model` (it flushes owed
LazyDP noise, refuses an un-flushed model and removes read hooks before
tracing):

    >>> module = RetrievalServingModule(model, k=10, item_ids=data.item_ids)
    >>> export_saved_model(dp_model, "out/retrieval_saved_model", serving_module=module,
    ...                    signatures={"serving_default": module.serve}, report=report)
    >>> serve = tf.saved_model.load("out/retrieval_saved_model").signatures["serving_default"]
    >>> serve(history=tf.constant([[50, 172, 0]], tf.int32))["item_ids"]

References: TFRS `layers/factorized_top_k.py` (BruteForce); EANA §4.1.2;
LazyDP §3 (only the final, flushed model is released).
"""

from __future__ import annotations

import numpy as np
import tensorflow_recommenders as tfrs

from tfdp_embed.data.item_ids import UNKNOWN_ID, ItemIdMap
from tfdp_embed.keras2._keras import tf
from tfdp_embed.keras2.models.two_tower import TwoTowerModel

_INT32_MAX = 2**31 - 1


class RetrievalServingModule(tf.Module):
    """A SavedModel-ready module: watch history (original movie ids) -> top-k original ids and scores.

    Args:
      model: the trained `TwoTowerModel` (e.g. `dp_model.inner`), flushed.
      k: number of items returned per request (1..num_items).
      item_ids: the map of original movie ids to the model's dense ids 1..num_items
        (`MovieLensData.item_ids`); None: original id == dense id.

    Raises:
      TypeError: `model` is not a `TwoTowerModel`.
      ValueError: `k` outside 1..num_items, or a map of another size or with ids beyond int32.
    """

    def __init__(
        self, model: TwoTowerModel, *, k: int = 10, item_ids: ItemIdMap | None = None, name: str = "two_tower_retrieval"
    ):
        super().__init__(name=name)
        if not isinstance(model, TwoTowerModel):
            raise TypeError(f"`model` must be a TwoTowerModel; received {type(model).__name__}.")
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= model.num_items:
            raise ValueError(f"`k` must be an int in [1, {model.num_items}]; received {k!r}.")
        item_ids = item_ids if item_ids is not None else ItemIdMap(np.arange(1, model.num_items + 1))
        if item_ids.num_items != model.num_items or item_ids.ids[-1] > _INT32_MAX:
            raise ValueError(
                f"`item_ids` must map {model.num_items} int32 movie ids (the model's items); received "
                f"{item_ids.num_items} ids up to {item_ids.ids[-1]}."
            )
        self.k = k
        self.num_items = model.num_items
        # Tracked: the query tower's variables (not the item table: the index holds a copy).
        self.query_variables = [
            v for v in model.trainable_variables if v.ref() != model.item_embedding.embeddings.ref()
        ]
        object.__setattr__(self, "_model", model)
        original = tf.constant(item_ids.ids, tf.int64)
        self.id_table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(original, tf.range(1, model.num_items + 1, dtype=tf.int64)),
            default_value=UNKNOWN_ID,
        )
        self.index = tfrs.layers.factorized_top_k.BruteForce(k=k, name="item_index")
        self.index.index(tf.identity(model.item_embedding.candidates()), tf.cast(original, tf.int32))
        self.serve = tf.function(
            self._serve,
            input_signature=[tf.TensorSpec([None, None], tf.int32, name="history")],
        )

    def _serve(self, history):
        dense = tf.cast(self.id_table.lookup(tf.cast(history, tf.int64)), tf.int32)
        # One padding column more: a 0-column request still has a slot for the empty-history stand-in.
        dense = tf.concat([dense, tf.zeros([tf.shape(dense)[0], 1], tf.int32)], axis=1)
        known = tf.reduce_sum(tf.cast(dense != UNKNOWN_ID, tf.int32), axis=1)
        empty = known == 0
        last_column = tf.range(tf.shape(dense)[1]) == tf.shape(dense)[1] - 1
        # Empty rows read item 1 (any real id satisfies the embedding's check); their pooled vector is replaced by 0.
        stand_in = tf.logical_and(empty[:, None], last_column[None, :])
        pooled = self._model.history_embedding(tf.where(stand_in, tf.ones_like(dense), dense))
        pooled = tf.where(empty[:, None], tf.zeros_like(pooled), pooled)
        scores, ids = self.index(self._model.query_of_pooled(pooled))
        return {"item_ids": ids, "scores": scores, "known_ids": known}

    def top_k(self, history) -> dict:
        """In-process retrieval with the same map and index (for comparison with the SavedModel)."""
        return self._serve(tf.constant(check_history(history)))


def check_history(history, *, num_items: int | None = None) -> np.ndarray:
    """Validates a serving request's type and shape in Python; returns it as int32 `[batch, length]`.

    Ids are not checked against the catalogue: unknown ids have a fallback (see the module docstring).
    `num_items` is accepted for callers of the old signature and ignored.

    Raises:
      TypeError: non-integer ids.
      ValueError: not 2-D, or an id beyond int32.
    """
    del num_items
    array = np.asarray(history)
    if array.dtype.kind not in "iu":
        raise TypeError(
            f"Two-tower serving input: `history` must hold integer movie ids (0 = padding); received dtype "
            f"{array.dtype}."
        )
    if array.ndim != 2:
        raise ValueError(
            f"Two-tower serving input: `history` must be 2-D [batch, length] (0-padded); received shape {array.shape}."
        )
    if array.size and (array.min() < -_INT32_MAX - 1 or array.max() > _INT32_MAX):
        raise ValueError(f"Two-tower serving input: ids must fit int32; received min {array.min()}, max {array.max()}.")
    return array.astype(np.int32)


__all__ = ["RetrievalServingModule", "check_history"]
