"""Serving a trained two-tower model: watch history in, top-k item ids and scores out.

`RetrievalServingModule` holds the query tower of a trained `TwoTowerModel`
(history embedding + dense layers) and a TFRS brute-force index
(`tfrs.layers.factorized_top_k.BruteForce`) over the item vectors
V[1:] with identifiers 1..num_items. Its `serve` signature takes

* `history`: tf.int32 `[batch, length]`, movie ids in [1, num_items], padded
  with 0 (any length; at least one real id per row),

and returns `{"item_ids": int32 [batch, k], "scores": float32 [batch, k]}`,
highest score first. Nothing is excluded from the ranking (watched movies
may be returned). Malformed requests fail with messages that name the
problem: wrong dtype or rank is rejected by the signature; an id out of
range or a row with only padding fails inside (`InvalidArgumentError` with
the message); `check_history` gives the same checks in Python first.

Export only through `tfdp_embed.export.export_saved_model` (it flushes owed
LazyDP noise, refuses an un-flushed model and removes read hooks before
tracing):

    >>> module = RetrievalServingModule(model, k=10)
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

from tfdp_embed._keras import tf
from tfdp_embed.models.two_tower import TwoTowerModel


class RetrievalServingModule(tf.Module):
    """A SavedModel-ready module: padded watch history -> top-k item ids and scores.

    Args:
      model: the trained `TwoTowerModel` (e.g. `dp_model.inner`), flushed.
      k: number of items returned per request (1..num_items).

    Raises:
      TypeError: `model` is not a `TwoTowerModel`.
      ValueError: `k` outside 1..num_items.
    """

    def __init__(self, model: TwoTowerModel, *, k: int = 10, name: str = "two_tower_retrieval"):
        super().__init__(name=name)
        if not isinstance(model, TwoTowerModel):
            raise TypeError(f"`model` must be a TwoTowerModel; received {type(model).__name__}.")
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= model.num_items:
            raise ValueError(f"`k` must be an int in [1, {model.num_items}]; received {k!r}.")
        self.k = k
        self.num_items = model.num_items
        # Tracked: the query tower's variables (not the item table: the index holds a copy).
        self.query_variables = [
            v for v in model.trainable_variables if v.ref() != model.item_embedding.embeddings.ref()
        ]
        object.__setattr__(self, "_model", model)
        self.index = tfrs.layers.factorized_top_k.BruteForce(k=k, name="item_index")
        self.index.index(
            tf.identity(model.item_embedding.candidates()),
            tf.range(1, model.num_items + 1, dtype=tf.int32),
        )
        self.serve = tf.function(
            self._serve,
            input_signature=[tf.TensorSpec([None, None], tf.int32, name="history")],
        )

    def _serve(self, history):
        checks = [
            tf.debugging.Assert(
                tf.logical_and(
                    tf.reduce_all(history >= 0),
                    tf.reduce_all(history <= self.num_items),
                ),
                [
                    (
                        f"Two-tower serving input: `history` ids must be movie ids in [1, {self.num_items}] "
                        "or 0 (padding); smallest and largest received:"
                    ),
                    tf.reduce_min(history),
                    tf.reduce_max(history),
                ],
            )
        ]
        with tf.control_dependencies(checks):
            queries = self._model.query(tf.identity(history))
        scores, ids = self.index(queries)
        return {"item_ids": ids, "scores": scores}

    def top_k(self, history) -> dict:
        """In-process retrieval with the same index (for comparison with the SavedModel)."""
        return self._serve(tf.constant(check_history(history, num_items=self.num_items)))


def check_history(history, *, num_items: int) -> np.ndarray:
    """Validates a serving request in Python; returns it as int32 `[batch, length]`.

    Raises:
      TypeError: non-integer ids.
      ValueError: not 2-D, an id outside [0, num_items], or a row with only padding (0).
    """
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
    if array.size and (array.min() < 0 or array.max() > num_items):
        raise ValueError(
            f"Two-tower serving input: ids must lie in [1, {num_items}] or be 0 (padding); received min "
            f"{array.min()}, max {array.max()}."
        )
    empty = np.flatnonzero(~np.any(array != 0, axis=1))
    if empty.size:
        raise ValueError(
            f"Two-tower serving input: rows {empty[:5].tolist()} hold only padding; every request needs at "
            "least one watched movie."
        )
    return array.astype(np.int32)


__all__ = ["RetrievalServingModule", "check_history"]
