"""Per-example clipping through a shared computation: a candidate tower run once per step over the catalogue.

A retrieval loss scores each query q_i against a candidate matrix C
`[K, d]` that a candidate (item) tower computes from inputs that do not
depend on the batch: the whole catalogue, or a sample of it drawn
independently of the data. C is computed once per step, yet every
example's loss depends on it, so example i's gradient with respect to a
parameter theta of the tower flows through C:

    g_i(theta) = J_theta(C)^T V_i,    V_i = d loss_i / d C,    V_i[k] = G_ik q_i

where G_i = d loss_i / d s_i are the gradients of example i's loss with
respect to its scores s_ik = q_i . C_k. The layers of the tower are
recorded by `record_taps` as usual; inside `shared_computation()` their
calls are marked shared (`LayerCall.shared`): they have no batch axis.
`per_example_output_grads` back-propagates every V_i through the tower
(one vectorised backward pass over the batch, `tf.vectorized_map`) to the
output of each shared call, giving that call's per-example output
gradients `[B, *output.shape]`. The layers' clipping rules then treat a
shared call as a per-example call whose input is the same for every
example, so a layer used both per example (the positive item's
embedding) and in the shared tower gets one exact norm of the *sum* of
both uses. The work is O(B K width) per tower layer: a per-example
`[batch, vocabulary, dim]` gradient is never built. When the tower is a
fixed linear map of each candidate's rows (tables, concatenation, Dense
without activation), `tfdp_embed.clipping.shared_factored` gives
the same per-example gradients factored, G_ik u_i, and this vectorised
pass is skipped.

What makes this private: the inputs of a shared computation must not
depend on the batch (a catalogue, a sample drawn from a fixed proposal).
Then loss_i depends on example i and on data-independent quantities only,
and clipping g_i bounds example i's influence as usual. A computation
over other examples' data (in-batch negatives) is not shared in this
sense: `DPModel`'s independence check refuses it.

Example:
    >>> with shared_computation() as shared:
    ...     candidates = shared.output(item_tower(catalogue_features))   # [K, d]
    >>> scores = shared.scored_by(queries, tf.matmul(queries, candidates, transpose_b=True))

References: Li et al. 2022 and Bu et al. 2022 (ghost norms, book-keeping);
Agarwal et al. 2019 (vectorised per-example gradients); Jean et al. 2015
and Bengio & Senecal 2008 (sampled softmax, the negatives it scores).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import tensorflow as tf

from tfdp_embed.clipping.taps import active_recording


class SharedComputation:
    """One shared computation of a recorded forward pass: its layer calls, output and scorers.

    Attributes:
      calls: the `LayerCall`s recorded inside it (every tapped layer of the tower).
      result: the tensor set with `output` (C, `[K, d]`), or None.
      scorers: `(queries [B, d], scores [B, K])` pairs set with `scored_by`.
      tape: the persistent tape that recorded the computation (None when inert).
    """

    def __init__(self, *, recording: bool):
        self.recording = recording
        self.calls: list = []
        self.result = None
        self.scorers: list = []
        self.tape = None

    def output(self, tensor: tf.Tensor) -> tf.Tensor:
        """Declares `tensor` `[K, d]` the computation's output (what the queries are scored against)."""
        tensor = tf.convert_to_tensor(tensor)
        if tensor.shape.rank != 2:
            raise ValueError(
                f"A shared computation's output must be a [num_candidates, dim] matrix; received shape {tensor.shape}."
            )
        if self.result is not None:
            raise ValueError("A shared computation has one output; `output` was called twice.")
        self.result = tensor
        return tensor

    def scored_by(self, queries: tf.Tensor, scores: tf.Tensor) -> tf.Tensor:
        """Declares `scores` = `queries @ output^T` (`[B, K]`); returns `scores` unchanged.

        The loss may transform `scores` further (temperature, log-Q correction,
        masks, a softmax); its gradient with respect to `scores` is what the
        per-example cotangents of the output are built from.

        Raises:
          ValueError: no `output` yet, or shapes that do not match.
        """
        if self.result is None:
            raise ValueError("Call `shared.output(candidates)` before `scored_by`.")
        if queries.shape.rank != 2 or scores.shape.rank != 2:
            raise ValueError(
                f"`queries` must be [batch, dim] and `scores` [batch, num_candidates]; received shapes "
                f"{queries.shape} and {scores.shape}."
            )
        if self.recording:
            self.scorers.append((queries, scores))
        return scores

    def per_example_output_grads(self, score_grads) -> list:
        """d loss_i / d output of every recorded call, `[B, *call.outputs.shape]`, one per call.

        Args:
          score_grads: d(sum_i loss_i)/d scores for each `scored_by` pair
            (row i holds example i's: a score row belongs to one example).

        Returns:
          One tensor per entry of `calls`, in order.

        Raises:
          ValueError: calls were recorded but no output or no scorer was declared.
        """
        if not self.calls:
            return []
        if self.result is None or not self.scorers:
            raise ValueError(
                "A shared computation ran layers with trainable weights but declared no "
                f"{'output' if self.result is None else 'scorer'}: call `shared.output(candidates)` "
                "and `shared.scored_by(queries, scores)`, so that per-example gradients through it can "
                "be computed."
            )
        dtype = self.result.dtype
        cotangents = None  # V [B, K, d]: V_i[k] = sum over scorers of G_ik q_i
        for (queries, _), grad in zip(self.scorers, score_grads):
            term = tf.cast(grad, dtype)[:, :, None] * tf.cast(queries, dtype)[:, None, :]
            cotangents = term if cotangents is None else cotangents + term
        sources = [call.outputs for call in self.calls]

        def back_propagate(v):
            return self.tape.gradient(
                self.result, sources, output_gradients=v, unconnected_gradients=tf.UnconnectedGradients.ZERO
            )

        if tf.executing_eagerly():  # the contract check runs eagerly, on a small batch
            rows = [back_propagate(cotangents[i]) for i in range(int(cotangents.shape[0]))]
            return [tf.stack(per_call) for per_call in zip(*rows)]
        return list(tf.vectorized_map(back_propagate, cotangents))


@contextlib.contextmanager
def shared_computation() -> Iterator[SharedComputation]:
    """Marks the layer calls inside the block as one shared (data-independent) computation.

    Outside a recorded training step (evaluation, serving, a plain call) it
    only returns an inert object whose `output` and `scored_by` pass their
    tensors through.

    Raises:
      ValueError: shared computations nested in one another.
    """
    recording = active_recording()
    if recording is None:
        yield SharedComputation(recording=False)
        return
    if recording.active_shared:
        raise ValueError("Shared computations cannot be nested.")
    shared = SharedComputation(recording=True)
    with tf.GradientTape(persistent=True) as tape:
        recording.active_shared.append(shared)
        try:
            yield shared
        finally:
            recording.active_shared.pop()
    shared.tape = tape
    recording.shared_computations.append(shared)


__all__ = ["SharedComputation", "shared_computation"]
