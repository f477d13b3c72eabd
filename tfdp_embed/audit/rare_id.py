"""One-run privacy audit of a DP training run with rare-id embedding canaries, for either Keras front end.

`run_audit` trains a model of the caller's architecture once, on the real
examples plus m canary examples each put in independently with probability
1/2, and returns the tightest one-run epsilon lower bound of Steinke, Nasr &
Jagielski's and the f-DP analyses (`tfdp_embed.audit.fdp_one_run.audit_lower_bound`,
the method named in `bound.method`). It never returns the trained model:
canaries reach no released model; train the model you release in a separate run.

Canary i is an example whose ids all point at row `first_canary_id + i` of
one `DPEmbedding` table, a row no real example touches (the table is sized
with room: real ids < `first_canary_id`). Its gradient therefore lands on
that row alone (a Dirac canary in the embedding's parameter space), and the
row moves only through the canary's own gradient plus the mechanism's noise.
The score is read from the released weights alone (`DPModel.get_weights`,
which flushes LazyDP's owed noise first) and the row's initial value:

    score_i = loss(released model with row i reset to its initial value, canary i)
              - loss(released model, canary i)

how much the row's movement lowered the canary's loss. Which canaries go in
is drawn by the auditor's generator (`audit_seed`), never by the training or
batching seeds.

Everything here is Keras-free; a front end passes its `DPModel` class and
its per-example loss as `FrontEndParts` (`tfdp_embed.keras2.audit_canaries`,
`tfdp_embed.keras3.audit_canaries`: `audit_run` on a tf-keras or a Keras 3 model).

References: Steinke, Nasr & Jagielski, "Privacy Auditing with One (1) Training
Run", NeurIPS 2023, §3 (Algorithm 1) and the white-box experiments with
gradient (Dirac) canaries; Mahloujifar, Melis & Chaudhuri, "Auditing f-Differential
Privacy in One Run", ICML 2025, §4.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from tfdp_embed import data
from tfdp_embed._checks import check_int
from tfdp_embed.audit.fdp_one_run import AuditBound, audit_lower_bound
from tfdp_embed.clipping.taps import submodules
from tfdp_embed.layers.lookup import EmbeddingLookup

_INCLUSION_TAG = 0xA0D17  # the auditor's stream: independent of every training seed


@dataclasses.dataclass(frozen=True)
class FrontEndParts:
    """What an audit run takes from a Keras front end.

    Attributes:
      dp_model: the front end's `DPModel` class (`DPModel(model, plan=, expected_batch_size=)`).
      per_example_loss: `(model, loss, features, labels) -> float64 [m]`, the model's loss per example.
    """

    dp_model: type
    per_example_loss: Callable


@dataclasses.dataclass(frozen=True)
class CanaryAudit:
    """What an audit run measured.

    Attributes:
      bound: the tightest one-run epsilon lower bound, its method and the guesses behind it.
      claimed_epsilon: the plan's target epsilon (None when its noise was given, not calibrated).
      delta: the delta of the bound (the plan's target delta unless given).
      mechanism_name: the plan's mechanism.
      scores: [m] canary scores (loss lowered by the canary's own row).
      included: [m] which canaries were trained on.
    """

    bound: AuditBound
    claimed_epsilon: float | None
    delta: float
    mechanism_name: str
    scores: np.ndarray
    included: np.ndarray

    def as_dict(self) -> dict:
        """JSON-able summary (the per-canary arrays left out)."""
        return {
            **self.bound.as_dict(),
            "claimed_epsilon": self.claimed_epsilon,
            "mechanism": self.mechanism_name,
            "num_included": int(self.included.sum()),
        }


def draw_inclusion(num_canaries: int, *, audit_seed: int) -> np.ndarray:
    """[m] booleans, each True with probability 1/2, from the auditor's own generator."""
    if isinstance(audit_seed, bool) or not isinstance(audit_seed, (int, np.integer)):
        raise TypeError(f"`audit_seed` must be an int (an audit is reproducible); received {audit_seed!r}.")
    rng = np.random.default_rng(np.random.SeedSequence([int(audit_seed), _INCLUSION_TAG]))
    return rng.random(check_int("num_canaries", num_canaries)) < 0.5


def id_canaries(model, row_ids: np.ndarray, *, label: float = 1.0, label_shape: tuple = (1,)) -> tuple:
    """Canaries for a model with one integer input of shape [width]: every slot holds the canary's row id.

    Returns:
      (features int32 [m, width], labels float32 [m, *label_shape] all equal to `label`).
    """
    inputs = list(getattr(model, "inputs", None) or [])
    if len(inputs) != 1 or len(inputs[0].shape) != 2:
        raise ValueError(
            "the default canaries need a functional model with one input of shape [batch, width]; pass "
            "`canary_examples(row_ids) -> (features, labels)` for other models."
        )
    width = int(inputs[0].shape[1])
    features = np.repeat(np.asarray(row_ids, np.int32)[:, None], width, axis=1)
    return features, np.full((len(row_ids), *label_shape), label, np.float32)


def canary_table(model, table: str | None) -> EmbeddingLookup:
    """The canaries' `DPEmbedding`: the one named `table`, or the model's only one."""
    if table is not None:
        layer = model.get_layer(table)
        if not isinstance(layer, EmbeddingLookup):
            raise ValueError(f"`table`={table!r} names a {type(layer).__name__}, not a DPEmbedding.")
        return layer
    tables = [layer for layer in submodules(model) if isinstance(layer, EmbeddingLookup)]
    if len(tables) != 1:
        raise ValueError(f"the model has {len(tables)} DPEmbedding tables; name the canaries' one with `table`.")
    return tables[0]


def _check_rows(layer: EmbeddingLookup, first_canary_id: int, num_canaries: int, real_ids) -> None:
    if layer.hash_ids:
        raise ValueError(
            "the canaries' table hashes ids: canary rows could collide with real rows; use hash_ids=False."
        )
    if layer.vocabulary_size < first_canary_id + num_canaries:
        raise ValueError(
            f"table {layer.name!r} has {layer.vocabulary_size} rows; the canaries need rows {first_canary_id} to "
            f"{first_canary_id + num_canaries - 1}: size it vocabulary + num_canaries."
        )
    if real_ids is not None and real_ids.size and real_ids.max() >= first_canary_id:
        raise ValueError(
            f"a real example holds id {int(real_ids.max())} >= `first_canary_id`={first_canary_id}: canary rows "
            "must be rows no real example touches."
        )


def _canaries(model, table, first_canary_id, num_canaries, examples, canary_examples) -> tuple:
    """(row ids [m], the canaries `(features, labels)`, the rows' initial values [m, dim]), after the checks."""
    first = check_int("first_canary_id", first_canary_id, minimum=0)
    layer = canary_table(model, table)
    # The default canaries' input is the table's ids: the real ones are checked to stay below the canary rows.
    # With `canary_examples` the caller sees to it (other inputs may feed other tables).
    real_ids = None if canary_examples else np.asarray(examples[0])
    _check_rows(layer, first, num_canaries, real_ids)
    row_ids = np.arange(first, first + num_canaries)
    if canary_examples:
        canaries = canary_examples(row_ids)
    else:
        canaries = id_canaries(model, row_ids, label_shape=np.shape(examples[1])[1:])
    return row_ids, canaries, np.asarray(layer.embeddings.numpy())[row_ids]


def with_canaries(examples: tuple, canaries: tuple, included: np.ndarray) -> tuple:
    """The real examples followed by the canaries that go in (same nesting: arrays or dicts of arrays)."""
    chosen = tf.nest.map_structure(lambda c: np.asarray(c)[included], canaries)
    return tf.nest.map_structure(lambda r, c: np.concatenate([np.asarray(r), c]), tuple(examples), chosen)


def _weight_index(model, layer: EmbeddingLookup) -> int:
    """Where the table's variable sits in `model.weights` (Keras 3 wraps the `tf.Variable` in a `keras.Variable`)."""
    table = layer.embeddings
    for index, weight in enumerate(model.weights):
        if weight is table or getattr(weight, "value", None) is table:
            return index
    raise ValueError(f"the canaries' table {layer.name!r} is not among the model's weights.")


def score_canaries(parts: FrontEndParts, build_model, table, released, initial_rows, row_ids, loss, canaries):
    """[m] loss(row reset to its initial value) - loss(released), on a fresh copy of the architecture."""
    model = build_model()
    if [tuple(w.shape) for w in model.weights] != [np.shape(w) for w in released]:
        raise ValueError("`build_model` returned an architecture whose weights differ from the trained model's.")
    index = _weight_index(model, canary_table(model, table))
    model.set_weights(released)
    trained = parts.per_example_loss(model, loss, *canaries)
    reset = list(released)
    reset[index] = np.array(released[index], copy=True)
    reset[index][row_ids] = initial_rows
    model.set_weights(reset)
    return parts.per_example_loss(model, loss, *canaries) - trained


def _train(parts: FrontEndParts, model, plan, examples, optimizer, loss, batch_seed, expected_size: float) -> list:
    """Trains `model` on `examples` with Poisson batches at the plan's q for the plan's T steps; the flushed weights.

    The noised sum is divided by q * `expected_size`, a constant fixed before the coin flips (the
    real examples plus m / 2), so the divisor does not depend on which canaries went in.
    """
    q = plan.sampling_probability
    batches, _ = data.poisson_batches(examples, sampling_probability=q, seed=batch_seed)
    expected = q * expected_size if plan.mechanism.clips_per_example else None
    dp = parts.dp_model(model, plan=plan, expected_batch_size=expected)
    dp.compile(optimizer=optimizer, loss=loss)
    dp.fit(batches.repeat().take(plan.steps), epochs=1, verbose=0)
    return dp.get_weights()  # the release path: LazyDP's owed noise is added first


def run_audit(
    parts: FrontEndParts,
    build_model: Callable,
    examples: tuple,
    *,
    plan,
    first_canary_id: int,
    num_canaries: int,
    audit_seed: int,
    optimizer_fn: Callable,
    loss,
    table: str | None = None,
    canary_examples: Callable[[np.ndarray], tuple] | None = None,
    delta: float | None = None,
    confidence: float = 0.95,
    batch_seed: int | None = None,
) -> CanaryAudit:
    """Trains once with canaries (each in with probability 1/2) and returns the one-run epsilon lower bound.

    Args:
      parts: the front end's `DPModel` and per-example loss (its `audit_run` passes them).
      build_model: returns a fresh, built model of the architecture to audit (called twice: to train, to score).
      examples: the real training examples, `(features, labels)` arrays with one leading row per example.
      plan: a `plan_run` RunPlan made with `sampling_probability` and `steps` (its mechanism serves this run only).
      first_canary_id: the canaries' rows are first_canary_id .. first_canary_id + m - 1 of the table.
      num_canaries: m (hundreds or more for a useful bound).
      audit_seed: seeds which canaries go in (the auditor's generator).
      optimizer_fn: returns the optimizer (the front end's SGD for LazyDP).
      loss: the `compile` loss.
      table: name of the canaries' `DPEmbedding`; None: the model's only one.
      canary_examples: `row_ids [m] -> (features, labels)` with leading dim m, touching only those rows of the
        table (and keeping real examples off them is then the caller's part); default `id_canaries` with label 1.
      delta: delta of the bound; default the plan's target delta.
      confidence: the bound holds with this probability.
      batch_seed: the Poisson batches' seed (None: OS entropy).

    Returns:
      A `CanaryAudit`.

    Raises:
      ValueError: a plan that fixes N (`batching=`), a table too small or hashing ids, real ids reaching the
        canary rows, or what `audit_lower_bound` refuses.
    """
    if plan.dataset_size is not None:
        raise ValueError(
            "plan the audit run with `sampling_probability` and `steps`, not `batching=`/`dataset_size`: "
            "its N is the real examples plus the canaries that go in."
        )
    m = check_int("num_canaries", num_canaries)
    included = draw_inclusion(m, audit_seed=audit_seed)
    model = build_model()
    row_ids, canaries, initial_rows = _canaries(model, table, first_canary_id, m, examples, canary_examples)
    combined = with_canaries(examples, canaries, included)
    num_real = int(np.shape(tf.nest.flatten(examples[1])[0])[0])
    released = _train(parts, model, plan, combined, optimizer_fn(), loss, batch_seed, num_real + m / 2)
    scores = score_canaries(parts, build_model, table, released, initial_rows, row_ids, loss, canaries)
    delta = plan.target_delta if delta is None else delta
    bound = audit_lower_bound(scores, included, delta=delta, confidence=confidence)
    return CanaryAudit(bound, plan.target_epsilon, float(delta), plan.mechanism_name, scores, included)


__all__ = [
    "CanaryAudit",
    "FrontEndParts",
    "canary_table",
    "draw_inclusion",
    "id_canaries",
    "run_audit",
    "score_canaries",
    "with_canaries",
]
