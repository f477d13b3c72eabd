"""Serving any retrieval model: the user's query model and candidates in, a top-k SavedModel out.

`TopKServing` wraps a query model of the user's (any Keras layer or model:
a `tfrs.Model`'s user tower, a functional model, a `Sequential`) and the
candidates it retrieves from, in a TFRS brute-force index
(`tfrs.layers.factorized_top_k.BruteForce`). The candidates are either

* a `tfdp_embed.keras2.retrieval.Retrieval` task: its candidate tower is run over
  its whole catalogue and the catalogue's identifiers are returned; or
* a float `[N, d]` matrix of candidate embeddings, with optional
  `identifiers` `[N]` (ints or strings; default the rows 0..N-1).

Its `serve` signature takes the query model's inputs (a `tf.TensorSpec`, or
a dict of them, one named input per key) and returns
`{"item_ids": [batch, k], "scores": float [batch, k]}`, highest score first.

`export_top_k` is the release path: it flushes the DP mechanism first
(LazyDP's owed noise reaches every row before the candidates are
computed), builds the module from the released weights, and saves it with
`tfdp_embed.keras2.export.export_saved_model` (privacy report beside it):

    >>> export_top_k(dp, "out/top_k", query_model=model.user_model, candidates=model.task,
    ...              input_signature={"user_id": tf.TensorSpec([None], tf.int32)}, k=10)
    >>> serve = tf.saved_model.load("out/top_k").signatures["serving_default"]
    >>> serve(user_id=tf.constant([3], tf.int32))["item_ids"]

References: TFRS `layers/factorized_top_k.py` (BruteForce); LazyDP §3
(only the final, flushed model is released).
"""

from __future__ import annotations

from collections.abc import Mapping

import tensorflow_recommenders as tfrs

from tfdp_embed.keras2._keras import tf
from tfdp_embed.keras2.export import export_saved_model, release_ready
from tfdp_embed.keras2.layers.embedding import DPEmbedding, read_hooks_removed
from tfdp_embed.keras2.retrieval.task import Retrieval


def _candidates_and_ids(candidates, identifiers):
    """(embeddings [N, d], ids [N]) from a Retrieval task or an embedding matrix."""
    if isinstance(candidates, Retrieval):
        if identifiers is not None:
            raise ValueError("`identifiers` come from the Retrieval task's catalogue; do not pass them too.")
        catalogue = candidates.catalogue
        embeddings = candidates.candidate_embeddings(training=False)
        return embeddings, catalogue.ids_of(tf.range(catalogue.size))
    try:
        embeddings = tf.convert_to_tensor(candidates)
    except (TypeError, ValueError):
        embeddings = None
    if embeddings is None or embeddings.shape.rank != 2 or not embeddings.dtype.is_floating:
        received = type(candidates).__name__ if embeddings is None else f"{embeddings.dtype.name} {embeddings.shape}"
        raise ValueError(
            "`candidates` must be a tfdp_embed.keras2.retrieval.Retrieval task or a float [num_items, dim] matrix "
            f"of candidate embeddings; received {received}."
        )
    size = int(embeddings.shape[0])
    if identifiers is None:
        return embeddings, tf.range(size, dtype=tf.int64)
    ids = tf.convert_to_tensor(identifiers)
    if ids.shape != (size,):
        raise ValueError(f"`identifiers` needs one id per candidate, shape ({size},); received {ids.shape}.")
    return embeddings, ids


def _input_signature(query_model, input_signature) -> tuple:
    """(flat named specs, structure) of the serving inputs."""
    if input_signature is None:
        inputs = getattr(query_model, "inputs", None)
        if not inputs:
            raise ValueError(
                "`input_signature` is needed: the query model does not declare its inputs (a subclassed "
                "model or a layer). Pass a tf.TensorSpec, or a dict of them, matching what the query model "
                'takes, e.g. {"user_id": tf.TensorSpec([None], tf.int32)}.'
            )
        specs = [tf.TensorSpec(t.shape, t.dtype, name=t.name.split(":")[0]) for t in inputs]
        input_signature = specs[0] if len(specs) == 1 else {spec.name: spec for spec in specs}
    if isinstance(input_signature, tf.TensorSpec):
        return [tf.TensorSpec(input_signature.shape, input_signature.dtype, name=input_signature.name or "query")], None
    if isinstance(input_signature, Mapping) and all(isinstance(s, tf.TensorSpec) for s in input_signature.values()):
        keys = sorted(input_signature)
        return [tf.TensorSpec(input_signature[k].shape, input_signature[k].dtype, name=k) for k in keys], tuple(keys)
    raise TypeError(
        f"`input_signature` must be a tf.TensorSpec or a dict of them; received {type(input_signature).__name__}."
    )


class TopKServing(tf.Module):
    """A SavedModel-ready module: the query model's inputs -> top-k candidate ids and scores.

    Args:
      query_model: the trained query tower (any Keras layer or model), flushed.
      candidates: a `Retrieval` task, or float `[N, d]` candidate embeddings.
      identifiers: optional `[N]` ids of the embedding rows (not with a task).
      k: results per query (1..N).
      input_signature: the query model's input, a `tf.TensorSpec` or a dict of
        them; optional for models that declare `inputs` (functional models).

    Raises:
      TypeError / ValueError: an argument of the wrong kind or shape (the message names it).
    """

    def __init__(self, query_model, candidates, *, identifiers=None, k: int = 10, input_signature=None):
        super().__init__(name="top_k_serving")
        if not callable(query_model):
            raise TypeError(f"`query_model` must be a Keras layer or model; received {type(query_model).__name__}.")
        embeddings, ids = _candidates_and_ids(candidates, identifiers)
        size = int(embeddings.shape[0])
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= size:
            raise ValueError(f"`k` must be an int in [1, {size}] (the number of candidates); received {k!r}.")
        specs, self._keys = _input_signature(query_model, input_signature)
        self.k = k
        self.query_model = query_model
        self.index = tfrs.layers.factorized_top_k.BruteForce(k=k, name="candidate_index")
        self.index.index(tf.identity(embeddings), ids)
        self.serve = tf.function(self._serve, input_signature=specs)

    def _serve(self, *inputs):
        features = inputs[0] if self._keys is None else dict(zip(self._keys, inputs))
        queries = tf.convert_to_tensor(self.query_model(features, training=False))
        scores, ids = self.index(queries)
        return {"item_ids": ids, "scores": scores}


def export_top_k(
    dp_model,
    path: str,
    *,
    query_model,
    candidates,
    identifiers=None,
    k: int = 10,
    input_signature=None,
    report: Mapping | None = None,
) -> str:
    """Flushes `dp_model`, builds a `TopKServing` from its released weights and saves it as a SavedModel.

    Args:
      dp_model: the trained `DPModel` whose inner model holds `query_model`
        and the candidate tower (or produced the candidate embeddings).
      path: output directory.
      query_model, candidates, identifiers, k, input_signature: as `TopKServing`.
      report: the privacy report, written beside the model.

    Returns:
      `path`; load it with `tf.saved_model.load(path).signatures["serving_default"]`.

    Raises:
      PrivacyContractError: the mechanism still owes noise after flushing.
    """
    release_ready(dp_model)  # before the candidates are computed from the tables
    tables = [m for m in [dp_model.inner, *dp_model.inner.submodules] if isinstance(m, DPEmbedding)]
    with read_hooks_removed(tables):
        module = TopKServing(query_model, candidates, identifiers=identifiers, k=k, input_signature=input_signature)
    return export_saved_model(
        dp_model, path, serving_module=module, signatures={"serving_default": module.serve}, report=report
    )


__all__ = ["TopKServing", "export_top_k"]
