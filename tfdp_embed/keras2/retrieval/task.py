"""`Retrieval`: the DP-safe drop-in for `tfrs.tasks.Retrieval`, with a full or a sampled softmax.

`tfrs.tasks.Retrieval` scores each query against the other examples'
items of the batch (in-batch negatives): example i's loss depends on the
examples j != i, so clipping example i's gradient does not bound its
influence (example j also moves through everyone else's loss), and
`DPModel` refuses it. This task scores each query against candidates that
do not depend on the data:

* `FullSoftmax()`: every item of the catalogue;
* `SampledSoftmax(K, ...)`: one sample of K items per step from a fixed
  proposal Q (uniform, public or DP-released), shared by the batch, drawn
  from a seed and the step number only; with the log-Q correction, and the
  example's own positive always included as the label.

Why this keeps the per-example contract: the candidate matrix C is the
candidate tower applied to the catalogue, or to a sample drawn
independently of the data, so loss_i is a function of example i (its
query and positive), the weights and that data-independent C only.
Removing example j leaves every other loss unchanged, and clipping g_i
bounds example i's influence on the update. (In-batch negatives would put
example j's item into C, i.e. into everyone's loss.) C is computed once
per step and every example's gradient flows through it; the candidate
tower runs in a `tfdp_embed.clipping.shared_computation`, which gives
exact per-example norms for every tower parameter (see
`tfdp_embed.clipping.shared`). A tower that ends in a fixed linear
map of each candidate (tables, concatenation, Dense without activation)
gets them in factored form, O(B (K + d)) work per layer
(`tfdp_embed.clipping.shared_factored`); any other tower costs
O(B K d) memory for the per-example cotangents of C through each layer
(K = catalogue size for the full softmax): use the sampled softmax there.

Differences from `tfrs.tasks.Retrieval`: the task owns the candidate tower
and the catalogue; `candidate_ids` (the positive's identifier) is
required; the call returns one loss per example (`[B]`, what `DPModel`
needs) rather than their sum; top-k metrics (recall@k, precision@k over
the full catalogue, `tfdp_embed.keras2.retrieval.top_k`) are computed when
`compute_metrics` is true, by default in evaluation only. The metrics are
operator-only, not differentially private, and never saved with the model.

Example:
    >>> task = Retrieval(candidate_tower=item_model,
    ...                  candidates={"movie_id": ids, "genres": genres}, identifiers=ids,
    ...                  negatives=SampledSoftmax(256), ks=(10, 50))
    >>> class Model(tfrs.Model):
    ...     def compute_loss(self, features, training=False):
    ...         q = self.query_model(features["user_id"])
    ...         return self.task(q, candidate_ids=features["movie_id"], training=training)

References: TFRS `tasks/retrieval.py`; Jean et al., ACL 2015 (sampled
softmax); Yi et al., RecSys 2019 (log-Q correction); Abadi et al. 2016 §3.1
(per-example clipping and sensitivity).
"""

from __future__ import annotations

import contextlib
import typing
from collections.abc import Sequence

import numpy as np
import tensorflow_recommenders as tfrs

from tfdp_embed.clipping.shared import shared_computation
from tfdp_embed.clipping.taps import untapped
from tfdp_embed.keras2._keras import keras, tf
from tfdp_embed.keras2.retrieval.catalogue import Catalogue
from tfdp_embed.keras2.retrieval.negatives import FullSoftmax, SampledSoftmax
from tfdp_embed.keras2.retrieval.top_k import TopKMetrics, check_ks


def _default_ks(num_items: int) -> tuple:
    return tuple(k for k in (1, 5, 10, 50, 100) if k <= num_items)


MIN_LOGIT = float(np.finfo(np.float32).min / 100.0)  # a masked logit (TFRS' MIN_FLOAT)


class _TrainingOnly:
    """State kept out of Keras/TF tracking: no checkpoint, weights file or SavedModel holds it."""

    def __init__(self, catalogue: Catalogue, metrics: TopKMetrics):
        self.catalogue = catalogue
        self.top_k = metrics
        # Under MirroredStrategy each replica advances its own copy once per step, with no collective
        # (replicas stay equal and draw the same sample); read across replicas: the first one's.
        self.step = tf.Variable(
            0,
            dtype=tf.int64,
            trainable=False,
            name="negative_sample_step",
            synchronization=tf.VariableSynchronization.ON_READ,
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )
        self.frozen = 0


class Retrieval(keras.layers.Layer, tfrs.tasks.Task):
    """Retrieval loss with data-independent negatives; one loss per example.

    Args:
      candidate_tower: a Keras layer or model mapping catalogue features to
        candidate embeddings `[n, d]` (e.g. a `DPEmbedding` subclass followed
        by Dense layers). Its weights are tracked by this task.
      candidates: every item's features (`Catalogue` input: a tensor or a dict
        of tensors / ragged tensors with leading axis N).
      identifiers: optional `[N]` ids of the items (ints or strings); then
        `candidate_ids` are these ids, else catalogue rows in [0, N).
      negatives: `FullSoftmax()` (default) or `SampledSoftmax(...)` (keyword-only).
      temperature: optional softmax temperature T (scores are divided by it).
      ks: cut-offs of the top-k metrics (each <= N); default those of
        (1, 5, 10, 50, 100) that are <= N.
      name: layer name.

    Raises:
      ValueError: bad catalogue, `ks`, `temperature` or proposal size.
    """

    def __init__(
        self,
        candidate_tower: keras.layers.Layer,
        candidates,
        *,
        identifiers=None,
        negatives: FullSoftmax | SampledSoftmax | None = None,
        temperature: float | None = None,
        ks: Sequence[int] | None = None,
        name: str = "retrieval",
    ):
        super().__init__(name=name, autocast=False)  # scores in the towers' dtype
        if not callable(candidate_tower):
            raise TypeError(f"`candidate_tower` must be a Keras layer or model; received {candidate_tower!r}.")
        negatives = FullSoftmax() if negatives is None else negatives
        if not isinstance(negatives, (FullSoftmax, SampledSoftmax)):
            raise TypeError(f"`negatives` must be FullSoftmax() or SampledSoftmax(...); received {negatives!r}.")
        if temperature is not None and not (isinstance(temperature, (int, float)) and temperature > 0):
            raise ValueError(f"`temperature` must be a number > 0 or None; received {temperature!r}.")
        catalogue = Catalogue(candidates, identifiers=identifiers)
        if isinstance(negatives, SampledSoftmax):
            negatives.check_catalogue(catalogue.size)
        ks = check_ks(ks, catalogue.size) if ks is not None else _default_ks(catalogue.size)
        self.candidate_tower = candidate_tower
        self.negatives = negatives
        self.temperature = None if temperature is None else float(temperature)
        self._training_only = _TrainingOnly(catalogue, TopKMetrics(ks))
        self._metrics.extend(self._training_only.top_k.metrics)  # reported by Keras, never saved

    @property
    def catalogue(self) -> Catalogue:
        return self._training_only.catalogue

    # -- the loss ----------------------------------------------------------------
    def call(
        self,
        query_embeddings,
        candidate_embeddings=None,
        sample_weight=None,
        candidate_ids=None,
        compute_metrics: bool | None = None,
        training: bool | None = None,
    ) -> tf.Tensor:
        """Per-example retrieval losses, float32 `[B]`.

        Args:
          query_embeddings: float `[B, d]`.
          candidate_embeddings: optional `[B, d]`, each query's positive as the
            user's candidate tower computed it (TFRS style); None: the task
            takes it from the catalogue (full softmax) or runs the tower on the
            positive's features (sampled softmax).
          sample_weight: optional `[B]` weights (multiply the losses).
          candidate_ids: required, `[B]` the positive's identifier (or row).
          compute_metrics: update the top-k metrics; default: when not training.
            Under a `tf.distribute` strategy they are updated in replica
            context only (the steps of `fit` and `evaluate`).
          training: Keras' training flag.

        Raises:
          ValueError: `candidate_ids` missing or shapes that do not match.
        """
        if candidate_ids is None:
            raise ValueError(
                "Retrieval needs `candidate_ids`, the catalogue id of each query's positive: the "
                "negatives are catalogue items (not the batch's), so the positive must be found among them."
            )
        queries = tf.convert_to_tensor(query_embeddings)
        if queries.shape.rank != 2:
            raise ValueError(f"`query_embeddings` must be [batch, dim]; received shape {queries.shape}.")
        positives = self.catalogue.indices(candidate_ids)
        if self.negatives.full:
            logits, labels = self._full_softmax(queries, positives, candidate_embeddings, training)
        else:
            logits, labels = self._sampled_softmax(queries, positives, candidate_embeddings, training)
        loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        if sample_weight is not None:
            loss = loss * tf.cast(tf.reshape(sample_weight, [-1]), loss.dtype)
        if compute_metrics is None:
            compute_metrics = not training
        if compute_metrics and self._training_only.top_k.updatable():  # replica context under a strategy
            with tf.control_dependencies([self._update_metrics(queries, positives, sample_weight, training)]):
                loss = tf.identity(loss)
        return loss

    def _scale(self, scores):
        return scores if self.temperature is None else scores / self.temperature

    def _tower(self, features, training):
        return tf.convert_to_tensor(self.candidate_tower(features, training=training))

    def _scored(self, queries, features, training):
        """Scores `[B, n]` of every query against the tower's embeddings of `features` (a shared computation)."""
        with shared_computation() as shared:
            candidates = shared.output(self._tower(features, training))
        queries = tf.cast(queries, candidates.dtype)
        return shared.scored_by(queries, tf.matmul(queries, candidates, transpose_b=True))

    def _positive_scores(self, queries, positives, candidate_embeddings, training):
        if candidate_embeddings is None:
            candidate_embeddings = self._tower(self.catalogue.gather(positives), training)
        candidate_embeddings = tf.convert_to_tensor(candidate_embeddings)
        if candidate_embeddings.shape.rank != 2:
            raise ValueError(
                f"`candidate_embeddings` must be [batch, dim]; received shape {candidate_embeddings.shape}."
            )
        return self._scale(tf.reduce_sum(queries * tf.cast(candidate_embeddings, queries.dtype), axis=1))

    def _full_softmax(self, queries, positives, candidate_embeddings, training):
        """Logits over every item; with given positives, [positive, every other item]."""
        scores = self._scale(self._scored(queries, self.catalogue.features, training))
        if candidate_embeddings is None:
            return scores, positives
        positive = self._positive_scores(queries, positives, candidate_embeddings, training)
        hit = tf.one_hot(positives, self.catalogue.size, on_value=True, off_value=False)
        others = tf.where(hit, tf.cast(MIN_LOGIT, scores.dtype), scores)
        return tf.concat([positive[:, None], others], axis=1), tf.zeros_like(positives)

    def _sampled_softmax(self, queries, positives, candidate_embeddings, training):
        """Logits [positive, K shared samples] with log-Q correction and accidental hits masked."""
        negatives = self.negatives
        sample = self._sample(training)
        scores = self._scale(self._scored(queries, self.catalogue.gather(sample), training))
        positive = self._positive_scores(queries, positives, candidate_embeddings, training)
        if negatives.log_q_correction:
            size = self.catalogue.size
            scores = scores - tf.cast(negatives.log_expected_counts(sample, size), scores.dtype)[None, :]
            positive = positive - tf.cast(negatives.log_expected_counts(positives, size), positive.dtype)
        if negatives.remove_accidental_hits:
            hit = tf.equal(sample[None, :], positives[:, None])
            scores = tf.where(hit, tf.cast(MIN_LOGIT, scores.dtype), scores)
        return tf.concat([positive[:, None], scores], axis=1), tf.zeros_like(positives)

    def _sample(self, training) -> tf.Tensor:
        """This step's shared negatives: a function of the seed and the step counter only."""
        state = self._training_only
        step = tf.identity(state.step)
        sample = typing.cast(SampledSoftmax, self.negatives).sample(step, self.catalogue.size)
        if training and not state.frozen:  # the next training step draws the next sample
            with tf.control_dependencies([sample]):
                advance = state.step.assign_add(1)
            with tf.control_dependencies([advance]):
                sample = tf.identity(sample)
        return sample

    # -- metrics -----------------------------------------------------------------
    def candidate_embeddings(self, training: bool = False) -> tf.Tensor:
        """The whole catalogue's embeddings `[N, d]` (for metrics and serving)."""
        return self._tower(self.catalogue.features, training)

    def _update_metrics(self, queries, positives, sample_weight, training) -> tf.Operation:
        with untapped():  # operator-only: outside every per-example norm and gradient
            candidates = tf.stop_gradient(self.candidate_embeddings(training=False))
        return self._training_only.top_k.update(tf.stop_gradient(queries), candidates, positives, sample_weight)

    # -- checks ------------------------------------------------------------------
    @contextlib.contextmanager
    def frozen_randomness(self):
        """Inside the block the negative sample does not advance (the contract checks re-run steps)."""
        self._training_only.frozen += 1
        try:
            yield
        finally:
            self._training_only.frozen -= 1


__all__ = ["Retrieval"]
