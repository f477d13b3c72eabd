"""A two-tower (dual encoder) next-item model with a full softmax, built by subclassing `DPEmbedding`.

EANA §4.1.2 (Fig. 3): the context tower encodes a watch history as a bag of
words (mean of `DPEmbedding` rows) followed by dense layers; the label tower
is an embedding lookup of the item; the score is the dot product; the loss
is the softmax cross-entropy over **all** items:

    q_i = MLP(mean_{j in context_i} E_ctx[j]),   logits_i = q_i V^T,
    loss_i = -log softmax(logits_i)[label_i]

Two layers subclass `DPEmbedding`:

* `HistoryEmbedding`: takes a padded `[batch, L]` int history (id 0 =
  padding), drops the padding and mean-pools (combiner "mean" over the
  ragged ids). Its `call` hands the ragged ids to `lookup`, which the
  default clipping rule records, so the norms cover the rows really read.
* `ItemEmbedding`: the item table V (row 0 = padding, rows 1..num_items =
  items). Called with int ids it looks them up (the label tower); called
  with float queries `[batch, d]` it returns the logits over all items,
  `q V[1:]^T` `[batch, num_items]`. The default `DPEmbedding` rule only
  knows lookups (DPModel refuses scoring under it), so this layer has its
  own rule, `tfdp_embed.clipping.item_embedding.item_embedding_gradients`,
  registered by `two_tower_registry()` on its `call` (pass it to
  `DPModel(registry=...)`); a subclass overriding `call`, `lookup` or
  `candidates` is refused under it.

Why the full softmax and not in-batch negatives: `tfrs.tasks.Retrieval`
scores each query against the *other* examples' items in the batch, so
example i's loss depends on examples j != i; removing one example changes
the others' gradients and per-example clipping no longer bounds one
example's influence (`DPModel` rejects it). The full softmax over the
catalogue depends on example i alone.

What that costs the sparse mechanisms: every item has a non-zero softmax
gradient p_ij q_i for every example, so the item table is touched in every
row at every step. EANA therefore noises all of its rows every step (as
DP-SGD does) and LazyDP has nothing to defer on it; their sparsity, and
EANA's difference from DP-SGD, is on the history (context) table only.

Example:
    >>> model = TwoTowerModel(num_items=1682, embedding_dim=32)
    >>> dp = DPModel(model, mechanism=EANA(l2_norm_clip=1.0, noise_multiplier=0.01),
    ...              expected_batch_size=256, registry=two_tower_registry())
    >>> dp.compile(optimizer=keras.optimizers.legacy.SGD(0.5))   # loss: model.compute_loss
    >>> dp.fit(poisson_batches_of_(contexts, labels))

References: Berlowitz et al., "EANA", RecSys 2022, §4.1.2, Fig. 3; Yi et
al. 2019 (two-tower retrieval); Li et al. 2022, Bu et al. 2022 (ghost
norms, book-keeping).
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow_recommenders as tfrs

from tfdp_embed._checks import check_int
from tfdp_embed.clipping.item_embedding import item_embedding_gradients
from tfdp_embed.clipping.registry import LayerRegistry
from tfdp_embed.data.movielens import PADDING_ID
from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.clipping import default_registry
from tfdp_embed.keras2.layers.embedding import DPEmbedding


class HistoryEmbedding(DPEmbedding):
    """Bag-of-words context tower input: mean of the embeddings of a padded id history.

    Input: int `[batch, L]` ids, `padding_id` (0) marking empty slots anywhere;
    every row needs at least one real id. Output: `[batch, output_dim]`.

    Args:
      vocabulary_size: rows (num_items + 1; row `padding_id` is never read).
      output_dim: embedding dimension.
      padding_id: the id that marks padding.
      **kwargs: passed to `DPEmbedding` (combiner is always "mean").

    Raises:
      tf.errors.InvalidArgumentError (at call time): a history with no real id.
    """

    def __init__(
        self,
        vocabulary_size: int,
        output_dim: int,
        *,
        padding_id: int = PADDING_ID,
        **kwargs,
    ):
        kwargs.pop("combiner", None)
        super().__init__(vocabulary_size, output_dim, combiner="mean", **kwargs)
        self.padding_id = int(padding_id)

    def _drop_padding(self, ids):
        ids = tf.convert_to_tensor(ids)
        if ids.shape.rank == 3:  # user units [users, k, L]: ragged [users, k, None]; a padding row has no ids
            k = ids.shape[1] if ids.shape[1] is not None else tf.shape(ids, out_type=tf.int64)[1]
            flat = tf.reshape(ids, [-1, tf.shape(ids)[2]])
            rows = tf.ragged.boolean_mask(flat, tf.not_equal(flat, tf.cast(self.padding_id, ids.dtype)))
            return tf.RaggedTensor.from_uniform_row_length(rows, k)
        if ids.shape.rank != 2:
            raise ValueError(
                f"HistoryEmbedding {self.name!r} takes padded histories of shape [batch, length] (or, for user "
                f"units, [users, k, length]); received shape {ids.shape}."
            )
        real = tf.not_equal(ids, tf.cast(self.padding_id, ids.dtype))
        check = tf.debugging.Assert(
            tf.reduce_all(tf.reduce_any(real, axis=1)),
            [
                (
                    f"HistoryEmbedding {self.name!r}: every history needs at least one id other than the "
                    f"padding id {self.padding_id}; rows without one:"
                ),
                tf.where(tf.logical_not(tf.reduce_any(real, axis=1)))[:5, 0],
            ],
        )
        with tf.control_dependencies([check]):
            return tf.ragged.boolean_mask(ids, real)

    def call(self, ids):
        return super().call(self._drop_padding(ids))

    def occurrences(self, ids, *, check_range: bool = True):
        return super().occurrences(self._drop_padding(ids), check_range=check_range)

    def get_config(self):
        config = super().get_config()
        config.pop("combiner", None)
        config.update(padding_id=self.padding_id)
        return config


class ItemEmbedding(DPEmbedding):
    """The item table: label-tower lookups (int ids) and full-softmax logits (float queries).

    Rows 1..num_items are items; row 0 is padding and never a candidate.

    * `layer(ids)` with int ids `[batch]`: the label tower, `[batch, dim]`.
    * `layer(queries)` with float `[batch, dim]`: logits over all items,
      `queries @ V[1:]^T`, `[batch, num_items]` (column j is item j + 1).

    Under `DPModel` use `two_tower_registry()`: the default rule handles only lookups.

    Args:
      num_items: number of items (the table has num_items + 1 rows).
      output_dim: embedding dimension (= the query dimension).
      **kwargs: passed to `DPEmbedding` (no combiner, no hashing).
    """

    def __init__(self, num_items: int, output_dim: int, **kwargs):
        num_items = check_int("num_items", num_items)
        kwargs.pop("combiner", None)
        kwargs.pop("vocabulary_size", None)
        super().__init__(num_items + 1, output_dim, combiner=None, hash_ids=False, **kwargs)
        self.num_items = num_items

    def candidates(self) -> tf.Tensor:
        """The item vectors V[1:], `[num_items, dim]` (row j is item j + 1)."""
        return self.embeddings[1:]

    def call(self, inputs):
        inputs = tf.convert_to_tensor(inputs)
        if inputs.dtype.is_floating:
            return self._all_item_logits(inputs)
        return super().call(inputs)

    def _all_item_logits(self, queries):
        if queries.shape.rank not in (2, 3) or (queries.shape[-1] is not None and queries.shape[-1] != self.output_dim):
            raise ValueError(
                f"ItemEmbedding {self.name!r} scores float queries of shape [batch, {self.output_dim}] (or, for "
                f"user units, [users, k, {self.output_dim}]); received shape {queries.shape}."
            )
        if self.read_hook is not None:  # every item row is read
            self.read_hook(tf.range(1, self.vocabulary_size, dtype=tf.int64))
        return tf.einsum("...d,nd->...n", queries, tf.cast(self.candidates(), queries.dtype))

    def occurrences(self, ids, *, check_range: bool = True):
        ids_tensor = ids if isinstance(ids, (tf.RaggedTensor, tf.SparseTensor)) else tf.convert_to_tensor(ids)
        if ids_tensor.dtype.is_floating:
            raise TypeError(
                f"ItemEmbedding {self.name!r} was called with float queries (the full softmax over all "
                "items), which the default DPEmbedding clipping rule cannot see: pass "
                "`registry=tfdp_embed.keras2.models.two_tower.two_tower_registry()` to DPModel."
            )
        return super().occurrences(ids, check_range=check_range)

    def get_config(self):
        config = super().get_config()
        for key in ("combiner", "hash_ids", "vocabulary_size"):
            config.pop(key, None)
        config.update(num_items=self.num_items)
        return config


def two_tower_registry() -> LayerRegistry:
    """The default clipping registry with `ItemEmbedding`'s rule first (it must win over DPEmbedding's)."""
    registry = LayerRegistry()
    # Tapped on `call` (it reads the queries and logits there); a subclass that
    # changes `call` or `lookup` changes the math the rule describes.
    registry.register(
        ItemEmbedding,
        item_embedding_gradients,
        described=("lookup", "candidates"),
        if_overridden="refuse",
    )
    return LayerRegistry([*registry, *default_registry()])


class TwoTowerModel(tfrs.Model):
    """Bag-of-words context tower + item lookup label tower, dot-product score, full softmax loss.

    Inputs: contexts int32 `[batch, L]` (0 = padding), labels int32 `[batch]` in [1, num_items].

    Args:
      num_items: largest item id (ids 1..num_items; 0 = padding).
      embedding_dim: embedding and query dimension d.
      hidden_units: widths of the ReLU layers after pooling (then a linear layer to d).
      name: model name.

    Raises:
      ValueError: on bad sizes.
    """

    def __init__(
        self,
        *,
        num_items: int,
        embedding_dim: int = 32,
        hidden_units: Sequence[int] = (64,),
        name: str = "two_tower",
    ):
        super().__init__(name=name)
        embedding_dim = check_int("embedding_dim", embedding_dim)
        hidden_units = tuple(hidden_units)
        if any(isinstance(u, bool) or not isinstance(u, int) or u < 1 for u in hidden_units):
            raise ValueError(f"`hidden_units` must be ints >= 1; received {hidden_units!r}.")
        self.num_items = num_items
        self.embedding_dim = embedding_dim
        self.hidden_units = hidden_units
        self.history_embedding = HistoryEmbedding(num_items + 1, embedding_dim, name="history_embedding")
        self.hidden_layers = [
            keras.layers.Dense(units, activation="relu", name=f"context_hidden_{i}")
            for i, units in enumerate(hidden_units)
        ]
        self.query_projection = keras.layers.Dense(embedding_dim, name="query_projection")
        self.item_embedding = ItemEmbedding(num_items, embedding_dim, name="item_embedding")

    # -- towers ---------------------------------------------------------------
    def query(self, contexts, training=False) -> tf.Tensor:
        """The context tower: float32 `[batch, d]` query embeddings of padded histories."""
        return self.query_of_pooled(self.history_embedding(contexts))

    def query_of_pooled(self, pooled) -> tf.Tensor:
        """The context tower after pooling: `[batch, d]` queries of mean history embeddings `[batch, d]`.

        Serving uses it for a history with no known movie (pooled vector 0).
        """
        x = pooled
        for layer in self.hidden_layers:
            x = layer(x)
        return self.query_projection(x)

    def item_vectors(self, item_ids) -> tf.Tensor:
        """The label tower: `[batch, d]` embeddings of items 1..num_items."""
        return self.item_embedding(item_ids)

    def call(self, contexts, training=False) -> tf.Tensor:
        """Logits over all items, `[batch, num_items]` (column j is item j + 1)."""
        return self.item_embedding(self.query(contexts, training=training))

    def score(self, contexts, item_ids) -> tf.Tensor:
        """Dot-product score of (context, item) pairs, `[batch]`."""
        return tf.reduce_sum(self.query(contexts) * self.item_vectors(item_ids), axis=-1)

    # -- loss ----------------------------------------------------------------
    def _checked_labels(self, labels) -> tf.Tensor:
        labels = tf.reshape(tf.cast(labels, tf.int64), [-1])
        check = tf.debugging.Assert(
            tf.logical_and(tf.reduce_all(labels >= 1), tf.reduce_all(labels <= self.num_items)),
            [
                f"TwoTowerModel: labels must be item ids in [1, {self.num_items}]; min and max received:",
                tf.reduce_min(labels),
                tf.reduce_max(labels),
            ],
        )
        with tf.control_dependencies([check]):
            return tf.identity(labels)

    def log_probs(self, contexts, labels) -> tf.Tensor:
        """log softmax probability of each label given its context, float32 `[batch]`."""
        labels = self._checked_labels(labels)
        log_p = tf.nn.log_softmax(self(contexts), axis=-1)
        return tf.gather(log_p, labels - 1, batch_dims=1)

    def compute_loss(self, inputs, training: bool = False) -> tf.Tensor:
        """Per-example softmax cross-entropy over all items, `[batch]` (one loss per example).

        User units (`poisson_user_batches`, contexts `[users, k, L]`, labels `[users, k]`, label 0 on
        padding rows): one loss per user, the sum of its real rows' losses (padding rows add 0).
        """
        contexts, labels = inputs
        if tf.convert_to_tensor(contexts).shape.rank == 3:
            return self._unit_loss(contexts, labels, training)
        labels = self._checked_labels(labels)
        logits = self(contexts, training=training)
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels - 1, logits=logits)

    def _unit_loss(self, contexts, labels, training) -> tf.Tensor:
        """sum_{r < k} [label_ur != 0] CE(logits_ur, label_ur), `[users]`."""
        labels = tf.cast(labels, tf.int64)
        real = tf.not_equal(labels, PADDING_ID)
        checked = self._checked_labels(tf.boolean_mask(labels, real))  # the real rows' labels in range
        with tf.control_dependencies([checked]):
            logits = self(contexts, training=training)  # [users, k, num_items]
        per_row = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.maximum(labels, 1) - 1, logits=logits)
        return tf.reduce_sum(tf.where(real, per_row, tf.zeros_like(per_row)), axis=1)


__all__ = [
    "HistoryEmbedding",
    "ItemEmbedding",
    "TwoTowerModel",
    "item_embedding_gradients",
    "two_tower_registry",
]
