"""Where in the batch stream a checkpoint was taken, and how to continue the same stream.

`poisson_batches` / `streaming_poisson_batches` draw each batch's seed from a
`tf.random.Generator` seeded once and advanced by one draw per batch (one
per pass of G batches when streaming), across epochs. The batch sequence is
therefore one stream b_0, b_1, ... cut into epochs of B = round(1/q)
batches. A checkpoint after k batches records (epoch e, batch in epoch p,
k = e B + p); the resumed run must feed b_k, b_{k+1}, ... and not restart
at b_0 (restarting would reuse the same Poisson draws, which the
accounting assumes independent).

`rest_of_epoch(batches, position)` rebuilds the stream from a sampler made
with the same seed: `batches.repeat().skip(k).take(B - p)`. `skip` runs the
sampler for the k skipped batches (their seed draws advance the generator;
cost: k batch samplings, and for the streaming sampler k/G passes over the
source), so after the B - p remaining batches of epoch e the generator is
exactly where the uninterrupted run's was, and `fit(batches,
initial_epoch=e + 1)` continues the stream. With `sampler_seed=None` (OS
entropy) there is nothing to reproduce: fresh batches are as private.

The sampler must not be read before training in one process and not in the
other. `DPModel.prepare` / `fit` build an unbuilt model from the first batch
of the dataset they get, and a partial read of a `with_lookahead` pipeline
draws a timing-dependent number of batch seeds (tf.data prefetches): build
the model from other data (`dp.prepare(small_fixed_batches)`) in every
process, as tests/checkpoint_worker.py does, and the resumed stream is
exactly the uninterrupted one (the SIGKILL test checks it batch for batch
through the weights).

Example:
    >>> batches, info = poisson_batches(ds, sampling_probability=q, seed=7)
    >>> dp.prepare(build_batches)                     # not the sampler (see above)
    >>> resumed = checkpoint.restore_or_initialize()
    >>> rest = rest_of_epoch(batches, resumed.position)
    >>> if rest is not None:
    ...     dp.fit(rest, epochs=resumed.position.epoch + 1, initial_epoch=resumed.position.epoch)
    >>> dp.fit(batches, epochs=EPOCHS, initial_epoch=resumed.position.next_full_epoch)

References: Abadi et al. 2016 §3.1 (independent Poisson lots).
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from tfdp_embed.data.provenance import register, registered_info


@dataclasses.dataclass(frozen=True)
class DataPosition:
    """A point in the batch stream.

    Attributes:
      batches_consumed: k, batches trained on since the start of training.
      epoch: the Keras epoch the next batch belongs to.
      batch_in_epoch: p, batches of that epoch already consumed (0 <= p < B).
      batches_per_epoch: B, or None when unknown.
    """

    batches_consumed: int
    epoch: int
    batch_in_epoch: int
    batches_per_epoch: int | None

    @property
    def next_full_epoch(self) -> int:
        """The first epoch to start from its beginning (`initial_epoch` of the last `fit`)."""
        return self.epoch + (1 if self.batch_in_epoch else 0)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def normalized_position(
    *,
    batches_consumed: int,
    epoch: int,
    batch_in_epoch: int,
    batches_per_epoch: int | None,
) -> DataPosition:
    """A position with a finished epoch written as (epoch + 1, 0)."""
    if batches_per_epoch is not None and batch_in_epoch >= batches_per_epoch:
        epoch, batch_in_epoch = epoch + 1, 0
    return DataPosition(int(batches_consumed), int(epoch), int(batch_in_epoch), batches_per_epoch)


def rest_of_epoch(batches: tf.data.Dataset, position: DataPosition) -> tf.data.Dataset | None:
    """The remaining batches of the interrupted epoch, continuing the uninterrupted stream.

    Args:
      batches: one epoch of batches from a sampler built exactly as before
        (same data, q and seed), not yet iterated.
      position: `ResumeInfo.position` of the restored checkpoint.

    Returns:
      `batches.repeat().skip(k).take(B - p)`, or None when the checkpoint
      was taken at an epoch boundary (p = 0: continue with
      `fit(batches, initial_epoch=position.epoch)`).

    Raises:
      ValueError: `batches_per_epoch` unknown, or `batches` holding a
        different number of batches per epoch than the checkpointed run.
    """
    if not isinstance(batches, tf.data.Dataset):
        raise TypeError(f"`batches` must be a tf.data.Dataset; received {type(batches).__name__}.")
    if position.batch_in_epoch == 0:
        return None
    per_epoch = position.batches_per_epoch
    if per_epoch is None:
        raise ValueError(
            "The checkpoint does not know how many batches an epoch has, so the rest of the "
            "interrupted epoch cannot be cut; pass `batches_per_epoch` to DPCheckpoint."
        )
    cardinality = int(batches.cardinality())
    if cardinality >= 0 and cardinality != per_epoch:
        raise ValueError(
            f"`batches` has {cardinality} batches per epoch but the checkpointed run had {per_epoch}; "
            "rebuild the sampler exactly as before (same data, sampling_probability and seed)."
        )
    rest = batches.repeat().skip(position.batches_consumed).take(per_epoch - position.batch_in_epoch)
    info = registered_info(batches)  # the same sampler's stream: its batching carries over
    return rest if info is None else register(rest, info)


__all__ = ["DataPosition", "normalized_position", "rest_of_epoch"]
