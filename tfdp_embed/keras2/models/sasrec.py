"""SASRec-style next-item Transformer with a shared item embedding, and DPFormer (Re-Attention).

    x_0 = E[s_t] + P[t]  (masked at padding)                  shared E: SharedEmbedding, P: DPEmbedding
    per block:  h = LN(x);  x += W_o Attn(W_q h, W_k h, W_v h);  x += W_2 ReLU(W_1 LN(x))
    hidden = LN(x);  logits_t = hidden_t E^T over ALL items   (the same E: tied input/output)
                     (+ log p, a fixed log-frequency prior, with `popularity_prior`)
    with `head_items=k`: E has k + 2 rows (padding, the k most frequent items,
    one shared "tail" row); item i reads and scores row r(i), logits_t[i] =
    hidden_t E[r(i)]^T (+ log p_i), so only k + 2 rows are trained and noised,
    and the training loss (still the softmax over all items) costs k + 2 rows
    loss_u = mean over u's non-padded positions t of CE(logits_t, s_{t+1})   (ONE value per user)

Every trainable weight lives in a layer the clipping registry covers exactly
(SharedEmbedding, DPEmbedding, Dense, LayerNormalization); attention has no
weights of its own (`CausalSelfAttention`), so DPModel never falls back to
`tf.vectorized_map`. Pre-LN blocks, one head, model dim 64, 2 blocks and a
learned positional embedding follow DPFormer App. A.9.2.

With `re_attention=True` (DPFormer), the model tracks each token's
activation variance from the effective errors (`set_effective_errors`)
through every layer (`tfdp_embed.keras2.attention.re_attention`) and subtracts
C_i sigma_j^2 / 2 from the attention logits. The tracking is wrapped in
`tf.stop_gradient`: a constant of the backward pass, so per-example
clipping stays exact.

Example:
    >>> model = SASRec(SASRecConfig(num_items=23715, max_len=50, re_attention=True))
    >>> model.set_effective_errors(item_errors, weight_error)
    >>> per_user_loss = model.compute_loss((inputs, targets), training=True)   # [B]

References: Kang & McAuley 2018 (SASRec); DPFormer App. A.9.2 (model), §4 and
Alg. 1 (Re-Attention), §3 (shared embedding).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tfdp_embed._checks import check_int
from tfdp_embed.data.item_ids import ItemIdMap
from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.attention import re_attention as ra
from tfdp_embed.keras2.attention.causal_attention import CausalSelfAttention
from tfdp_embed.keras2.layers.embedding import DPEmbedding
from tfdp_embed.keras2.layers.shared_embedding import SharedEmbedding


@dataclasses.dataclass(frozen=True)
class SASRecConfig:
    """Static model settings.

    Attributes:
      num_items: V; item ids are 1..V, 0 pads (the table has V + 1 rows, or
        head_items + 2).
      max_len: L, the input length.
      dim: model dimension d (64 in DPFormer).
      blocks: Transformer blocks (2).
      dropout: dropout rate on embeddings, attention weights and block outputs.
      re_attention: DPFormer's Re-Attention correction on.
      layer_norm_epsilon: LayerNormalization epsilon.
      popularity_prior: add a fixed log item frequency to every logit
        (`SASRec.set_item_prior`; not trained, so it needs no clipping or noise:
        its privacy cost is that of the frequencies, the ones Re-Attention
        uses — nothing when they are public, their accounted release when not).
    """

    num_items: int
    max_len: int = 50
    dim: int = 64
    blocks: int = 2
    dropout: float = 0.5
    re_attention: bool = False
    layer_norm_epsilon: float = 1e-6
    popularity_prior: bool = False
    head_items: int | None = None

    def __post_init__(self):
        for name in ("num_items", "max_len", "dim", "blocks"):
            check_int(name, getattr(self, name))
        if not 0 <= self.dropout < 1:
            raise ValueError(f"`dropout` must lie in [0, 1); received {self.dropout!r}.")
        k = self.head_items
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= self.num_items):
            raise ValueError(f"`head_items` must be None or an int in [1, num_items={self.num_items}]; received {k!r}.")

    @property
    def table_rows(self) -> int:
        """Rows of the item table: num_items + 1, or head_items + 2 (padding, head, tail)."""
        return self.num_items + 1 if self.head_items is None else self.head_items + 2

    def get_config(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_config(cls, config: dict) -> SASRecConfig:
        return cls(**config)


class _Block:
    """The layers of one pre-LN block (held by the model so Keras tracks them)."""

    def __init__(self, model: keras.Model, index: int, config: SASRecConfig):
        d, eps = config.dim, config.layer_norm_epsilon
        self.attn_norm = keras.layers.LayerNormalization(epsilon=eps, name=f"block{index}_attn_norm")
        self.query = keras.layers.Dense(d, name=f"block{index}_query")
        self.key = keras.layers.Dense(d, name=f"block{index}_key")
        self.value = keras.layers.Dense(d, name=f"block{index}_value")
        self.output = keras.layers.Dense(d, name=f"block{index}_attn_output")
        self.attention = CausalSelfAttention(dropout=config.dropout, name=f"block{index}_attention")
        self.ffn_norm = keras.layers.LayerNormalization(epsilon=eps, name=f"block{index}_ffn_norm")
        self.ffn_in = keras.layers.Dense(d, activation="relu", name=f"block{index}_ffn_in")
        self.ffn_out = keras.layers.Dense(d, name=f"block{index}_ffn_out")
        self.dropout = keras.layers.Dropout(config.dropout)
        for name, layer in vars(self).items():
            setattr(model, f"_block{index}_{name}", layer)


class _Tracer:
    """Holds `trace_errors`' stages while it runs (a plain object: Keras does not track it)."""

    def __init__(self):
        self.stages: dict | None = None
        self.apply_correction = True


class SASRec(keras.Model):
    """Next-item Transformer over left-padded item sequences `[B, L]` (0 = padding).

    `call(ids)` returns the hidden states `[B, L, d]`; `logits(hidden)` scores
    them against all V + 1 rows of the shared table (column 0 is padding and
    never a target); `compute_loss((ids, targets))` is the per-user loss
    DPModel clips; `scores(histories)` gives `[B, V + 1]` for the next item.

    Args:
      config: `SASRecConfig`.

    Raises:
      ValueError: ids not of shape `[B, max_len]`.
    """

    def __init__(self, config: SASRecConfig, **kwargs):
        super().__init__(name=kwargs.pop("name", "dpformer" if config.re_attention else "sasrec"), **kwargs)
        self.config = config
        self.items = SharedEmbedding(
            config.table_rows,
            config.dim,
            padding_id=0,
            embeddings_initializer=keras.initializers.TruncatedNormal(stddev=0.02),
            name="items",
        )
        self.positions = DPEmbedding(
            config.max_len,
            config.dim,
            embeddings_initializer=keras.initializers.TruncatedNormal(stddev=0.02),
            name="positions",
        )
        self.embedding_dropout = keras.layers.Dropout(config.dropout)
        self.blocks = [_Block(self, i, config) for i in range(config.blocks)]
        self.final_norm = keras.layers.LayerNormalization(epsilon=config.layer_norm_epsilon, name="final_norm")
        # Re-Attention's effective errors: data, not trainable (DPFormer Claims 4.3-4.4).
        self.item_errors = tf.Variable(tf.zeros([config.table_rows]), trainable=False, name="item_effective_errors")
        # Item id -> table row (`head_items`): until `set_item_rows`, ids 1..k are the head.
        self.item_rows = None
        if config.head_items is not None:
            default = np.minimum(np.arange(config.num_items + 1), config.head_items + 1)
            self.item_rows = tf.Variable(default.astype(np.int32), trainable=False, name="item_rows")
        self.weight_error = tf.Variable(0.0, trainable=False, name="weight_effective_error")
        # log p_i added to the logits when `config.popularity_prior` (zeros until set).
        self.item_log_prior = tf.Variable(tf.zeros([config.num_items + 1]), trainable=False, name="item_log_prior")
        self._tracer = _Tracer()  # `trace_errors` only

    # -- head items ------------------------------------------------------------------
    def set_item_rows(self, item_frequencies) -> None:
        """Gives the `head_items` most frequent items their own rows; all others share the tail row.

        Args:
          item_frequencies: `[V + 1]` frequencies (index 0 pads); ties go to the
            smaller id. Public, or a DP release (then this is post-processing).

        Raises:
          ValueError: without `head_items` in the config, or for bad shapes/values.
        """
        if self.item_rows is None:
            raise ValueError("`set_item_rows` needs SASRecConfig(head_items=k); every item has its own row otherwise.")
        freq = self._item_frequencies(item_frequencies)
        k = self.config.head_items
        assert k is not None  # item_rows exists only with head_items
        order = np.argsort(-freq[1:], kind="stable") + 1  # item ids, most frequent first
        rows = np.full(self.config.num_items + 1, k + 1, np.int32)
        rows[0] = 0
        rows[order[:k]] = np.arange(1, k + 1, dtype=np.int32)
        self.item_rows.assign(rows)

    def _item_frequencies(self, item_frequencies) -> np.ndarray:
        """`[V + 1]` finite frequencies as float64, or ValueError."""
        freq = np.asarray(item_frequencies, np.float64)
        if freq.shape != (self.config.num_items + 1,) or np.any(~np.isfinite(freq)):
            raise ValueError(
                f"`item_frequencies` must be finite and of shape ({self.config.num_items + 1},); "
                f"received shape {freq.shape}."
            )
        return freq

    def row_frequencies(self, item_frequencies) -> np.ndarray:
        """Item frequencies `[V + 1]` -> per table row `[table_rows]` (the tail row: min(1, sum of its items)).

        Without `head_items` the rows are the items and the frequencies are returned unchanged.
        """
        freq = self._item_frequencies(item_frequencies)
        if self.item_rows is None:
            return freq
        out = np.zeros(self.config.table_rows)
        np.add.at(out, self.item_rows.numpy(), freq)
        out[0] = freq[0]
        return np.minimum(out, 1.0)

    def _rows(self, ids):
        return ids if self.item_rows is None else tf.gather(self.item_rows, tf.cast(ids, tf.int32))

    # -- Re-Attention setup -----------------------------------------------------------
    def set_effective_errors(self, item_errors, weight_error: float) -> None:
        """Sets sigma_eff per table row `[table_rows]` and for every other weight (`effective_errors`)."""
        item_errors = np.asarray(item_errors, np.float32)
        rows = self.config.table_rows
        if item_errors.shape != (rows,) or np.any(~np.isfinite(item_errors)) or item_errors.min() < 0:
            raise ValueError(
                f"`item_errors` must be finite, >= 0 and of shape ({rows},) (one per table row); "
                f"received shape {item_errors.shape}."
            )
        if not weight_error >= 0:
            raise ValueError(f"`weight_error` must be >= 0; received {weight_error!r}.")
        self.item_errors.assign(item_errors)
        self.weight_error.assign(float(weight_error))

    def set_item_prior(self, item_frequencies, *, min_frequency: float) -> None:
        """Sets the logit prior to log(max(p_i, min_frequency)) per item (`[V + 1]`; row 0 pads).

        Args:
          item_frequencies: p_i per item, `[V + 1]` (public, or a DP release:
            noisy values below `min_frequency` are raised to it).
          min_frequency: the floor, > 0 (e.g. half a user: 0.5 / N).

        Raises:
          ValueError: without `popularity_prior` in the config, or for bad shapes/values.
        """
        if not self.config.popularity_prior:
            raise ValueError(
                "`set_item_prior` needs SASRecConfig(popularity_prior=True); the logits ignore it otherwise."
            )
        freq = self._item_frequencies(item_frequencies)
        if not (isinstance(min_frequency, (int, float)) and 0 < min_frequency <= 1):
            raise ValueError(f"`min_frequency` must be in (0, 1]; received {min_frequency!r}.")
        prior = np.log(np.maximum(freq, min_frequency))
        prior[0] = 0.0  # padding: never a target, never served
        self.item_log_prior.assign(prior.astype(np.float32))

    # -- forward ---------------------------------------------------------------------
    def _check_ids(self, ids):
        ids = tf.convert_to_tensor(ids)
        if ids.shape.rank != 2 or (ids.shape[1] is not None and ids.shape[1] != self.config.max_len):
            raise ValueError(
                f"SASRec takes left-padded item ids of shape [batch, {self.config.max_len}]; received shape "
                f"{ids.shape}."
            )
        return ids

    def trace_errors(self, ids, *, apply_correction: bool = True) -> dict:
        """Every stage's activation and tracked per-token variance, for checking the propagation (eager only).

        Args:
          ids: `[B, L]` item ids.
          apply_correction: False runs the vanilla attention (the tracked
            variances are still computed), to compare with noisy vanilla forwards.

        Returns:
          {stage: (activation [B, L, ...], tracked variance [B, L] or, for
          "blockN.score_log_bias", the correction [B, L, L])}, in forward order.

        Raises:
          ValueError: a model without `re_attention` (nothing is tracked).
        """
        if not self.config.re_attention:
            raise ValueError("`trace_errors` needs SASRecConfig(re_attention=True); nothing is tracked otherwise.")
        self._tracer.stages, self._tracer.apply_correction = {}, apply_correction
        try:
            self(ids, training=False)
            return {k: (a.numpy(), v.numpy()) for k, (a, v) in self._tracer.stages.items()}
        finally:
            self._tracer.stages, self._tracer.apply_correction = None, True

    def _record(self, stage: str, activation, variance) -> None:
        if self._tracer.stages is not None:
            self._tracer.stages[stage] = (activation, variance)

    def call(self, ids, training=None):
        ids = self._check_ids(ids)
        mask = tf.cast(ids > 0, tf.float32)
        positions = tf.broadcast_to(tf.range(self.config.max_len)[None], tf.shape(ids))
        rows = self._rows(ids)
        x = (self.items(rows) + self.positions(positions)) * mask[..., None]
        var = None
        if self.config.re_attention:
            var = (tf.square(tf.gather(self.item_errors, rows)) + tf.square(self.weight_error)) * mask
            self._record("input", x, var)
        x = self.embedding_dropout(x, training=training)
        for index, block in enumerate(self.blocks):
            x, var = self._block(block, x, var, mask, training, f"block{index}")
        return self.final_norm(x) * mask[..., None]

    def _block(self, block: _Block, x, var, mask, training, name: str = "block"):
        h = block.attn_norm(x)
        q, k, v = block.query(h), block.key(h), block.value(h)
        correction = None
        if var is not None:
            s_w = tf.square(self.weight_error)
            h_var = ra.layer_norm_output_variance(x, var, block.attn_norm.gamma, block.attn_norm.epsilon)
            key_var = ra.dense_output_variance(h, h_var, block.key.kernel, s_w)
            correction = tf.stop_gradient(ra.re_attention_correction(q, key_var))
            self._record(f"{name}.attn_norm", h, h_var)
            self._record(f"{name}.key", k, key_var)
            scores = tf.matmul(q, k, transpose_b=True) / tf.sqrt(tf.cast(tf.shape(q)[-1], q.dtype))
            self._record(f"{name}.score_log_bias", scores, correction)
            if not self._tracer.apply_correction:
                correction = None
        out, weights = block.attention(
            q, k, v, key_mask=mask, correction=correction, training=training, return_weights=True
        )
        x = x + block.dropout(block.output(out), training=training)
        x = x * mask[..., None]
        if var is not None:
            value_var = ra.dense_output_variance(h, h_var, block.value.kernel, s_w)
            out_var = ra.attention_output_variance(weights, value_var)
            var = var + ra.dense_output_variance(out, out_var, block.output.kernel, s_w)
            self._record(f"{name}.value", v, value_var)
            self._record(f"{name}.attention", out, out_var)
            self._record(f"{name}.attn_residual", x, var)
        ffn_input = x
        h2 = block.ffn_norm(x)
        f = block.ffn_in(h2)
        x = x + block.dropout(block.ffn_out(block.dropout(f, training=training)), training=training)
        x = x * mask[..., None]
        if var is not None:  # the norm's input is the residual stream BEFORE the feed-forward adds to it
            h2_var = ra.layer_norm_output_variance(ffn_input, var, block.ffn_norm.gamma, block.ffn_norm.epsilon)
            pre = tf.tensordot(h2, block.ffn_in.kernel, 1) + block.ffn_in.bias
            pre_var = ra.dense_output_variance(h2, h2_var, block.ffn_in.kernel, s_w)
            _, relu_var = ra.relu_moments(pre, pre_var[..., None])
            f_var = tf.reduce_mean(relu_var, axis=-1)
            var = tf.stop_gradient((var + ra.dense_output_variance(f, f_var, block.ffn_out.kernel, s_w)) * mask)
            self._record(f"{name}.ffn_norm", h2, h2_var)
            self._record(f"{name}.ffn_pre", pre, pre_var)
            self._record(f"{name}.ffn_relu", f, f_var)
            self._record(f"{name}.ffn_residual", x, var)
        return x, var

    def logits(self, hidden):
        """`hidden [..., d] @ E^T` (+ the log-frequency prior) -> `[..., V + 1]` over every item (shared table).

        With `head_items`, item i's logit is that of its row (its own or the shared tail row).
        """
        logits = self.items(hidden, mode="logits")
        if self.item_rows is not None:
            logits = tf.gather(logits, self.item_rows, axis=-1)
        if self.config.popularity_prior:  # a constant: the table's logits gradient is unchanged
            logits = logits + tf.cast(self.item_log_prior, logits.dtype)
        return logits

    def compute_loss(self, data, training=None):
        """Per-user loss `[B]`: mean cross-entropy over all items at the user's non-padded positions.

        Args:
          data: `(ids [B, L], targets [B, L])`, targets 0 where there is no next item.
          training: dropout on.

        Returns:
          float32 `[B]`; a user without targets contributes 0.
        """
        ids, targets = data
        targets = tf.cast(targets, tf.int32)
        hidden = self(ids, training=training)
        if self.item_rows is None:
            ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=self.logits(hidden))
        else:
            ce = self._head_cross_entropy(hidden, targets)
        weight = tf.cast(targets > 0, ce.dtype)
        return tf.reduce_sum(ce * weight, axis=1) / tf.maximum(tf.reduce_sum(weight, axis=1), 1.0)

    def _head_cross_entropy(self, hidden, targets):
        """The cross-entropy over all V + 1 items, computed over the table's head_items + 2 rows.

        Items sharing a row differ only by their prior b_i, so
        logsumexp_i(z_r(i) + b_i) = logsumexp_r(z_r + c_r) with c_r = logsumexp_{i in r} b_i,
        and CE = that - z_r(t) - b_t: exactly the full softmax (`logits`), at the cost of the rows.
        """
        table_logits = self.items(hidden, mode="logits")  # [B, L, rows]
        prior = self.item_log_prior if self.config.popularity_prior else tf.zeros_like(self.item_log_prior)
        rows, num_rows = self.item_rows, self.config.table_rows
        top = tf.math.unsorted_segment_max(prior, rows, num_rows)
        offsets = top + tf.math.log(tf.math.unsorted_segment_sum(tf.exp(prior - tf.gather(top, rows)), rows, num_rows))
        log_partition = tf.reduce_logsumexp(table_logits + tf.cast(offsets, table_logits.dtype), axis=-1)
        target_logit = tf.gather(table_logits, tf.gather(rows, targets), batch_dims=2) + tf.gather(prior, targets)
        return log_partition - target_logit

    def scores(self, histories, training=False):
        """`[B, V + 1]` next-item scores after each history (the last position's hidden state)."""
        hidden = self(histories, training=training)
        return self.logits(hidden[:, -1])

    def get_config(self):
        return {"config": self.config.get_config()}

    @classmethod
    def from_config(cls, config):
        return cls(SASRecConfig.from_config(config["config"]))


class SASRecServing(tf.Module):
    """Serving module: a history of item ids of any length -> the top-k next items (padding id never returned).

    `serve(history)` takes int32 `[B, any length]`, each row a user's item ids in time
    order (most recent last), 0 = padding anywhere, and returns `{"items": [B, k] int32,
    "scores": [B, k] float32, "known_ids": [B] int32}`. Inside, padding and unknown ids are
    dropped, the last `max_len` remaining ids are kept and left-padded to `max_len` (the
    training layout), so a shorter or longer history needs no preparation.

    With `item_ids` (the run's item-id map: a DP vocabulary or a public catalogue), requests and
    answers are in the data's own item ids, looked up in the map inside.

    Unknown ids (the documented fallback): an id outside 1..num_items, or not in `item_ids` (an item
    the model was not trained with, a negative id) is dropped like padding; `known_ids` counts the known ids of
    the request. A history with no known id (`known_ids` 0) is the empty history: every item's score is
    its fixed log-frequency prior (`popularity_prior`) or 0, so the answer is the same for
    every such request (the most frequent items by the run's frequencies, or items 1..k).

    It only references the trained model's variables (for `export_saved_model`).
    """

    def __init__(self, model: SASRec, *, k: int = 10, item_ids: ItemIdMap | None = None):
        super().__init__(name="sasrec_serving")
        num_items = model.config.num_items
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= num_items:
            raise ValueError(f"`k` must be an int in [1, {num_items}]; received {k!r}.")
        if item_ids is not None and (item_ids.num_items != num_items or item_ids.ids[-1] > np.iinfo(np.int32).max):
            raise ValueError(
                f"`item_ids` must map {num_items} int32 item ids (the model's items); received {item_ids.num_items} "
                f"ids up to {item_ids.ids[-1]}."
            )
        self.model = model
        self.k = k
        self.id_table, self.original_ids = None, None
        if item_ids is not None:  # requests and answers in the data's own ids; the map is a (DP or public) release
            original = tf.constant(item_ids.ids, tf.int64)
            self.id_table = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(original, tf.range(1, num_items + 1, dtype=tf.int64)),
                default_value=0,
            )
            self.original_ids = tf.constant(np.concatenate([[0], item_ids.ids]).astype(np.int32))
        self.serve = tf.function(self._serve, input_signature=[tf.TensorSpec([None, None], tf.int32, name="history")])

    def _serve(self, history):
        if self.id_table is not None:
            history = tf.cast(self.id_table.lookup(tf.cast(history, tf.int64)), tf.int32)
        known, padded = fit_history(history, num_items=self.model.config.num_items, max_len=self.model.config.max_len)
        scores = self.model.scores(padded, training=False)
        scores = tf.concat([tf.fill([tf.shape(scores)[0], 1], tf.constant(-np.inf, scores.dtype)), scores[:, 1:]], 1)
        top = tf.math.top_k(scores, k=self.k)
        items = tf.cast(top.indices, tf.int32)
        if self.original_ids is not None:
            items = tf.gather(self.original_ids, items)
        return {"items": items, "scores": top.values, "known_ids": known}


def fit_history(history, *, num_items: int, max_len: int) -> tuple:
    """`(known_ids [B], ids [B, max_len])`: ids outside 1..num_items dropped, the last max_len kept, left-padded.

    Example: num_items 9, max_len 3: [[4, 0, 12, 5, 6, 7]] -> known 4, [[5, 6, 7]];  [[0, 8]] -> 1, [[0, 0, 8]].
    """
    history = tf.convert_to_tensor(history, tf.int32)
    kept = tf.logical_and(history >= 1, history <= num_items)
    newest_first = tf.reverse(history, axis=[1])
    recent = tf.ragged.boolean_mask(newest_first, tf.reverse(kept, axis=[1]))[:, :max_len]
    padded = tf.reverse(recent.to_tensor(default_value=0, shape=[None, max_len]), axis=[1])
    return tf.reduce_sum(tf.cast(kept, tf.int32), axis=1), padded


__all__ = ["SASRec", "SASRecConfig", "SASRecServing", "fit_history"]
