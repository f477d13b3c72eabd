"""Which batching the data fed to `DPModel.fit` really has, so that a report never claims Poisson on trust.

The Poisson accounting (`PoissonSampled(q, ...)` per step) describes a run
only if its batches were Poisson-sampled. The samplers of `tfdp_embed.data`
(`poisson_batches`, `poisson_user_batches`, `streaming_poisson_batches`, `one_pass_poisson_batches`,
`beam_poisson_batches`, `fixed_shape_batches`, `fixed_size_batches`, `with_lookahead`, and
`tfdp_embed.keras2.checkpointing.rest_of_epoch`) register
the dataset they return, with its `BatchingInfo`, in a weak registry.
`fed_batching(x)` finds the batching of what `fit` receives by walking
back from `x` through transformations that keep each batch as it is
(prefetch, map, with_options, repeat, take, skip, assert_cardinality) to a
registered dataset:

    fed(x) = info(registered ancestor of x)   if every step back is pass-through
           = not verified                      otherwise

Anything else is not verified Poisson: numpy arrays (Keras batches them
into shuffled fixed-size batches), generators, `keras.utils.Sequence`,
datasets built elsewhere, and a registered dataset under a transformation
that can change batches or their independence (`rebatch`, `unbatch`,
`shuffle`, `filter`, `batch`, and `cache`, which replays the same Poisson
draws every epoch). Sources that cannot be inspected (a `DatasetCreator`
under ParameterServerStrategy) may be declared by the caller
(`fit(..., batching=info)`); the report then says "declared by the caller,
not verified".

Example:
    >>> batches, info = poisson_batches(ds, sampling_probability=q)
    >>> fed_batching(batches.prefetch(2)).verified_poisson
    True
    >>> fed_batching(batches.shuffle(10)).verified_poisson
    False

References: Chua et al., "Scalable DP-SGD: Shuffling vs. Poisson
Subsampling", NeurIPS 2024 (shuffled batches are not covered by Poisson
accounting); Abadi et al. 2016 §3.1.
"""

from __future__ import annotations

import dataclasses
import weakref

import tensorflow as tf

POISSON = "poisson"
FIXED_SHUFFLED = "fixed_shuffled"
UNVERIFIED = "unverified"

VERIFIED = "verified"
DECLARED = "declared"
NOT_VERIFIED = "not_verified"

# tf.data transformations that pass each batch through unchanged (one input,
# batches in order, none added or merged). `cache` is not one of them: it
# replays the first epoch's Poisson draws in every later epoch.
_PASS_THROUGH = frozenset(
    {
        "_PrefetchDataset",
        "_MapDataset",
        "_ParallelMapDataset",
        "_OptionsDataset",
        "_RepeatDataset",
        "_TakeDataset",
        "_SkipDataset",
        "_AssertCardinalityDataset",
    }
)

_REGISTRY: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # dataset -> BatchingInfo


@dataclasses.dataclass
class BatchingInfo:
    """How a batched dataset was sampled: what the privacy report needs.

    Attributes:
      batching: "poisson" or "fixed_shuffled".
      num_examples: N.
      sampling_probability: q (Poisson) or batch_size / N (fixed).
      expected_batch_size: q N (the divisor of the noised gradient sum).
      batches_per_epoch: round(1/q) (Poisson) or ceil(N / batch_size).
      max_batch_size: the truncation cap, or None.
      streaming: True for `streaming_poisson_batches`.
      batches_per_pass: G for streaming, else None.
      seeded: True if an explicit seed was given (reproducible batches).
      truncated_batches: int64 `tf.Variable`, batches cut to the cap so far
        (counts batches the pipeline produced, including prefetched ones).
      truncated_examples: int64 `tf.Variable`, examples removed by the cap.
      sampler: which sampler drew the batches: "in_memory", "multi_pass"
        (`streaming_poisson_batches`), "one_pass_spill"
        (`one_pass_poisson_batches`), "beam_poisson" (`beam_poisson_batches`:
        the Apache Beam job's shards), or None (shuffled batches).
      fixed_shape: True when every batch is padded to `max_batch_size`
        (`fixed_shape_batches`; padding examples carry weight 0).
      spill: the one-pass sampler's `SpillStats` (disk and memory it used), else None.
      steps: the number of batches the dataset yields in all, where the sampler fixes it (the Beam job's
        shards: E round(1/q) steps, i.e. `steps // batches_per_epoch` epochs), else None.
      privacy_unit: what one sampled unit is: "example" (every sampler but one), or "user"
        (`poisson_user_batches`: then `num_examples` counts users, q and the expected batch are in users).
      max_examples_per_unit: k, the most rows one user contributes to a step (user level), else None.
      num_rows: the examples (rows) behind the units at user level, else None.
    """

    batching: str
    num_examples: int
    sampling_probability: float
    expected_batch_size: float
    batches_per_epoch: int
    max_batch_size: int | None = None
    streaming: bool = False
    batches_per_pass: int | None = None
    seeded: bool = False
    truncated_batches: tf.Variable | None = None
    truncated_examples: tf.Variable | None = None
    sampler: str | None = None
    fixed_shape: bool = False
    spill: object = None
    steps: int | None = None
    privacy_unit: str = "example"
    max_examples_per_unit: int | None = None
    num_rows: int | None = None

    def report(self) -> dict:
        """Plain-Python fields for `privacy_report(batching=...)`."""
        out = {
            "batching": self.batching,
            "num_examples": self.num_examples,
            "sampling_probability": self.sampling_probability,
            "expected_batch_size": self.expected_batch_size,
            "batches_per_epoch": self.batches_per_epoch,
            "max_batch_size": self.max_batch_size,
            "streaming": self.streaming,
            "batches_per_pass": self.batches_per_pass,
            "seeded": self.seeded,
            "sampler": self.sampler,
            "fixed_shape": self.fixed_shape,
        }
        if self.steps is not None:
            out["steps"] = self.steps
        if self.privacy_unit != "example":  # user level: N and q count users, each bounded to k rows
            out.update(
                privacy_unit=self.privacy_unit,
                max_examples_per_unit=self.max_examples_per_unit,
                num_rows=self.num_rows,
            )
        if self.truncated_batches is not None and self.truncated_examples is not None:  # set together
            out["truncated_batches"] = int(self.truncated_batches.numpy())
            out["truncated_examples"] = int(self.truncated_examples.numpy())
        return out


@dataclasses.dataclass(frozen=True)
class FedBatching:
    """How the batches fed to training were drawn, and how we know.

    Attributes:
      batching: "poisson", "fixed_shuffled" or "unverified" (unknown).
      source: "verified" (a `tfdp_embed.data` sampler, found through
        pass-through transformations), "declared" (stated by the caller of
        `fit`, not verified) or "not_verified" (anything else).
      description: what was fed, in words (for the report).
      info: the sampler's `BatchingInfo` (verified or declared), else None.
    """

    batching: str
    source: str
    description: str
    info: BatchingInfo | None = None

    @property
    def verified_poisson(self) -> bool:
        """True only for batches from a `tfdp_embed.data` Poisson sampler."""
        return self.source == VERIFIED and self.batching == POISSON

    @property
    def claims_poisson(self) -> bool:
        """True when the batches are Poisson, verified or declared."""
        return self.batching == POISSON and self.source in (VERIFIED, DECLARED)

    def report(self) -> dict:
        """Plain-Python fields for `privacy_report(batching=...)`."""
        out = dict(self.info.report()) if self.info is not None else {"batching": self.batching}
        out.update(batching=self.batching, batching_source=self.source, fed=self.description)
        return out


def register(dataset: tf.data.Dataset, info: BatchingInfo) -> tf.data.Dataset:
    """Records that `dataset` was made by a `tfdp_embed.data` sampler with `info`; returns `dataset`.

    Library-internal: only the samplers of `tfdp_embed.data` (and
    `rest_of_epoch`) call it.
    """
    _REGISTRY[dataset] = info
    return dataset


def registered_info(dataset) -> BatchingInfo | None:
    """The `BatchingInfo` of `dataset` or of the registered dataset it passes through to; else None."""
    return _walk(dataset)[0]


def fed_batching(x, *, declared: BatchingInfo | None = None) -> FedBatching:
    """The batching of `x`, what `DPModel.fit` receives.

    Args:
      x: `fit`'s data argument.
      declared: the caller's `BatchingInfo` for a source that cannot be
        inspected (e.g. a `DatasetCreator`); recorded as "declared".

    Returns:
      A `FedBatching`: verified from a registered dataset, declared, or not verified.

    Raises:
      TypeError: `declared` is not a `BatchingInfo`.
      ValueError: a declaration that contradicts what `x` verifiably is
        (Poisson declared for numpy arrays, or another batching than the
        registered sampler's).
    """
    if declared is not None and not isinstance(declared, BatchingInfo):
        raise TypeError(
            "`batching` must be the `BatchingInfo` of the sampler that made the data (tfdp_embed.data); "
            f"received {type(declared).__name__}."
        )
    info, stopped_at = _walk(x)
    if info is not None:
        if declared is not None and declared.batching != info.batching:
            raise ValueError(
                f"`batching` declares {declared.batching!r} batches but the dataset was made by a tfdp_embed.data "
                f"sampler of {info.batching!r} batches; drop `batching` (it is read from the dataset)."
            )
        return FedBatching(
            info.batching, VERIFIED, f"tf.data.Dataset from a tfdp_embed.data sampler ({info.batching})", info
        )
    described = _describe(x, stopped_at)
    if _is_arrays(x):
        if declared is not None and declared.batching == POISSON:
            raise ValueError(
                "`batching` declares Poisson batches, but arrays passed to `fit` are batched by Keras into "
                "shuffled fixed-size batches. Sample with tfdp_embed.data.poisson_batches instead."
            )
        return FedBatching(FIXED_SHUFFLED, VERIFIED, described)
    if declared is not None:
        return FedBatching(
            declared.batching, DECLARED, f"{described}; declared {declared.batching} by the caller", declared
        )
    return FedBatching(UNVERIFIED, NOT_VERIFIED, described)


def _walk(x) -> tuple:
    """(registered info, None) or (None, the first dataset that is neither registered nor pass-through)."""
    dataset = x
    while isinstance(dataset, tf.data.Dataset):
        info = _REGISTRY.get(dataset)
        if info is not None:
            return info, None
        if type(dataset).__name__ not in _PASS_THROUGH:
            return None, dataset
        inputs = dataset._inputs()  # noqa: SLF001 - tf.data's only way to walk a pipeline back
        if len(inputs) != 1:
            return None, dataset
        dataset = inputs[0]
    return None, None


def _is_arrays(x) -> bool:
    """True for array data that Keras batches itself (numpy arrays, tensors, nests of them)."""
    if isinstance(x, tf.data.Dataset):
        return False
    leaves = tf.nest.flatten(x)
    return bool(leaves) and all(hasattr(leaf, "shape") and hasattr(leaf, "dtype") for leaf in leaves)


def _describe(x, stopped_at) -> str:
    if isinstance(x, tf.data.Dataset):
        name = type(stopped_at).__name__.lstrip("_") if stopped_at is not None else "dataset"
        return (
            f"a tf.data.Dataset not verified as a tfdp_embed.data sampler (the walk back stopped at {name}, "
            "which is neither a sampler's output nor a pass-through transformation)"
        )
    if _is_arrays(x):
        return "arrays batched by Keras fit (fixed-size batches, shuffled unless shuffle=False)"
    return f"{type(x).__name__} (its batching cannot be inspected)"


__all__ = [
    "DECLARED",
    "FIXED_SHUFFLED",
    "NOT_VERIFIED",
    "POISSON",
    "UNVERIFIED",
    "VERIFIED",
    "BatchingInfo",
    "FedBatching",
    "fed_batching",
    "register",
    "registered_info",
]
