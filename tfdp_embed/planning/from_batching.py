"""q, T and N for `plan_run` read from the sampler's `BatchingInfo`, so they are stated once."""

from __future__ import annotations

import math

from tfdp_embed.data.provenance import BatchingInfo


def run_from_batching(batching, *, sampling_probability, steps, epochs, dataset_size, max_batch_size) -> tuple:
    """(q, T, N, cap, known N): from `batching` (a `BatchingInfo`) where given, else the explicit arguments.

    T is `steps`, or round(epochs / q) when only `epochs` is given. The cap is the sampler's when it truncated
    its batches (then each step is accounted as a truncated event); the known N goes to the plan's report.

    Raises:
      TypeError: `batching` is not a `BatchingInfo`.
      ValueError: `batching` and a different explicit q or N, or both or neither of `steps`/`epochs`.
    """
    known = dataset_size
    if batching is not None:
        if not isinstance(batching, BatchingInfo):
            raise TypeError(
                "`batching` must be the `BatchingInfo` a tfdp_embed.data sampler returned "
                f"(`batches, info = data.poisson_batches(...)`); received {type(batching).__name__}."
            )
        q, n = batching.sampling_probability, batching.num_examples
        if sampling_probability is not None and not math.isclose(sampling_probability, q, rel_tol=1e-9):
            raise ValueError(
                f"`sampling_probability`={sampling_probability!r} but `batching` was sampled with q={q!r}: "
                "pass one of them (q is read from `batching`)."
            )
        if dataset_size is not None and dataset_size != n:
            raise ValueError(f"`dataset_size`={dataset_size!r} but `batching` has {n} examples: pass one of them.")
        sampling_probability, known = q, n
        max_batch_size = batching.max_batch_size if max_batch_size is None else max_batch_size
        dataset_size = None if max_batch_size is None else n  # N is a truncation argument only with a cap
    if epochs is not None:
        if steps is not None:
            raise ValueError(f"Pass `steps` or `epochs`, not both; received {steps!r}, {epochs!r}.")
        if sampling_probability is None or not epochs > 0:
            raise ValueError(f"`epochs` needs q (`sampling_probability` or `batching`) and > 0; received {epochs!r}.")
        steps = max(1, round(epochs / sampling_probability))
    return sampling_probability, steps, dataset_size, max_batch_size, known


__all__ = ["run_from_batching"]
